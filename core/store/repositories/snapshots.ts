import type { DbOrTx } from '../db.js';
import type { Snapshot } from '../../types.js';

interface SnapshotRow {
  id: string;
  organization_id: string;
  name: string;
  host_id: string;
  source_sandbox_id: string | null;
  parent_snapshot_id: string | null;
  state: string;
  size_bytes: string | number | null;
  error_message: string | null;
  created_at: Date | string;
  deleted_at: Date | string | null;
  kind: string | null;
}

const fromRow = (r: SnapshotRow): Snapshot => ({
  id: r.id,
  organizationId: r.organization_id,
  name: r.name,
  hostId: r.host_id,
  sourceSandboxId: r.source_sandbox_id,
  parentSnapshotId: r.parent_snapshot_id,
  state: r.state as Snapshot['state'],
  sizeBytes: r.size_bytes === null ? null : Number(r.size_bytes),
  errorMessage: r.error_message,
  createdAt: new Date(r.created_at),
  deletedAt: r.deleted_at === null ? null : new Date(r.deleted_at),
  kind: r.kind === 'layer' ? 'layer' : 'snapshot',
});

export function snapshotRepository(db: DbOrTx) {
  return {
    async insertCreating(s: { id: string; organizationId: string; name: string; hostId: string; sourceSandboxId: string; parentSnapshotId: string | null; kind?: Snapshot['kind'] }): Promise<Snapshot> {
      const [row] = await db<SnapshotRow>('snapshots')
        .insert({
          id: s.id,
          organization_id: s.organizationId,
          name: s.name,
          host_id: s.hostId,
          source_sandbox_id: s.sourceSandboxId,
          parent_snapshot_id: s.parentSnapshotId,
          state: 'creating',
          kind: s.kind ?? 'snapshot',
        })
        .returning('*');
      return fromRow(row as SnapshotRow);
    },
    async findLiveByName(organizationId: string, name: string): Promise<Snapshot | undefined> {
      // Layers of image builds are not snapshots a user can name (their names are their ids).
      const row = await db<SnapshotRow>('snapshots').where({ organization_id: organizationId, name, kind: 'snapshot' }).whereNull('deleted_at').first();
      return row ? fromRow(row as SnapshotRow) : undefined;
    },
    /** Deleted ones too (a layer chain is walked through them). */
    async findById(id: string): Promise<Snapshot | undefined> {
      const row = await db<SnapshotRow>('snapshots').where({ id }).first();
      return row ? fromRow(row as SnapshotRow) : undefined;
    },
    async listLive(organizationId: string): Promise<Snapshot[]> {
      const rows = await db<SnapshotRow>('snapshots').where({ organization_id: organizationId, kind: 'snapshot' }).whereNull('deleted_at').orderBy('created_at', 'desc');
      return (rows as SnapshotRow[]).map(fromRow);
    },
    async update(id: string, patch: Partial<{ state: Snapshot['state']; sizeBytes: number; errorMessage: string | null; deletedAt: Date }>): Promise<Snapshot | undefined> {
      const columns: Record<string, unknown> = {};
      if (patch.state !== undefined) columns.state = patch.state;
      if (patch.sizeBytes !== undefined) columns.size_bytes = patch.sizeBytes;
      if (patch.errorMessage !== undefined) columns.error_message = patch.errorMessage;
      if (patch.deletedAt !== undefined) columns.deleted_at = patch.deletedAt;
      const [row] = await db<SnapshotRow>('snapshots').where({ id }).update(columns).returning('*');
      return row ? fromRow(row as SnapshotRow) : undefined;
    },
    /** Compare-and-set on the state, so two deletes (or a delete and a create-from) cannot both win. */
    async transition(id: string, from: Snapshot['state'], to: Snapshot['state']): Promise<boolean> {
      return (await db('snapshots').where({ id, state: from }).whereNull('deleted_at').update({ state: to })) > 0;
    },
    async countChildren(id: string): Promise<number> {
      const [{ count }] = (await db('snapshots').count<{ count: string | number }[]>('* as count').where({ parent_snapshot_id: id }).whereNull('deleted_at')) as { count: string | number }[];
      return Number(count);
    },
  };
}
