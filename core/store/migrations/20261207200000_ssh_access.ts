import type { Knex } from 'knex';

// Issue 19, SSH access. Additive: replicas of the release before ignore both tables.
//  - ssh_access_tokens: short-lived tokens that open one sandbox through the SSH gateway (the
//    username is the token). Only a SHA-256 of the token is stored; the row names the API key it
//    was minted with, so the key's revocation and scopes apply at use time.
//  - ssh_public_keys: public keys registered per organisation; they open any sandbox of it
//    (username = sandbox id). The fingerprint (OpenSSH's SHA256:…) is unique per organisation.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('ssh_access_tokens', (t) => {
    t.text('id').primary();
    t.text('token_hash').notNullable().unique();
    t.text('sandbox_id').notNullable();
    t.text('organization_id').notNullable();
    t.text('api_key_id').notNullable();
    t.timestamp('expires_at', { useTz: true }).notNullable();
    t.timestamp('revoked_at', { useTz: true });
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['sandbox_id']);
  });
  await knex.schema.createTable('ssh_public_keys', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable();
    t.text('fingerprint').notNullable();
    t.text('key_type').notNullable();
    t.text('public_key').notNullable();
    t.text('comment').notNullable().defaultTo('');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.unique(['organization_id', 'fingerprint']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('ssh_public_keys');
  await knex.schema.dropTable('ssh_access_tokens');
}
