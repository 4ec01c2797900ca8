import knexFactory, { type Knex } from 'knex';
import ClientPgLite from 'knex-pglite';
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

export async function migrateToLatest(db: Db): Promise<void> {
  await db.migrate.latest({ migrationSource });
}

export async function rollbackAll(db: Db): Promise<void> {
  await db.migrate.rollback({ migrationSource }, true);
}
