// Shared by the store's and the lifecycle engine's tests (never imported by the program): the
// same code against a real PostgreSQL database and against PGlite.
import { mkdtempSync, rmSync } from 'node:fs';
import { createTestDatabase } from '../../test/harness.js';
import { openDatabase, type Db } from './db.js';

export type OpenTestDb = () => Promise<{ db: Db; cleanup: () => Promise<void> }>;

/** `describe.each(DB_BACKENDS)`: a fresh PostgreSQL database, then a fresh PGlite directory. */
export const DB_BACKENDS: [string, OpenTestDb][] = [
  [
    'postgres',
    async () => {
      const t = await createTestDatabase();
      const db = openDatabase({ kind: 'postgres', url: t.url });
      return { db, cleanup: async () => { await db.destroy(); await t.drop(); } };
    },
  ],
  [
    'pglite',
    async () => {
      const dir = mkdtempSync('/tmp/nbx-pglite-');
      const db = openDatabase({ kind: 'pglite', directory: dir });
      return { db, cleanup: async () => { await db.destroy(); rmSync(dir, { recursive: true, force: true }); } };
    },
  ],
];
