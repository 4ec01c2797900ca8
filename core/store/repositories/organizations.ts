import type { DbOrTx } from '../db.js';
import type { Organization, OrganizationLimitOverrides } from '../../types.js';

interface OrganizationRow {
  id: string;
  name: string;
  created_at: Date | string;
  suspended_at: Date | string | null;
  max_sandboxes: number | null;
  max_cpu: number | null;
  max_memory_mib: number | null;
  max_disk_gib: number | null;
  max_snapshots: number | null;
  max_images: number | null;
  requests_per_second: number | null;
  request_burst: number | null;
  key_requests_per_second: number | null;
  key_request_burst: number | null;
  max_volumes: number | null;
  max_volume_total_gib: number | null;
  max_volume_size_gib: number | null;
}

/** Limit field → column. */
export const LIMIT_COLUMNS: Record<keyof OrganizationLimitOverrides, keyof OrganizationRow> = {
  maxSandboxes: 'max_sandboxes',
  maxCpu: 'max_cpu',
  maxMemoryMiB: 'max_memory_mib',
  maxDiskGiB: 'max_disk_gib',
  maxSnapshots: 'max_snapshots',
  maxImages: 'max_images',
  requestsPerSecond: 'requests_per_second',
  requestBurst: 'request_burst',
  keyRequestsPerSecond: 'key_requests_per_second',
  keyRequestBurst: 'key_request_burst',
  maxVolumes: 'max_volumes',
  maxVolumeTotalGiB: 'max_volume_total_gib',
  maxVolumeSizeGiB: 'max_volume_size_gib',
};

const num = (v: number | string | null | undefined): number | null => (v === null || v === undefined ? null : Number(v));

const fromRow = (r: OrganizationRow): Organization => ({
  id: r.id,
  name: r.name,
  createdAt: new Date(r.created_at),
  suspendedAt: r.suspended_at ? new Date(r.suspended_at) : null,
  limits: {
    maxSandboxes: num(r.max_sandboxes),
    maxCpu: num(r.max_cpu),
    maxMemoryMiB: num(r.max_memory_mib),
    maxDiskGiB: num(r.max_disk_gib),
    maxSnapshots: num(r.max_snapshots),
    maxImages: num(r.max_images),
    requestsPerSecond: num(r.requests_per_second),
    requestBurst: num(r.request_burst),
    keyRequestsPerSecond: num(r.key_requests_per_second),
    keyRequestBurst: num(r.key_request_burst),
    maxVolumes: num(r.max_volumes),
    maxVolumeTotalGiB: num(r.max_volume_total_gib),
    maxVolumeSizeGiB: num(r.max_volume_size_gib),
  },
});

export interface OrganizationPatch {
  name?: string;
  suspendedAt?: Date | null;
  limits?: Partial<OrganizationLimitOverrides>;
}

export function organizationRepository(db: DbOrTx) {
  return {
    async insert(org: { id: string; name: string; limits?: Partial<OrganizationLimitOverrides> }): Promise<Organization> {
      const [row] = await db<OrganizationRow>('organizations').insert({ id: org.id, name: org.name, ...limitColumns(org.limits) }).returning('*');
      return fromRow(row as OrganizationRow);
    },
    async findById(id: string): Promise<Organization | undefined> {
      const row = await db<OrganizationRow>('organizations').where({ id }).first();
      return row ? fromRow(row as OrganizationRow) : undefined;
    },
    /**
     * The row, locked until the caller's transaction ends: every check of a limit against what
     * the organisation holds takes it first, so two concurrent creates cannot both pass on the
     * same spare capacity (and a limit changed meanwhile is seen).
     */
    async lockById(id: string): Promise<Organization | undefined> {
      const row = await db<OrganizationRow>('organizations').where({ id }).forUpdate().first();
      return row ? fromRow(row as OrganizationRow) : undefined;
    },
    async findByName(name: string): Promise<Organization | undefined> {
      const row = await db<OrganizationRow>('organizations').where({ name }).orderBy('created_at').first();
      return row ? fromRow(row as OrganizationRow) : undefined;
    },
    async list(options: { limit: number; after?: { createdAt: Date; id: string } }): Promise<Organization[]> {
      const q = db<OrganizationRow>('organizations').orderBy([{ column: 'created_at', order: 'asc' }, { column: 'id', order: 'asc' }]).limit(options.limit);
      if (options.after) {
        const { createdAt, id } = options.after;
        q.where((w) => w.where('created_at', '>', createdAt).orWhere((x) => x.where('created_at', '=', createdAt).where('id', '>', id)));
      }
      return ((await q) as OrganizationRow[]).map(fromRow);
    },
    async listIds(): Promise<string[]> {
      return ((await db('organizations').select('id').orderBy('id')) as { id: string }[]).map((r) => r.id);
    },
    async update(id: string, patch: OrganizationPatch): Promise<Organization | undefined> {
      const columns: Record<string, unknown> = { ...limitColumns(patch.limits) };
      if (patch.name !== undefined) columns.name = patch.name;
      if (patch.suspendedAt !== undefined) columns.suspended_at = patch.suspendedAt;
      if (Object.keys(columns).length === 0) return this.findById(id);
      const [row] = await db<OrganizationRow>('organizations').where({ id }).update(columns).returning('*');
      return row ? fromRow(row as OrganizationRow) : undefined;
    },
    async isSuspended(id: string): Promise<boolean> {
      const row = (await db('organizations').select('suspended_at').where({ id }).first()) as { suspended_at: Date | string | null } | undefined;
      return Boolean(row?.suspended_at);
    },
  };
}

function limitColumns(limits: Partial<OrganizationLimitOverrides> | undefined): Record<string, number | null> {
  const columns: Record<string, number | null> = {};
  for (const [field, column] of Object.entries(LIMIT_COLUMNS) as [keyof OrganizationLimitOverrides, string][]) {
    if (limits && limits[field] !== undefined) columns[column] = limits[field] ?? null;
  }
  return columns;
}
