// The same migrations and repositories against real PostgreSQL and against PGlite.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, rollbackAll, type Db } from './db.js';
import { sandboxRepository } from './repositories/sandboxes.js';
import { organizationRepository } from './repositories/organizations.js';
import { hostRepository } from './repositories/hosts.js';
import { encodeCursor } from '../services/sandboxes.js';
import { DB_BACKENDS } from './test-support.js';


describe.each(DB_BACKENDS)('store on %s', (_name, open) => {
  let db: Db;
  let cleanup: () => Promise<void>;
  beforeAll(async () => {
    ({ db, cleanup } = await open());
    await migrateToLatest(db);
    await organizationRepository(db).insert({ id: 'orga', name: 'a' });
    await organizationRepository(db).insert({ id: 'orgb', name: 'b' });
    await hostRepository(db).upsertHeartbeat({ id: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
  });
  afterAll(async () => cleanup());

  const make = (id: string, org = 'orga', labels: Record<string, string> = {}) =>
    sandboxRepository(db).insertCreating({ id, organizationId: org, hostId: 'h1', image: 'default', cpu: 1, memoryMiB: 256, env: { A: '1' }, labels, timeoutSeconds: 60, operationId: `op${id}`, operationOwner: 'cp1', diskGiB: 10 });

  it('migrates down and up again unchanged', async () => {
    await rollbackAll(db);
    expect(await db.schema.hasTable('sandboxes')).toBe(false);
    await migrateToLatest(db);
    expect(await db.schema.hasTable('sandboxes')).toBe(true);
    await organizationRepository(db).insert({ id: 'orga', name: 'a' });
    await organizationRepository(db).insert({ id: 'orgb', name: 'b' });
    await hostRepository(db).upsertHeartbeat({ id: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
  });

  it('round-trips a sandbox with its json columns', async () => {
    const s = await make('s1', 'orga', { team: 'x' });
    expect(s).toMatchObject({ id: 's1', state: 'creating', env: { A: '1' }, labels: { team: 'x' }, operation: 'create' });
    expect(await sandboxRepository(db).findVisible('s1', 'orgb')).toBeUndefined();
    expect((await sandboxRepository(db).findVisible('s1', 'orga'))?.labels).toEqual({ team: 'x' });
  });

  it('transitions only from the expected state and operation (compare-and-set)', async () => {
    const repo = sandboxRepository(db);
    expect(await repo.transition('s1', ['running'], { state: 'stopping' })).toBeUndefined();
    expect(await repo.transition('s1', ['creating'], { state: 'running' }, 'wrong-op')).toBeUndefined();
    const ran = await repo.transition('s1', ['creating'], { state: 'running', operation: null, operationId: null }, 'ops1');
    expect(ran?.state).toBe('running');
    // Two racers: exactly one wins.
    const results = await Promise.all([repo.transition('s1', ['running'], { state: 'stopping' }), repo.transition('s1', ['running'], { state: 'stopping' })]);
    expect(results.filter(Boolean)).toHaveLength(1);
  });

  it('pages with a cursor, filters by labels and hides other organisations', async () => {
    const repo = sandboxRepository(db);
    for (let i = 0; i < 5; i++) await make(`p${i}`, 'orga', { batch: 'p', n: String(i) });
    await make('other', 'orgb', { batch: 'p' });
    const first = await repo.list({ organizationId: 'orga', labels: { batch: 'p' }, limit: 3 });
    expect(first.map((s) => s.id)).toEqual(['p4', 'p3', 'p2']);
    const last = first[first.length - 1];
    const second = await repo.list({ organizationId: 'orga', labels: { batch: 'p' }, limit: 3, after: { createdAt: last.createdAt, id: last.id } });
    expect(second.map((s) => s.id)).toEqual(['p1', 'p0']);
    expect(encodeCursor(last)).toMatch(/^[A-Za-z0-9_-]+$/);
    expect((await repo.list({ organizationId: 'orga', labels: { n: '3' }, limit: 10 })).map((s) => s.id)).toEqual(['p3']);
  });

  it('keeps sandbox names unique per organisation among live sandboxes, finds by name, sorts and filters by prefix', async () => {
    const repo = sandboxRepository(db);
    const named = (id: string, name: string, org = 'orga', cpu = 1) =>
      repo.insertCreating({ id, organizationId: org, hostId: 'h1', image: 'default', cpu, memoryMiB: 256, env: {}, labels: { batch: 'n' }, timeoutSeconds: 60, operationId: `op${id}`, operationOwner: 'cp1', name, diskGiB: 10 });
    await named('n1', 'zeta', 'orga', 2);
    await named('n2', 'alpha', 'orga', 1);
    await expect(named('n3', 'zeta')).rejects.toThrow();
    await named('n4', 'zeta', 'orgb');
    expect((await repo.findVisibleByName('zeta', 'orga'))?.id).toBe('n1');
    expect((await repo.findVisibleByName('zeta', 'orgb'))?.id).toBe('n4');
    // A deleted sandbox frees its name.
    await repo.update('n1', { state: 'deleted' });
    expect(await repo.findVisibleByName('zeta', 'orga')).toBeUndefined();
    await named('n5', 'zeta', 'orga', 3);
    const byName = await repo.list({ organizationId: 'orga', labels: { batch: 'n' }, limit: 1, sort: { key: 'name', order: 'asc' } });
    expect(byName.map((s) => s.name)).toEqual(['alpha']);
    const next = await repo.list({ organizationId: 'orga', labels: { batch: 'n' }, limit: 5, sort: { key: 'name', order: 'asc' }, sortAfter: { value: 'alpha', id: 'n2' } });
    expect(next.map((s) => s.id)).toEqual(['n5']);
    const byCpu = await repo.list({ organizationId: 'orga', labels: { batch: 'n' }, limit: 5, sort: { key: 'cpu', order: 'desc' } });
    expect(byCpu.map((s) => s.id)).toEqual(['n5', 'n2']);
    expect((await repo.list({ organizationId: 'orga', labels: { batch: 'n' }, limit: 5, namePrefix: 'al' })).map((s) => s.id)).toEqual(['n2']);
    expect((await repo.list({ organizationId: 'orga', labels: { batch: 'n' }, limit: 5, idPrefix: 'n5' })).map((s) => s.id)).toEqual(['n5']);
    // LIKE wildcards in a prefix are literal.
    expect(await repo.list({ organizationId: 'orga', labels: { batch: 'n' }, limit: 5, namePrefix: '%' })).toEqual([]);
  });

  it('claims expired sandboxes once, even with concurrent sweepers', async () => {
    const repo = sandboxRepository(db);
    await make('e1');
    await repo.transition('e1', ['creating'], { state: 'running', expiresAt: new Date(Date.now() - 1000) });
    const claims = await Promise.all([0, 1, 2].map(() => repo.claimExpired(new Date(), 10, () => ({ operation: 'stop' }))));
    const claimedIds = claims.flat().map((s) => s.id);
    expect(claimedIds.filter((id) => id === 'e1')).toHaveLength(1);
    expect((await repo.findById('e1'))?.state).toBe('stopping');
  });

  it('knows the earliest deadline, claims kill-at-timeout rows for delete, and extends deadlines only later', async () => {
    const repo = sandboxRepository(db);
    const soon = new Date(Date.now() + 60_000);
    const later = new Date(Date.now() + 120_000);
    await make('d1');
    await repo.transition('d1', ['creating'], { state: 'running', expiresAt: later });
    await make('d2');
    await repo.transition('d2', ['creating'], { state: 'running', expiresAt: soon, autoDeleteSeconds: 0 });
    expect((await repo.nextDeadline())?.getTime()).toBe(soon.getTime());
    // A stopped sandbox's auto-delete is a deadline too.
    await make('d3');
    const stoppedAt = new Date(Date.now() - 5_000);
    await repo.transition('d3', ['creating'], { state: 'running' });
    await repo.transition('d3', ['running'], { state: 'stopping' });
    await repo.transition('d3', ['stopping'], { state: 'stopped', stoppedAt, autoDeleteSeconds: 2 });
    expect((await repo.nextDeadline())?.getTime()).toBe(stoppedAt.getTime() + 2_000);
    await repo.update('d3', { autoDeleteSeconds: null });

    // Only later: a shorter deadline changes nothing, a longer one moves it.
    expect(await repo.extendDeadline('d1', soon, 60)).toBeUndefined();
    expect((await repo.extendDeadline('d1', new Date(later.getTime() + 1_000), 121))?.expiresAt?.getTime()).toBe(later.getTime() + 1_000);

    // Due: auto-delete 0 is claimed for deleting, the rest for stopping, each by one sweeper only.
    const past = new Date(Date.now() - 1);
    await repo.update('d1', { expiresAt: past });
    await repo.update('d2', { expiresAt: past });
    const atOnce = await Promise.all([0, 1].map(() => repo.claimExpired(new Date(), 10, () => ({ operation: 'delete' }), 'at-once')));
    expect(atOnce.flat().map((r) => `${r.id}:${r.state}`)).toEqual(['d2:deleting']);
    const stops = await repo.claimExpired(new Date(), 10, () => ({ operation: 'stop' }));
    expect(stops.map((r) => `${r.id}:${r.state}`)).toEqual(['d1:stopping']);
  });

  it('lists by start time, from a start time and by source snapshot', async () => {
    const repo = sandboxRepository(db);
    const t0 = Date.now() - 60_000;
    for (const [id, offset, snapshot] of [['t1', 0, null], ['t2', 1_000, 'snap1'], ['t3', 2_000, null]] as const) {
      await make(id, 'orga', { batch: 't' });
      await repo.transition(id, ['creating'], { state: 'running', startedAt: new Date(t0 + offset) });
      if (snapshot) await db('sandboxes').where({ id }).update({ source_snapshot_id: snapshot });
    }
    const ids = async (extra: object) => (await repo.list({ organizationId: 'orga', labels: { batch: 't' }, limit: 10, ...extra })).map((r) => r.id);
    expect(await ids({ sort: { key: 'startedAt', order: 'asc' } })).toEqual(['t1', 't2', 't3']);
    expect(await ids({ sort: { key: 'startedAt', order: 'desc' }, sortAfter: { value: new Date(t0 + 2_000).toISOString(), id: 't3' } })).toEqual(['t2', 't1']);
    expect(await ids({ startedAfter: new Date(t0 + 1_000), sort: { key: 'startedAt', order: 'asc' } })).toEqual(['t2', 't3']);
    expect(await ids({ startedBefore: new Date(t0 + 1_000), sort: { key: 'startedAt', order: 'asc' } })).toEqual(['t1', 't2']);
    expect(await ids({ sourceSnapshotId: 'snap1' })).toEqual(['t2']);
    expect(await ids({ sourceSnapshotId: null, sort: { key: 'startedAt', order: 'asc' } })).toEqual(['t1', 't3']);
  });
});
