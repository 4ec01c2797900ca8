import type { Knex } from 'knex';

// Issue 11 finding 6: quotas. `disk_gib` is the size of the sandbox's own disk (its writable
// layer); NULL for sandboxes created before disk quotas, whose disk has no limit of its own.
// The index serves the per-organisation usage sum taken under the organisation's row lock at
// every create, fork and resume.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.integer('disk_gib');
  });
  await knex.raw(`CREATE INDEX sandboxes_org_active ON sandboxes (organization_id) WHERE state NOT IN ('stopped', 'deleted')`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX IF EXISTS sandboxes_org_active');
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropColumn('disk_gib');
  });
}
