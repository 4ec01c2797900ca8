import type { Knex } from 'knex';

// Issue 6: per-sandbox egress policy and hosted ports.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    // {mode, allow?}; null = allow all (every sandbox made before this column existed).
    t.jsonb('egress');
  });

  await knex.schema.createTable('ports', (t) => {
    t.text('sandbox_id').notNullable().references('sandboxes.id').onDelete('CASCADE');
    t.integer('port').notNullable();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.boolean('public').notNullable().defaultTo(false);
    // SHA-256 of the private port's token (the token itself is shown once); null when public.
    t.text('token_hash');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['sandbox_id', 'port']);
    t.index(['organization_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('ports');
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropColumn('egress');
  });
}
