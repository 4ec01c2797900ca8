import type { Knex } from 'knex';

// Issue 16: organisations as tenants. Each organisation may carry its own limits (NULL = the
// server's default from NESTBOX_ORG_MAX_*, so changing a default reaches every organisation that
// never had its own), and may be suspended (its keys and credentials are refused, its sandboxes
// stopped). `usage_records` are the hourly rollups a billing system reads
// (core/services/usage-records.ts).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('organizations', (t) => {
    t.timestamp('suspended_at', { useTz: true });
    t.integer('max_sandboxes');
    t.integer('max_cpu');
    t.integer('max_memory_mib');
    t.integer('max_disk_gib');
    t.integer('max_snapshots');
    t.integer('max_images');
  });
  await knex.raw('CREATE UNIQUE INDEX organizations_name_unique ON organizations (name)');

  await knex.schema.createTable('usage_records', (t) => {
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.timestamp('hour_start', { useTz: true }).notNullable();
    // Seconds of sandboxes alive (sampled) in the hour, in total and per size:
    // [{ cpu, memoryMiB, sandboxSeconds, cpuSeconds }].
    t.double('sandbox_seconds').notNullable().defaultTo(0);
    t.jsonb('by_size').notNullable().defaultTo('[]');
    // CPU time actually used (the samples' share of the CPU limit × vCPUs × seconds).
    t.double('cpu_seconds').notNullable().defaultTo(0);
    // Storage held (sandbox disks, snapshots, images), integrated over the hour.
    t.double('storage_gib_hours').notNullable().defaultTo(0);
    // Storage is integrated up to here; the next pass adds the level it sees times the time since.
    t.timestamp('storage_accounted_until', { useTz: true }).notNullable();
    // Set once the hour is over (plus a grace for late heartbeats): the row never changes again.
    t.timestamp('closed_at', { useTz: true });
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['organization_id', 'hour_start']);
    t.index(['closed_at', 'hour_start']);
  });

  // The bootstrap key of the default organisation is the platform operator's (issue 16): keys
  // made before the `operator` preset existed were `admin`.
  await knex('api_keys')
    .where({ name: 'bootstrap', preset: 'admin' })
    .whereIn('organization_id', knex('organizations').select('id').where({ name: 'default' }))
    .update({ preset: 'operator', scopes: JSON.stringify(OPERATOR_SCOPES) });
}

export async function down(knex: Knex): Promise<void> {
  await knex('api_keys')
    .where({ name: 'bootstrap', preset: 'operator' })
    .whereIn('organization_id', knex('organizations').select('id').where({ name: 'default' }))
    .update({ preset: 'admin', scopes: JSON.stringify(ADMIN_SCOPES) });
  await knex.schema.dropTable('usage_records');
  await knex.raw('DROP INDEX IF EXISTS organizations_name_unique');
  await knex.schema.alterTable('organizations', (t) => {
    for (const c of ['suspended_at', 'max_sandboxes', 'max_cpu', 'max_memory_mib', 'max_disk_gib', 'max_snapshots', 'max_images']) t.dropColumn(c);
  });
}

// Written out, not imported: a migration keeps meaning what it meant when it was written.
const ADMIN_SCOPES = ['sandboxes:read', 'sandboxes:create', 'sandboxes:operate', 'sandboxes:delete', 'sandboxes:exec', 'files:read', 'files:write', 'snapshots:read', 'snapshots:write', 'images:read', 'images:write', 'keys:manage', 'webhooks:manage'];
const OPERATOR_SCOPES = [...ADMIN_SCOPES, 'platform:organizations', 'platform:hosts'];
