// Organisations as tenants (issue 16): the platform operator (a key of the `operator` preset,
// scope platform:organizations) creates, lists, renames, limits and suspends them and mints
// their first keys; every organisation reads its own limits, what it holds against them, and
// its hourly usage. Nothing here lets one organisation see another's anything: the operator's
// routes are the only ones that name an organisation, and they need the platform scope.
import type { Db } from '../store/db.js';
import { organizationRepository, type OrganizationPatch } from '../store/repositories/organizations.js';
import { errors, NestboxError } from '../errors.js';
import { newOrganizationId } from '../ids.js';
import type { Organization, OrganizationLimitOverrides, Principal } from '../types.js';
import { DEFAULT_ORGANIZATION_NAME, requireScope, type AuthService, type CreatedApiKey, type KeyPreset } from './auth.js';
import { effectiveLimits, organizationUsage, type LimitValues, type OrganizationLimits, type OrganizationUsage } from './org-limits.js';
import type { UsageRecordService, UsageRecordView } from './usage-records.js';
import { volumeLimitsInForce, type VolumeLimits } from './volumes.js';
import { requestLimitsOf, requestRatesInForce, type RequestLimits, type RequestRatesInForce } from './rate-limits.js';

/** Organisation names: like sandbox names, usable in a URL and a CLI argument as they are. */
const ORGANIZATION_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
/** The largest limit one may set (beyond it, a limit means nothing on one installation). */
export const MAX_LIMIT_VALUE = 1_000_000_000;
const LIMIT_FIELDS: (keyof OrganizationLimitOverrides)[] = [
  'maxSandboxes', 'maxCpu', 'maxMemoryMiB', 'maxDiskGiB', 'maxSnapshots', 'maxImages',
  'requestsPerSecond', 'requestBurst', 'keyRequestsPerSecond', 'keyRequestBurst',
  'maxVolumes', 'maxVolumeTotalGiB', 'maxVolumeSizeGiB',
];
/**
 * A burst of 0 would refuse every request: suspension is the way to do that. A largest volume
 * of 0 GiB would refuse every volume with a size message: maxVolumes 0 says it plainly.
 */
const AT_LEAST_ONE: (keyof OrganizationLimitOverrides)[] = ['requestBurst', 'keyRequestBurst', 'maxVolumeSizeGiB'];
/** Volume GiB are stored as integers of GiB; beyond this their bytes leave the safe integers of the checks' sums. */
const MAX_VOLUME_GIB = 1_000_000;
const VOLUME_GIB_FIELDS: (keyof OrganizationLimitOverrides)[] = ['maxVolumeTotalGiB', 'maxVolumeSizeGiB'];
/** Rates may be fractions (one request every 4 s is 0.25); everything else counts whole things. */
const FRACTIONAL: (keyof OrganizationLimitOverrides)[] = ['requestsPerSecond', 'keyRequestsPerSecond'];
const MAX_LIST_LIMIT = 1000;
/**
 * How long assertActive believes "not suspended" (hosted-port requests ask it on every request).
 * This replica's own suspend forgets its entry at once; another replica's is seen within this
 * long, and the sandboxes it stops change state, which the port proxy hears at once anyway.
 */
export const ORGANIZATION_STATE_CACHE_MS = 1_000;
const ORGANIZATION_STATE_CACHE_MAX = 10_000;

export interface OrganizationView {
  organization: Organization;
  /** The limits in force: its own, else the server's default. */
  limits: LimitValues & RequestRatesInForce & ReturnType<typeof volumeLimitsInForce>;
}

export interface UpdateOrganizationInput {
  name?: string;
  suspended?: boolean;
  /** A number sets the organisation's own limit; null returns it to the server's default. */
  limits?: Partial<OrganizationLimitOverrides>;
}

export class OrganizationService {
  /**
   * Called after an organisation is suspended, to stop its sandboxes at once (the background
   * pass does the same for any it missed). Set by the composition root.
   */
  onSuspended: ((organizationId: string) => Promise<unknown>) | undefined;
  private readonly suspendedCache = new Map<string, { at: number; suspended: boolean }>();

  constructor(
    private readonly db: Db,
    private readonly auth: Pick<AuthService, 'mintApiKey'>,
    private readonly defaults: OrganizationLimits,
    private readonly usageRecords: Pick<UsageRecordService, 'range'>,
    private readonly requestRateDefaults: RequestLimits = {},
    private readonly volumeDefaults: VolumeLimits,
  ) {}

  private view(organization: Organization): OrganizationView {
    return {
      organization,
      limits: {
        ...effectiveLimits(organization, this.defaults),
        ...requestRatesInForce(requestLimitsOf(organization.limits, this.requestRateDefaults)),
        ...volumeLimitsInForce(organization.limits, this.volumeDefaults),
      },
    };
  }

  async create(principal: Principal, input: { name: string; limits?: Partial<OrganizationLimitOverrides> }): Promise<OrganizationView> {
    requireScope(principal, 'platform:organizations');
    const name = validateName(input.name);
    const limits = validateLimits(input.limits);
    try {
      return this.view(await organizationRepository(this.db).insert({ id: newOrganizationId(), name, limits }));
    } catch (err) {
      throw nameConflict(err, name);
    }
  }

  async list(principal: Principal, input: { limit?: number; cursor?: string }): Promise<{ items: OrganizationView[]; nextCursor: string | null }> {
    requireScope(principal, 'platform:organizations');
    const limit = input.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIST_LIMIT) throw errors.validation('limit', `must be an integer from 1 to ${MAX_LIST_LIMIT}`);
    const after = input.cursor === undefined ? undefined : decodeCursor(input.cursor);
    const rows = await organizationRepository(this.db).list({ limit: limit + 1, after });
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    return { items: page.map((o) => this.view(o)), nextCursor: rows.length > limit && last ? encodeCursor(last) : null };
  }

  async get(principal: Principal, id: string): Promise<OrganizationView> {
    requireScope(principal, 'platform:organizations');
    return this.view(await this.find(id));
  }

  private async find(id: string): Promise<Organization> {
    const org = await organizationRepository(this.db).findById(id);
    if (!org) throw errors.notFound('organization', id);
    return org;
  }

  /**
   * Rename, suspend or unsuspend, set limits. The default organisation (the operator's own) can
   * be neither suspended nor renamed: the operator would lock itself out, or lose it. Suspending
   * stops the organisation's running and paused sandboxes before answering (their disks are
   * kept; after unsuspending they can be resumed).
   */
  async update(principal: Principal, id: string, input: UpdateOrganizationInput): Promise<OrganizationView> {
    requireScope(principal, 'platform:organizations');
    const org = await this.find(id);
    const isDefault = org.name === DEFAULT_ORGANIZATION_NAME;
    const patch: OrganizationPatch = {};
    if (input.name !== undefined && input.name !== org.name) {
      if (isDefault) throw new NestboxError('conflict', `name: the default organisation cannot be renamed`, { field: 'name' });
      patch.name = validateName(input.name);
    }
    if (input.suspended !== undefined) {
      if (typeof input.suspended !== 'boolean') throw errors.validation('suspended', 'must be true or false');
      if (input.suspended && isDefault) throw new NestboxError('conflict', 'suspended: the default organisation (the operator\'s own) cannot be suspended', { field: 'suspended' });
      // Suspending twice keeps the first time.
      if (input.suspended !== (org.suspendedAt !== null)) patch.suspendedAt = input.suspended ? new Date() : null;
    }
    if (input.limits !== undefined) patch.limits = validateLimits(input.limits);
    let updated: Organization;
    try {
      updated = (await organizationRepository(this.db).update(id, patch)) ?? org;
    } catch (err) {
      throw nameConflict(err, patch.name ?? org.name);
    }
    this.suspendedCache.delete(id);
    if (updated.suspendedAt !== null && this.onSuspended) await this.onSuspended(id);
    return this.view(updated);
  }

  /** A key of the organisation (its first admin key, typically); shown once. */
  async mintKey(principal: Principal, id: string, input: { name?: string; preset?: KeyPreset }): Promise<CreatedApiKey> {
    requireScope(principal, 'platform:organizations');
    const org = await this.find(id);
    return this.auth.mintApiKey(principal, org.id, { name: input.name ?? 'admin', preset: input.preset ?? 'admin' });
  }

  /** The caller's own organisation: its limits in force and what it holds against them. */
  async own(principal: Principal): Promise<OrganizationView & { usage: OrganizationUsage }> {
    const org = await this.find(principal.organizationId);
    return { ...this.view(org), usage: await organizationUsage(this.db, org.id) };
  }

  async usage(principal: Principal, id: string, query: { from?: string; to?: string }): Promise<{ from: Date; to: Date; items: UsageRecordView[] }> {
    requireScope(principal, 'platform:organizations');
    const org = await this.find(id);
    return this.usageRecords.range(org.id, query);
  }

  async ownUsage(principal: Principal, query: { from?: string; to?: string }): Promise<{ from: Date; to: Date; items: UsageRecordView[] }> {
    return this.usageRecords.range(principal.organizationId, query);
  }

  /** For front doors that reach a sandbox without a key (hosted ports): 403 when its organisation is suspended. */
  async assertActive(organizationId: string): Promise<void> {
    if (await this.isSuspended(organizationId)) throw errors.organizationSuspended(organizationId);
  }

  /** Read at most every ORGANIZATION_STATE_CACHE_MS per organisation (and at once after this replica's own update). */
  private async isSuspended(organizationId: string): Promise<boolean> {
    const cached = this.suspendedCache.get(organizationId);
    if (cached && Date.now() - cached.at < ORGANIZATION_STATE_CACHE_MS) return cached.suspended;
    const suspended = await organizationRepository(this.db).isSuspended(organizationId);
    if (this.suspendedCache.size >= ORGANIZATION_STATE_CACHE_MAX) this.suspendedCache.clear();
    this.suspendedCache.set(organizationId, { at: Date.now(), suspended });
    return suspended;
  }
}

function validateName(name: unknown): string {
  if (typeof name !== 'string' || !ORGANIZATION_NAME.test(name)) throw errors.validation('name', 'must be 1-63 letters, digits, "_", "." or "-", starting with a letter or digit');
  return name;
}

function validateLimits(limits: Partial<OrganizationLimitOverrides> | undefined): Partial<OrganizationLimitOverrides> {
  if (limits === undefined) return {};
  if (limits === null || typeof limits !== 'object' || Array.isArray(limits)) throw errors.validation('limits', 'must be an object');
  const out: Partial<OrganizationLimitOverrides> = {};
  for (const [field, value] of Object.entries(limits)) {
    if (!(LIMIT_FIELDS as string[]).includes(field)) throw errors.validation(`limits.${field}`, `is not a known limit (${LIMIT_FIELDS.join(', ')})`);
    const least = (AT_LEAST_ONE as string[]).includes(field) ? 1 : 0;
    const most = (VOLUME_GIB_FIELDS as string[]).includes(field) ? MAX_VOLUME_GIB : MAX_LIMIT_VALUE;
    const fractional = (FRACTIONAL as string[]).includes(field);
    const inForm = fractional ? typeof value === 'number' && Number.isFinite(value) : Number.isInteger(value);
    if (value !== null && (!inForm || (value as number) < least || (value as number) > most)) {
      throw errors.validation(`limits.${field}`, `must be ${fractional ? 'a number' : 'an integer'} from ${least} to ${most}, or null for the server's default`);
    }
    out[field as keyof OrganizationLimitOverrides] = value as number | null;
  }
  return out;
}

function nameConflict(err: unknown, name: string): unknown {
  if (/organizations_name_unique|unique|duplicate/i.test(String((err as Error)?.message))) {
    return new NestboxError('conflict', `name: an organisation named "${name}" already exists`, { field: 'name' });
  }
  return err;
}

function encodeCursor(o: Organization): string {
  return Buffer.from(`${o.createdAt.toISOString()}|${o.id}`).toString('base64url');
}

function decodeCursor(cursor: string): { createdAt: Date; id: string } {
  const [iso, id] = Buffer.from(cursor, 'base64url').toString('utf8').split('|');
  const createdAt = new Date(iso ?? '');
  if (!id || Number.isNaN(createdAt.getTime())) throw errors.validation('cursor', 'is not a cursor returned by this API');
  return { createdAt, id };
}
