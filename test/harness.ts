// Shared test plumbing: a real server (control plane + local host agent child process) on a
// fresh database, real PostgreSQL by default, PGlite on request.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import knexFactory from 'knex';
import supertest from 'supertest';
import { WebSocket } from 'ws';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { silentLogger } from '../core/logger.js';
import { startServer, type RunningServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';
import { serverSentEvents } from '../host/protocol/sse.js';
import { removeTree } from '../host/util/fs.js';
import { projectPath } from '../src/paths.js';

export const TEST_IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
export const TEST_DATABASE_URL = process.env.NESTBOX_TEST_DATABASE_URL ?? 'postgres://nestbox:nestbox@127.0.0.1:5432/postgres';

/** A brand-new PostgreSQL database for one test file; dropped by the returned function. */
export async function createTestDatabase(): Promise<{ url: string; drop: () => Promise<void> }> {
  const name = `nbx_test_${randomBytes(6).toString('hex')}`;
  const admin = knexFactory({ client: 'pg', connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
  await admin.raw(`CREATE DATABASE ${name}`);
  await admin.destroy();
  const url = new URL(TEST_DATABASE_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: async () => {
      const a = knexFactory({ client: 'pg', connection: TEST_DATABASE_URL, pool: { min: 0, max: 1 } });
      await a.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await a.destroy();
    },
  };
}

/**
 * Removes a test server's data dir. With the default `NESTBOX_REFLINK_STORE=auto` it holds
 * mounts (the loop-mounted XFS store, each sandbox's disk and each snapshot's image): they are
 * unmounted first, deepest first, so nothing of them (loop devices included) outlives the test.
 */
export function removeDataDir(dataDir: string): void {
  removeTree(dataDir);
}

export interface TestServer {
  server: RunningServer;
  url: string;
  apiKey: string;
  dataDir: string;
  databaseUrl?: string;
  logs: string[];
  http: ReturnType<typeof supertest>;
  auth: { Authorization: string };
  close(): Promise<void>;
}

/**
 * The environment of a `nestbox host-agent` a test starts as another machine's would be: its own
 * id and data dir, its own secret (what `nestbox host-secret <id>` prints on the control plane),
 * heartbeats to `controlPlaneUrl` twice a second, plain disks, no slot pool, and the code
 * interpreter's image only when asked for. `extra` adds to it or overrides it.
 */
export function extraHostAgentEnv(o: { id: string; dataDir: string; controlPlaneUrl: string; secret: string }, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '/root',
    NESTBOX_DATA_DIR: o.dataDir,
    NESTBOX_IMAGES_DIR: TEST_IMAGES_DIR,
    NESTBOX_HOST_ID: o.id,
    NESTBOX_HOST_AGENT_PORT: '0',
    NESTBOX_CONTROL_PLANE_URL: o.controlPlaneUrl,
    NESTBOX_HOST_AGENT_SECRET: o.secret,
    NESTBOX_HEARTBEAT_INTERVAL_MS: '500',
    NESTBOX_REFLINK_STORE: 'off',
    NESTBOX_CODE_INTERPRETER_IMAGE: 'on-demand',
    NESTBOX_SLOT_POOL_SIZE: '0',
    NESTBOX_LOG_LEVEL: 'warn',
    ...extra,
  };
}

/** A host's secret as an operator gets it: `nestbox host-secret <id>` with the deployment's NESTBOX_HOST_SECRET. */
export async function hostSecretFromCli(hostId: string, hostSecret: string): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [projectPath('dist/src/cli.js'), 'host-secret', hostId], { env: { PATH: process.env.PATH, NESTBOX_HOST_SECRET: hostSecret } });
  return stdout.trim();
}

/**
 * A terminal used over its WebSocket (`wsUrl`: `ws://…/sandboxes/{id}/commands/{processId}/pty`):
 * `echo $((6*7))` must show 42, then `exit 3` must close it with exit code 3.
 */
export async function expectTerminalRoundTrip(wsUrl: string, headers: Record<string, string>): Promise<void> {
  const ws = new WebSocket(wsUrl, { headers });
  let screen = '';
  let exit: { exitCode?: number } | undefined;
  const closed = new Promise<void>((resolve) => ws.on('close', () => resolve()));
  ws.on('message', (data, isBinary) => {
    if (isBinary) screen += Buffer.from(data as Buffer).toString('utf8');
    else exit = JSON.parse(String(data));
  });
  await new Promise((resolve, reject) => {
    ws.on('open', resolve);
    ws.on('error', reject);
  });
  ws.send(Buffer.from('echo $((6*7))\r'), { binary: true });
  await waitFor('42 on the terminal', async () => /[\r\n]42\r?\n/.test(screen), 15_000, 50);
  ws.send(Buffer.from('exit 3\r'), { binary: true });
  await closed;
  if (exit?.exitCode !== 3) throw new Error(`the terminal ended with ${JSON.stringify(exit)}, not exit code 3`);
}

export function testEnv(dataDir: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    NESTBOX_PORT: '0',
    // No SSH gateway unless a test asks for one (parallel servers would fight over its port).
    NESTBOX_SSH_PORT: '0',
    NESTBOX_DATA_DIR: dataDir,
    NESTBOX_IMAGES_DIR: TEST_IMAGES_DIR,
    NESTBOX_HEARTBEAT_INTERVAL_MS: '500',
    NESTBOX_BACKGROUND_INTERVAL_MS: '500',
    // No warm pool unless a test asks for one (its members would be every test's residue).
    NESTBOX_WARM_POOL_SIZE: '0',
    ...extra,
  };
}

export async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs = 60_000, intervalMs = 200): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as T;
    } catch (err) {
      last = err;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

/**
 * Sandboxes outlive their server and host agent by design (a restart adopts them), so a test
 * server must remove its sandboxes itself before it goes, or they keep running on the machine.
 */
export async function destroyAllSandboxes(server: RunningServer): Promise<void> {
  // The warm pool first: stopped, so it refills nothing behind the cleanup, then emptied.
  await server.services.warmPool.stop();
  const pooled = (await server.db('warm_pool_sandboxes').select('id', 'host_id')) as { id: string; host_id: string }[];
  for (const row of pooled) {
    const client = await server.services.hosts.clientFor(row.host_id).catch(() => undefined);
    await client?.destroySandbox(row.id).catch((err) => console.error(`cleanup of warm sandbox ${row.id} failed: ${String(err)}`));
    await server.db('warm_pool_sandboxes').where({ id: row.id }).delete();
  }
  const rows = (await server.db('sandboxes').whereNot({ state: 'deleted' }).select('id', 'host_id')) as { id: string; host_id: string | null }[];
  for (const row of rows) {
    if (!row.host_id) continue;
    const client = await server.services.hosts.clientFor(row.host_id);
    await client.destroySandbox(row.id).catch((err) => console.error(`cleanup of sandbox ${row.id} failed: ${String(err)}`));
    await server.db('sandboxes').where({ id: row.id }).update({ state: 'deleted', deleted_at: new Date() });
  }
  // Volumes are loop-mounted images on their host: removed there too, so no mount outlives the test.
  const volumes = (await server.db('volumes').whereNull('deleted_at').select('id', 'host_id')) as { id: string; host_id: string }[];
  for (const v of volumes) {
    const client = await server.services.hosts.clientFor(v.host_id).catch(() => undefined);
    await client?.deleteVolume(v.id).catch((err) => console.error(`cleanup of volume ${v.id} failed: ${String(err)}`));
    await server.db('volumes').where({ id: v.id }).update({ deleted_at: new Date() });
  }
}

export async function startTestServer(opts: { database?: 'postgres' | 'pglite'; env?: Record<string, string> } = {}): Promise<TestServer> {
  const dataDir = mkdtempSync('/tmp/nbx-it-');
  const db = opts.database === 'pglite' ? undefined : await createTestDatabase();
  const apiKey = generateApiKey();
  const logs: string[] = [];
  const config = loadConfig(
    testEnv(dataDir, {
      NESTBOX_BOOTSTRAP_API_KEY: apiKey,
      ...(db ? { NESTBOX_DATABASE_URL: db.url } : {}),
      ...opts.env,
    }),
  );
  // The server's own JSON lines (and the host agent's, relayed), kept for assertions and failures.
  const server = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => logs.push(line.trimEnd()) }));
  const http = supertest(server.url);
  await waitFor('a registered host agent', async () => {
    const res = await http.get('/api/v1/health');
    return res.body.hostsAvailable >= 1 ? true : undefined;
  }, 120_000).catch((err) => {
    throw new Error(`${(err as Error).message}\nserver log:\n${logs.slice(-40).join('\n')}`);
  });
  return {
    server,
    url: server.url,
    apiKey,
    dataDir,
    databaseUrl: db?.url,
    logs,
    http,
    auth: { Authorization: `Bearer ${apiKey}` },
    async close() {
      await destroyAllSandboxes(server);
      await server.close();
      await db?.drop();
      removeDataDir(dataDir);
    },
  };
}

/** Server-sent events from a native stream route, parsed as JSON, until `until` says stop (or the stream ends). */
export async function readEvents<T = Record<string, unknown>>(
  url: string,
  headers: Record<string, string>,
  until: (event: T, all: T[]) => boolean,
  timeoutMs = 30_000,
): Promise<T[]> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  const events: T[] = [];
  try {
    const res = await fetch(url, { headers: { ...headers, accept: 'text/event-stream' }, signal: abort.signal });
    if (!res.ok) throw new Error(`stream answered ${res.status}: ${await res.text()}`);
    for await (const event of serverSentEvents<T>(res.body as unknown as AsyncIterable<Uint8Array>)) {
      events.push(event);
      if (until(event, events)) return events;
    }
    return events;
  } catch (err) {
    if (abort.signal.aborted) throw new Error(`no end of stream within ${timeoutMs} ms; got ${JSON.stringify(events).slice(0, 500)}`);
    throw err;
  } finally {
    clearTimeout(timer);
    abort.abort();
  }
}

/** Decode stdout/stderr chunks of a process event stream. */
export function outputOf(events: { type?: unknown; data?: unknown }[], stream: 'stdout' | 'stderr'): string {
  return events
    .filter((e) => e.type === stream)
    .map((e) => Buffer.from(String(e.data), 'base64').toString('utf8'))
    .join('');
}

/** The pids of `pid`'s direct children whose command line contains `match`. */
export function childPids(pid: number, match = ''): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid && readFileSync(`/proc/${entry}/cmdline`, 'utf8').replace(/\0/g, ' ').includes(match)) found.push(Number(entry));
    } catch {
      // gone
    }
  }
  return found;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

export interface TestServerProcess {
  url: string;
  port: number;
  apiKey: string;
  dataDir: string;
  /** Its database (a second replica can be started on it). */
  databaseUrl: string;
  output: string[];
  http: ReturnType<typeof supertest>;
  auth: { Authorization: string };
  /** `nestbox server` as a user starts it: the supervisor. */
  supervisor: ChildProcess;
  /** The control plane worker now running under the supervisor. */
  workerPid(): number | undefined;
  /** The worker's local host agent. */
  hostAgentPid(): number | undefined;
  close(): Promise<void>;
}

/**
 * Sandboxes a server process could not delete (it died, or the test failed first) would keep
 * running on the machine: an in-process server on the same data dir and database adopts and
 * destroys them.
 */
async function removeLeftSandboxes(dataDir: string, databaseUrl: string): Promise<void> {
  const db = knexFactory({ client: 'pg', connection: databaseUrl, pool: { min: 0, max: 1 } });
  const left = (await db('sandboxes').whereNot({ state: 'deleted' }).count<{ count: string }[]>('id as count'))[0];
  const pooled = (await db('warm_pool_sandboxes').count<{ count: string }[]>('id as count'))[0];
  await db.destroy();
  if (Number(left.count) === 0 && Number(pooled.count) === 0) return;
  const server = await startServer(loadConfig(testEnv(dataDir, { NESTBOX_DATABASE_URL: databaseUrl })), silentLogger);
  try {
    const started = new Date();
    // Only once this server's own host agent has registered (the row's URL is then its own).
    await waitFor('the cleanup host agent', async () => {
      const rows = (await server.db('hosts').where('last_heartbeat_at', '>', started).select('id')) as unknown[];
      return rows.length > 0;
    }, 120_000);
    await destroyAllSandboxes(server);
  } finally {
    await server.close();
  }
}

/**
 * The real program (`node dist/src/cli.js server`, supervised) in its own process, for tests
 * that must see what a user sees when something kills a process. Needs `npm run build`.
 */
export async function startServerProcess(opts: { env?: Record<string, string> } = {}): Promise<TestServerProcess> {
  const dataDir = mkdtempSync('/tmp/nbx-proc-');
  const db = await createTestDatabase();
  const apiKey = generateApiKey();
  const port = await freePort();
  const output: string[] = [];
  const supervisor = spawn(process.execPath, [projectPath('dist/src/cli.js'), 'server'], {
    env: { PATH: process.env.PATH, ...testEnv(dataDir, { NESTBOX_PORT: String(port), NESTBOX_DATABASE_URL: db.url, NESTBOX_BOOTSTRAP_API_KEY: apiKey, ...opts.env }) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  supervisor.stdout!.on('data', (d) => output.push(String(d)));
  supervisor.stderr!.on('data', (d) => output.push(String(d)));
  const url = `http://127.0.0.1:${port}`;
  const http = supertest(url);
  const workerPid = () => childPids(supervisor.pid!, ' server --worker')[0];
  const auth = { Authorization: `Bearer ${apiKey}` };
  const close = async () => {
    // A process ended by a signal has no exit code, only a signal code.
    if (supervisor.exitCode === null && supervisor.signalCode === null) {
      const listed = await http.get('/api/v1/sandboxes?limit=1000').set(auth).catch(() => undefined);
      for (const s of (listed?.body?.items ?? []) as { id: string }[]) await http.delete(`/api/v1/sandboxes/${s.id}`).set(auth).catch(() => undefined);
      const exited = new Promise((r) => supervisor.once('exit', r));
      supervisor.kill('SIGTERM');
      await exited;
    }
    await removeLeftSandboxes(dataDir, db.url);
    await db.drop();
    removeDataDir(dataDir);
  };
  try {
    await waitFor('a registered host agent', async () => (await http.get('/api/v1/health')).body.hostsAvailable >= 1, 120_000);
  } catch (err) {
    await close();
    throw new Error(`${(err as Error).message}\nserver output:\n${output.join('').slice(-4000)}`);
  }
  return {
    url,
    port,
    apiKey,
    dataDir,
    databaseUrl: db.url,
    output,
    http,
    auth,
    supervisor,
    workerPid,
    hostAgentPid: () => {
      const worker = workerPid();
      return worker ? childPids(worker, 'host-agent')[0] : undefined;
    },
    close,
  };
}
