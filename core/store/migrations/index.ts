import type { Knex } from 'knex';
import * as initial from './20261129120000_initial.js';
import * as lifecycle from './20261129130000_lifecycle.js';

// Migrations are imported modules rather than files knex discovers at run time, so the same
// list works from TypeScript sources (tests) and compiled JavaScript (the server).
const MIGRATIONS: Record<string, Knex.Migration> = {
  '20261129120000_initial': initial,
  '20261129130000_lifecycle': lifecycle,
};

export const migrationSource: Knex.MigrationSource<string> = {
  getMigrations: async () => Object.keys(MIGRATIONS).sort(),
  getMigrationName: (name) => name,
  getMigration: async (name) => MIGRATIONS[name],
};
