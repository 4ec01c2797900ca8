import type { Knex } from 'knex';

// Issue 14: images, their tags, builds with their logs, and the build layer cache.
//
// An image row is immutable once ready (like an OCI digest): what a sandbox starts from is its
// base (`default` or a pulled OCI image id, on its host) plus an optional snapshot holding the
// layers its build wrote, plus the config processes start with. Names point at images through
// tags, so a rebuild moves `name:tag` to a new row and the old one stays for the sandboxes that
// use it until nothing does (then the collector removes it).
export async function up(knex: Knex): Promise<void> {
  await knex.schema.createTable('images', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('name').notNullable();
    t.text('state').notNullable(); // ready | deleting
    t.text('host_id').references('hosts.id');
    // `default` or `sha256:<hex>` of the host's OCI store: HostSandboxSpec.image.
    t.text('base').notNullable();
    // The top of the layer chain the build wrote (a `layer` snapshot); null: the base alone.
    t.text('snapshot_id');
    t.jsonb('config').notNullable();
    t.jsonb('source').notNullable();
    t.text('build_id');
    t.bigInteger('size_bytes');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('deleted_at', { useTz: true });
    t.index(['organization_id', 'created_at']);
    t.index(['snapshot_id']);
  });

  await knex.schema.createTable('image_tags', (t) => {
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('name').notNullable();
    t.text('tag').notNullable();
    t.text('image_id').notNullable().references('images.id');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['organization_id', 'name', 'tag']);
    t.index(['image_id']);
  });

  await knex.schema.createTable('image_builds', (t) => {
    t.text('id').primary();
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('name').notNullable();
    t.specificType('tags', 'text[]').notNullable();
    // queued | running | succeeded | failed | cancelled
    t.text('state').notNullable();
    t.jsonb('spec').notNullable();
    t.jsonb('options').notNullable();
    t.jsonb('error');
    t.text('image_id');
    t.text('host_id');
    // The control-plane instance running it; a build whose instance stopped heartbeating is failed.
    t.text('owner_instance_id');
    t.boolean('cancel_requested').notNullable().defaultTo(false);
    t.integer('log_count').notNullable().defaultTo(0);
    // Which step runs now (1-based over all stages), for status answers.
    t.integer('current_step');
    t.integer('total_steps');
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('started_at', { useTz: true });
    t.timestamp('finished_at', { useTz: true });
    t.index(['organization_id', 'created_at']);
    t.index(['state']);
  });

  await knex.schema.createTable('image_build_logs', (t) => {
    t.text('build_id').notNullable().references('image_builds.id').onDelete('CASCADE');
    t.integer('seq').notNullable();
    t.timestamp('at', { useTz: true }).notNullable();
    t.text('stream').notNullable(); // system | stdout | stderr
    t.text('text').notNullable();
    t.integer('step');
    t.primary(['build_id', 'seq']);
  });

  // A step's result, keyed by (its parent's key, the instruction, its inputs): the snapshot
  // holding the tree after it (null: the base alone) and the config. Per organisation and host,
  // since a snapshot lives on one host and no organisation may see another's layers.
  await knex.schema.createTable('image_build_cache', (t) => {
    t.text('organization_id').notNullable().references('organizations.id').onDelete('CASCADE');
    t.text('host_id').notNullable();
    t.text('key').notNullable();
    t.text('base').notNullable();
    t.text('snapshot_id');
    t.jsonb('config').notNullable();
    t.timestamp('created_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.timestamp('last_used_at', { useTz: true }).notNullable().defaultTo(knex.fn.now());
    t.primary(['organization_id', 'host_id', 'key']);
    t.index(['snapshot_id']);
  });

  // `snapshot`: a user's named snapshot; `layer`: a build's layer (hidden from snapshot lists).
  await knex.schema.alterTable('snapshots', (t) => {
    t.text('kind').notNullable().defaultTo('snapshot');
  });
  // `user`: everything a user made; `build`: a build's sandbox (hidden from sandbox lists).
  // host_image: what the host starts it from when that is not `image` (an image's base).
  await knex.schema.alterTable('sandboxes', (t) => {
    t.text('kind').notNullable().defaultTo('user');
    t.text('image_id');
    t.text('host_image');
    t.index(['image_id']);
  });
}

export async function down(knex: Knex): Promise<void> {
  await knex.schema.alterTable('sandboxes', (t) => {
    t.dropIndex(['image_id']);
    t.dropColumn('kind');
    t.dropColumn('image_id');
    t.dropColumn('host_image');
  });
  await knex.schema.alterTable('snapshots', (t) => {
    t.dropColumn('kind');
  });
  await knex.schema.dropTable('image_build_cache');
  await knex.schema.dropTable('image_build_logs');
  await knex.schema.dropTable('image_builds');
  await knex.schema.dropTable('image_tags');
  await knex.schema.dropTable('images');
}
