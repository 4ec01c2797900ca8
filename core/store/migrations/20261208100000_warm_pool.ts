import type { Knex } from 'knex';

// Issue 20: the warm pool. Ready sandboxes a host agent runs before anyone asks, one row each,
// kept apart from `sandboxes` on purpose: a pool member belongs to no organisation, so nothing
// that reads `sandboxes` (lists, usage, quotas, events, billing) can see or count it. A create
// claims one by deleting its row in the same transaction that inserts the `sandboxes` row under
// the same id (core/services/warm-pool.ts), so a crash leaves one of the two, never both or none.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('warm_pool_sandboxes', (t) => {
    t.text('id').primary();
    t.text('host_id').notNullable().references('hosts.id').onDelete('CASCADE');
    // The pool key: what a create must ask for to be answered by this member.
    t.text('image').notNullable();
    t.integer('cpu').notNullable();
    t.integer('memory_mib').notNullable();
    t.integer('disk_gib').notNullable();
    // warming: the host is building it (owner_instance_id asked); ready: claimable.
    t.text('state').notNullable();
    t.text('owner_instance_id').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('ready_at', { useTz: true });
    t.index(['host_id', 'image', 'cpu', 'memory_mib', 'disk_gib', 'state'], 'warm_pool_key');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('warm_pool_sandboxes');
}
