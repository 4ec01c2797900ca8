import type { Knex } from 'knex';

// Issue 4: sandbox names. Daytona addresses a sandbox by id or by name, so a name is unique per
// organisation among sandboxes that still exist; a deleted sandbox's name can be reused.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.text('name');
  });
  await knex.raw(`CREATE UNIQUE INDEX sandboxes_org_name_live ON sandboxes (organization_id, name) WHERE state <> 'deleted' AND name IS NOT NULL`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw('DROP INDEX IF EXISTS sandboxes_org_name_live');
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropColumn('name');
  });
}
