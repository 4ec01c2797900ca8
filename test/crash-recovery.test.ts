// kill -9 of the server or of the host agent loses nothing. The server runs as its own process
// here (the real CLI), so it can be killed for real.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, statSync } from 'node:fs';
import net from 'node:net';
import knexFactory, { type Knex } from 'knex';
import supertest from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, removeDataDir, testEnv, waitFor } from './harness.js';
import { residueOf, snapshotHostNetwork } from './residue.js';
import { projectPath } from '../src/paths.js';
import { TRANSITIONAL_STATES } from '../core/state-machine.js';

interface ServerProcess {
  child: ChildProcess;
  output: string[];
}

let dataDir: string;
let database: { url: string; drop: () => Promise<void> };
let db: Knex;
let port: number;
let server: ServerProcess | undefined;
let apiKey: string;
const api = () => supertest(`http://127.0.0.1:${port}`);
const auth = () => ({ Authorization: `Bearer ${apiKey}` });

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

function startServerProcess(): ServerProcess {
  const output: string[] = [];
  const child = spawn(process.execPath, [projectPath('dist/src/cli.js'), 'server'], {
    // One process (no supervisor): the kill -9s here are meant for the control plane itself.
    env: { PATH: process.env.PATH, ...testEnv(dataDir, { NESTBOX_PORT: String(port), NESTBOX_DATABASE_URL: database.url, NESTBOX_SERVER_SUPERVISOR: 'false' }) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (d) => output.push(String(d)));
  child.stderr!.on('data', (d) => output.push(String(d)));
  return { child, output };
}

async function waitReady(p: ServerProcess): Promise<void> {
  await waitFor('server with a host agent', async () => (await api().get('/api/v1/health')).body.hostsAvailable >= 1, 120_000).catch((err) => {
    throw new Error(`${(err as Error).message}\n${p.output.join('')}`);
  });
}

function hostAgentPidOf(serverPid: number): number | undefined {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === serverPid && readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes('host-agent')) return Number(entry);
    } catch {
      // gone
    }
  }
  return undefined;
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

async function kill9(p: ServerProcess): Promise<void> {
  const exited = new Promise((r) => p.child.once('exit', r));
  p.child.kill('SIGKILL');
  await exited;
}

beforeAll(async () => {
  dataDir = mkdtempSync('/tmp/nbx-crash-');
  database = await createTestDatabase();
  db = knexFactory({ client: 'pg', connection: database.url, pool: { min: 0, max: 2 } });
  port = await freePort();
});

afterAll(async () => {
  // Whatever a failed test left running: delete it through the (still running) server.
  if (server && server.child.exitCode === null && apiKey) {
    const left = (await db('sandboxes').whereNot({ state: 'deleted' }).select('id')) as { id: string }[];
    for (const { id } of left) await api().delete(`/api/v1/sandboxes/${id}`).set(auth()).catch(() => undefined);
  }
  if (server && server.child.exitCode === null) {
    const exited = new Promise((r) => server!.child.once('exit', r));
    server.child.kill('SIGTERM');
    await exited;
  }
  await db.destroy();
  await database.drop();
  removeDataDir(dataDir);
});

describe('crash recovery', () => {
  let sandboxId: string;
  const network = snapshotHostNetwork();

  it('prints a generated first API key once and keeps it with mode 0600', async () => {
    server = startServerProcess();
    await waitReady(server);
    const printed = server.output.join('').match(/nbx_[A-Za-z0-9]{40}/);
    expect(printed).not.toBeNull();
    apiKey = printed![0];
    const keyFile = `${dataDir}/bootstrap-api-key`;
    expect(readFileSync(keyFile, 'utf8').trim()).toBe(apiKey);
    expect(statSync(keyFile).mode & 0o777).toBe(0o600);
    expect(statSync(dataDir).mode & 0o777).toBe(0o700);
    const created = await api().post('/api/v1/sandboxes').set(auth()).send({ timeoutSeconds: 0 });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    sandboxId = created.body.id;
    await api().put(`/api/v1/sandboxes/${sandboxId}/files`).query({ path: '/root/state.txt' }).set(auth()).set('content-type', 'application/octet-stream').send(Buffer.from('before the crash'));
    await api().post(`/api/v1/sandboxes/${sandboxId}/commands`).set(auth()).send({ cmd: 'nohup sleep 1000 >/dev/null 2>&1 & echo $! > /root/sleeper.pid' });
  });

  it('kill -9 of the server: the sandbox keeps running and is adopted after restart', async () => {
    const agentPid = hostAgentPidOf(server!.child.pid!);
    expect(agentPid).toBeDefined();
    await kill9(server!);
    // The orphaned host agent notices its parent is gone and exits; sandboxes stay.
    await waitFor('the host agent to exit', async () => !alive(agentPid!), 10_000);
    server = startServerProcess();
    await waitReady(server);
    expect(server.output.join('')).not.toMatch(/nbx_[A-Za-z0-9]{40}/); // the key is printed once only
    const got = await api().get(`/api/v1/sandboxes/${sandboxId}`).set(auth());
    expect(got.body.state).toBe('running');
    // Until the new host agent's first heartbeat, the old (dead) address may still be on
    // record; requests then get a clean 503, never a wrong answer.
    const interim: string[] = [];
    const out = await waitFor('exec through the restarted host agent', async () => {
      const res = await api().post(`/api/v1/sandboxes/${sandboxId}/commands`).set(auth()).send({ cmd: 'kill -0 $(cat /root/sleeper.pid) && echo alive; cat /root/state.txt' });
      if (res.status !== 200) interim.push(`${res.status} ${res.body?.error?.code}`);
      return res.status === 200 ? res.body : undefined;
    }, 30_000);
    expect(interim.filter((r) => r !== '503 host_unavailable')).toEqual([]);
    // The same processes: the background sleeper started before the crash is still there.
    expect(out.stdout).toBe('alive\nbefore the crash');
  });

  it('kill -9 of the host agent: it is restarted and adopts its sandboxes', async () => {
    const agentPid = hostAgentPidOf(server!.child.pid!)!;
    process.kill(agentPid, 'SIGKILL');
    await waitFor('a new host agent', async () => {
      const pid = hostAgentPidOf(server!.child.pid!);
      return pid && pid !== agentPid ? pid : undefined;
    }, 20_000);
    const out = await waitFor('exec through the new host agent', async () => {
      const res = await api().post(`/api/v1/sandboxes/${sandboxId}/commands`).set(auth()).send({ cmd: 'kill -0 $(cat /root/sleeper.pid) && echo alive' });
      return res.status === 200 ? res.body : undefined;
    }, 30_000);
    expect(out.stdout).toBe('alive\n');
  });

  it('kill -9 in the middle of a create leaves no row in a transitional state', async () => {
    // Fire a create and kill the server while the host is building the sandbox.
    const pending = api().post('/api/v1/sandboxes').set(auth()).send({}).then(() => undefined, () => undefined);
    await waitFor('a creating row', async () => (await db('sandboxes').where({ state: 'creating' }).first()) ?? undefined, 10_000, 20);
    await kill9(server!);
    await pending;
    server = startServerProcess();
    await waitReady(server);
    const rows = await waitFor('no transitional rows', async () => {
      const r = await db('sandboxes').whereIn('state', TRANSITIONAL_STATES as string[]).select('id', 'state');
      return r.length === 0 ? true : undefined;
    }, 30_000);
    expect(rows).toBe(true);
    const all = await db('sandboxes').select('id', 'state');
    for (const row of all as { id: string; state: string }[]) expect(['running', 'error', 'deleted']).toContain(row.state);
  });

  it('deletes everything and leaves nothing behind', async () => {
    const rows = (await db('sandboxes').whereNot({ state: 'deleted' }).select('id')) as { id: string }[];
    for (const { id } of rows) expect((await api().delete(`/api/v1/sandboxes/${id}`).set(auth())).status).toBe(204);
    for (const { id } of rows) expect(residueOf(id, `${dataDir}/host`, network)).toEqual([]);
  });
});
