import type { Knex } from 'knex';

// Why jsonb for env/labels/scopes: they are read and written whole, and label filters use the
// jsonb containment operator (`@>`), which PostgreSQL and PGlite both index-support.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('organizations', (t) => {
    t.text('id').primary();
    t.text('name').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });

  await knex.schema.createTable('api_keys', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('name').notNullable();
    // First characters of the key, shown in listings so people can tell keys apart.
    t.text('key_prefix').notNullable();
    // SHA-256 of the whole key; keys have 40 random characters, so a slow hash adds nothing.
    t.text('key_hash').notNullable().unique();
    t.jsonb('scopes').notNullable();
    t.text('preset').notNullable();
    t.jsonb('sandbox_ids');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_used_at', { useTz: true });
    t.timestamp('revoked_at', { useTz: true });
    t.index(['organization_id']);
  });

  await knex.schema.createTable('hosts', (t) => {
    t.text('id').primary();
    t.text('url').notNullable();
    t.text('driver').notNullable();
    t.jsonb('capabilities').notNullable();
    t.timestamp('registered_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_heartbeat_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });

  await knex.schema.createTable('control_plane_instances', (t) => {
    t.text('id').primary();
    t.timestamp('started_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_seen_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
  });

  await knex.schema.createTable('sandboxes', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('host_id').references('hosts.id');
    t.text('state').notNullable();
    t.text('image').notNullable();
    t.integer('cpu').notNullable();
    t.integer('memory_mib').notNullable();
    t.jsonb('env').notNullable();
    t.jsonb('labels').notNullable();
    t.integer('timeout_seconds').notNullable();
    t.timestamp('expires_at', { useTz: true });
    // The in-flight operation (with its id) while the state is transitional; the reconciler
    // uses them to finish or fail what a crash interrupted.
    t.text('operation');
    t.text('operation_id');
    // The control-plane instance running the operation; when that instance stops heartbeating
    // its operations are taken over by the reconciler of another (or the restarted) instance.
    t.text('operation_owner');
    t.timestamp('operation_started_at', { useTz: true });
    t.text('error_message');
    t.boolean('memory_restored');
    t.text('resume_reason');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('started_at', { useTz: true });
    t.timestamp('stopped_at', { useTz: true });
    t.timestamp('deleted_at', { useTz: true });
    t.index(['organization_id', 'created_at', 'id']);
    t.index(['state']);
    t.index(['expires_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('sandboxes');
  await knex.schema.dropTable('control_plane_instances');
  await knex.schema.dropTable('hosts');
  await knex.schema.dropTable('api_keys');
  await knex.schema.dropTable('organizations');
}
