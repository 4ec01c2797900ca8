import type { Knex } from 'knex';

// Issue 19: organisation secrets and the secrets a sandbox is given.
//
// A secret's value is kept only as AES-256-GCM ciphertext under a key derived (HKDF) from the
// host secret (core/services/secrets.ts); no API returns it. `sandbox_secrets` holds which
// secrets a sandbox gets and how (env name or file path), never a value: values are resolved
// from `secrets` every time the sandbox starts.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('secrets', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('name').notNullable();
    t.text('description').notNullable().defaultTo('');
    // Daytona's `hosts` (stored and reported; see ARCHITECTURE.md "Secrets").
    t.jsonb('hosts').notNullable().defaultTo('[]');
    // E2B's customer metadata.
    t.jsonb('metadata').notNullable().defaultTo('{}');
    t.text('value_encrypted').notNullable();
    t.integer('version').notNullable().defaultTo(1);
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.unique(['organization_id', 'name']);
  });
  await knex.schema.createTable('sandbox_secrets', (t) => {
    t.text('sandbox_id').primary().references('sandboxes.id').onDelete('CASCADE');
    t.text('organization_id').notNullable();
    // [{name, env?, file?}] (core/services/secrets.ts SecretRef).
    t.jsonb('refs').notNullable();
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('sandbox_secrets');
  await knex.schema.dropTable('secrets');
}
