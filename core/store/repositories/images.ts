import type { DbOrTx } from '../db.js';
import type { BuildError, BuildOptions, BuildState, Image, ImageBuild, ImageConfig, ImageSource, BuildLogLine } from '../../images/types.js';
import type { BuildSpec } from '../../images/build-spec.js';
import { deleteCounted } from './rows-deleted.js';

// PGlite returns jsonb already parsed; pg too. A string means a driver returned raw text.
const json = <T>(v: unknown): T => (typeof v === 'string' ? (JSON.parse(v) as T) : (v as T));
const date = (v: Date | string | null): Date | null => (v === null ? null : v instanceof Date ? v : new Date(v));

interface ImageRow {
  id: string;
  organization_id: string;
  name: string;
  state: string;
  host_id: string | null;
  base: string;
  snapshot_id: string | null;
  config: unknown;
  source: unknown;
  build_id: string | null;
  size_bytes: string | number | null;
  created_at: Date | string;
  deleted_at: Date | string | null;
}

const imageFromRow = (r: ImageRow, tags: string[]): Image => ({
  id: r.id,
  organizationId: r.organization_id,
  name: r.name,
  tags,
  state: r.state as Image['state'],
  hostId: r.host_id,
  base: r.base,
  snapshotId: r.snapshot_id,
  config: json<ImageConfig>(r.config),
  source: json<ImageSource>(r.source),
  buildId: r.build_id,
  sizeBytes: r.size_bytes === null ? null : Number(r.size_bytes),
  createdAt: date(r.created_at)!,
});

interface BuildRow {
  id: string;
  organization_id: string;
  name: string;
  tags: string[];
  state: string;
  spec: unknown;
  options: unknown;
  error: unknown;
  image_id: string | null;
  host_id: string | null;
  owner_instance_id: string | null;
  cancel_requested: boolean;
  log_count: number;
  current_step: number | null;
  total_steps: number | null;
  created_at: Date | string;
  started_at: Date | string | null;
  finished_at: Date | string | null;
}

const buildFromRow = (r: BuildRow): ImageBuild => ({
  id: r.id,
  organizationId: r.organization_id,
  name: r.name,
  tags: r.tags,
  state: r.state as BuildState,
  spec: json<BuildSpec>(r.spec),
  options: json<BuildOptions>(r.options),
  error: r.error ? json<BuildError>(r.error) : null,
  imageId: r.image_id,
  hostId: r.host_id,
  ownerInstanceId: r.owner_instance_id,
  cancelRequested: r.cancel_requested,
  logCount: r.log_count,
  currentStep: r.current_step,
  totalSteps: r.total_steps,
  createdAt: date(r.created_at)!,
  startedAt: date(r.started_at),
  finishedAt: date(r.finished_at),
});

export interface CacheEntry {
  key: string;
  base: string;
  snapshotId: string | null;
  config: ImageConfig;
}

export function imageRepository(db: DbOrTx) {
  const tagsOf = async (imageIds: string[]): Promise<Map<string, string[]>> => {
    const map = new Map<string, string[]>();
    if (!imageIds.length) return map;
    const rows = (await db('image_tags').whereIn('image_id', imageIds).orderBy('created_at', 'asc').select('image_id', 'tag')) as { image_id: string; tag: string }[];
    for (const r of rows) map.set(r.image_id, [...(map.get(r.image_id) ?? []), r.tag]);
    return map;
  };
  const withTags = async (rows: ImageRow[]): Promise<Image[]> => {
    const tags = await tagsOf(rows.map((r) => r.id));
    return rows.map((r) => imageFromRow(r, tags.get(r.id) ?? []));
  };

  return {
    async insert(i: Omit<Image, 'tags' | 'createdAt' | 'state'>): Promise<void> {
      await db('images').insert({
        id: i.id,
        organization_id: i.organizationId,
        name: i.name,
        state: 'ready',
        host_id: i.hostId,
        base: i.base,
        snapshot_id: i.snapshotId,
        config: JSON.stringify(i.config),
        source: JSON.stringify(i.source),
        build_id: i.buildId,
        size_bytes: i.sizeBytes,
        created_at: new Date(),
      });
    },
    async findById(organizationId: string, id: string): Promise<Image | undefined> {
      const row = (await db('images').where({ id, organization_id: organizationId }).whereNull('deleted_at').first()) as ImageRow | undefined;
      return row ? (await withTags([row]))[0] : undefined;
    },
    async findByTag(organizationId: string, name: string, tag: string): Promise<Image | undefined> {
      const row = (await db('images as i')
        .join('image_tags as t', 't.image_id', 'i.id')
        .where({ 't.organization_id': organizationId, 't.name': name, 't.tag': tag })
        .whereNull('i.deleted_at')
        .first('i.*')) as ImageRow | undefined;
      return row ? (await withTags([row]))[0] : undefined;
    },
    /** Tagged images, newest first; `includeUntagged` adds those no tag points at any more. */
    async list(organizationId: string, options: { name?: string; includeUntagged?: boolean; limit: number; before?: { createdAt: Date; id: string } }): Promise<Image[]> {
      const q = db('images as i').where({ 'i.organization_id': organizationId }).whereNull('i.deleted_at').orderBy([{ column: 'i.created_at', order: 'desc' }, { column: 'i.id', order: 'desc' }]).limit(options.limit);
      if (options.name) q.andWhere('i.name', options.name);
      if (!options.includeUntagged) q.whereExists(db('image_tags as t').whereRaw('t.image_id = i.id'));
      if (options.before) q.andWhere((w) => w.where('i.created_at', '<', options.before!.createdAt).orWhere((x) => x.where('i.created_at', '=', options.before!.createdAt).andWhere('i.id', '<', options.before!.id)));
      return withTags((await q.select('i.*')) as ImageRow[]);
    },
    /** Points `name:tag` at the image; answers the image it pointed at before (if another). */
    async setTag(organizationId: string, name: string, tag: string, imageId: string): Promise<string | undefined> {
      const previous = (await db('image_tags').where({ organization_id: organizationId, name, tag }).forUpdate().first('image_id')) as { image_id: string } | undefined;
      if (previous) await db('image_tags').where({ organization_id: organizationId, name, tag }).update({ image_id: imageId, created_at: new Date() });
      else await db('image_tags').insert({ organization_id: organizationId, name, tag, image_id: imageId, created_at: new Date() });
      return previous && previous.image_id !== imageId ? previous.image_id : undefined;
    },
    async removeTag(organizationId: string, name: string, tag: string): Promise<boolean> {
      return (await deleteCounted(db('image_tags').where({ organization_id: organizationId, name, tag }), 'tag')) > 0;
    },
    async tagCount(imageId: string): Promise<number> {
      const [{ count }] = (await db('image_tags').where({ image_id: imageId }).count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      return Number(count);
    },
    async tagsOfName(organizationId: string, name: string): Promise<{ tag: string; imageId: string; buildId: string | null; createdAt: Date }[]> {
      const rows = (await db('image_tags as t').join('images as i', 'i.id', 't.image_id').where({ 't.organization_id': organizationId, 't.name': name }).orderBy('t.created_at', 'asc').select('t.tag', 't.image_id', 'i.build_id', 't.created_at')) as { tag: string; image_id: string; build_id: string | null; created_at: Date | string }[];
      return rows.map((r) => ({ tag: r.tag, imageId: r.image_id, buildId: r.build_id, createdAt: date(r.created_at)! }));
    },
    /** Sandboxes (not deleted) created from the image. */
    async sandboxesUsing(imageId: string): Promise<number> {
      const [{ count }] = (await db('sandboxes').where({ image_id: imageId }).whereNot({ state: 'deleted' }).count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      return Number(count);
    },
    /** Images not deleted, no tag pointing at them, no sandbox using them. */
    async unreferenced(limit: number): Promise<Image[]> {
      const rows = (await db('images as i')
        .whereNull('i.deleted_at')
        .whereNotExists(db('image_tags as t').whereRaw('t.image_id = i.id'))
        .whereNotExists(db('sandboxes as s').whereRaw('s.image_id = i.id').whereNot('s.state', 'deleted'))
        .limit(limit)
        .select('i.*')) as ImageRow[];
      return withTags(rows);
    },
    async markDeleted(id: string): Promise<void> {
      await db('images').where({ id }).update({ state: 'deleting', deleted_at: new Date() });
    },
    /** Live images and cached steps on this host that start from `base` (an OCI image id). */
    async usersOfBase(hostId: string, base: string): Promise<number> {
      const [{ count: images }] = (await db('images').where({ host_id: hostId, base }).whereNull('deleted_at').count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      const [{ count: cached }] = (await db('image_build_cache').where({ host_id: hostId, base }).count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      return Number(images) + Number(cached);
    },
    async liveImagesOnSnapshot(snapshotId: string): Promise<number> {
      const [{ count }] = (await db('images').where({ snapshot_id: snapshotId }).whereNull('deleted_at').count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      return Number(count);
    },
  };
}

export function buildRepository(db: DbOrTx) {
  return {
    async insert(b: { id: string; organizationId: string; name: string; tags: string[]; spec: BuildSpec; options: BuildOptions; ownerInstanceId: string; totalSteps: number }): Promise<ImageBuild> {
      const [row] = await db('image_builds')
        .insert({
          id: b.id,
          organization_id: b.organizationId,
          name: b.name,
          tags: b.tags,
          state: 'queued',
          spec: JSON.stringify(b.spec),
          options: JSON.stringify(b.options),
          owner_instance_id: b.ownerInstanceId,
          total_steps: b.totalSteps,
          created_at: new Date(),
        })
        .returning('*');
      return buildFromRow(row as BuildRow);
    },
    async findById(organizationId: string, id: string): Promise<ImageBuild | undefined> {
      const row = (await db('image_builds').where({ id, organization_id: organizationId }).first()) as BuildRow | undefined;
      return row ? buildFromRow(row) : undefined;
    },
    async list(organizationId: string, options: { limit: number; name?: string; states?: BuildState[] }): Promise<ImageBuild[]> {
      const q = db('image_builds').where({ organization_id: organizationId }).orderBy([{ column: 'created_at', order: 'desc' }, { column: 'id', order: 'desc' }]).limit(options.limit);
      if (options.name) q.andWhere({ name: options.name });
      if (options.states?.length) q.whereIn('state', options.states);
      return ((await q) as BuildRow[]).map(buildFromRow);
    },
    /** Compare-and-set on the state: only one writer ends a build. */
    async transition(id: string, from: BuildState[], patch: Partial<{ state: BuildState; error: BuildError | null; imageId: string; hostId: string; startedAt: Date; finishedAt: Date; currentStep: number; ownerInstanceId: string }>): Promise<boolean> {
      const columns: Record<string, unknown> = {};
      if (patch.state !== undefined) columns.state = patch.state;
      if (patch.error !== undefined) columns.error = patch.error === null ? null : JSON.stringify(patch.error);
      if (patch.imageId !== undefined) columns.image_id = patch.imageId;
      if (patch.hostId !== undefined) columns.host_id = patch.hostId;
      if (patch.startedAt !== undefined) columns.started_at = patch.startedAt;
      if (patch.finishedAt !== undefined) columns.finished_at = patch.finishedAt;
      if (patch.currentStep !== undefined) columns.current_step = patch.currentStep;
      if (patch.ownerInstanceId !== undefined) columns.owner_instance_id = patch.ownerInstanceId;
      return (await db('image_builds').where({ id }).whereIn('state', from).update(columns)) > 0;
    },
    async requestCancel(id: string): Promise<void> {
      await db('image_builds').where({ id }).update({ cancel_requested: true });
    },
    async cancelRequested(id: string): Promise<boolean> {
      const row = (await db('image_builds').where({ id }).first('cancel_requested')) as { cancel_requested: boolean } | undefined;
      return row?.cancel_requested ?? false;
    },
    /** Queued or running builds whose owner instance has not heartbeaten since `staleBefore`. */
    /** Builds whose instance has not heartbeated for `instanceTimeoutMs`, by the database's clock (as every liveness check). */
    async orphaned(instanceTimeoutMs: number): Promise<ImageBuild[]> {
      const rows = (await db('image_builds as b')
        .whereIn('b.state', ['queued', 'running'])
        .whereNotExists(db('control_plane_instances as c').whereRaw('c.id = b.owner_instance_id').andWhereRaw('c.last_seen_at >= now() - make_interval(secs => ?)', [instanceTimeoutMs / 1000]))
        .select('b.*')) as BuildRow[];
      return rows.map(buildFromRow);
    },
    /** Appends lines in order; answers the new count. Lines past `maxLines` are dropped (one note says so). */
    async appendLogs(id: string, lines: Omit<BuildLogLine, 'offset'>[], maxLines: number): Promise<number> {
      return db.transaction(async (tx) => {
        const row = (await tx('image_builds').where({ id }).forUpdate().first('log_count')) as { log_count: number } | undefined;
        if (!row) return 0;
        let count = row.log_count;
        const rows: Record<string, unknown>[] = [];
        for (const line of lines) {
          if (count > maxLines) break;
          const text = count === maxLines ? `… log truncated at ${maxLines} lines (the build goes on)` : line.text;
          rows.push({ build_id: id, seq: count, at: line.at, stream: count === maxLines ? 'system' : line.stream, text, step: line.step ?? null });
          count++;
        }
        if (rows.length) {
          await tx('image_build_logs').insert(rows);
          await tx('image_builds').where({ id }).update({ log_count: count });
        }
        return count;
      });
    },
    async logs(id: string, offset: number, limit: number): Promise<BuildLogLine[]> {
      const rows = (await db('image_build_logs').where({ build_id: id }).andWhere('seq', '>=', offset).orderBy('seq', 'asc').limit(limit)) as { seq: number; at: Date | string; stream: string; text: string; step: number | null }[];
      return rows.map((r) => ({ offset: r.seq, at: date(r.at)!, stream: r.stream as BuildLogLine['stream'], text: r.text, step: r.step ?? undefined }));
    },
  };
}

export function buildCacheRepository(db: DbOrTx) {
  return {
    async get(organizationId: string, hostId: string, key: string): Promise<CacheEntry | undefined> {
      const row = (await db('image_build_cache').where({ organization_id: organizationId, host_id: hostId, key }).first()) as { key: string; base: string; snapshot_id: string | null; config: unknown } | undefined;
      if (!row) return undefined;
      await db('image_build_cache').where({ organization_id: organizationId, host_id: hostId, key }).update({ last_used_at: new Date() });
      return { key: row.key, base: row.base, snapshotId: row.snapshot_id, config: json<ImageConfig>(row.config) };
    },
    async put(organizationId: string, hostId: string, entry: CacheEntry): Promise<void> {
      await db('image_build_cache')
        .insert({ organization_id: organizationId, host_id: hostId, key: entry.key, base: entry.base, snapshot_id: entry.snapshotId, config: JSON.stringify(entry.config), created_at: new Date(), last_used_at: new Date() })
        .onConflict(['organization_id', 'host_id', 'key'])
        .merge(['base', 'snapshot_id', 'config', 'last_used_at']);
    },
    /** Entries not used since `before`, oldest first. */
    async stale(before: Date, limit: number): Promise<{ organizationId: string; hostId: string; key: string; base: string; snapshotId: string | null }[]> {
      const rows = (await db('image_build_cache').where('last_used_at', '<', before).orderBy('last_used_at', 'asc').limit(limit)) as { organization_id: string; host_id: string; key: string; base: string; snapshot_id: string | null }[];
      return rows.map((r) => ({ organizationId: r.organization_id, hostId: r.host_id, key: r.key, base: r.base, snapshotId: r.snapshot_id }));
    },
    async remove(organizationId: string, hostId: string, key: string): Promise<void> {
      await db('image_build_cache').where({ organization_id: organizationId, host_id: hostId, key }).delete();
    },
    async entriesOnSnapshot(snapshotId: string): Promise<number> {
      const [{ count }] = (await db('image_build_cache').where({ snapshot_id: snapshotId }).count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      return Number(count);
    },
  };
}
