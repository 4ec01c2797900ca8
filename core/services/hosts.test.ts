// The control plane's "vanished sandbox" check against a real PostgreSQL, with the interleaving
// that used to flip a fresh sandbox to `error`: the host takes its list, a create completes,
// then the (older) list arrives.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, openDatabase, type Db } from '../store/db.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { createTestDatabase } from '../../test/harness.js';
import { HostService, type HeartbeatInput } from './hosts.js';

describe('HostService heartbeat reconciliation', () => {
  let db: Db;
  let drop: () => Promise<void>;
  let hosts: HostService;
  beforeAll(async () => {
    const t = await createTestDatabase();
    drop = t.drop;
    db = openDatabase({ kind: 'postgres', url: t.url });
    await migrateToLatest(db);
    await organizationRepository(db).insert({ id: 'orga', name: 'a' });
    // The heartbeat never dials the host, so no client is ever made.
    hosts = new HostService(db, () => { throw new Error('heartbeat must not call the host'); }, 10_000);
  });
  afterAll(async () => { await db.destroy(); await drop(); });

  const beat = (sandboxes: HeartbeatInput['sandboxes']) =>
    hosts.heartbeat({ hostId: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {}, sandboxes });
  const startRunning = async (id: string) => {
    const repo = sandboxRepository(db);
    await repo.insertCreating({ id, organizationId: 'orga', hostId: 'h1', image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, operationId: `op-${id}`, operationOwner: 'cp1', diskGiB: 10 });
    await repo.transition(id, ['creating'], { state: 'running', operation: null, operationId: null, operationOwner: null, operationStartedAt: null, startedAt: new Date() });
  };
  const stateOf = async (id: string) => (await sandboxRepository(db).findById(id))?.state;

  it('does not judge a sandbox by a list taken before it started, and does judge it by the next one', async () => {
    await beat([]); // registers the host
    await new Promise((r) => setTimeout(r, 5));
    // The host took its list here (empty); then the create completed; then the list arrived.
    await startRunning('fresh');
    await beat([]);
    expect(await stateOf('fresh')).toBe('running');
    // The next list is taken after that heartbeat was answered: a sandbox missing from it really vanished.
    await beat([]);
    expect(await stateOf('fresh')).toBe('error');
  });

  it('keeps a sandbox the host reports, running or paused', async () => {
    await startRunning('kept');
    await beat([{ id: 'kept', status: 'running' }]);
    await beat([{ id: 'kept', status: 'paused' }]);
    expect(await stateOf('kept')).toBe('running');
  });

  it('marks a sandbox the host reports as stopped once it was running before the previous heartbeat', async () => {
    await startRunning('died');
    await beat([{ id: 'died', status: 'running' }]);
    await beat([{ id: 'died', status: 'stopped' }]);
    expect(await stateOf('died')).toBe('error');
  });
});

describe('HostService lost hosts', () => {
  let db: Db;
  let drop: () => Promise<void>;
  beforeAll(async () => {
    const t = await createTestDatabase();
    drop = t.drop;
    db = openDatabase({ kind: 'postgres', url: t.url });
    await migrateToLatest(db);
    await organizationRepository(db).insert({ id: 'orga', name: 'a' });
  });
  afterAll(async () => { await db.destroy(); await drop(); });

  const noClient = () => { throw new Error('marking a host lost must not call it'); };
  const policy = { cpuOvercommit: 1, memoryOvercommit: 1, diskOvercommit: 1, reserveCpu: 0, reserveMemoryMiB: 0, hostLostAfterMs: 1000, retryAfterSeconds: 5, defaultRegion: 'local', defaultDiskGiB: 1 };
  const insert = async (id: string, hostId: string, state: 'running' | 'creating' | 'stopped') => {
    const repo = sandboxRepository(db);
    await repo.insertCreating({ id, organizationId: 'orga', hostId, image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, operationId: `op-${id}`, operationOwner: 'cp1', diskGiB: 1 });
    if (state === 'running') await repo.transition(id, ['creating'], { state: 'running', operation: null, operationId: null, operationOwner: null, operationStartedAt: null, startedAt: new Date() });
    if (state === 'stopped') {
      await repo.transition(id, ['creating'], { state: 'running', operation: null, operationId: null, operationOwner: null, operationStartedAt: null, startedAt: new Date() });
      await repo.transition(id, ['running'], { state: 'stopping' });
      await repo.transition(id, ['stopping'], { state: 'stopped' });
    }
  };

  it('marks a silent host lost once across replicas and moves its running and in-flight sandboxes to error together', async () => {
    const { hostRepository } = await import('../store/repositories/hosts.js');
    await hostRepository(db).upsertHeartbeat({ id: 'gone', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date(Date.now() - 60_000));
    await hostRepository(db).upsertHeartbeat({ id: 'alive', url: 'http://127.0.0.1:2', driver: 'local', capabilities: {} });
    await insert('g1', 'gone', 'running');
    await insert('g2', 'gone', 'creating');
    await insert('g3', 'gone', 'stopped');
    await insert('a1', 'alive', 'running');
    const replicas = [new HostService(db, noClient, 10_000, undefined, undefined, policy), new HostService(db, noClient, 10_000, undefined, undefined, policy)];
    const [x, y] = await Promise.all(replicas.map((r) => r.markLostHosts()));
    expect([...x, ...y]).toEqual([{ hostId: 'gone', sandboxes: 2 }]);
    const row = async (id: string) => (await sandboxRepository(db).findById(id))!;
    for (const id of ['g1', 'g2']) expect(await row(id)).toMatchObject({ state: 'error', stopReason: 'host_lost', operationId: null });
    expect((await row('g3')).state).toBe('stopped');
    expect((await row('a1')).state).toBe('running');
    expect((await hostRepository(db).findById('gone'))!.lostAt).not.toBeNull();

    // It heartbeats again, still running g1: g1 is adopted, g2 (absent) stays error.
    await replicas[0].heartbeat({ hostId: 'gone', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {}, sandboxes: [{ id: 'g1', status: 'running' }] });
    expect((await hostRepository(db).findById('gone'))!.lostAt).toBeNull();
    expect(await row('g1')).toMatchObject({ state: 'running', stopReason: null, errorMessage: null });
    expect((await row('g2')).state).toBe('error');
  });
});

// Where a create from a snapshot goes (host-transfer.ts copies the layers when it is not a holder).
describe('placement with preferred hosts and exclusions', () => {
  let db: Db;
  let drop: () => Promise<void>;
  let hosts: HostService;
  beforeAll(async () => {
    const t = await createTestDatabase();
    drop = t.drop;
    db = openDatabase({ kind: 'postgres', url: t.url });
    await migrateToLatest(db);
    const policy = { cpuOvercommit: 1, memoryOvercommit: 1, diskOvercommit: 1, reserveCpu: 0, reserveMemoryMiB: 0, hostLostAfterMs: 30_000, retryAfterSeconds: 5, defaultRegion: 'local', defaultDiskGiB: 1 };
    hosts = new HostService(db, () => { throw new Error('placement must not call the host'); }, 10_000, undefined, undefined, policy);
    // p-big has the most room, p-small less: spread alone would pick p-big.
    for (const [id, memoryMiB] of [['p-big', 8192], ['p-small', 2048]] as const) {
      await hosts.heartbeat({ hostId: id, url: `http://127.0.0.1:1/${id}`, driver: 'local', capabilities: {}, sandboxes: [], capacity: { cpu: 4, memoryMiB, diskGiB: 100 } });
    }
  });
  afterAll(async () => { await db.destroy(); await drop(); });
  const place = (req: Partial<Parameters<HostService['place']>[1]>) => db.transaction((tx) => hosts.place(tx, { cpu: 1, memoryMiB: 256, diskGiB: 1, ...req }));

  it('takes a ready holder with room over a roomier host, and any host when no holder can take it', async () => {
    expect((await place({})).id).toBe('p-big');
    expect((await place({ preferred: { hostIds: ['p-small'] } })).id).toBe('p-small');
    await db('hosts').where({ id: 'p-small' }).update({ admin_state: 'cordoned' });
    expect((await place({ preferred: { hostIds: ['p-small'] } })).id).toBe('p-big');
    await db('hosts').where({ id: 'p-small' }).update({ admin_state: 'ready' });
    // Too big for the holder: placed where it fits.
    expect((await place({ memoryMiB: 4096, preferred: { hostIds: ['p-small'] } })).id).toBe('p-big');
  });

  it('never picks an excluded host (a move\'s source), and says so when nothing else is left', async () => {
    expect((await place({ excludeHostIds: ['p-big'] })).id).toBe('p-small');
    await expect(place({ excludeHostIds: ['p-big', 'p-small'] })).rejects.toMatchObject({ code: 'host_unavailable' });
  });
});
