import knexFactory, { type Knex } from 'knex';
import ClientPgLite from 'knex-pglite';
import { createHash } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { migrationSource } from './migrations/index.js';

export type Db = Knex;
/** Repositories take either the pool or a transaction, so callers decide the unit of work. */
export type DbOrTx = Knex | Knex.Transaction;

export type DatabaseTarget = { kind: 'postgres'; url: string } | { kind: 'pglite'; directory: string };

export function openDatabase(target: DatabaseTarget): Db {
  if (target.kind === 'postgres') {
    return knexFactory({ client: 'pg', connection: target.url, pool: { min: 0, max: 10 } });
  }
  mkdirSync(target.directory, { recursive: true });
  // PGlite is one embedded connection; knex-pglite pins the pool to 1, so never hold a
  // transaction open across a host-agent call (it would block every other request).
  return knexFactory({ client: ClientPgLite as unknown as typeof Knex.Client, dialect: 'postgres', connection: { filename: target.directory } } as Knex.Config);
}

/**
 * Upgrades the schema to this release's latest migration.
 *
 * Mixed versions during a rolling upgrade: a newer replica migrates first while older ones keep
 * serving, and an older replica may (re)start on a database that already has migrations it does
 * not know. knex refuses that by default ("migration directory is corrupt"); it is allowed here
 * because migrations are additive while old replicas serve (ARCHITECTURE.md, "Scale-out"): new
 * tables, nullable or defaulted columns, new indexes; drops, renames and tighter constraints
 * wait for a release after the one that stopped using them. knex's own lock row is taken inside
 * the migration transaction, so a replica killed mid-migration leaves no stale lock behind.
 */
export async function migrateToLatest(db: Db): Promise<void> {
  await db.migrate.latest({ migrationSource, disableMigrationsListValidation: true });
}

/** Key of the advisory lock that serialises replicas' start-up steps ('nest' in ASCII). */
const STARTUP_LOCK_KEY = 0x6e657374;

/**
 * Runs `fn` (migrations, the bootstrap key and default organisation) while holding a
 * PostgreSQL advisory lock, so replicas started at once on a fresh database take turns: without
 * it both create knex's bookkeeping tables at the same moment (one fails on a duplicate type)
 * and both may find no key and mint a bootstrap key each. The lock is transaction-scoped on a
 * connection of its own that does nothing else: `fn` uses the pool's other connections, and a
 * process killed while holding it releases it with its connection. PGlite is one process with
 * one connection (the lock's connection would starve `fn`), so there it is not taken.
 */
export async function withStartupLock<T>(db: Db, target: DatabaseTarget, fn: () => Promise<T>): Promise<T> {
  if (target.kind === 'pglite') return fn();
  return db.transaction(async (lockTx) => {
    await lockTx.raw('SELECT pg_advisory_xact_lock(?)', [STARTUP_LOCK_KEY]);
    return fn();
  });
}

export async function rollbackAll(db: Db): Promise<void> {
  await db.migrate.rollback({ migrationSource }, true);
}

/**
 * Runs `fn` while holding the advisory lock named `name` (hashed to PostgreSQL's 64-bit lock
 * space; a collision only makes two names wait for each other), so processes sharing something
 * outside the database (replicas on one object-store directory) take turns. Transaction-scoped
 * on a pooled connection, released by commit, rollback or the connection's end. PGlite: one
 * process, nothing to coordinate with, so `fn` just runs.
 */
export async function withAdvisoryLock<T>(db: Db, target: DatabaseTarget, name: string, fn: () => Promise<T>): Promise<T> {
  if (target.kind === 'pglite') return fn();
  return db.transaction(async (lockTx) => {
    await lockTx.raw('SELECT pg_advisory_xact_lock(?::bigint)', [advisoryLockId(name)]);
    return fn();
  });
}

/**
 * A lock name's 64-bit id, hashed here rather than by PostgreSQL's hashtextextended: names
 * carry object keys, whose separator is a NUL, and PostgreSQL refuses a NUL in any text value.
 */
export function advisoryLockId(name: string): string {
  return createHash('sha256').update(name).digest().readBigInt64BE(0).toString();
}
