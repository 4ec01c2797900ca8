// Pending (build-on-demand) sandboxes in the database, as two replicas see them.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase } from '../../test/harness.js';
import { migrateToLatest, openDatabase, type Db } from '../store/db.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { controlPlaneInstanceRepository } from '../store/repositories/control-plane-instances.js';
import { PendingSandboxService } from './pending-sandboxes.js';

describe('pending sandboxes shared by replicas', () => {
  let database: { url: string; drop: () => Promise<void> };
  let db: Db;
  beforeAll(async () => {
    database = await createTestDatabase();
    db = openDatabase({ kind: 'postgres', url: database.url });
    await migrateToLatest(db);
    await organizationRepository(db).insert({ id: 'orga', name: 'a' });
  });
  afterAll(async () => {
    await db?.destroy();
    await database?.drop();
  });

  it('one replica writes, the other reads, updates lose to a delete, and a dead owner shows', async () => {
    const a = new PendingSandboxService(db, 'cp-a', 60_000);
    const b = new PendingSandboxService(db, 'cp-b', 60_000);
    await controlPlaneInstanceRepository(db).heartbeat('cp-a');
    await a.insert('orga', 'pnd-1', { buildId: 'b1' });
    expect(await b.get('orga', 'pnd-1')).toMatchObject({ phase: 'build', record: { buildId: 'b1' }, ownerAlive: true });
    expect(await b.get('orgb', 'pnd-1')).toBeUndefined();
    // The id is taken while pending, through either replica.
    await expect(b.insert('orga', 'pnd-1', {})).rejects.toMatchObject({ code: 'conflict' });
    expect(await b.holds('orga', 'pnd-1')).toBe(true);
    // Deleted through B: A's later phase write does not bring it back.
    expect(await b.update('orga', 'pnd-1', 'deleted', { buildId: 'b1' }, [])).toBe(true);
    expect(await a.update('orga', 'pnd-1', 'creating', { buildId: 'b1' })).toBe(false);
    expect(await a.holds('orga', 'pnd-1')).toBe(false);
    // A freed id can be pending again.
    await b.insert('orga', 'pnd-1', { buildId: 'b2' });
    expect(await a.get('orga', 'pnd-1')).toMatchObject({ phase: 'build', record: { buildId: 'b2' } });
    // B's owner (cp-b) never heartbeated: A sees nobody will finish it.
    expect((await a.get('orga', 'pnd-1'))?.ownerAlive).toBe(false);
    expect((await b.get('orga', 'pnd-1'))?.ownerAlive).toBe(true);
  });
});
