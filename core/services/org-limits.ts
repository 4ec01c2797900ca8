// Per-organisation limits: what an organisation may hold at once, checked under its row lock
// wherever something that counts is created (sandboxes.ts create/fork/resume, snapshots.ts,
// images.ts), so two concurrent creates serialise and cannot both pass on the same spare
// capacity. An organisation's own limit (organizations.max_*) wins; NULL means the server's
// default (NESTBOX_ORG_MAX_*). A limit set below what is already held is allowed: it only
// refuses new work until usage falls under it.
import type { DbOrTx } from '../store/db.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors } from '../errors.js';
import type { Organization, OrganizationLimitOverrides } from '../types.js';

/** The server's defaults for every organisation without a limit of its own. */
export interface OrganizationLimits {
  /** Sandboxes that are neither stopped nor deleted. */
  maxSandboxes: number;
  /** vCPUs and memory of those sandboxes. */
  maxCpu: number;
  maxMemoryMiB: number;
  /** GiB of sandbox disks: every sandbox that is not deleted (a stopped one keeps its disk). */
  maxDiskGiB: number;
  /** Named snapshots (image layers are counted as images, not here). */
  maxSnapshots: number;
  /** Images (rows of `images` not deleted; the built-in ones are not counted). */
  maxImages: number;
  /** Retry-After of the 429 when a limit is reached. */
  retryAfterSeconds: number;
}

export type LimitValues = Omit<OrganizationLimits, 'retryAfterSeconds'>;

export const NO_ORGANIZATION_LIMITS: OrganizationLimits = {
  maxSandboxes: Number.MAX_SAFE_INTEGER,
  maxCpu: Number.MAX_SAFE_INTEGER,
  maxMemoryMiB: Number.MAX_SAFE_INTEGER,
  maxDiskGiB: Number.MAX_SAFE_INTEGER,
  maxSnapshots: Number.MAX_SAFE_INTEGER,
  maxImages: Number.MAX_SAFE_INTEGER,
  retryAfterSeconds: 30,
};

/** What an organisation holds now, in the units of its limits. */
export interface OrganizationUsage {
  sandboxes: number;
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
  snapshots: number;
  images: number;
}

/** Each limit: its usage key, what the message calls it, and the setting of its default. */
const LIMITS: { field: keyof LimitValues; usage: keyof OrganizationUsage; what: string; setting: string }[] = [
  { field: 'maxSandboxes', usage: 'sandboxes', what: 'sandboxes that are not stopped', setting: 'NESTBOX_ORG_MAX_SANDBOXES' },
  { field: 'maxCpu', usage: 'cpu', what: 'vCPUs', setting: 'NESTBOX_ORG_MAX_CPU' },
  { field: 'maxMemoryMiB', usage: 'memoryMiB', what: 'MiB of memory', setting: 'NESTBOX_ORG_MAX_MEMORY_MIB' },
  { field: 'maxDiskGiB', usage: 'diskGiB', what: 'GiB of sandbox disk', setting: 'NESTBOX_ORG_MAX_DISK_GIB' },
  { field: 'maxSnapshots', usage: 'snapshots', what: 'snapshots', setting: 'NESTBOX_ORG_MAX_SNAPSHOTS' },
  { field: 'maxImages', usage: 'images', what: 'images', setting: 'NESTBOX_ORG_MAX_IMAGES' },
];

export function effectiveLimits(org: Pick<Organization, 'limits'>, defaults: OrganizationLimits): LimitValues {
  const out = {} as LimitValues;
  for (const l of LIMITS) out[l.field] = org.limits[l.field] ?? defaults[l.field];
  return out;
}

/** Everything the organisation holds now (`excludeSandboxId`: a sandbox being resumed counts as asked, not as held). */
export async function organizationUsage(db: DbOrTx, organizationId: string, excludeSandboxId?: string): Promise<OrganizationUsage> {
  const active = await sandboxRepository(db).usageOf(organizationId, excludeSandboxId);
  const [disk] = (await db('sandboxes')
    .where({ organization_id: organizationId })
    .whereNot({ state: 'deleted' })
    .select(db.raw('coalesce(sum(disk_gib), 0) as disk'))) as { disk: string | number }[];
  const [snapshots] = (await db('snapshots').where({ organization_id: organizationId, kind: 'snapshot' }).whereNull('deleted_at').count('* as n')) as { n: string | number }[];
  const [images] = (await db('images').where({ organization_id: organizationId }).whereNull('deleted_at').count('* as n')) as { n: string | number }[];
  return { ...active, diskGiB: Number(disk.disk), snapshots: Number(snapshots.n), images: Number(images.n) };
}

/**
 * Inside the caller's transaction: lock the organisation's row, then refuse with `quota_exceeded`
 * (429, Retry-After) if `ask` more of anything would go over a limit. What is not asked for is
 * not checked (a resume asks for no disk: its disk already counts).
 */
export async function checkWithinLimits(tx: DbOrTx, organizationId: string, ask: Partial<OrganizationUsage>, defaults: OrganizationLimits, excludeSandboxId?: string): Promise<void> {
  const org = await organizationRepository(tx).lockById(organizationId);
  if (!org) throw errors.notFound('organization', organizationId);
  const limits = effectiveLimits(org, defaults);
  const used = await organizationUsage(tx, organizationId, excludeSandboxId);
  for (const l of LIMITS) {
    const requested = ask[l.usage];
    if (requested === undefined || requested === 0) continue;
    const max = limits[l.field];
    const current = used[l.usage];
    if (current + requested > max) {
      const own = org.limits[l.field] !== null;
      throw errors.quotaExceeded(
        l.usage,
        `organisation limit reached: ${current} of ${max} ${l.what} in use, this call needs ${requested} more (${l.usage === 'sandboxes' || l.usage === 'cpu' || l.usage === 'memoryMiB' ? 'stop or delete sandboxes' : 'delete some'}, or raise ${own ? `the organisation's ${l.field}` : l.setting})`,
        { max, current, requested, retryAfterSeconds: defaults.retryAfterSeconds },
      );
    }
  }
}
