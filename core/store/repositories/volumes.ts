import type { DbOrTx } from '../db.js';
import type { Volume } from '../../types.js';

interface VolumeRow {
  id: string;
  organization_id: string;
  name: string;
  host_id: string;
  size_bytes: string | number;
  state: string;
  error_message: string | null;
  created_at: Date | string;
  updated_at: Date | string;
  last_used_at: Date | string | null;
  deleted_at: Date | string | null;
}

const date = (v: Date | string | null) => (v === null ? null : new Date(v));

const fromRow = (r: VolumeRow): Volume => ({
  id: r.id,
  organizationId: r.organization_id,
  name: r.name,
  hostId: r.host_id,
  sizeBytes: Number(r.size_bytes),
  state: r.state as Volume['state'],
  errorMessage: r.error_message,
  createdAt: new Date(r.created_at),
  updatedAt: new Date(r.updated_at),
  lastUsedAt: date(r.last_used_at),
  deletedAt: date(r.deleted_at),
});

export function volumeRepository(db: DbOrTx) {
  return {
    async insertCreating(v: { id: string; organizationId: string; name: string; hostId: string; sizeBytes: number }): Promise<Volume> {
      const now = new Date();
      const [row] = await db<VolumeRow>('volumes')
        .insert({ id: v.id, organization_id: v.organizationId, name: v.name, host_id: v.hostId, size_bytes: v.sizeBytes, state: 'creating', created_at: now, updated_at: now })
        .returning('*');
      return fromRow(row as VolumeRow);
    },
    /** Live (not deleted) volumes of the organisation, newest first. */
    async listLive(organizationId: string): Promise<Volume[]> {
      const rows = await db<VolumeRow>('volumes').where({ organization_id: organizationId }).whereNull('deleted_at').orderBy('created_at', 'desc');
      return (rows as VolumeRow[]).map(fromRow);
    },
    async findLive(organizationId: string, id: string): Promise<Volume | undefined> {
      const row = await db<VolumeRow>('volumes').where({ organization_id: organizationId, id }).whereNull('deleted_at').first();
      return row ? fromRow(row as VolumeRow) : undefined;
    },
    async findLiveByName(organizationId: string, name: string): Promise<Volume | undefined> {
      const row = await db<VolumeRow>('volumes').where({ organization_id: organizationId, name }).whereNull('deleted_at').first();
      return row ? fromRow(row as VolumeRow) : undefined;
    },
    /** Row locks: FOR UPDATE (a delete) or FOR SHARE (a sandbox create mounting it). */
    async lock(organizationId: string, ids: string[], mode: 'update' | 'share'): Promise<Volume[]> {
      const q = db<VolumeRow>('volumes').where({ organization_id: organizationId }).whereIn('id', ids).whereNull('deleted_at');
      const rows = mode === 'update' ? await q.forUpdate() : await q.forShare();
      return (rows as VolumeRow[]).map(fromRow);
    },
    async update(id: string, patch: Partial<{ state: Volume['state']; errorMessage: string | null; deletedAt: Date; lastUsedAt: Date }>): Promise<Volume | undefined> {
      const columns: Record<string, unknown> = { updated_at: new Date() };
      if (patch.state !== undefined) columns.state = patch.state;
      if (patch.errorMessage !== undefined) columns.error_message = patch.errorMessage;
      if (patch.deletedAt !== undefined) columns.deleted_at = patch.deletedAt;
      if (patch.lastUsedAt !== undefined) columns.last_used_at = patch.lastUsedAt;
      const [row] = await db<VolumeRow>('volumes').where({ id }).update(columns).returning('*');
      return row ? fromRow(row as VolumeRow) : undefined;
    },
    /** Count and total size of the organisation's live volumes (its limits). */
    async usageOf(organizationId: string): Promise<{ count: number; bytes: number }> {
      const [row] = (await db('volumes').where({ organization_id: organizationId }).whereNull('deleted_at').select(db.raw('count(*) as n'), db.raw('coalesce(sum(size_bytes), 0) as bytes'))) as { n: string | number; bytes: string | number }[];
      return { count: Number(row.n), bytes: Number(row.bytes) };
    },
    /** Sandboxes that are not deleted and mount the volume. */
    async mountedBy(volumeId: string): Promise<string[]> {
      const rows = (await db('sandboxes')
        .whereNot({ state: 'deleted' })
        .whereRaw('volume_mounts @> ?::jsonb', [JSON.stringify([{ volumeId }])])
        .select('id')) as { id: string }[];
      return rows.map((r) => r.id);
    },
  };
}

/** What a volume token is checked against: its key (revoked or not) and its organisation. */
export async function volumeTokenKey(db: DbOrTx, keyId: string): Promise<{ organizationId: string; preset: string; scopes: unknown; revoked: boolean; organizationSuspended: boolean } | undefined> {
  const row = (await db('api_keys as k')
    .join('organizations as o', 'o.id', 'k.organization_id')
    .where('k.id', keyId)
    .first('k.organization_id', 'k.preset', 'k.scopes', 'k.revoked_at', 'o.suspended_at')) as
    | { organization_id: string; preset: string; scopes: unknown; revoked_at: Date | null; suspended_at: Date | null }
    | undefined;
  if (!row) return undefined;
  return { organizationId: row.organization_id, preset: row.preset, scopes: typeof row.scopes === 'string' ? JSON.parse(row.scopes) : row.scopes, revoked: row.revoked_at !== null, organizationSuspended: row.suspended_at !== null };
}
