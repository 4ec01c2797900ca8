// The warm pool (core/services/warm-pool.ts) end to end: real server, PostgreSQL and local
// driver. A create of the pooled (image, size) is answered by a member, which must then look
// exactly like a sandbox created cold; the pool is no one's (invisible, free of quota) until
// claimed, refills, never hands one member to two creates, and survives a restart.
import { mkdtempSync } from 'node:fs';
import supertest from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { startServer, type RunningServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';
import { sandboxRepository } from '../core/store/repositories/sandboxes.js';
import { createTestDatabase, destroyAllSandboxes, removeDataDir, testEnv, waitFor } from './harness.js';

const POOL = 2;
/** The pooled key is the default image at 1 vCPU, 512 MiB, 1 GiB; a cold sandbox asks for 640 MiB. */
const POOLED = { cpu: 1, memoryMiB: 512, diskGiB: 1 };
const COLD = { cpu: 1, memoryMiB: 640, diskGiB: 1 };
const METRICS_TOKEN = 'metrics-token-for-tests-0123456789';

let db: Awaited<ReturnType<typeof createTestDatabase>>;
let dataDir: string;
let apiKey: string;
let server: RunningServer;
let http: ReturnType<typeof supertest>;
const logs: string[] = [];
const auth = () => ({ Authorization: `Bearer ${apiKey}` });
let acme: { id: string; key: string };

async function start(): Promise<void> {
  const config = loadConfig(testEnv(dataDir, {
    NESTBOX_BOOTSTRAP_API_KEY: apiKey,
    NESTBOX_DATABASE_URL: db.url,
    NESTBOX_DEFAULT_DISK_GIB: '1',
    NESTBOX_WARM_POOL_SIZE: '0',
    NESTBOX_WARM_POOL_TARGETS: `default:${POOLED.cpu}:${POOLED.memoryMiB}:${POOLED.diskGiB}=${POOL}`,
    // Fixed at POOL: no growth with demand and no idle shrink while the tests run.
    NESTBOX_WARM_POOL_MAX: String(POOL),
    NESTBOX_WARM_POOL_IDLE_SECONDS: '0',
    NESTBOX_WARM_POOL_MAX_AGE_SECONDS: '0',
    NESTBOX_ORG_MAX_SANDBOXES: '20',
    NESTBOX_METRICS_TOKEN: METRICS_TOKEN,
  }));
  const started = new Date();
  server = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => logs.push(line.trimEnd()) }));
  http = supertest(server.url);
  // This server's own host agent (after a restart the previous one's row is still fresh, with its old URL).
  await waitFor('this server\'s host agent registered', async () => ((await server.db('hosts').where('last_heartbeat_at', '>', started).select('id')) as unknown[]).length > 0, 120_000);
}

interface PoolItem { hostId: string; image: string; cpu: number; memoryMiB: number; diskGiB: number; target: number; ready: number; warming: number }
const pool = async () => (await http.get('/api/v1/warm-pool').set(auth()).expect(200)).body as { hits: number; misses: number; items: PoolItem[] };
const readyIds = async () => ((await server.db('warm_pool_sandboxes').where({ state: 'ready' }).select('id')) as { id: string }[]).map((r) => r.id);
const full = () => waitFor(`${POOL} ready warm sandboxes`, async () => (await readyIds()).length === POOL, 120_000, 200);

const create = async (body: Record<string, unknown>, key = apiKey) => {
  const res = await http.post('/api/v1/sandboxes').set({ Authorization: `Bearer ${key}` }).send({ timeoutSeconds: 0, ...body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { id: string; state: string; labels: Record<string, string>; env?: Record<string, string>; [k: string]: unknown };
};
const run = async (id: string, cmd: string, key = apiKey) => {
  const res = await http.post(`/api/v1/sandboxes/${id}/commands`).set({ Authorization: `Bearer ${key}` }).send({ cmd });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body as { exitCode: number; stdout: string; stderr: string };
};

/** What a user can see of a sandbox's make-up, with its id and pids taken out so two sandboxes compare. */
async function observed(id: string): Promise<Record<string, string>> {
  const norm = (s: string) => s.replaceAll(id, '<id>');
  const ps = (await run(id, 'ps -eo user,comm,args --no-headers')).stdout;
  return {
    // The command itself (ps, and the sh the exec runs it in) aside, every process.
    processes: norm(ps).split('\n').filter((l) => l && !/\bps -eo\b/.test(l)).map((l) => l.replace(/\s+/g, ' ').trim()).sort().join('\n'),
    // Scratch directories, and every file written after launch wrote /etc/resolv.conf last (runtime.ts).
    tmp: (await run(id, 'ls -A /tmp /var/tmp /run 2>&1; find / -xdev -newer /etc/resolv.conf -not -path "/proc/*" -not -path "/sys/*" -not -path "/dev/*" -not -path "/run/*" 2>/dev/null | sort | head -50')).stdout,
    hostname: norm((await run(id, 'hostname; cat /etc/hostname; cat /etc/hosts')).stdout),
    env: norm((await run(id, 'env | grep -v "^_=" | grep -v "^PWD=" | grep -v "^SHLVL=" | sort')).stdout),
    home: (await run(id, 'ls -A /root')).stdout,
    // Every other process's environment as /proc shows it (the guest agent's, tini's too); the
    // pipeline's own processes left out, and each list sorted (the launcher's order is a hash's).
    environ: norm((await run(id, 'for p in /proc/[0-9]*; do n=${p#/proc/}; [ "$n" = "$$" ] && continue; c=$(cat $p/comm 2>/dev/null) || continue; e=$(tr "\\0" "\\n" < $p/environ 2>/dev/null | sort | tr "\\n" " "); echo "$c: $e"; done')).stdout)
      .split('\n').filter((l) => l && !/^(cat|tr|sort|grep): /.test(l)).sort().join('\n'),
  };
}

beforeAll(async () => {
  db = await createTestDatabase();
  dataDir = mkdtempSync('/tmp/nbx-warm-');
  apiKey = generateApiKey();
  await start();
  const org = await http.post('/api/v1/organizations').set(auth()).send({ name: 'acme', limits: { maxSandboxes: 1 } });
  expect(org.status, JSON.stringify(org.body)).toBe(201);
  const key = await http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(auth()).send({});
  expect(key.status, JSON.stringify(key.body)).toBe(201);
  acme = { id: org.body.id, key: key.body.key };
}, 180_000);

afterAll(async () => {
  if (server) {
    await destroyAllSandboxes(server);
    await server.close();
  }
  await db?.drop();
  if (dataDir) removeDataDir(dataDir);
});

describe('warm pool', () => {
  it('fills to its target, counted in its host allocation, and reports itself to operators only', async () => {
    await full();
    const stats = await pool();
    expect(stats.items).toHaveLength(1);
    expect(stats.items[0]).toMatchObject({ image: 'default', ...POOLED, target: POOL, ready: POOL, warming: 0 });
    // Placement sees the members: they are in the host's allocation though no sandbox row exists.
    const host = (await http.get(`/api/v1/hosts/${stats.items[0].hostId}`).set(auth()).expect(200)).body;
    expect(host.allocated).toMatchObject({ sandboxes: POOL, memoryMiB: POOL * POOLED.memoryMiB });
    // An organisation's admin is no operator.
    expect((await http.get('/api/v1/warm-pool').set({ Authorization: `Bearer ${acme.key}` })).status).toBe(403);
    expect((await http.get('/api/v1/warm-pool?hostId=nope').set(auth())).status).toBe(404);
  });

  it('is invisible: no organisation lists or finds its members', async () => {
    const members = await readyIds();
    for (const key of [apiKey, acme.key]) {
      const listed = (await http.get('/api/v1/sandboxes?limit=100').set({ Authorization: `Bearer ${key}` }).expect(200)).body.items as { id: string }[];
      for (const id of members) {
        expect(listed.map((s) => s.id)).not.toContain(id);
        expect((await http.get(`/api/v1/sandboxes/${id}`).set({ Authorization: `Bearer ${key}` })).status).toBe(404);
        expect((await http.post(`/api/v1/sandboxes/${id}/commands`).set({ Authorization: `Bearer ${key}` }).send({ cmd: 'true' })).status).toBe(404);
      }
    }
    // Nor is any usage recorded for them (no organisation owns them).
    const usage = (await server.db('sandbox_usage').whereIn('sandbox_id', members).count<{ count: string }[]>('* as count'))[0];
    expect(Number(usage.count)).toBe(0);
  });

  it('answers a create of the pooled size with a member that is indistinguishable from a cold sandbox', async () => {
    await full();
    const members = await readyIds();
    const before = await pool();
    const env = { GREETING: 'hello', HOME: '/root' };
    const labels = { team: 'pool-test' };
    const claimed = await create({ ...POOLED, env, labels });
    expect(members).toContain(claimed.id);
    const after = await pool();
    expect(after.hits).toBe(before.hits + 1);
    expect(claimed).toMatchObject({ state: 'running', labels, ...POOLED });
    // The member is no member any more: gone from the pool's rows, a sandbox of the default organisation.
    expect(await server.db('warm_pool_sandboxes').where({ id: claimed.id }).first()).toBeUndefined();

    const cold = await create({ ...COLD, env, labels });
    expect(members).not.toContain(cold.id);
    expect((await pool()).misses).toBe(after.misses); // an unpooled size is no miss

    const a = await observed(claimed.id);
    const b = await observed(cold.id);
    expect(a).toEqual(b);
    expect(a.hostname.split('\n')[0]).toBe('<id>');
    expect(a.env).toContain('GREETING=hello');
    expect(a.env).toContain('HOSTNAME=<id>');
    // Uptime is the sandbox's own (LXCFS), not the host's, and no older than the member: the
    // one pool-era trace a user can read, bounded by NESTBOX_WARM_POOL_MAX_AGE_SECONDS.
    const row = (await server.db('sandboxes').where({ id: claimed.id }).first()) as { created_at: Date };
    const member = await run(claimed.id, 'cut -d" " -f1 /proc/uptime');
    const hostUptime = Number((await import('node:fs')).readFileSync('/proc/uptime', 'utf8').split(' ')[0]);
    expect(Number(member.stdout)).toBeLessThan(hostUptime);
    expect(row.created_at).toBeInstanceOf(Date);
    // The caller's environment is what every process starts with, the pool's left nothing.
    expect((await run(claimed.id, 'echo "$GREETING"')).stdout).toBe('hello\n');
    // Its events and its usage are its owner's from the claim on.
    const events = (await http.get(`/api/v1/sandboxes/${claimed.id}/events`).set(auth())).body;
    if (Array.isArray(events?.items)) expect(events.items.length).toBeGreaterThan(0);
    for (const id of [claimed.id, cold.id]) await http.delete(`/api/v1/sandboxes/${id}`).set(auth()).expect(204);
  });

  it('gives the caller egress policy to a claimed member', async () => {
    await full();
    const claimed = await create({ ...POOLED, egress: { mode: 'allow-list', allow: ['127.0.0.1/32'] } });
    expect((await readyIds())).not.toContain(claimed.id);
    const got = (await http.get(`/api/v1/sandboxes/${claimed.id}`).set(auth()).expect(200)).body;
    expect(got.egress).toMatchObject({ mode: 'allow-list' });
    // The host's record of it carries the caller's policy, not the pool's deny-all.
    const record = JSON.parse((await import('node:fs')).readFileSync(`${dataDir}/host/sandboxes/${claimed.id}/record.json`, 'utf8').toString()) as { spec: { egress?: { mode: string }; warm?: boolean } };
    expect(record.spec.egress?.mode).toBe('allow-list');
    expect(record.spec.warm).toBeUndefined();
    await http.delete(`/api/v1/sandboxes/${claimed.id}`).set(auth()).expect(204);
  });

  it('honours placement: a member on a host that satisfies it, none for a region no host is in', async () => {
    await full();
    const members = await readyIds();
    const placed = await create({ ...POOLED, placement: { region: 'local' } });
    expect(members).toContain(placed.id);
    await full();
    const before = await readyIds();
    const nowhere = await http.post('/api/v1/sandboxes').set(auth()).send({ ...POOLED, placement: { region: 'mars' } });
    expect(nowhere.status, JSON.stringify(nowhere.body)).toBe(400);
    expect(nowhere.body.error.message).toContain('placement.region');
    expect((await readyIds()).sort()).toEqual(before.sort());
    await http.delete(`/api/v1/sandboxes/${placed.id}`).set(auth()).expect(204);
  });

  it('never gives one member to two concurrent creates, and refills after claims', async () => {
    await full();
    const members = new Set(await readyIds());
    const before = await pool();
    const made = await Promise.all(Array.from({ length: POOL + 2 }, () => create(POOLED)));
    const ids = made.map((s) => s.id);
    expect(new Set(ids).size).toBe(ids.length);
    const fromPool = ids.filter((id) => members.has(id));
    const after = await pool();
    expect(after.hits - before.hits).toBe(fromPool.length);
    expect(after.hits + after.misses - before.hits - before.misses).toBe(ids.length);
    // Every member went to at most one create (ids are unique above) and none is still pooled.
    for (const id of fromPool) expect(await server.db('warm_pool_sandboxes').where({ id }).first()).toBeUndefined();
    for (const s of made) expect((await run(s.id, 'echo ok')).stdout).toBe('ok\n');
    // Refilled in the background with new members.
    await full();
    const refilled = await readyIds();
    for (const id of refilled) expect(ids).not.toContain(id);
    for (const id of ids) await http.delete(`/api/v1/sandboxes/${id}`).set(auth()).expect(204);
  });

  it('does not consume an organisation quota: an organisation of one sandbox gets one, from the pool', async () => {
    await full();
    const members = await readyIds();
    const mine = await create(POOLED, acme.key);
    expect(members).toContain(mine.id);
    expect((await http.get(`/api/v1/sandboxes/${mine.id}`).set(auth())).status).toBe(404); // acme's, not default's
    const second = await http.post('/api/v1/sandboxes').set({ Authorization: `Bearer ${acme.key}` }).send(POOLED);
    expect(second.status, JSON.stringify(second.body)).toBe(429);
    // The refused create claimed nothing: its transaction rolled back with the quota check.
    await full();
    await http.delete(`/api/v1/sandboxes/${mine.id}`).set({ Authorization: `Bearer ${acme.key}` }).expect(204);
  });

  it('keeps its members across a restart of the server and its host agent, and claims them after', async () => {
    await full();
    const members = (await readyIds()).sort();
    await server.close();
    await start();
    // The new host agent adopted them (still running, still warm) and the rows are unchanged.
    const client = await server.services.hosts.clientFor((await pool()).items[0].hostId);
    for (const id of members) expect(await client.getSandbox(id)).toMatchObject({ status: 'running', warm: true });
    expect((await readyIds()).sort()).toEqual(members);
    const claimed = await create({ ...POOLED, env: { AFTER: 'restart' } });
    expect(members).toContain(claimed.id);
    expect((await run(claimed.id, 'echo "$AFTER"')).stdout).toBe('restart\n');
    expect(await client.getSandbox(claimed.id)).toEqual({ id: claimed.id, status: 'running' });
    await http.delete(`/api/v1/sandboxes/${claimed.id}`).set(auth()).expect(204);
  });

  it('finishes a claim the control plane died in: the takeover hands the member its spec', async () => {
    await full();
    // A create that committed its claim and died before the host call: its row in creating,
    // owned by an instance that no longer heartbeats, the member still warm on its host.
    const [memberId] = await readyIds();
    const member = (await server.db('warm_pool_sandboxes').where({ id: memberId }).first()) as { host_id: string };
    const orgId = ((await server.db('organizations').whereNot({ id: acme.id }).first('id')) as { id: string }).id;
    await server.db.transaction(async (tx) => {
      await tx('warm_pool_sandboxes').where({ id: memberId }).delete();
      await sandboxRepository(tx).insertCreating({
        id: memberId,
        organizationId: orgId,
        hostId: member.host_id,
        image: 'default',
        ...POOLED,
        env: { TAKEN: 'over' },
        labels: {},
        timeoutSeconds: 0,
        operation: 'create',
        operationId: 'op0000000000000dead',
        operationOwner: 'dead-instance',
        egress: { mode: 'allow-all' },
      });
    });
    const done = await waitFor('the takeover', async () => {
      const s = (await http.get(`/api/v1/sandboxes/${memberId}`).set(auth())).body as { state: string };
      return s.state === 'running' || s.state === 'error' ? s : undefined;
    }, 60_000);
    expect(done.state).toBe('running');
    expect((await run(memberId, 'echo "$TAKEN"')).stdout).toBe('over\n');
    const client = await server.services.hosts.clientFor(member.host_id);
    expect(await client.getSandbox(memberId)).toEqual({ id: memberId, status: 'running' });
    await http.delete(`/api/v1/sandboxes/${memberId}`).set(auth()).expect(204);
  });

  it('empties on a cordoned host and fills again when it is uncordoned', async () => {
    await full();
    const hostId = (await pool()).items[0].hostId;
    const members = await readyIds();
    await http.post(`/api/v1/hosts/${hostId}/cordon`).set(auth()).expect(200);
    try {
      await waitFor('the pool of a cordoned host removed', async () => (await server.db('warm_pool_sandboxes').count<{ count: string }[]>('* as count'))[0].count === '0', 60_000);
      // Rows first (in one statement), then each member destroyed on its host.
      const client = await server.services.hosts.clientFor(hostId);
      for (const id of members) await waitFor(`member ${id} destroyed on its host`, async () => (await client.getSandbox(id)) === undefined, 60_000);
    } finally {
      await http.post(`/api/v1/hosts/${hostId}/uncordon`).set(auth()).expect(200);
    }
    await full();
  });

  it('counts hits and misses in the metrics', async () => {
    const text = (await http.get('/metrics').set({ Authorization: `Bearer ${METRICS_TOKEN}` }).expect(200)).text;
    expect(text).toMatch(/nestbox_warm_pool_claims_total\{result="hit"\} [1-9]/);
    expect(text).toMatch(/nestbox_warm_pool_sandboxes\{host="[^"]+",state="(ready|warming)",image="default"\}/);
  });
});
