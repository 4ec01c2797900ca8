import type { Knex } from 'knex';

// Issue 11, finding 2: credentials minted from an API key for one sandbox (E2B's envd access
// and traffic tokens, Daytona's file-URL signing key). Each row ties the credential to the key
// that obtained it and has an expiry, so a revoked key, an expired row or a deleted sandbox ends
// it. The secrets themselves are derived from the master secret and the row id (never stored):
// the server can recompute them, which E2B's signed URLs need (they hash the token itself).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('sandbox_credentials', (t) => {
    t.text('id').primary();
    // 'envd' (E2B access + traffic token) or 'daytona-signing' (Daytona signing key).
    t.text('kind').notNullable();
    t.text('sandbox_id').notNullable().references('sandboxes.id').onDelete('CASCADE');
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('api_key_id').notNullable().references('api_keys.id').onDelete('CASCADE');
    t.timestamp('expires_at', { useTz: true }).notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['sandbox_id', 'kind', 'expires_at']);
    t.index(['expires_at']);
  });
  // The deterministic per-sandbox token of issue 5 is replaced by the rows above.
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropUnique(['access_token_hash']);
    t.dropColumn('access_token_hash');
  });
  // Who minted a private port's current token: the token dies with that key.
  await knex.schema.alterTable('ports', (t) => {
    t.text('token_api_key_id');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('ports', (t) => {
    t.dropColumn('token_api_key_id');
  });
  await knex.schema.alterTable('sandboxes', (t) => {
    t.text('access_token_hash');
    t.unique(['access_token_hash']);
  });
  await knex.schema.dropTable('sandbox_credentials');
}
