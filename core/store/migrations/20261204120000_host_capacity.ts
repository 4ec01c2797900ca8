import type { Knex } from 'knex';

// Issue 16 (hosts): what each host reports in its heartbeat (capacity, labels, release, what its
// sandboxes hold), the operator's state of it (`ready`, `cordoned`, `draining`) and when the
// control plane declared it lost (null while it heartbeats). All nullable or defaulted, so old
// replicas keep writing heartbeats while new ones read them.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('hosts', (t) => {
    t.jsonb('capacity');
    t.jsonb('labels').notNullable().defaultTo('{}');
    t.text('version');
    t.jsonb('allocated');
    t.text('admin_state').notNullable().defaultTo('ready');
    t.timestamp('lost_at', { useTz: true });
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('hosts', (t) => {
    t.dropColumn('capacity');
    t.dropColumn('labels');
    t.dropColumn('version');
    t.dropColumn('allocated');
    t.dropColumn('admin_state');
    t.dropColumn('lost_at');
  });
}
