// Replicas sharing one PostgreSQL database: start-up steps taken at once by several processes
// (each with a pool of its own, as separate replicas have), and a database a newer release
// migrated further than this one knows.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase } from '../../test/harness.js';
import { migrateToLatest, openDatabase, withStartupLock, type Db } from './db.js';
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
});
// PGlite (one process, no lock taken): test/pglite-smoke.test.ts starts a server on it.
