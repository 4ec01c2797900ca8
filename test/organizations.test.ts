// Organisations as tenants (issue 16), end to end on a real server, PostgreSQL and the local
// driver: the operator's admin API and its 403 for everyone else, isolation between two
// organisations, per-organisation limits hit in the native and compat shapes, suspension on
// every front door (native, Daytona, E2B control plane and envd, hosted ports) with its
// sandboxes stopped and resumable after, hourly usage records, and the `nestbox orgs` CLI.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { projectPath } from '../src/paths.js';
import { hourStartOf } from '../core/services/usage-records.js';

const CLI = projectPath('dist/src/cli.js');
let t: TestServer;
let work: string;

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'nestbox-orgs-'));
  t = await startTestServer({
    env: {
      NESTBOX_QUOTA_RETRY_AFTER_SECONDS: '7',
      NESTBOX_DEFAULT_DISK_GIB: '1',
      // Usage samples every second, so a sandbox that ran a few seconds has some.
      NESTBOX_USAGE_SAMPLE_SECONDS: '1',
    },
  });
}, 180_000);
afterAll(async () => {
  await t?.close();
  if (work) rmSync(work, { recursive: true, force: true });
}, 180_000);

const bearer = (key: string) => ({ Authorization: `Bearer ${key}` });
const small = { cpu: 1, memoryMiB: 256, egress: { mode: 'deny-all' } };

interface Run { code: number; stdout: string; stderr: string }
function cli(args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, XDG_CONFIG_HOME: join(work, 'config'), NESTBOX_DATA_DIR: join(work, 'data'), NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey };
    execFile(process.execPath, [CLI, ...args], { env, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

// State shared by the cases, which run in order (one organisation's story).
let acme: { id: string; key: string };
let mine: { sandbox: string; snapshot: string };
let acmeSandboxes: string[] = [];

describe('the organisations admin API', () => {
  it('creates an organisation with limits, refuses a taken or bad name, lists and gets it, and mints its admin key', async () => {
    const created = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'acme', limits: { maxSandboxes: 2, maxCpu: 2, maxSnapshots: 1, maxImages: 0 } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toMatchObject({ name: 'acme', suspended: false, suspendedAt: null, limits: { maxSandboxes: 2, maxCpu: 2, maxSnapshots: 1, maxImages: 0, maxMemoryMiB: 131072 }, customLimits: { maxSandboxes: 2, maxMemoryMiB: null } });
    const id = created.body.id as string;

    const taken = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'acme' });
    expect(taken.status).toBe(409);
    expect(taken.body.error).toMatchObject({ code: 'conflict', details: { field: 'name' } });
    const bad = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: '-x' });
    expect(bad.status).toBe(400);
    expect(bad.body.error.details.field).toBe('name');
    const badLimit = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'x', limits: { maxCpu: -1 } });
    expect(badLimit.status).toBe(400);
    expect(badLimit.body.error.message).toMatch(/maxCpu/);

    const list = await t.http.get('/api/v1/organizations').set(t.auth);
    expect(list.status).toBe(200);
    expect((list.body.items as { name: string }[]).map((o) => o.name)).toEqual(['default', 'acme']);
    expect((await t.http.get(`/api/v1/organizations/${id}`).set(t.auth)).body.name).toBe('acme');
    expect((await t.http.get('/api/v1/organizations/org0000000000000000').set(t.auth)).status).toBe(404);

    const key = await t.http.post(`/api/v1/organizations/${id}/api-keys`).set(t.auth).send({});
    expect(key.status, JSON.stringify(key.body)).toBe(201);
    expect(key.body).toMatchObject({ name: 'admin', preset: 'admin' });
    expect(key.body.key).toMatch(/^nbx_/);
    acme = { id, key: key.body.key };
  });

  it('answers 403 to a key that is not an operator, and only an operator mints operator keys', async () => {
    const a = bearer(acme.key);
    for (const res of [
      await t.http.get('/api/v1/organizations').set(a),
      await t.http.post('/api/v1/organizations').set(a).send({ name: 'evil' }),
      await t.http.get(`/api/v1/organizations/${acme.id}`).set(a),
      await t.http.patch(`/api/v1/organizations/${acme.id}`).set(a).send({ limits: { maxSandboxes: 100 } }),
      await t.http.post(`/api/v1/organizations/${acme.id}/api-keys`).set(a).send({ preset: 'admin' }),
      await t.http.get(`/api/v1/organizations/${acme.id}/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z`).set(a),
    ]) {
      expect(res.status, JSON.stringify(res.body)).toBe(403);
      expect(res.body.error.code).toBe('forbidden');
    }
    const operatorKey = await t.http.post('/api/v1/api-keys').set(a).send({ name: 'op', preset: 'operator' });
    expect(operatorKey.status).toBe(403);
    expect(operatorKey.body.error.message).toMatch(/operator/);
    const viaAdmin = await t.http.post(`/api/v1/organizations/${acme.id}/api-keys`).set(t.auth).send({ preset: 'operator', name: 'second-operator' });
    expect(viaAdmin.status).toBe(201);
    const mintedByOperator = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'op2', preset: 'operator' });
    expect(mintedByOperator.status, JSON.stringify(mintedByOperator.body)).toBe(201);
    expect(mintedByOperator.body.scopes).toContain('platform:organizations');
    // The bootstrap key is the operator's (the migration turns an older `admin` one into it).
    const bootstrap = (await t.http.get('/api/v1/api-keys').set(t.auth)).body.items.find((k: { name: string }) => k.name === 'bootstrap');
    expect(bootstrap.preset).toBe('operator');
    // Keys of acme are not listed to the default organisation, and the other way round.
    const acmeKeys = (await t.http.get('/api/v1/api-keys').set(a)).body.items as { name: string }[];
    expect(acmeKeys.map((k) => k.name).sort()).toEqual(['admin', 'second-operator']);
    expect(((await t.http.get('/api/v1/api-keys').set(t.auth)).body.items as { name: string }[]).map((k) => k.name)).not.toContain('admin');
  });
});

describe('isolation between organisations', () => {
  it("an organisation sees none of another's sandboxes, snapshots or keys", async () => {
    const sandbox = await t.http.post('/api/v1/sandboxes').set(t.auth).send(small);
    expect(sandbox.status, JSON.stringify(sandbox.body)).toBe(201);
    const snapshot = await t.http.post('/api/v1/snapshots').set(t.auth).send({ sandboxId: sandbox.body.id, name: 'operators-snap' });
    expect(snapshot.status, JSON.stringify(snapshot.body)).toBe(201);
    mine = { sandbox: sandbox.body.id, snapshot: 'operators-snap' };

    const a = bearer(acme.key);
    const theirs = await t.http.post('/api/v1/sandboxes').set(a).send(small);
    expect(theirs.status, JSON.stringify(theirs.body)).toBe(201);
    acmeSandboxes.push(theirs.body.id);

    expect((await t.http.get('/api/v1/sandboxes').set(a)).body.items.map((s: { id: string }) => s.id)).toEqual([theirs.body.id]);
    expect((await t.http.get(`/api/v1/sandboxes/${mine.sandbox}`).set(a)).status).toBe(404);
    expect((await t.http.post(`/api/v1/sandboxes/${mine.sandbox}/commands`).set(a).send({ cmd: 'true' })).status).toBe(404);
    expect((await t.http.get('/api/v1/snapshots').set(a)).body.items).toEqual([]);
    expect((await t.http.get(`/api/v1/snapshots/${mine.snapshot}`).set(a)).status).toBe(404);
    // Another organisation's snapshot is answered exactly like one that does not exist.
    const fromTheirs = await t.http.post('/api/v1/sandboxes').set(a).send({ ...small, snapshot: mine.snapshot });
    const fromNothing = await t.http.post('/api/v1/sandboxes').set(a).send({ ...small, snapshot: 'no-such-snapshot' });
    expect(fromTheirs.status).toBe(fromNothing.status);
    expect(fromTheirs.body.error.code).toBe(fromNothing.body.error.code);
    expect(fromTheirs.body.error.message.replace(mine.snapshot, 'X')).toBe(fromNothing.body.error.message.replace('no-such-snapshot', 'X'));
    const images = (await t.http.get('/api/v1/images').set(a)).body.items as { source?: { kind?: string } }[];
    expect(images.filter((i) => i.source?.kind !== 'builtin')).toEqual([]);
    // And the other way round.
    expect((await t.http.get(`/api/v1/sandboxes/${theirs.body.id}`).set(t.auth)).status).toBe(404);
    expect((await t.http.get('/api/v1/sandboxes').set(t.auth)).body.items.map((s: { id: string }) => s.id)).toEqual([mine.sandbox]);
    // Compat layers see the same walls.
    expect((await t.http.get(`/e2b/sandboxes/${mine.sandbox}`).set('X-API-Key', acme.key)).status).toBe(404);
    expect((await t.http.get(`/daytona/api/sandbox/${mine.sandbox}`).set(a)).status).toBe(404);
  }, 120_000);
});

describe('per-organisation limits', () => {
  it('are read by the organisation itself with what it holds against them', async () => {
    const own = await t.http.get('/api/v1/organization').set(bearer(acme.key));
    expect(own.status, JSON.stringify(own.body)).toBe(200);
    expect(own.body).toMatchObject({ id: acme.id, limits: { maxSandboxes: 2, maxCpu: 2 }, usage: { sandboxes: 1, cpu: 1, memoryMiB: 256, diskGiB: 1, snapshots: 0, images: 0 } });
  });

  it('sandboxes, vCPUs, disk, snapshots and images: 429 quota_exceeded with Retry-After, natively and in the Daytona and E2B shapes', async () => {
    const a = bearer(acme.key);
    const second = await t.http.post('/api/v1/sandboxes').set(a).send(small);
    expect(second.status, JSON.stringify(second.body)).toBe(201);
    acmeSandboxes.push(second.body.id);

    const third = await t.http.post('/api/v1/sandboxes').set(a).send(small);
    expect(third.status).toBe(429);
    expect(third.headers['retry-after']).toBe('7');
    expect(third.body.error).toMatchObject({ code: 'quota_exceeded', details: { limit: 'sandboxes', max: 2, current: 2, requested: 1 } });
    expect(third.body.error.message).toMatch(/organisation's maxSandboxes/);

    const daytona = await t.http.post('/daytona/api/sandbox').set(a).send({});
    expect(daytona.status).toBe(429);
    expect(daytona.headers['retry-after']).toBe('7');
    expect(daytona.body).toMatchObject({ statusCode: 429, code: 'quota_exceeded' });
    const e2b = await t.http.post('/e2b/sandboxes').set('X-API-Key', acme.key).send({ templateID: 'base' });
    expect(e2b.status).toBe(429);
    expect(e2b.headers['retry-after']).toBe('7');
    expect(e2b.body).toMatchObject({ code: 429, message: expect.stringMatching(/organisation limit reached/) });

    // More sandboxes allowed, but the vCPUs are all used.
    expect((await t.http.patch(`/api/v1/organizations/${acme.id}`).set(t.auth).send({ limits: { maxSandboxes: 5 } })).status).toBe(200);
    const cpu = await t.http.post('/api/v1/sandboxes').set(a).send(small);
    expect(cpu.status).toBe(429);
    expect(cpu.body.error.details).toMatchObject({ limit: 'cpu', max: 2, current: 2 });

    // Disk counts every sandbox that exists (2 × 1 GiB here).
    expect((await t.http.patch(`/api/v1/organizations/${acme.id}`).set(t.auth).send({ limits: { maxCpu: 10, maxDiskGiB: 2 } })).status).toBe(200);
    const disk = await t.http.post('/api/v1/sandboxes').set(a).send(small);
    expect(disk.status).toBe(429);
    expect(disk.body.error.details).toMatchObject({ limit: 'diskGiB', max: 2, current: 2, requested: 1 });

    const snap = await t.http.post('/api/v1/snapshots').set(a).send({ sandboxId: acmeSandboxes[0], name: 's1' });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    const snap2 = await t.http.post('/api/v1/snapshots').set(a).send({ sandboxId: acmeSandboxes[0], name: 's2' });
    expect(snap2.status).toBe(429);
    expect(snap2.body.error.details).toMatchObject({ limit: 'snapshots', max: 1, current: 1 });

    // No images at all: a pull is refused before anything is fetched.
    const pull = await t.http.post('/api/v1/images').set(a).send({ reference: 'docker.io/library/alpine:3.20' });
    expect(pull.status, JSON.stringify(pull.body)).toBe(429);
    expect(pull.body.error.details).toMatchObject({ limit: 'images', max: 0, current: 0 });

    // A limit below what is held is allowed: it only refuses new work.
    const lowered = await t.http.patch(`/api/v1/organizations/${acme.id}`).set(t.auth).send({ limits: { maxSandboxes: 1, maxDiskGiB: null } });
    expect(lowered.status).toBe(200);
    expect(lowered.body.customLimits).toMatchObject({ maxSandboxes: 1, maxDiskGiB: null });
    expect(lowered.body.limits.maxDiskGiB).toBe(2048);
    const own = await t.http.get('/api/v1/organization').set(a);
    expect(own.body.usage).toMatchObject({ sandboxes: 2, snapshots: 1 });
    expect((await t.http.post('/api/v1/sandboxes').set(a).send(small)).status).toBe(429);
    // The default organisation has the server's defaults and is not affected.
    expect((await t.http.get('/api/v1/organization').set(t.auth)).body.limits.maxSandboxes).toBe(50);

    // Back to one sandbox (the second goes), limits the rest of the file can live with.
    expect((await t.http.delete(`/api/v1/sandboxes/${acmeSandboxes[1]}`).set(a)).status).toBe(204);
    acmeSandboxes = [acmeSandboxes[0]];
    expect((await t.http.patch(`/api/v1/organizations/${acme.id}`).set(t.auth).send({ limits: { maxSandboxes: 5 } })).status).toBe(200);
  }, 180_000);
});

describe('suspension', () => {
  it('refuses every key and credential of the organisation in each API\'s shape, stops its sandboxes, and unsuspending lets them resume', async () => {
    const a = bearer(acme.key);
    const id = acmeSandboxes[0];
    // Before: a hosted port and an E2B envd token, which must stop working too.
    expect((await t.http.post(`/api/v1/sandboxes/${id}/ports`).set(a).send({ port: 8080, public: true })).status).toBe(201);
    const envdToken = (await t.http.get(`/e2b/sandboxes/${id}`).set('X-API-Key', acme.key)).body.envdAccessToken as string;
    expect(envdToken).toMatch(/^nbxe_/);
    const envdBefore = await t.http.get('/files?path=%2Fetc%2Fhostname').set({ 'e2b-sandbox-id': id, 'x-access-token': envdToken });
    expect(envdBefore.status, envdBefore.text).toBe(200);
    // Usage samples of it exist before it stops (the usage case below reads them).
    await waitFor('usage samples of the sandbox', async () => Number((await t.server.db('sandbox_usage').where({ sandbox_id: id }).count('* as n'))[0].n) >= 3, 30_000);
    // The port proxy caches an organisation's state and a running sandbox's row for a second:
    // a request now fills both (nothing listens there: 502 from the sandbox's side, past every
    // check), and the refusal below must still come at once after the suspension.
    const warm = await t.http.get(`/p/${id}/8080/`).set('accept', 'application/json');
    expect(warm.status, warm.text).toBe(502);
    expect(JSON.parse(warm.text).error.code).toBe('port_not_listening');

    const suspended = await t.http.patch(`/api/v1/organizations/${acme.id}`).set(t.auth).send({ suspended: true });
    expect(suspended.status, JSON.stringify(suspended.body)).toBe(200);
    expect(suspended.body.suspended).toBe(true);
    // Stopped before the answer, disk kept.
    const row = await t.server.db('sandboxes').where({ id }).first();
    expect(row).toMatchObject({ state: 'stopped', stop_reason: 'suspended' });

    const native = await t.http.get('/api/v1/sandboxes').set(a);
    expect(native.status).toBe(403);
    expect(native.body.error).toMatchObject({ code: 'organization_suspended' });
    expect((await t.http.get('/api/v1/organization').set(a)).body.error.code).toBe('organization_suspended');
    const daytona = await t.http.get('/daytona/api/sandbox').set(a);
    expect(daytona.status).toBe(403);
    expect(daytona.body).toMatchObject({ statusCode: 403, code: 'organization_suspended' });
    const e2b = await t.http.get('/e2b/sandboxes').set('X-API-Key', acme.key);
    expect(e2b.status).toBe(403);
    expect(e2b.body).toEqual({ code: 403, message: expect.stringMatching(/suspended/) });
    const envd = await t.http.get('/files?path=%2Fetc%2Fhostname').set({ 'e2b-sandbox-id': id, 'x-access-token': envdToken });
    expect(envd.status, envd.text).toBe(403);
    expect(envd.body).toMatchObject({ code: 403, message: expect.stringMatching(/suspended/) });
    const port = await t.http.get(`/p/${id}/8080/`).set('accept', 'application/json');
    expect(port.status, port.text).toBe(403);
    expect(JSON.parse(port.text).error.code).toBe('organization_suspended');
    // The operator still works, and cannot suspend its own organisation.
    const defaultOrg = (await t.http.get('/api/v1/organization').set(t.auth)).body.id as string;
    const self = await t.http.patch(`/api/v1/organizations/${defaultOrg}`).set(t.auth).send({ suspended: true });
    expect(self.status).toBe(409);
    expect(self.body.error.details.field).toBe('suspended');

    const lifted = await t.http.patch(`/api/v1/organizations/${acme.id}`).set(t.auth).send({ suspended: false });
    expect(lifted.body).toMatchObject({ suspended: false, suspendedAt: null });
    const resumed = await t.http.post(`/api/v1/sandboxes/${id}/resume`).set(a);
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body.state).toBe('running');
    expect((await t.http.get('/e2b/sandboxes').set('X-API-Key', acme.key)).status).toBe(200);
  }, 180_000);
});

describe('usage records', () => {
  it('the rollup makes hourly rows for a sandbox that ran, idempotently on two replicas at once, and the range query returns them', async () => {
    const now = new Date();
    const hour = hourStartOf(now);
    // Two passes at the same moment (two replicas): the second adds no storage time. The
    // sandbox still runs, so a sample may arrive between passes: sandbox-seconds only grow.
    await Promise.all([t.server.services.usageRecords.rollup(now), t.server.services.usageRecords.rollup(now)]);
    const first = await t.server.db('usage_records').where({ organization_id: acme.id }).select();
    await t.server.services.usageRecords.rollup(now);
    const again = await t.server.db('usage_records').where({ organization_id: acme.id }).select();
    expect(again).toHaveLength(1);
    expect(Number(again[0].storage_gib_hours)).toBe(Number(first[0].storage_gib_hours));
    expect(Number(again[0].sandbox_seconds)).toBeGreaterThanOrEqual(Number(first[0].sandbox_seconds));

    const from = hour.toISOString();
    const to = new Date(hour.getTime() + 3600_000).toISOString();
    const res = await t.http.get(`/api/v1/organizations/${acme.id}/usage?from=${from}&to=${to}`).set(t.auth);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.items).toHaveLength(1);
    const record = res.body.items[0];
    expect(record).toMatchObject({ organizationId: acme.id, hourStart: from, closed: false });
    expect(record.sandboxSeconds).toBeGreaterThanOrEqual(3);
    expect(record.bySize).toEqual([expect.objectContaining({ cpu: 1, memoryMiB: 256 })]);
    expect(record.cpuSeconds).toBeGreaterThanOrEqual(0);
    expect(record.storageGiBHours).toBeGreaterThan(0);
    // The organisation reads its own, the same rows; the default organisation's are its own.
    const own = await t.http.get(`/api/v1/organization/usage?from=${from}&to=${to}`).set(bearer(acme.key));
    expect(own.body.items).toEqual(res.body.items);
    const operators = await t.http.get(`/api/v1/organization/usage?from=${from}&to=${to}`).set(t.auth);
    expect(operators.body.items.map((r: { organizationId: string }) => r.organizationId)).not.toContain(acme.id);

    // An hour is closed once it is over by the grace, and never changes again.
    const later = new Date(hour.getTime() + 3600_000 + 6 * 60_000);
    await t.server.services.usageRecords.rollup(later);
    const closed = await t.server.db('usage_records').where({ organization_id: acme.id, hour_start: hour }).first();
    expect(closed.closed_at).not.toBeNull();
    await t.server.services.usageRecords.rollup(new Date(later.getTime() + 60_000));
    const still = await t.server.db('usage_records').where({ organization_id: acme.id, hour_start: hour }).first();
    expect(Number(still.storage_gib_hours)).toBe(Number(closed.storage_gib_hours));
  }, 60_000);

  it('validates the range: 400 naming the field', async () => {
    const base = `/api/v1/organization/usage`;
    const cases: [string, string][] = [
      ['?to=2026-12-04T11:00:00Z', 'from'],
      ['?from=yesterday&to=2026-12-04T11:00:00Z', 'from'],
      ['?from=2026-12-04T10:00:00Z&to=2026-13-40T00:00:00Z', 'to'],
      ['?from=2026-12-04T10:00:00Z&to=2026-12-04T09:00:00Z', 'to'],
      ['?from=2024-01-01T00:00:00Z&to=2026-12-04T09:00:00Z', 'to'],
    ];
    for (const [query, field] of cases) {
      const res = await t.http.get(base + query).set(t.auth);
      expect(res.status, `${query}: ${JSON.stringify(res.body)}`).toBe(400);
      expect(res.body.error.code).toBe('validation_failed');
      expect(res.body.error.message.startsWith(`${field}:`) || res.body.error.details?.field === field, `${query}: ${res.body.error.message}`).toBe(true);
    }
  });
});

describe('nestbox orgs', () => {
  it('create, ls, get, limits, keys create, suspend, unsuspend, usage', async () => {
    const created = await cli(['orgs', 'create', 'beta', '--max-sandboxes', '3', '--max-images', '0']);
    expect(created.code, created.stderr).toBe(0);
    const id = created.stdout.trim();
    expect(id).toMatch(/^org[a-z0-9]{16}$/);

    const [ls, lsJson, got] = await Promise.all([cli(['orgs', 'ls']), cli(['--json', 'orgs', 'ls']), cli(['orgs', 'get', id])]);
    expect(ls.code, ls.stderr).toBe(0);
    expect(ls.stdout).toMatch(/beta/);
    expect((JSON.parse(lsJson.stdout) as { name: string }[]).map((o) => o.name)).toContain('beta');
    expect(got.stdout).toMatch(/maxSandboxes\s+3\s+own/);
    expect(got.stdout).toMatch(/maxCpu\s+64\s+default/);

    // Independent commands, run at once to keep the file short.
    const [limits, badLimit, key] = await Promise.all([
      cli(['--json', 'orgs', 'limits', id, '--max-cpu', '4', '--max-sandboxes', 'default']),
      cli(['orgs', 'limits', id, '--max-cpu', 'lots']),
      cli(['orgs', 'keys', 'create', id]),
    ]);
    expect(limits.code, limits.stderr).toBe(0);
    expect(JSON.parse(limits.stdout)).toMatchObject({ limits: { maxCpu: 4, maxSandboxes: 50 }, customLimits: { maxCpu: 4, maxSandboxes: null } });
    expect(badLimit.code).not.toBe(0);
    expect(badLimit.stderr).toMatch(/--max-cpu/);
    expect(key.code, key.stderr).toBe(0);
    const betaKey = key.stdout.trim();
    expect(betaKey).toMatch(/^nbx_/);
    const asBeta = await t.http.get('/api/v1/organization').set(bearer(betaKey));
    expect(asBeta.body).toMatchObject({ id, name: 'beta' });

    expect((await cli(['orgs', 'suspend', id])).stdout).toMatch(/suspended/);
    expect((await t.http.get('/api/v1/organization').set(bearer(betaKey))).status).toBe(403);
    expect((await cli(['orgs', 'unsuspend', id])).stdout).toMatch(/active/);
    expect((await t.http.get('/api/v1/organization').set(bearer(betaKey))).status).toBe(200);

    const hour = hourStartOf(new Date());
    await t.server.services.usageRecords.rollup();
    const range = ['--from', hour.toISOString(), '--to', new Date(hour.getTime() + 3600_000).toISOString()];
    const [usage, badRange, forbidden] = await Promise.all([
      cli(['--json', 'orgs', 'usage', acme.id, ...range]),
      cli(['orgs', 'usage', acme.id, '--from', 'soon', '--to', 'later']),
      // A key that is not an operator's is told so in one line.
      new Promise<Run>((resolve) => {
        execFile(process.execPath, [CLI, 'orgs', 'ls'], { env: { PATH: process.env.PATH ?? '', HOME: work, XDG_CONFIG_HOME: join(work, 'config'), NESTBOX_URL: t.url, NESTBOX_API_KEY: betaKey }, timeout: 60_000 }, (error, stdout, stderr) => resolve({ code: error ? 1 : 0, stdout, stderr }));
      }),
    ]);
    expect(usage.code, usage.stderr).toBe(0);
    expect((JSON.parse(usage.stdout) as { organizationId: string }[])[0].organizationId).toBe(acme.id);
    expect(badRange.code).not.toBe(0);
    expect(badRange.stderr).toMatch(/from/);
    expect(forbidden.code).not.toBe(0);
    expect(forbidden.stderr.trim().split('\n')).toHaveLength(1);
    expect(forbidden.stderr).toMatch(/platform:organizations/);
  }, 120_000);
});
