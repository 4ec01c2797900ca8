// Hourly usage records and per-organisation limits in the store, on PostgreSQL and PGlite, with
// times chosen by the test: the rollup's figures from samples (by size), storage integrated from
// each row's watermark across an hour boundary, idempotence (the same pass twice, two at once),
// closing, the limits checked under the organisation's row lock, and the bootstrap-key migration.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, type Db } from '../store/db.js';
import { DB_BACKENDS } from '../store/test-support.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { hostRepository } from '../store/repositories/hosts.js';
import { sandboxUsageRepository } from '../store/repositories/sandbox-usage.js';
import { hourStartOf, UsageRecordService, USAGE_CLOSE_GRACE_MS } from './usage-records.js';
import { checkWithinLimits, NO_ORGANIZATION_LIMITS } from './org-limits.js';
import { migrationSource } from '../store/migrations/index.js';

const HOUR = 3600_000;

describe.each(DB_BACKENDS)('usage records and organisation limits (%s)', (_name, open) => {
  let db: Db;
  let cleanup: () => Promise<void>;
  let records: UsageRecordService;
  // An hour well in the past, so nothing the clock does interferes.
  const hour = hourStartOf(new Date(Date.UTC(2026, 0, 5, 10, 0, 0)));
  const at = (minutes: number) => new Date(hour.getTime() + minutes * 60_000);

  beforeAll(async () => {
    ({ db, cleanup } = await open());
    await migrateToLatest(db);
    for (const org of ['orga', 'orgb']) await organizationRepository(db).insert({ id: org, name: org });
    await hostRepository(db).upsertHeartbeat({ id: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
    for (const [id, org, cpu, memoryMiB] of [['sa', 'orga', 1, 256], ['sb', 'orga', 2, 1024], ['sc', 'orgb', 1, 256]] as const) {
      await sandboxRepository(db).insertCreating({ id, organizationId: org, hostId: 'h1', image: 'default', cpu, memoryMiB, env: {}, labels: {}, timeoutSeconds: 60, operationId: `op-${id}`, operationOwner: 'cp1', diskGiB: 4 });
    }
    const sample = (sandboxId: string, organizationId: string, minute: number, cpuUsedPct: number, cpuCount: number) => ({ sandboxId, organizationId, hostId: 'h1', at: at(minute), cpuUsedPct, cpuCount, memUsed: null, memCache: null, memTotal: null, diskUsed: null, diskTotal: null, netRx: null, netTx: null });
    // 10 samples of sa at 50 % of 1 vCPU, 5 of sb at 100 % of 2, one of orgb's sc, one in the next hour.
    await sandboxUsageRepository(db).insert([
      ...Array.from({ length: 10 }, (_, i) => sample('sa', 'orga', i, 50, 1)),
      ...Array.from({ length: 5 }, (_, i) => sample('sb', 'orga', 20 + i, 100, 2)),
      sample('sc', 'orgb', 30, 10, 1),
      sample('sa', 'orga', 61, 50, 1),
    ]);
    records = new UsageRecordService(db, { sampleSeconds: 5 });
  });
  afterAll(async () => cleanup());

  const row = async (org: string, start: Date) => db('usage_records').where({ organization_id: org, hour_start: start }).first();

  it('sums samples by size, integrates storage from the watermark, and a second pass adds nothing', async () => {
    // A first pass a quarter into the hour: the hour's row, storage from the hour's start.
    await records.rollup(at(15));
    await Promise.all([records.rollup(at(30)), records.rollup(at(30))]);
    await records.rollup(at(30));
    const r = await row('orga', hour);
    expect(Number(r.sandbox_seconds)).toBe(15 * 5);
    expect(typeof r.by_size === 'string' ? JSON.parse(r.by_size) : r.by_size).toEqual([
      { cpu: 1, memoryMiB: 256, sandboxSeconds: 50, cpuSeconds: 25 },
      { cpu: 2, memoryMiB: 1024, sandboxSeconds: 25, cpuSeconds: 50 },
    ]);
    expect(Number(r.cpu_seconds)).toBe(75);
    // Two sandboxes of 4 GiB for half an hour, whatever the number of passes.
    expect(Number(r.storage_gib_hours)).toBeCloseTo(4, 9);
    expect(r.closed_at).toBeNull();
    const b = await row('orgb', hour);
    expect(Number(b.sandbox_seconds)).toBe(5);
    expect(Number(b.storage_gib_hours)).toBeCloseTo(2, 9);
  });

  it('finishes the hour at its end, starts the next from there, and closes after the grace', async () => {
    await records.rollup(new Date(hour.getTime() + HOUR + 60_000));
    const done = await row('orga', hour);
    expect(Number(done.storage_gib_hours)).toBeCloseTo(8, 9);
    expect(done.closed_at).toBeNull();
    const next = await row('orga', new Date(hour.getTime() + HOUR));
    expect(Number(next.storage_gib_hours)).toBeCloseTo(8 / 60, 9);
    expect(Number(next.sandbox_seconds)).toBe(5);

    const closing = new Date(hour.getTime() + HOUR + USAGE_CLOSE_GRACE_MS);
    await records.rollup(closing);
    expect((await row('orga', hour)).closed_at).not.toBeNull();
    // Closed rows never change, even when their samples are gone.
    await db('sandbox_usage').where('sampled_at', '<', at(60)).delete();
    await records.rollup(new Date(closing.getTime() + 60_000));
    const final = await row('orga', hour);
    expect(Number(final.sandbox_seconds)).toBe(75);
    expect(Number(final.storage_gib_hours)).toBeCloseTo(8, 9);
    const listed = await records.range('orga', { from: hour.toISOString(), to: new Date(hour.getTime() + 2 * HOUR).toISOString() });
    expect(listed.items.map((i) => [i.hourStart.toISOString(), i.closed])).toEqual([[hour.toISOString(), true], [new Date(hour.getTime() + HOUR).toISOString(), false]]);
  });

  it('checks limits under the organisation row lock: the server default, the organisation\'s own, what is not asked', async () => {
    const defaults = { ...NO_ORGANIZATION_LIMITS, maxSandboxes: 5, maxDiskGiB: 10 };
    // orga holds 2 sandboxes (creating counts) and 8 GiB of disk.
    await db.transaction((tx) => checkWithinLimits(tx, 'orga', { sandboxes: 3, diskGiB: 2 }, defaults));
    await expect(db.transaction((tx) => checkWithinLimits(tx, 'orga', { sandboxes: 1, diskGiB: 3 }, defaults))).rejects.toMatchObject({ code: 'quota_exceeded', details: { limit: 'diskGiB', max: 10, current: 8, requested: 3 } });
    await organizationRepository(db).update('orga', { limits: { maxSandboxes: 2 } });
    await expect(db.transaction((tx) => checkWithinLimits(tx, 'orga', { sandboxes: 1 }, defaults))).rejects.toMatchObject({ details: { limit: 'sandboxes', max: 2, current: 2 } });
    // A resume of one of them (excluded from what is held) fits; asking for nothing always does.
    await db.transaction((tx) => checkWithinLimits(tx, 'orga', { sandboxes: 1 }, defaults, 'sa'));
    await db.transaction((tx) => checkWithinLimits(tx, 'orga', { snapshots: 0 }, { ...defaults, maxSnapshots: 0 }));
    await organizationRepository(db).update('orga', { limits: { maxSandboxes: null } });
    expect((await organizationRepository(db).findById('orga'))!.limits.maxSandboxes).toBeNull();
  });

  it("the migration makes the default organisation's admin bootstrap key an operator key, and down undoes it", async () => {
    await organizationRepository(db).insert({ id: 'orgdefault', name: 'default' });
    const key = (id: string, organizationId: string) => ({ id, organization_id: organizationId, name: 'bootstrap', key_prefix: 'nbx_', key_hash: id, scopes: JSON.stringify(['sandboxes:read']), preset: 'admin' });
    await db('api_keys').insert([key('keyd', 'orgdefault'), key('keya', 'orga')]);
    const presets = async () => Object.fromEntries(((await db('api_keys').select('id', 'preset')) as { id: string; preset: string }[]).map((k) => [k.id, k.preset]));
    const name = '20261204100000_organizations';
    await db.migrate.down({ migrationSource, name });
    await db.migrate.up({ migrationSource, name });
    expect(await presets()).toEqual({ keyd: 'operator', keya: 'admin' });
    const scopes = (await db('api_keys').where({ id: 'keyd' }).first()).scopes;
    expect(typeof scopes === 'string' ? JSON.parse(scopes) : scopes).toContain('platform:organizations');
    await db.migrate.down({ migrationSource, name });
    expect(await presets()).toEqual({ keyd: 'admin', keya: 'admin' });
    await migrateToLatest(db);
  });
});
