import type { Knex } from 'knex';

// Issue 19 review: an organisation's own volume limits (how many live volumes, their total GiB,
// the largest one in GiB), NULL = the server's NESTBOX_ORG_MAX_VOLUMES, NESTBOX_ORG_MAX_VOLUME_GIB
// and NESTBOX_VOLUME_MAX_MIB. Additive: replicas of the release before ignore them.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('organizations', (t) => {
    t.integer('max_volumes');
    t.integer('max_volume_total_gib');
    t.integer('max_volume_size_gib');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('organizations', (t) => {
    t.dropColumn('max_volumes');
    t.dropColumn('max_volume_total_gib');
    t.dropColumn('max_volume_size_gib');
  });
}
