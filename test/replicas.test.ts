// Two `nestbox server` replicas (real processes) on one PostgreSQL database, no sticky sessions,
// and one host agent of their own (`nestbox host-agent`, a third process) that both reach through
// the URL it registered. Both replicas start at the same moment on a fresh database; a sandbox made
// through replica A is used through replica B (exec, files, an SSE stream, a PTY WebSocket, the
// Daytona and E2B SDKs); and replica A is killed with SIGKILL in the middle of a create and in the
// middle of a stop, held there by a proxy in front of the host agent, so replica B takes over.
//
// Why a host agent of its own rather than one replica's embedded one: the embedded host agent
// exits with its server, and replica A is the one killed here. Both replicas run with
// NESTBOX_LOCAL_HOST_AGENT=false; the host agent heartbeats to B and advertises the proxy's URL.
import { existsSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import knexFactory, { type Knex } from 'knex';
import supertest from 'supertest';
import { Daytona } from '@daytonaio/sdk';
import { Sandbox as E2bSandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, expectTerminalRoundTrip, freePort, outputOf, readEvents, removeDataDir, testEnv, waitFor } from './harness.js';
import { isRunning, spawnNestbox, stopProcess, waitForReplica, type NestboxProcess } from './cluster-harness.js';
import { deriveHostSecret } from '../core/services/hosts.js';
import { HttpHostClient } from '../host/protocol/client.js';
import { TRANSITIONAL_STATES } from '../core/state-machine.js';
import { migrationSource } from '../core/store/migrations/index.js';

const HOST_SECRET = randomBytes(32).toString('base64url');
const HOST_ID = `rep-${randomBytes(4).toString('hex')}`;
/** A replica silent this long is dead to the others (6 background intervals of 500 ms: short, yet no live replica misses it). */
const INSTANCE_TIMEOUT_MS = 3000;

/**
 * A TCP proxy in front of the host agent that can hold what the control planes send: while held,
 * bytes from a replica are kept, not forwarded. A replica killed while its request is held has its
 * connection closed by the kernel; the held bytes are then dropped, so the host never sees that
 * request (the create or stop is cut off exactly between the row's write and the host's call).
 */
class HoldingProxy {
  private held = false;
  private readonly queues = new Map<net.Socket, { upstream: net.Socket; chunks: Buffer[] }>();
  readonly server: net.Server;
  constructor(private readonly targetPort: number) {
    this.server = net.createServer((client) => this.accept(client));
  }
  listen(port: number): Promise<void> {
    return new Promise((resolve) => this.server.listen(port, '127.0.0.1', () => resolve()));
  }
  private accept(client: net.Socket): void {
    const upstream = net.connect(this.targetPort, '127.0.0.1');
    const entry = { upstream, chunks: [] as Buffer[] };
    this.queues.set(client, entry);
    upstream.pipe(client);
    client.on('data', (chunk: Buffer) => {
      if (this.held || entry.chunks.length) entry.chunks.push(chunk);
      else upstream.write(chunk);
    });
    const gone = () => {
      this.queues.delete(client);
      // Held bytes of a closed client are dropped: the request never reaches the host.
      if (entry.chunks.length) upstream.destroy();
      else upstream.end();
    };
    client.on('close', gone);
    client.on('error', () => undefined);
    upstream.on('close', () => client.destroy());
    upstream.on('error', () => client.destroy());
  }
  hold(): void {
    this.held = true;
  }
  /** Whether a held request mentions `text` (a sandbox id: every host call names its sandbox). */
  holds(text: string): boolean {
    return [...this.queues.values()].some((q) => Buffer.concat(q.chunks).includes(text));
  }
  release(): void {
    this.held = false;
    for (const q of this.queues.values()) {
      for (const chunk of q.chunks.splice(0)) q.upstream.write(chunk);
    }
  }
  close(): Promise<void> {
    for (const client of this.queues.keys()) client.destroy();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

let database: { url: string; drop: () => Promise<void> };
let db: Knex;
const dataDirs: Record<'a' | 'b' | 'host', string> = { a: '', b: '', host: '' };
const ports = { a: 0, b: 0, agent: 0, proxy: 0 };
let a: NestboxProcess | undefined;
let b: NestboxProcess | undefined;
let hostAgent: NestboxProcess | undefined;
let proxy: HoldingProxy;
let apiKey: string;
let hostClient: HttpHostClient;

const urlOf = (port: number) => `http://127.0.0.1:${port}`;
const A = () => supertest(urlOf(ports.a));
const B = () => supertest(urlOf(ports.b));
const auth = () => ({ Authorization: `Bearer ${apiKey}` });
const row = async (id: string) => (await db('sandboxes').where({ id }).first()) as Record<string, unknown> | undefined;

/** A replica as an operator runs one: no supervisor (kill -9 is meant for the control plane itself), no host agent. */
function startReplica(name: 'a' | 'b'): NestboxProcess {
  return spawnNestbox(['server'], testEnv(dataDirs[name], {
    NESTBOX_PORT: String(ports[name]),
    NESTBOX_DATABASE_URL: database.url,
    NESTBOX_HOST_SECRET: HOST_SECRET,
    NESTBOX_LOCAL_HOST_AGENT: 'false',
    NESTBOX_SERVER_SUPERVISOR: 'false',
    NESTBOX_INSTANCE_TIMEOUT_MS: String(INSTANCE_TIMEOUT_MS),
  }));
}

const hostsAvailable = async (port: number) => (await supertest(urlOf(port)).get('/api/v1/health')).body.hostsAvailable >= 1;

beforeAll(async () => {
  database = await createTestDatabase();
  db = knexFactory({ client: 'pg', connection: database.url, pool: { min: 0, max: 2 } });
  for (const name of ['a', 'b', 'host'] as const) dataDirs[name] = mkdtempSync(`/tmp/nbx-rep-${name}-`);
  for (const name of ['a', 'b', 'agent', 'proxy'] as const) ports[name] = await freePort();
  proxy = new HoldingProxy(ports.agent);
  await proxy.listen(ports.proxy);
  hostClient = new HttpHostClient({ hostId: HOST_ID, baseUrl: urlOf(ports.agent), secret: deriveHostSecret(HOST_SECRET, HOST_ID) });
});

afterAll(async () => {
  // What a failed test left: delete it through a live replica, then off the host directly.
  const survivor = isRunning(b) ? B : isRunning(a) ? A : undefined;
  const left = db ? ((await db('sandboxes').whereNot({ state: 'deleted' }).select('id')) as { id: string }[]) : [];
  if (survivor && apiKey) for (const { id } of left) await survivor().delete(`/api/v1/sandboxes/${id}`).set(auth()).catch(() => undefined);
  if (isRunning(hostAgent)) for (const { id } of left) await hostClient.destroySandbox(id).catch(() => undefined);
  await stopProcess(a, 'SIGTERM');
  await stopProcess(b, 'SIGTERM');
  await stopProcess(hostAgent, 'SIGTERM');
  await proxy?.close();
  await db?.destroy();
  await database?.drop();
  for (const dir of Object.values(dataDirs)) if (dir) removeDataDir(dir);
});

describe('two control-plane replicas on one PostgreSQL database', () => {
  it('start at the same moment on a fresh database: migrated once, one bootstrap key', async () => {
    a = startReplica('a');
    b = startReplica('b');
    await Promise.all([waitForReplica(a, urlOf(ports.a)), waitForReplica(b, urlOf(ports.b))]);
    const applied = ((await db('knex_migrations').select('name')) as { name: string }[]).map((m) => m.name).sort();
    expect(applied).toEqual(await migrationSource.getMigrations([]));
    expect(Number((await db('api_keys').count<{ count: string }[]>('* as count'))[0].count)).toBe(1);
    expect(Number((await db('organizations').count<{ count: string }[]>('* as count'))[0].count)).toBe(1);
    // Exactly one of them minted the key (and kept it in its data dir).
    const keyFiles = (['a', 'b'] as const).map((n) => `${dataDirs[n]}/bootstrap-api-key`).filter((f) => existsSync(f));
    expect(keyFiles).toHaveLength(1);
    apiKey = readFileSync(keyFiles[0], 'utf8').trim();
    expect((await A().get('/api/v1/sandboxes').set(auth())).status).toBe(200);
    expect((await B().get('/api/v1/sandboxes').set(auth())).status).toBe(200);
    // Both are alive in the instance table.
    expect(Number((await db('control_plane_instances').count<{ count: string }[]>('* as count'))[0].count)).toBe(2);
  });

  it('a replica with a host secret of its own refuses to start, naming NESTBOX_HOST_SECRET', async () => {
    const dir = mkdtempSync('/tmp/nbx-rep-c-');
    let c: NestboxProcess | undefined;
    try {
      c = spawnNestbox(['server'], testEnv(dir, { NESTBOX_PORT: String(await freePort()), NESTBOX_DATABASE_URL: database.url, NESTBOX_LOCAL_HOST_AGENT: 'false', NESTBOX_SERVER_SUPERVISOR: 'false' }));
      const child = c.child;
      const code = await new Promise<number | null>((resolve) => child.once('exit', (exitCode) => resolve(exitCode)));
      expect(code).not.toBe(0);
      expect(c.output.join('')).toMatch(/NESTBOX_HOST_SECRET: differs from the host secret/);
    } finally {
      await stopProcess(c, 'SIGKILL');
      removeDataDir(dir);
    }
  });

  it('both replicas reach the one host agent by the URL it registered', async () => {
    hostAgent = spawnNestbox(['host-agent'], testEnv(dataDirs.host, {
      NESTBOX_HOST_ID: HOST_ID,
      NESTBOX_HOST_AGENT_HOST: '127.0.0.1',
      NESTBOX_HOST_AGENT_PORT: String(ports.agent),
      // The control planes reach it through the proxy; it heartbeats to replica B.
      NESTBOX_HOST_AGENT_URL: urlOf(ports.proxy),
      NESTBOX_CONTROL_PLANE_URL: urlOf(ports.b),
      NESTBOX_HOST_AGENT_SECRET: deriveHostSecret(HOST_SECRET, HOST_ID),
    }));
    await waitFor('the host agent registered, as both replicas see it', async () => {
      if (!isRunning(hostAgent)) throw new Error('the host agent exited');
      return (await hostsAvailable(ports.a)) && (await hostsAvailable(ports.b));
    }, 120_000, 200).catch((err) => {
      throw new Error(`${(err as Error).message}\n${hostAgent!.output.join('').slice(-3000)}`);
    });
    expect((await db('hosts').where({ id: HOST_ID }).first()).url).toBe(urlOf(ports.proxy));
  });

  let id: string;
  it('a sandbox created through A runs commands, files, an SSE stream and a PTY through B', async () => {
    const created = await A().post('/api/v1/sandboxes').set(auth()).send({ timeoutSeconds: 600, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    id = created.body.id;
    const api = `/api/v1/sandboxes/${id}`;
    expect((await B().get(api).set(auth())).body.state).toBe('running');

    const exec = await B().post(`${api}/commands`).set(auth()).send({ cmd: 'echo from-b' });
    expect(exec.body).toMatchObject({ exitCode: 0, stdout: 'from-b\n' });

    // Written through A, read through B, and the other way round.
    const put = await A().put(`${api}/files`).query({ path: '/tmp/via-a.txt' }).set(auth()).set('content-type', 'application/octet-stream').send(Buffer.from('written through A'));
    expect(put.status, JSON.stringify(put.body)).toBeLessThan(300);
    const got = await B().get(`${api}/files`).query({ path: '/tmp/via-a.txt' }).set(auth()).buffer(true).parse((res, done) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => done(null, Buffer.concat(chunks)));
    });
    expect(got.status).toBe(200);
    expect(String(got.body)).toBe('written through A');
    await B().put(`${api}/files`).query({ path: '/tmp/via-b.txt' }).set(auth()).set('content-type', 'application/octet-stream').send(Buffer.from('written through B'));
    expect((await A().post(`${api}/commands`).set(auth()).send({ cmd: 'cat /tmp/via-b.txt' })).body.stdout).toBe('written through B');

    // A process started through A, its output streamed (SSE) through B.
    const started = await A().post(`${api}/commands`).set(auth()).send({ detach: true, cmd: 'for i in 1 2 3; do echo sse$i; sleep 0.05; done' });
    expect(started.status, JSON.stringify(started.body)).toBe(202);
    const events = await readEvents<{ type: string; data: string; exitCode?: number }>(`${urlOf(ports.b)}${api}/commands/${started.body.processId}/stream`, auth(), (e) => e.type === 'exit');
    expect(outputOf(events, 'stdout')).toBe('sse1\nsse2\nsse3\n');
    expect(events.at(-1)).toMatchObject({ type: 'exit', exitCode: 0 });

    // A terminal opened through A, driven over a WebSocket through B.
    const terminal = await A().post(`${api}/terminals`).set(auth()).send({ cols: 80, rows: 24 });
    expect(terminal.status, JSON.stringify(terminal.body)).toBe(201);
    await expectTerminalRoundTrip(`ws://127.0.0.1:${ports.b}${api}/commands/${terminal.body.processId}/pty`, auth());
  });

  it('the Daytona SDK creates through A and works through B', async () => {
    for (const k of Object.keys(process.env)) if (k.startsWith('DAYTONA_')) delete process.env[k];
    const viaA = new Daytona({ apiUrl: `${urlOf(ports.a)}/daytona/api`, apiKey });
    const viaB = new Daytona({ apiUrl: `${urlOf(ports.b)}/daytona/api`, apiKey });
    const made = await viaA.create({ language: 'python', networkBlockAll: true, labels: { suite: 'replicas' } }, { timeout: 60 });
    const sb = await viaB.get(made.id);
    expect(sb.state).toBe('started');
    expect((await sb.process.executeCommand('echo daytona-b')).result.trim()).toBe('daytona-b');
    await sb.fs.uploadFile(Buffer.from('daytona file'), '/tmp/daytona.txt');
    expect(String(await made.fs.downloadFile('/tmp/daytona.txt'))).toBe('daytona file');
    await viaB.delete(sb);
    expect((await row(made.id))?.state).toBe('deleted');
  });

  it('a Daytona sandbox built on demand through A is followed through B, from pending_build to started', async () => {
    const dockerfileContent = `FROM default\nRUN echo on-demand-${randomBytes(4).toString('hex')} > /od.txt\n`;
    const created = await A().post('/daytona/api/sandbox').set(auth()).send({ buildInfo: { dockerfileContent, contextHashes: [] }, networkBlockAll: true });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    expect(created.body.state).toMatch(/^(pending_build|building_snapshot)$/);
    const pendingId = created.body.id as string;
    // B reads the pending record A wrote (it lives in the database, not in A's memory).
    const seen = await B().get(`/daytona/api/sandbox/${pendingId}`).set(auth());
    expect(seen.status, JSON.stringify(seen.body)).toBe(200);
    expect(seen.body.state).toMatch(/^(pending_build|building_snapshot|creating|started)$/);
    const started = await waitFor('the built sandbox started, as B sees it', async () => {
      const got = await B().get(`/daytona/api/sandbox/${pendingId}`).set(auth());
      if (got.body.state === 'build_failed' || got.body.state === 'error') throw new Error(JSON.stringify(got.body));
      return got.body.state === 'started' ? got.body : undefined;
    }, 120_000, 250);
    expect(started.name).toBe(pendingId);
    expect((await B().post(`/api/v1/sandboxes/${started.id}/commands`).set(auth()).send({ cmd: 'cat /od.txt' })).body.stdout).toMatch(/^on-demand-/);
    expect((await B().delete(`/daytona/api/sandbox/${started.id}`).set(auth())).status).toBe(200);
  });

  it('the E2B SDK creates through A and works through B', async () => {
    const optsA = { apiKey, apiUrl: `${urlOf(ports.a)}/e2b`, sandboxUrl: urlOf(ports.a) };
    const optsB = { apiKey, apiUrl: `${urlOf(ports.b)}/e2b`, sandboxUrl: urlOf(ports.b) };
    const made = await E2bSandbox.create({ ...optsA, allowInternetAccess: false, timeoutMs: 120_000 });
    const sb = await E2bSandbox.connect(made.sandboxId, optsB);
    expect((await sb.commands.run('echo e2b-b')).stdout).toBe('e2b-b\n');
    await sb.files.write('/tmp/e2b.txt', 'e2b file');
    expect(await made.files.read('/tmp/e2b.txt')).toBe('e2b file');
    await E2bSandbox.kill(made.sandboxId, optsB);
    expect((await row(made.sandboxId))?.state).toBe('deleted');
  });

  /** SIGKILL of replica A once `sandboxId`'s host call is held in the proxy; the held call is dropped. */
  async function killAWhileHeld(sandboxId: string): Promise<void> {
    await waitFor(`the host call for ${sandboxId} held in the proxy`, async () => proxy.holds(sandboxId), 30_000, 20);
    await stopProcess(a, 'SIGKILL');
    // The kernel closed A's connections; once the proxy has seen that, nothing of A's is left to forward.
    await waitFor('the killed replica\'s held request dropped', async () => !proxy.holds(sandboxId), 10_000, 20);
    proxy.release();
  }

  const settled = (sandboxId: string) => waitFor(`sandbox ${sandboxId} out of its transitional state`, async () => {
    const r = await row(sandboxId);
    return r && !(TRANSITIONAL_STATES as readonly string[]).includes(r.state as string) ? r : undefined;
  }, 30_000, 100);

  it('kill -9 of A in the middle of a create: B fails it cleanly (the host never made it)', async () => {
    proxy.hold();
    const pending = A().post('/api/v1/sandboxes').set(auth()).send({ timeoutSeconds: 600, egress: { mode: 'deny-all' } }).then(() => undefined, () => undefined);
    const creating = await waitFor('the row of the create in flight', async () => (await db('sandboxes').where({ state: 'creating' }).first()) as Record<string, unknown> | undefined, 30_000, 20);
    await killAWhileHeld(creating.id as string);
    await pending;
    const after = await settled(creating.id as string);
    expect(after).toMatchObject({ state: 'error', operation: null, operation_id: null });
    expect(after.error_message).toMatch(/create operation was interrupted/);
    expect(await hostClient.getSandbox(creating.id as string)).toBeUndefined();
    // The user sees it as failed through B, and can delete it there.
    expect((await B().get(`/api/v1/sandboxes/${creating.id}`).set(auth())).body.state).toBe('error');
    expect((await B().delete(`/api/v1/sandboxes/${creating.id}`).set(auth())).status).toBeLessThan(300);
  });

  it('kill -9 of A in the middle of a stop: B finishes the stop', async () => {
    a = startReplica('a');
    await waitForReplica(a, urlOf(ports.a));
    const created = await A().post('/api/v1/sandboxes').set(auth()).send({ timeoutSeconds: 600, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const stopId = created.body.id as string;
    proxy.hold();
    const pending = A().post(`/api/v1/sandboxes/${stopId}/stop`).set(auth()).then(() => undefined, () => undefined);
    await waitFor('the stop in flight', async () => (await row(stopId))?.state === 'stopping', 30_000, 20);
    await killAWhileHeld(stopId);
    await pending;
    const after = await settled(stopId);
    expect(after).toMatchObject({ state: 'stopped', operation: null, operation_id: null });
    expect((await hostClient.getSandbox(stopId))?.status).toBe('stopped');
    // And it resumes through B.
    const resumed = await B().post(`/api/v1/sandboxes/${stopId}/resume`).set(auth());
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect((await B().post(`/api/v1/sandboxes/${stopId}/commands`).set(auth()).send({ cmd: 'cat /tmp/nothing 2>/dev/null; echo back' })).body.stdout).toBe('back\n');
  });

  it('leaves no row transitional and no sandbox on the host without a row', async () => {
    const transitional = await db('sandboxes').whereIn('state', TRANSITIONAL_STATES as unknown as string[]).select('id', 'state');
    expect(transitional).toEqual([]);
    const live = new Set(((await db('sandboxes').whereNot({ state: 'deleted' }).select('id')) as { id: string }[]).map((r) => r.id));
    const onHost = readdirSync(`${dataDirs.host}/sandboxes`);
    expect(onHost.filter((sandboxId) => !live.has(sandboxId))).toEqual([]);
    // Everything deleted through B, the survivor.
    for (const sandboxId of live) expect((await B().delete(`/api/v1/sandboxes/${sandboxId}`).set(auth())).status).toBeLessThan(300);
    await waitFor('the host agent\'s sandboxes gone', async () => readdirSync(`${dataDirs.host}/sandboxes`).length === 0, 30_000, 100);
  });
});
