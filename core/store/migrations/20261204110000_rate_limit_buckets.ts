import type { Knex } from 'knex';

// Issue 16: request rate limits (core/services/rate-limits.ts). One row per token bucket
// (`key:<api key id>`, `org:<organisation id>`), shared by every control-plane replica. The
// bucket's size and refill rate are not stored: each lease passes the limits that apply now, so a
// changed setting (or a per-organisation override) takes effect at the next lease without a
// migration of rows. `refreshed_at` is the database's clock, never a replica's. `granted` is what
// the last lease took, written in the same UPDATE so that RETURNING can report it (RETURNING sees
// only the new row). No foreign keys: a bucket of a revoked key is a few bytes, and it must not
// make deleting a key or an organisation wait on this table's locks.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('rate_limit_buckets', (t) => {
    t.text('id').primary();
    t.double('tokens').notNullable();
    t.integer('granted').notNullable().defaultTo(0);
    t.timestamp('refreshed_at', { useTz: true }).notNullable();
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('rate_limit_buckets');
}
