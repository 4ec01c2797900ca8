import type { Knex } from 'knex';

// Issue 8: pause, idle policy, auto-delete, fork and snapshot lineage, idempotency keys.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    // Why a sandbox was last paused or stopped: only idle-paused/-stopped sandboxes (and paused
    // ones in general) are woken transparently by the next call; a user's or a timeout's stop is kept.
    t.text('stop_reason');
    t.text('pause_reason');
    t.timestamp('paused_at', { useTz: true });
    t.timestamp('last_activity_at', { useTz: true });
    t.integer('idle_timeout_seconds').notNullable().defaultTo(0);
    t.text('idle_action').notNullable().defaultTo('pause');
    // null = never; 0 = as soon as it stops.
    t.integer('auto_delete_seconds');
    t.text('source_snapshot_id');
    t.text('forked_from');
    t.index(['state', 'last_activity_at']);
    t.index(['source_snapshot_id']);
  });

  await knex.schema.createTable('snapshots', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('name').notNullable();
    t.text('host_id').notNullable().references('hosts.id');
    t.text('source_sandbox_id');
    // The snapshot this one was taken on top of (its source was created from it): it needs it.
    t.text('parent_snapshot_id');
    t.text('state').notNullable();
    t.bigInteger('size_bytes');
    t.text('error_message');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('deleted_at', { useTz: true });
    t.index(['organization_id', 'created_at']);
    t.index(['parent_snapshot_id']);
  });
  // One live snapshot per name per organisation; a deleted name can be reused.
  await knex.raw(`CREATE UNIQUE INDEX snapshots_org_name_live ON snapshots (organization_id, name) WHERE deleted_at IS NULL`);

  await knex.schema.createTable('idempotency_keys', (t) => {
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('key').notNullable();
    t.text('operation').notNullable();
    t.text('request_hash').notNullable();
    t.text('status').notNullable(); // pending | done
    t.jsonb('result');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('expires_at', { useTz: true }).notNullable();
    t.primary(['organization_id', 'key']);
    t.index(['expires_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('idempotency_keys');
  await knex.schema.dropTable('snapshots');
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropIndex(['state', 'last_activity_at']);
    t.dropIndex(['source_snapshot_id']);
    for (const c of ['stop_reason', 'pause_reason', 'paused_at', 'last_activity_at', 'idle_timeout_seconds', 'idle_action', 'auto_delete_seconds', 'source_snapshot_id', 'forked_from']) t.dropColumn(c);
  });
}
