import type { Knex } from 'knex';

// Issue 17: durable lifecycle events, webhooks and their deliveries.
//
// `seq` orders events (the listing cursor, sandbox logs) and deliveries (per-webhook send order);
// ids are what clients see. Deliveries are inserted in the transaction that inserts their event,
// so an event is never committed without the deliveries it owes (and a rolled-back state write
// leaves neither).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('sandbox_events', (t) => {
    t.bigIncrements('seq').primary();
    t.text('id').notNullable().unique();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    // No foreign key: an event outlives the sandbox row it is about (deleted rows are purged).
    t.text('sandbox_id').notNullable();
    t.text('type').notNullable();
    t.text('old_state');
    t.text('new_state').notNullable();
    t.text('operation');
    t.text('reason');
    t.jsonb('details').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['organization_id', 'seq']);
    t.index(['sandbox_id', 'seq']);
    t.index(['created_at']);
  });

  await knex.schema.createTable('webhooks', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('url').notNullable();
    // Empty: every event type.
    t.specificType('event_types', 'text[]').notNullable();
    t.boolean('enabled').notNullable().defaultTo(true);
    t.text('description').notNullable().defaultTo('');
    // AES-256-GCM under a key derived from the host secret (never returned after create/rotate).
    t.text('secret_encrypted').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.index(['organization_id']);
  });

  await knex.schema.createTable('webhook_deliveries', (t) => {
    t.bigIncrements('seq').primary();
    t.text('id').notNullable().unique();
    t.text('webhook_id').notNullable().references('webhooks.id').onDelete('CASCADE');
    t.text('organization_id').notNullable();
    // The webhook-id header: the event id (receivers dedupe on it), or a ping's own id.
    t.text('message_id').notNullable();
    t.text('event_id').references('sandbox_events.id').onDelete('CASCADE');
    t.text('event_type').notNullable();
    t.jsonb('payload').notNullable();
    // pending (waiting for or in an attempt) | delivered | failed
    t.text('status').notNullable();
    t.integer('attempts').notNullable().defaultTo(0);
    t.timestamp('next_attempt_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    // Set while one replica sends an attempt; an attempt whose lease ran out (its process died) is sent again.
    t.timestamp('lease_until', { useTz: true });
    t.text('last_error');
    t.integer('response_status');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_attempt_at', { useTz: true });
    t.timestamp('delivered_at', { useTz: true });
    t.index(['webhook_id', 'seq']);
    t.index(['status', 'next_attempt_at']);
    t.index(['event_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.dropTable('webhook_deliveries');
  await knex.schema.dropTable('webhooks');
  await knex.schema.dropTable('sandbox_events');
}
