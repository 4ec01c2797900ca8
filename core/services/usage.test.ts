// Usage samples in the store: only a sandbox's own host may write them, reads are scoped to the
// organisation, ranges are downsampled, and the retention pass removes expired samples (those of
// deleted sandboxes too) and each sandbox's beyond its cap. PostgreSQL and PGlite both.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, type Db } from '../store/db.js';
import { DB_BACKENDS } from '../store/test-support.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { hostRepository } from '../store/repositories/hosts.js';
import { NestboxError } from '../errors.js';
import type { Principal, Sandbox } from '../types.js';
import type { UsageSample } from '../../host/protocol/schemas.js';
import { downsample, UsageService } from './usage.js';

const principal = (organizationId: string): Principal => ({ organizationId, keyId: 'k', scopes: new Set(['sandboxes:read']), sandboxIds: null });

describe.each(DB_BACKENDS)('UsageService (%s)', (_name, open) => {
  let db: Db;
  let cleanup: () => Promise<void>;
  let usage: UsageService;
  beforeAll(async () => {
    ({ db, cleanup } = await open());
    await migrateToLatest(db);
    for (const org of ['orga', 'orgb']) await organizationRepository(db).insert({ id: org, name: org });
    for (const host of ['h1', 'h2']) await hostRepository(db).upsertHeartbeat({ id: host, url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
    for (const [id, org, host] of [['sa', 'orga', 'h1'], ['sb', 'orgb', 'h1'], ['sc', 'orga', 'h2']]) {
      await sandboxRepository(db).insertCreating({ id, organizationId: org, hostId: host, image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, operationId: `op-${id}`, operationOwner: 'cp1', diskGiB: 10 });
    }
    // The real lookup of sandbox rows, organisation-scoped as SandboxService.get is.
    const sandboxes = {
      get: async (p: Principal, id: string): Promise<Sandbox> => {
        const found = await sandboxRepository(db).findById(id);
        if (!found || found.organizationId !== p.organizationId) throw new NestboxError('not_found', `sandbox ${id} not found`);
        return found;
      },
    };
    usage = new UsageService(db, sandboxes, { retentionHours: 1, maxSamplesPerSandbox: 5 });
  });
  afterAll(async () => cleanup());

  const sample = (sandboxId: string, at: Date, extra: Partial<UsageSample> = {}): UsageSample => ({ sandboxId, at: at.toISOString(), cpuCount: 1, cpuUsedPct: 10, memUsed: 100, memTotal: 1000, ...extra });

  it('stores samples of the reporting host\'s sandboxes only, each once, and reads them per organisation', async () => {
    const t = new Date(Date.now() - 10_000);
    const written = await usage.record('h1', [sample('sa', t), sample('sb', t), sample('sc', t), sample('nope', t)]);
    expect(written).toBe(2); // sc lives on h2, nope nowhere
    await usage.record('h1', [sample('sa', t, { cpuUsedPct: 99 })]); // a retried heartbeat: kept as first stored
    const latest = await usage.latest(principal('orga'), 'sa');
    expect(latest.point).toMatchObject({ cpuUsedPct: 10, memUsed: 100, memCache: null, diskUsed: null, cpuCount: 1 });
    expect((await usage.latest(principal('orga'), 'sc')).point).toBeNull();
    await expect(usage.latest(principal('orga'), 'sb')).rejects.toMatchObject({ code: 'not_found' });
    expect([...(await usage.latestMany(principal('orga'), ['sa', 'sb', 'sc'])).keys()]).toEqual(['sa']);
  });

  it('answers a range oldest first, downsampled to maxPoints, and refuses start after end', async () => {
    const base = Date.now() - 60_000;
    await usage.record('h1', [1, 2, 3, 4].map((i) => sample('sa', new Date(base + i * 1000), { cpuUsedPct: i * 10 })));
    const all = await usage.range(principal('orga'), 'sa', { start: new Date(base), end: new Date(), maxPoints: 100 });
    expect(all.points.map((p) => p.cpuUsedPct)).toEqual([10, 20, 30, 40, 10]);
    const two = await usage.range(principal('orga'), 'sa', { start: new Date(base), end: new Date(base + 4500), maxPoints: 2 });
    expect(two.points.map((p) => p.cpuUsedPct)).toEqual([15, 35]);
    expect(two.points[1].at.getTime()).toBe(base + 4000);
    await expect(usage.range(principal('orga'), 'sa', { start: new Date(), end: new Date(base), maxPoints: 10 })).rejects.toMatchObject({ code: 'validation_failed' });
  });

  it('removes samples past the retention (deleted sandboxes\' too) and keeps at most the cap per sandbox', async () => {
    const old = new Date(Date.now() - 2 * 3600_000);
    await usage.record('h1', [sample('sb', old)]);
    await sandboxRepository(db).transition('sb', ['creating'], { state: 'deleted', deletedAt: new Date(), operation: null, operationId: null, operationOwner: null, operationStartedAt: null });
    const fresh = Date.now() - 5_000; // newer than every sample the tests above wrote
    await usage.record('h1', [1, 2, 3, 4, 5, 6].map((i) => sample('sa', new Date(fresh + i * 100))));
    const count = async (id: string) => Number(((await db('sandbox_usage').where({ sandbox_id: id }).count('* as n')) as { n: string | number }[])[0].n);
    expect(await count('sb')).toBe(2);
    expect(await count('sa')).toBeGreaterThan(5);
    await usage.prune();
    expect(await count('sb')).toBe(1); // the expired one went; the fresh one stays until it expires
    expect(await count('sa')).toBe(5);
    const kept = await usage.range(principal('orga'), 'sa', { start: new Date(0), end: new Date(), maxPoints: 100 });
    expect(kept.points[kept.points.length - 1].at.getTime()).toBe(fresh + 600); // the newest are kept
    await usage.prune(new Date(Date.now() + 3 * 3600_000));
    expect(await count('sb')).toBe(0);
    expect(await count('sa')).toBe(0);
  });
});

describe('downsample', () => {
  it('leaves short series alone and keeps limits, counters and the last time per bucket', () => {
    const p = (i: number) => ({ at: new Date(i * 1000), cpuUsedPct: i, cpuCount: 2, memUsed: i * 10, memCache: null, memTotal: 100, diskUsed: null, diskTotal: null, netRx: i * 5, netTx: null });
    const points = [1, 2, 3, 4, 5, 6].map(p);
    expect(downsample(points, 6)).toBe(points);
    const three = downsample(points, 3);
    expect(three.map((x) => [x.at.getTime(), x.cpuUsedPct, x.memUsed, x.netRx, x.memCache])).toEqual([[2000, 1.5, 15, 10, null], [4000, 3.5, 35, 20, null], [6000, 5.5, 55, 30, null]]);
  });
});
