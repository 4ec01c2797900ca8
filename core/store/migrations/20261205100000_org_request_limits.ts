import type { Knex } from 'knex';

// Issue 16: an organisation's own request rates (its bucket, and each of its keys'), NULL = the
// server's NESTBOX_RATE_LIMIT_* default. Additive: replicas of the release before ignore them.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('organizations', (t) => {
    t.double('requests_per_second');
    t.integer('request_burst');
    t.double('key_requests_per_second');
    t.integer('key_request_burst');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('organizations', (t) => {
    t.dropColumn('requests_per_second');
    t.dropColumn('request_burst');
    t.dropColumn('key_requests_per_second');
    t.dropColumn('key_request_burst');
  });
}
