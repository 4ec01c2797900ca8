import type { Knex } from 'knex';

// Issue 16 (replicas): facts every control-plane replica of one database must agree on, checked
// at start-up. The first is a fingerprint of the host secret (never the secret): a replica
// started without the shared NESTBOX_HOST_SECRET would make up one of its own and then fail
// every host call and every sandbox token the others signed, so it refuses to start instead.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('control_plane_settings', (t) => {
    t.text('name').primary();
    t.text('value').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('control_plane_settings');
}
