import type { Knex } from 'knex';

// Issue 16 (replicas): sandboxes a front door has promised but core cannot create yet, because
// their image is still being built (Daytona's create with `buildInfo`). They were kept in the
// memory of the replica that took the create, so any other replica answered 404 for them; here
// every replica reads them. `record` is the front door's own (what it renders); `phase` is
// where the create is; `owner_instance_id` is the replica waiting for the build, so a reader
// can tell a create nobody will finish (its owner stopped heartbeating).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('pending_sandboxes', (t) => {
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    // The future sandbox's name: the caller's, or one the front door made up.
    t.text('id').notNullable();
    t.text('phase').notNullable();
    t.text('owner_instance_id').notNullable();
    t.jsonb('record').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['organization_id', 'id']);
    t.index(['phase', 'updated_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('pending_sandboxes');
}
