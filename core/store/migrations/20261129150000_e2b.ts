import type { Knex } from 'knex';

// Issue 5: each sandbox's access token (E2B's envdAccessToken). The token itself is derived from
// the master secret (so connect can hand it out again); only its SHA-256 is stored, to find the
// sandbox from a token alone (old E2B SDKs send /files and /health without routing headers).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.text('access_token_hash');
    t.unique(['access_token_hash']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropUnique(['access_token_hash']);
    t.dropColumn('access_token_hash');
  });
}
