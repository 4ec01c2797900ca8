import type { Knex } from 'knex';

// Issue 16, host-to-host transfers. Additive: replicas of the release before ignore both.
//  - snapshot_hosts: hosts holding a COPY of a snapshot's layers (its own host stays
//    snapshots.host_id), so creates from it can be placed on any of them without copying again.
//  - sandboxes.moving_to_host_id / move_lease_until: a move in flight claims the stopped sandbox
//    for its target host until the lease runs out (renewed while bytes flow), so a start waits
//    for it and a retry after a crashed replica takes it over and cleans the old target first.
//    moved_from_host_id: the host a committed move left, until its copy there is destroyed.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('snapshot_hosts', (t) => {
    t.text('snapshot_id').notNullable().references('id').inTable('snapshots');
    t.text('host_id').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['snapshot_id', 'host_id']);
  });
  await knex.schema.alterTable('sandboxes', (t) => {
    t.text('moving_to_host_id');
    t.timestamp('move_lease_until', { useTz: true });
    t.text('moved_from_host_id');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropColumn('moving_to_host_id');
    t.dropColumn('move_lease_until');
    t.dropColumn('moved_from_host_id');
  });
  await knex.schema.dropTable('snapshot_hosts');
}
