// Several host agents on one control plane: capacity reports, placement (spread, region and
// label constraints, a full host skipped, capacity_exhausted in native and Daytona shapes),
// cordon/uncordon/drain, and a host agent killed with SIGKILL: its sandboxes become
// error/host_lost within the grace period in one step, the others are untouched, and when it
// comes back the sandboxes it still runs are adopted. One server (with its own local host agent)
// plus two extra `nestbox host-agent` processes with their own data dirs, ids and labels.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { existsSync, mkdtempSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { extraHostAgentEnv, hostSecretFromCli, removeDataDir, startTestServer, waitFor, type TestServer } from './harness.js';
import { isRunning, spawnNestbox, stopProcess, type NestboxProcess } from './cluster-harness.js';
import { projectPath } from '../src/paths.js';

const execFileAsync = promisify(execFile);
const HOST_SECRET = randomBytes(32).toString('base64url');
const LOST_AFTER_MS = 3000;
let t: TestServer;
let adminAuth: { Authorization: string };

interface ExtraAgent {
  id: string;
  dataDir: string;
  env: Record<string, string>;
  process?: NestboxProcess;
}
const extras: ExtraAgent[] = [];

/** A host agent as an operator starts one on another machine: its own id, data dir and labels, the secret from `nestbox host-secret`. */
function startAgent(agent: ExtraAgent): void {
  agent.process = spawnNestbox(['host-agent'], agent.env);
}

async function extraAgent(id: string, extra: Record<string, string>): Promise<ExtraAgent> {
  const dataDir = mkdtempSync('/tmp/nbx-hosts-');
  const agent: ExtraAgent = { id, dataDir, env: extraHostAgentEnv({ id, dataDir, controlPlaneUrl: t.url, secret: await hostSecretFromCli(id, HOST_SECRET) }, extra) };
  extras.push(agent);
  startAgent(agent);
  return agent;
}

const operator = () => t.auth;
const hostOf = async (id: string): Promise<string> => (await t.http.get(`/api/v1/sandboxes/${id}`).set(operator())).body.hostId;
const create = (body: Record<string, unknown> = {}) => t.http.post('/api/v1/sandboxes').set(operator()).send({ memoryMiB: 128, timeoutSeconds: 0, egress: { mode: 'deny-all' }, ...body });
const listHosts = async () => (await t.http.get('/api/v1/hosts').set(operator()).expect(200)).body.items as { id: string; state: string; labels: Record<string, string>; capacity: { memoryMiB: number } | null; allocated: { sandboxes: number }; version: string | null; region: string }[];

beforeAll(async () => {
  t = await startTestServer({
    env: {
      NESTBOX_HOST_SECRET: HOST_SECRET,
      NESTBOX_HOST_LOST_AFTER_MS: String(LOST_AFTER_MS),
      NESTBOX_DEFAULT_DISK_GIB: '1',
      NESTBOX_CAPACITY_RETRY_AFTER_SECONDS: '9',
    },
  });
  // hx-small offers 1024 MiB (× 1.5 overcommit − 512 MiB reserve = 1024 MiB to place).
  await extraAgent('hx-small', { NESTBOX_HOST_LABELS: 'region=eu-central,tier=small', NESTBOX_HOST_CAPACITY_MEMORY_MIB: '1024' });
  await extraAgent('hx-big', { NESTBOX_HOST_LABELS: 'region=eu-central,disk=ssd' });
  await waitFor('three live hosts', async () => (await t.http.get('/api/v1/health')).body.hostsAvailable === 3, 90_000).catch((err) => {
    throw new Error(`${(err as Error).message}\n${extras.map((a) => `${a.id}:\n${a.process?.output.join('').slice(-2000)}`).join('\n')}`);
  });
  const key = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'org-admin', preset: 'admin' }).expect(201);
  adminAuth = { Authorization: `Bearer ${key.body.key}` };
}, 150_000);

afterAll(async () => {
  // Every sandbox is destroyed through its (live) host agent first, so one killed by a failed
  // test is started again; then the extra agents go.
  for (const agent of extras) if (agent.process && !isRunning(agent.process)) startAgent(agent);
  if (t) await waitFor('every host agent back', async () => (await t.http.get('/api/v1/health')).body.hostsAvailable === 1 + extras.length, 60_000).catch(() => undefined);
  await t?.close();
  for (const agent of extras) {
    await stopProcess(agent.process);
    removeDataDir(agent.dataDir);
  }
}, 120_000);

describe('many host agents', () => {
  const ids: Record<string, string> = {};

  it('lists the hosts with capacity, labels and state to operators only', async () => {
    const hosts = await listHosts();
    expect(hosts.map((h) => h.id)).toEqual(['hx-big', 'hx-small', 'local']);
    const small = hosts.find((h) => h.id === 'hx-small')!;
    expect(small).toMatchObject({ state: 'ready', region: 'eu-central', labels: { region: 'eu-central', tier: 'small' }, capacity: { memoryMiB: 1024 }, allocatable: { memoryMiB: 1024 } });
    expect(small.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(hosts.find((h) => h.id === 'local')!.region).toBe('local');
    expect((await t.http.get('/api/v1/hosts/hx-big').set(operator()).expect(200)).body.labels).toEqual({ region: 'eu-central', disk: 'ssd' });
    const refused = await t.http.get('/api/v1/hosts').set(adminAuth);
    expect(refused.status).toBe(403);
    expect(refused.body.error.message).toContain('platform:hosts');
    expect((await t.http.get('/api/v1/hosts/nope').set(operator())).status).toBe(404);
  });

  it('the CLI lists, cordons and uncordons hosts', async () => {
    // Asynchronously: the server runs in this process and must answer meanwhile.
    const cli = async (...args: string[]) => (await execFileAsync(process.execPath, [projectPath('dist/src/cli.js'), ...args], { env: { PATH: process.env.PATH, NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey } })).stdout;
    expect((JSON.parse(await cli('hosts', 'ls', '--json')) as { id: string }[]).map((h) => h.id)).toEqual(['hx-big', 'hx-small', 'local']);
    expect(await cli('hosts', 'ls')).toMatch(/hx-small\s+ready\s+eu-central/);
    expect(await cli('hosts', 'cordon', 'local')).toBe('local cordoned\n');
    expect(await cli('hosts', 'get', 'local')).toMatch(/state\s+cordoned/);
    expect(await cli('hosts', 'uncordon', 'local')).toBe('local ready\n');
  });

  it('spreads creates over the hosts with most room, and shows the host to operators only', async () => {
    const [a, b] = await Promise.all([create(), create()]);
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    ids.a = a.body.id;
    ids.b = b.body.id;
    const placed = [a.body.hostId, b.body.hostId].sort();
    // hx-small has far less room than the other two, which get one each.
    expect(placed).toEqual(['hx-big', 'local']);
    const seenByAdmin = await t.http.get(`/api/v1/sandboxes/${ids.a}`).set(adminAuth).expect(200);
    expect(seenByAdmin.body).not.toHaveProperty('hostId');
  });

  it('honours label and region constraints, skips a full host, and answers capacity_exhausted when nothing fits', async () => {
    // Two creates race for hx-small's 1024 placeable MiB: the host row lock lets exactly one in.
    const race = await Promise.all([1, 2].map(() => create({ memoryMiB: 1024, placement: { labels: { tier: 'small' } } })));
    expect(race.map((r) => r.status).sort()).toEqual([201, 503]);
    const small = race.find((r) => r.status === 201)!;
    expect(small.body.hostId).toBe('hx-small');
    ids.small = small.body.id;
    const full = await create({ placement: { labels: { tier: 'small' } } });
    expect(full.status).toBe(503);
    expect(full.body.error.code).toBe('capacity_exhausted');
    expect(full.body.error.message).toContain('hx-small');
    expect(full.headers['retry-after']).toBe('9');
    // The region has a second host with room: the full one is skipped.
    const eu = await create({ placement: { region: 'eu-central' } });
    expect(eu.status).toBe(201);
    expect(eu.body.hostId).toBe('hx-big');
    ids.eu = eu.body.id;
    const mars = await create({ placement: { region: 'mars' } });
    expect(mars.status).toBe(400);
    expect(mars.body.error.message).toMatch(/^placement\.region: no live host satisfies placement\.region=mars/);
    const daytonaMars = await t.http.post('/daytona/api/sandbox').set(operator()).send({ target: 'mars', networkBlockAll: true });
    expect(daytonaMars.status).toBe(400);
    expect(JSON.stringify(daytonaMars.body.message)).toContain('target');
    const hostChoice = await t.http.post('/api/v1/sandboxes').set(adminAuth).send({ placement: { hostId: 'local' }, egress: { mode: 'deny-all' } });
    expect(hostChoice.status).toBe(403);
  });

  it('cordon keeps new sandboxes off a host, uncordon lets them back; drain marks it draining', async () => {
    expect((await t.http.post('/api/v1/hosts/hx-big/cordon').set(operator()).expect(200)).body.state).toBe('cordoned');
    // eu-central is now hx-small (full) only: nothing fits, in both APIs' shapes.
    const native = await create({ placement: { region: 'eu-central' } });
    expect(native.status).toBe(503);
    expect(native.body.error.code).toBe('capacity_exhausted');
    const daytona = await t.http.post('/daytona/api/sandbox').set(operator()).send({ target: 'eu-central', networkBlockAll: true });
    expect(daytona.status).toBe(503);
    expect(daytona.headers['retry-after']).toBe('9');
    expect(daytona.body).toMatchObject({ statusCode: 503 });
    expect(String(daytona.body.message)).toContain('room');
    // Not placed on the cordoned host without constraints either.
    const elsewhere = await create();
    expect(elsewhere.status).toBe(201);
    expect(elsewhere.body.hostId).toBe('local');
    ids.elsewhere = elsewhere.body.id;
    expect((await t.http.post('/api/v1/hosts/hx-big/uncordon').set(operator()).expect(200)).body.state).toBe('ready');
    const back = await create({ placement: { region: 'eu-central' } });
    expect(back.status).toBe(201);
    expect(back.body.hostId).toBe('hx-big');
    ids.back = back.body.id;
    expect((await t.http.post('/api/v1/hosts/hx-big/drain').set(operator()).expect(200)).body.state).toBe('draining');
    expect((await t.http.post('/api/v1/hosts/hx-big/uncordon').set(operator()).expect(200)).body.state).toBe('ready');
  });

  it('a killed host agent: its sandboxes become error/host_lost in one step, the rest untouched; its return adopts them', async () => {
    const big = extras.find((a) => a.id === 'hx-big')!;
    const onBig: string[] = [];
    const elsewhere: string[] = [];
    for (const id of Object.values(ids)) ((await hostOf(id)) === 'hx-big' ? onBig : elsewhere).push(id);
    expect(onBig.length).toBeGreaterThanOrEqual(2);
    await t.http.post(`/api/v1/sandboxes/${ids.back}/ports`).set(operator()).send({ port: 8080, public: true }).expect(201);

    await stopProcess(big.process, 'SIGKILL');
    const killedAt = Date.now();
    await waitFor('hx-big lost', async () => (await listHosts()).find((h) => h.id === 'hx-big')!.state === 'lost', 20_000);
    for (const id of onBig) {
      const s = (await t.http.get(`/api/v1/sandboxes/${id}`).set(operator()).expect(200)).body;
      expect(s).toMatchObject({ state: 'error', stopReason: 'host_lost' });
      expect(s.errorMessage).toContain('hx-big');
    }
    // Marked within the grace period plus a few background passes (the whole batch at once).
    expect(Date.now() - killedAt).toBeLessThan(LOST_AFTER_MS + 10_000);
    for (const id of elsewhere) expect((await t.http.get(`/api/v1/sandboxes/${id}`).set(operator())).body.state).toBe('running');
    const exec = await t.http.post(`/api/v1/sandboxes/${ids.back}/commands`).set(operator()).send({ cmd: 'true' });
    expect(exec.status).toBe(503);
    expect(exec.body.error.message).toContain('host_lost');
    const page = await t.http.get(`/p/${ids.back}/8080/`);
    expect(page.status).toBe(503);
    expect(page.text).toContain('host_lost');
    // A sandbox deleted while its host is lost is gone at once (the host destroys it when it returns).
    await t.http.delete(`/api/v1/sandboxes/${ids.eu}`).set(operator()).expect(204);

    startAgent(big);
    await waitFor('hx-big ready again', async () => (await listHosts()).find((h) => h.id === 'hx-big')!.state === 'ready', 60_000);
    await waitFor('the sandboxes on hx-big adopted', async () => {
      for (const id of onBig.filter((x) => x !== ids.eu)) if ((await t.http.get(`/api/v1/sandboxes/${id}`).set(operator())).body.state !== 'running') return false;
      return true;
    }, 20_000);
    const run = await t.http.post(`/api/v1/sandboxes/${ids.back}/commands`).set(operator()).send({ cmd: 'echo adopted' }).expect(200);
    expect(run.body.stdout).toContain('adopted');
    await waitFor('the deleted sandbox destroyed on hx-big', async () => !existsSync(`${big.dataDir}/sandboxes/${ids.eu}`), 20_000);
  });
});
