import type { Knex } from 'knex';

// Issue 17: a webhook's signing scheme. `standard` (Standard Webhooks: webhook-id, -timestamp,
// -signature over id.timestamp.body) is what the native API creates; `e2b` is E2B's lifecycle
// webhooks (compat/e2b/events.ts): `e2b-signature` over secret + body, E2B's body shape, and a
// signing secret the client chose (kept encrypted in secret_encrypted like the generated ones).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.alterTable('webhooks', (t) => {
    t.text('signing_scheme').notNullable().defaultTo('standard');
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('webhooks', (t) => {
    t.dropColumn('signing_scheme');
  });
}
