import type { Knex } from 'knex';

// Issue 19, persistent named volumes. Additive: replicas of the release before ignore both.
//  - volumes: one row per volume of an organisation; its data lives on `host_id` (one ext4
//    image there, host/storage/volumes.ts). The name is unique per organisation among volumes
//    not deleted (a partial unique index), so a deleted volume's name can be used again.
//  - sandboxes.volume_mounts: the mounts a sandbox was created with ([{volumeId, name,
//    mountPath, readOnly, subpath?}]), sent to its host at every start; a volume cannot be
//    deleted while a sandbox that is not deleted names it.
//  - keys holding snapshots:read / snapshots:write get volumes:read / volumes:write, so keys
//    made before volumes can use them as the presets made now do.
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('volumes', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable();
    t.text('name').notNullable();
    t.text('host_id').notNullable();
    t.bigInteger('size_bytes').notNullable();
    t.text('state').notNullable();
    t.text('error_message');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('updated_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_used_at', { useTz: true });
    t.timestamp('deleted_at', { useTz: true });
    t.index(['organization_id']);
  });
  await knex.raw('CREATE UNIQUE INDEX volumes_live_name ON volumes (organization_id, name) WHERE deleted_at IS NULL');
  await knex.schema.alterTable('sandboxes', (t) => {
    t.jsonb('volume_mounts');
  });
  await knex.raw(`UPDATE api_keys SET scopes = scopes || '["volumes:read"]'::jsonb WHERE scopes @> '["snapshots:read"]'::jsonb AND NOT scopes @> '["volumes:read"]'::jsonb`);
  await knex.raw(`UPDATE api_keys SET scopes = scopes || '["volumes:write"]'::jsonb WHERE scopes @> '["snapshots:write"]'::jsonb AND NOT scopes @> '["volumes:write"]'::jsonb`);
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropColumn('volume_mounts');
  });
  await knex.schema.dropTable('volumes');
}
