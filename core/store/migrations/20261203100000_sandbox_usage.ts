import type { Knex } from 'knex';

// Issue 17: per-sandbox usage samples, taken by the host agents and carried by their heartbeats
// (core/services/usage.ts). No foreign key to sandboxes: a deleted sandbox's samples stay
// readable until retention removes them with the rest. Numbers are float8 (exact for integers
// up to 2^53, and read back as numbers rather than the strings bigint columns give).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('sandbox_usage', (t) => {
    t.text('sandbox_id').notNullable();
    t.text('organization_id').notNullable();
    t.text('host_id').notNullable();
    t.timestamp('sampled_at', { useTz: true }).notNullable();
    // Null = the driver could not know it (e.g. memory inside a microVM).
    t.double('cpu_used_pct');
    t.double('cpu_count').notNullable();
    t.double('mem_used');
    t.double('mem_cache');
    t.double('mem_total');
    t.double('disk_used');
    t.double('disk_total');
    t.double('net_rx');
    t.double('net_tx');
    // A heartbeat retried after a lost answer carries the same samples again: kept once.
    t.primary(['sandbox_id', 'sampled_at']);
    t.index(['sampled_at']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('sandbox_usage');
}
