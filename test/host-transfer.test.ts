// Host-to-host transfers on real processes: one server (with its own local host agent) plus two
// extra `nestbox host-agent` processes. A snapshot made on hx-a is used to create a sandbox on
// another host (its layers copied there, host to host, with a token signed by hx-a's secret); a
// drained host's stopped sandboxes are moved (API and CLI) and start elsewhere with their files
// (a snapshot child's layers going along); moves that cannot be made are refused naming why; the
// source keeps nothing of a moved sandbox. hx-c reports so little memory that nothing fits on it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { promisify } from 'node:util';
import { existsSync, mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { extraHostAgentEnv, hostSecretFromCli, removeDataDir, startTestServer, waitFor, type TestServer } from './harness.js';
import { projectPath } from '../src/paths.js';

const execFileAsync = promisify(execFile);
const HOST_SECRET = randomBytes(32).toString('base64url');
let t: TestServer;

interface ExtraAgent {
  id: string;
  dataDir: string;
  env: Record<string, string>;
  child?: ChildProcess;
  output: string[];
}

function startAgent(agent: ExtraAgent): void {
  const child = spawn(process.execPath, [projectPath('dist/src/cli.js'), 'host-agent'], { env: agent.env, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (d) => agent.output.push(String(d)));
  child.stderr!.on('data', (d) => agent.output.push(String(d)));
  agent.child = child;
}
const extras: ExtraAgent[] = [];

async function extraAgent(id: string, extra: Record<string, string>): Promise<ExtraAgent> {
  const dataDir = mkdtempSync('/tmp/nbx-transfer-');
  const env = extraHostAgentEnv({ id, dataDir, controlPlaneUrl: t.url, secret: await hostSecretFromCli(id, HOST_SECRET) }, extra);
  const agent: ExtraAgent = { id, dataDir, env, output: [] };
  startAgent(agent);
  extras.push(agent);
  return agent;
}

const op = () => t.auth;
const create = (body: Record<string, unknown> = {}) => t.http.post('/api/v1/sandboxes').set(op()).send({ memoryMiB: 128, timeoutSeconds: 0, egress: { mode: 'deny-all' }, ...body });
const run = async (id: string, cmd: string): Promise<string> => {
  const r = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(op()).send({ cmd });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  expect(r.body.exitCode, r.body.stderr).toBe(0);
  return r.body.stdout as string;
};
const move = (id: string, body: Record<string, unknown> = {}) => t.http.post(`/api/v1/sandboxes/${id}/move`).set(op()).send(body);
const stop = async (id: string) => expect((await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(op())).body.state).toBe('stopped');
const hostAction = async (hostId: string, action: string) => t.http.post(`/api/v1/hosts/${hostId}/${action}`).set(op()).expect(200);
const agentDir = (hostId: string) => extras.find((a) => a.id === hostId)!.dataDir;

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_HOST_SECRET: HOST_SECRET, NESTBOX_DEFAULT_DISK_GIB: '1' } });
  await extraAgent('hx-a', { NESTBOX_HOST_LABELS: 'region=eu-central' });
  // 400 MiB × 1.5 overcommit − 512 MiB reserve = 88 MiB to place: a 128 MiB sandbox never fits.
  await extraAgent('hx-c', { NESTBOX_HOST_CAPACITY_MEMORY_MIB: '400' });
  await waitFor('three live hosts', async () => (await t.http.get('/api/v1/health')).body.hostsAvailable === 3, 90_000).catch((err) => {
    throw new Error(`${(err as Error).message}\n${extras.map((a) => `${a.id}:\n${a.output.join('').slice(-2000)}`).join('\n')}`);
  });
}, 150_000);

afterAll(async () => {
  // A host agent a failed test left dead is started again, so its sandboxes are destroyed through
  // it; it is back once the control plane has its new URL (it listens on a new port).
  for (const agent of extras) {
    if (!t || !agent.child || (agent.child.exitCode === null && agent.child.signalCode === null)) continue;
    const oldUrl = (await t.http.get(`/api/v1/hosts/${agent.id}`).set(op())).body.url as string | undefined;
    startAgent(agent);
    await waitFor(`${agent.id} back`, async () => (await t.http.get(`/api/v1/hosts/${agent.id}`).set(op())).body.url !== oldUrl, 60_000).catch(() => undefined);
  }
  await t?.close();
  for (const agent of extras) {
    if (agent.child && agent.child.exitCode === null && agent.child.signalCode === null) {
      const exited = new Promise((r) => agent.child!.once('exit', r));
      agent.child.kill('SIGTERM');
      await exited;
    }
    removeDataDir(agent.dataDir);
  }
}, 120_000);

describe('host-to-host transfers', () => {
  it('a snapshot made on hx-a is used on another host when hx-a is cordoned: its layers are copied there', async () => {
    const source = await create({ placement: { hostId: 'hx-a' } });
    expect(source.status, JSON.stringify(source.body)).toBe(201);
    expect(source.body.hostId).toBe('hx-a');
    await run(source.body.id, 'mkdir -p /srv/app && echo "made on hx-a" > /srv/app/origin.txt');
    const snap = await t.http.post('/api/v1/snapshots').set(op()).send({ sandboxId: source.body.id, name: 'transfer-snap' });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    await hostAction('hx-a', 'cordon');
    try {
      const child = await create({ snapshot: 'transfer-snap' });
      expect(child.status, JSON.stringify(child.body)).toBe(201);
      // hx-a is cordoned and hx-c has no room: the server's own host takes it.
      expect(child.body.hostId).toBe('local');
      expect(await run(child.body.id, 'cat /srv/app/origin.txt')).toBe('made on hx-a\n');
      // A second create there finds the copy; the snapshot's row records both holders.
      const again = await create({ snapshot: 'transfer-snap', placement: { hostId: 'local' } });
      expect(again.status, JSON.stringify(again.body)).toBe(201);
      const holders = (await t.server.db('snapshot_hosts').where({ snapshot_id: snap.body.id }).select('host_id')) as { host_id: string }[];
      expect(holders.map((h) => h.host_id)).toEqual(['local']);
    } finally {
      await hostAction('hx-a', 'uncordon');
    }
    // A placement constraint picks the holder itself: no copy needed.
    const onHolder = await create({ snapshot: 'transfer-snap', placement: { hostId: 'hx-a' } });
    expect(onHolder.status, JSON.stringify(onHolder.body)).toBe(201);
    expect(await run(onHolder.body.id, 'cat /srv/app/origin.txt')).toBe('made on hx-a\n');
  });

  it("a drained host's stopped sandboxes move elsewhere and start there with their files; impossible moves are refused", async () => {
    const plain = await create({ placement: { hostId: 'hx-a' } });
    expect(plain.status, JSON.stringify(plain.body)).toBe(201);
    const sum = await run(plain.body.id, 'head -c 16777216 /dev/urandom > /root/blob && echo kept > /root/note.txt && sha256sum /root/blob | cut -d" " -f1');
    const busy = await create({ placement: { hostId: 'hx-a' } });
    expect(busy.status).toBe(201);
    // A snapshot child on hx-a: moving it takes its layers along.
    const base = await create({ placement: { hostId: 'hx-a' } });
    await run(base.body.id, 'echo "layer of s2" > /root/layer.txt');
    const s2 = await t.http.post('/api/v1/snapshots').set(op()).send({ sandboxId: base.body.id, name: 'transfer-s2' });
    expect(s2.status, JSON.stringify(s2.body)).toBe(201);
    const child = await create({ snapshot: 'transfer-s2', placement: { hostId: 'hx-a' } });
    expect(child.body.hostId).toBe('hx-a');
    await run(child.body.id, 'echo "own file" > /root/own.txt');
    await stop(plain.body.id);
    await stop(child.body.id);
    await hostAction('hx-a', 'drain');

    const running = await move(busy.body.id);
    expect(running.status).toBe(409);
    expect(running.body.error.code).toBe('invalid_state');
    expect(running.body.error.message).toContain('running');
    const full = await move(plain.body.id, { hostId: 'hx-c' });
    expect(full.status).toBe(409);
    expect(full.body.error.message).toMatch(/hx-c.*(lacks|room)/);
    const ownHost = await move(plain.body.id, { hostId: 'hx-a' });
    expect(ownHost.status).toBe(409);
    expect(ownHost.body.error.message).toContain('already on host hx-a');
    await hostAction('local', 'cordon');
    try {
      const cordoned = await move(plain.body.id, { hostId: 'local' });
      expect(cordoned.status).toBe(409);
      expect(cordoned.body.error.message).toContain('host local is cordoned');
      // Without a target, no ready host has room: capacity_exhausted, and nothing moved.
      const nowhere = await move(plain.body.id);
      expect(nowhere.status).toBe(503);
      expect(nowhere.body.error.code).toBe('capacity_exhausted');
    } finally {
      await hostAction('local', 'uncordon');
    }
    expect(existsSync(join(agentDir('hx-a'), 'sandboxes', plain.body.id))).toBe(true);

    const moved = await move(plain.body.id);
    expect(moved.status, JSON.stringify(moved.body)).toBe(200);
    expect(moved.body).toMatchObject({ fromHostId: 'hx-a', toHostId: 'local', layersCopied: [] });
    expect(moved.body.sandbox).toMatchObject({ id: plain.body.id, state: 'stopped', hostId: 'local' });
    // Nothing of it is left on the source.
    expect(existsSync(join(agentDir('hx-a'), 'sandboxes', plain.body.id))).toBe(false);
    const resumed = await t.http.post(`/api/v1/sandboxes/${plain.body.id}/resume`).set(op());
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body).toMatchObject({ state: 'running', hostId: 'local' });
    expect(await run(plain.body.id, 'cat /root/note.txt && sha256sum /root/blob | cut -d" " -f1')).toBe(`kept\n${sum}`);

    // The CLI evacuates the rest: the stopped child moves (with its snapshot layers), the running one is skipped.
    const cli = async (...args: string[]) => (await execFileAsync(process.execPath, [projectPath('dist/src/cli.js'), ...args], { env: { PATH: process.env.PATH, NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey } })).stdout;
    const out = await cli('hosts', 'evacuate', 'hx-a');
    expect(out).toContain(`moved   ${child.body.id} hx-a → local`);
    expect(out).toContain(`skipped ${busy.body.id} (running`);
    expect(existsSync(join(agentDir('hx-a'), 'sandboxes', child.body.id))).toBe(false);
    const holders = (await t.server.db('snapshot_hosts').where({ snapshot_id: s2.body.id }).select('host_id')) as { host_id: string }[];
    expect(holders.map((h) => h.host_id)).toEqual(['local']);
    const childBack = await t.http.post(`/api/v1/sandboxes/${child.body.id}/resume`).set(op());
    expect(childBack.status, JSON.stringify(childBack.body)).toBe(200);
    expect(childBack.body.hostId).toBe('local');
    expect(await run(child.body.id, 'cat /root/layer.txt /root/own.txt')).toBe('layer of s2\nown file\n');
    await hostAction('hx-a', 'uncordon');
  });

  it('refuses a move without platform:hosts, and of an unknown sandbox or to an unknown host', async () => {
    const key = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'org-admin-transfer', preset: 'admin' }).expect(201);
    const s = await create();
    await stop(s.body.id);
    const refused = await t.http.post(`/api/v1/sandboxes/${s.body.id}/move`).set({ Authorization: `Bearer ${key.body.key}` }).send({});
    expect(refused.status).toBe(403);
    expect(refused.body.error.message).toContain('platform:hosts');
    expect((await move('nosuchsandbox0000000')).status).toBe(404);
    expect((await move(s.body.id, { hostId: 'no-such-host' })).status).toBe(404);
  });

  it('a move whose receiving host agent is killed with SIGKILL mid-copy leaves the sandbox on its source, nothing on the target, and a retry finishes', async () => {
    const s = await create({ placement: { hostId: 'local' } });
    expect(s.status, JSON.stringify(s.body)).toBe(201);
    // Enough bytes that the copy is still streaming when the target's record appears.
    const sum = await run(s.body.id, 'head -c 402653184 /dev/urandom > /root/big && sha256sum /root/big | cut -d" " -f1');
    await stop(s.body.id);
    const target = extras.find((a) => a.id === 'hx-a')!;
    const record = join(target.dataDir, 'sandboxes', s.body.id, 'record.json');
    const moving = move(s.body.id, { hostId: 'hx-a' }).then((r) => r);
    await waitFor('the import to begin on hx-a', async () => existsSync(record), 60_000, 5);
    const oldUrl = (await t.http.get('/api/v1/hosts/hx-a').set(op()).expect(200)).body.url as string;
    const exited = new Promise((r) => target.child!.once('exit', r));
    target.child!.kill('SIGKILL');
    await exited;
    const failed = await moving;
    expect(failed.status, JSON.stringify(failed.body)).toBeGreaterThanOrEqual(500);
    const after = await t.http.get(`/api/v1/sandboxes/${s.body.id}`).set(op()).expect(200);
    expect(after.body).toMatchObject({ state: 'stopped', hostId: 'local' });
    // The host agent comes back: its init removes the half-made copy (a create never finished).
    startAgent(target);
    // Back on a new port (NESTBOX_HOST_AGENT_PORT=0): registered once its heartbeat names the new URL.
    await waitFor('hx-a back', async () => (await t.http.get('/api/v1/hosts/hx-a').set(op())).body.url !== oldUrl, 60_000);
    await waitFor('no half-made copy on hx-a', async () => !existsSync(join(target.dataDir, 'sandboxes', s.body.id)), 30_000);
    const retried = await move(s.body.id, { hostId: 'hx-a' });
    expect(retried.status, JSON.stringify(retried.body)).toBe(200);
    expect(retried.body).toMatchObject({ fromHostId: 'local', toHostId: 'hx-a' });
    const resumed = await t.http.post(`/api/v1/sandboxes/${s.body.id}/resume`).set(op());
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body.hostId).toBe('hx-a');
    expect(await run(s.body.id, 'sha256sum /root/big | cut -d" " -f1')).toBe(sum);
  }, 180_000);
});
