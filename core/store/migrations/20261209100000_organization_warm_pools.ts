import type { Knex } from 'knex';

// Issue 20 (Daytona's `daytona.warmPool`): warm pools an organisation asks for, per image and
// size, beside the operator's configured keys. Each row is a desired count; its members are rows
// of `warm_pool_sandboxes` carrying its id (`pool_id`), claimable only by that organisation's
// creates. `pool_id` has no foreign key on purpose: deleting a pool must not delete member rows
// before their sandboxes are destroyed on their hosts, so the refill loop removes members whose
// pool is gone (core/services/warm-pool.ts). Additive: replicas of the release before ignore both.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('organization_warm_pools', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    // What the organisation named (Daytona's snapshot) and the region it asked for.
    t.text('snapshot').notNullable();
    t.text('region').notNullable();
    // What its members are launched from, resolved once at create: the image's label as a
    // sandbox row records it, its base on the host, its row, the layers snapshot and its host.
    t.text('image').notNullable();
    t.text('host_image');
    t.text('image_id');
    t.text('layers_snapshot_id');
    t.text('host_id');
    t.jsonb('env').notNullable().defaultTo('{}');
    t.integer('cpu').notNullable();
    t.integer('memory_mib').notNullable();
    t.integer('disk_gib').notNullable();
    t.integer('pool').notNullable();
    t.text('error_reason');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.unique(['organization_id', 'snapshot', 'region'], { indexName: 'organization_warm_pools_snapshot_region' });
  });
  await knex.schema.alterTable('warm_pool_sandboxes', (t) => {
    t.text('pool_id');
    t.index(['pool_id', 'state'], 'warm_pool_sandboxes_pool');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('warm_pool_sandboxes', (t) => {
    t.dropIndex(['pool_id', 'state'], 'warm_pool_sandboxes_pool');
    t.dropColumn('pool_id');
  });
  await knex.schema.dropTable('organization_warm_pools');
}
