// Replicas sharing one PostgreSQL database: start-up steps taken at once by several processes
// (each with a pool of its own, as separate replicas have), and a database a newer release
// migrated further than this one knows.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase } from '../../test/harness.js';
import { migrateToLatest, openDatabase, withAdvisoryLock, withStartupLock, type Db } from './db.js';
import { AuthService } from '../services/auth.js';
import { migrationSource } from './migrations/index.js';

describe('start-up of replicas on one PostgreSQL database', () => {
  let database: { url: string; drop: () => Promise<void> };
  const pools: Db[] = [];
  beforeAll(async () => {
    database = await createTestDatabase();
    for (let i = 0; i < 3; i++) pools.push(openDatabase({ kind: 'postgres', url: database.url }));
  });
  afterAll(async () => {
    for (const db of pools) await db.destroy();
    await database?.drop();
  });

  it('three replicas starting at once on a fresh database migrate once and mint one bootstrap key', async () => {
    const started = await Promise.all(pools.map((db) => withStartupLock(db, { kind: 'postgres', url: database.url }, async () => {
      await migrateToLatest(db);
      return new AuthService(db).ensureBootstrapKey(undefined);
    })));
    expect(started.filter((s) => s.generatedKey !== undefined)).toHaveLength(1);
    expect(new Set(started.map((s) => s.organizationId)).size).toBe(1);
    const applied = (await pools[0]('knex_migrations').select('name')) as { name: string }[];
    expect(applied.map((m) => m.name).sort()).toEqual(await migrationSource.getMigrations([]));
    expect((await pools[0]('api_keys').count<{ count: string }[]>('* as count'))[0].count).toBe('1');
    expect((await pools[0]('organizations').count<{ count: string }[]>('* as count'))[0].count).toBe('1');
  });

  it('an older release starts on a database with a migration it does not know', async () => {
    // What a newer replica's migration leaves in knex's bookkeeping.
    await pools[0]('knex_migrations').insert({ name: '20991231235959_from_a_newer_release', batch: 99, migration_time: new Date() });
    await expect(withStartupLock(pools[1], { kind: 'postgres', url: database.url }, () => migrateToLatest(pools[1]))).resolves.toBeUndefined();
    await pools[0]('knex_migrations').where({ name: '20991231235959_from_a_newer_release' }).delete();
  });

  it('an advisory lock named by an object key (a NUL inside) serialises two replicas', async () => {
    // The object store's lock names are `object:<organisation>\0<key>`; PostgreSQL refuses a
    // NUL in text, which once turned every put through a replica into a 400.
    const target = { kind: 'postgres' as const, url: database.url };
    const name = 'object:org_1\0e2b/builds/1.json';
    const order: string[] = [];
    let releaseFirst!: () => void;
    const firstHolds = new Promise<void>((resolve) => { releaseFirst = resolve; });
    let firstEntered!: () => void;
    const entered = new Promise<void>((resolve) => { firstEntered = resolve; });
    const first = withAdvisoryLock(pools[0], target, name, async () => {
      order.push('first in');
      firstEntered();
      await firstHolds;
      order.push('first out');
    });
    await entered;
    const second = withAdvisoryLock(pools[1], target, name, async () => { order.push('second in'); });
    // The second is waiting on the lock in PostgreSQL, not merely not yet scheduled.
    await expect.poll(async () => Number((await pools[2].raw("SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")).rows[0].n)).toBeGreaterThan(0);
    releaseFirst();
    await Promise.all([first, second]);
    expect(order).toEqual(['first in', 'first out', 'second in']);
  });
});
// PGlite (one process, no lock taken): test/pglite-smoke.test.ts starts a server on it.
