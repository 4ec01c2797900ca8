// Organisation warm pools (issue 20; Daytona's `daytona.warmPool`): an organisation asks for N
// ready sandboxes of one of its images (or a built-in one) at one size, and its creates of that
// image and size, with nothing a member cannot be given after the fact, are answered by one.
// The pool itself is warm-pool.ts's: these are extra keys owned by one organisation, filled over
// all hosts by the same loop, claimed in the create's quota transaction like the operator's.
//
// Matching (Daytona's CreateWarmPool: "only serves sandbox creates that use this snapshot with the
// default OS user and no custom env, volumes or secrets"): same image, same cpu, memory and disk,
// no environment of the create's own, no secrets, no volumes, no named snapshot. Anything else
// goes cold, as it would on Daytona.
//
// Quota: members are not the organisation's sandboxes until claimed. They count against no
// quota (sandboxes, vCPUs, memory, disk) and are in no list, event, usage sample or bill; a claim
// is checked against the quota like any create, so a warm pool never lets an organisation run
// more than its limits. What an organisation can keep warm is bounded instead by
// NESTBOX_ORG_WARM_POOL_MAX (its pools' counts together) and by host room (members take room
// like the operator's, and a pool that finds none says so in `errorReason`).
import { randomId } from '../ids.js';
import type { Db, DbOrTx } from '../store/db.js';
import { errors, NestboxError } from '../errors.js';
import type { Principal } from '../types.js';
import { requireScope } from './auth.js';
import { snapshotRepository } from '../store/repositories/snapshots.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { organizationWarmPoolRepository } from '../store/repositories/warm-pool.js';
import type { ImageService } from './images.js';
import type { SandboxLimits } from './sandboxes.js';
import type { OrganizationPoolRow, WarmPoolService } from './warm-pool.js';

export interface OrganizationWarmPool {
  id: string;
  organizationId: string;
  /** What the organisation named (a Daytona snapshot name, or an image reference). */
  snapshot: string;
  region: string;
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
  env: Record<string, string>;
  /** Desired members. */
  pool: number;
  /** Ready members now. */
  currentSize: number;
  errorReason: string | null;
  createdAt: Date;
  updatedAt: Date;
}

export interface CreateOrganizationWarmPoolInput {
  /** The name the pool is known by (unique per region with `region`). */
  snapshot: string;
  /** The image its members start from: `default`, a built-in, or the organisation's `name[:tag]` / id. */
  image: string;
  cpu?: number;
  memoryMiB?: number;
  diskGiB?: number;
  region: string;
  pool: number;
}

export const newWarmPoolId = (): string => `wp${randomId(18)}`;

export class OrganizationWarmPoolService {
  constructor(
    private readonly db: Db,
    private readonly images: Pick<ImageService, 'find' | 'startPoint'>,
    private readonly limits: SandboxLimits,
    private readonly warmPool: WarmPoolService,
  ) {}

  async list(principal: Principal): Promise<OrganizationWarmPool[]> {
    requireScope(principal, 'sandboxes:read');
    return this.render(await organizationWarmPoolRepository(this.db).list(principal.organizationId));
  }

  async get(principal: Principal, id: string): Promise<OrganizationWarmPool> {
    requireScope(principal, 'sandboxes:read');
    return (await this.render([await this.load(principal, id)]))[0];
  }

  async create(principal: Principal, input: CreateOrganizationWarmPoolInput): Promise<OrganizationWarmPool> {
    requireScope(principal, 'sandboxes:create');
    this.requireEnabled();
    if (typeof input.snapshot !== 'string' || !input.snapshot || input.snapshot.length > 300) throw errors.validation('snapshot', 'must be a snapshot name');
    if (typeof input.region !== 'string' || !input.region || input.region.length > 100) throw errors.validation('target', 'must be a region name');
    const pool = this.validatePool(input.pool);
    const size = this.validateSize(input);
    const launch = await this.resolve(principal.organizationId, input.image);
    const id = newWarmPoolId();
    await this.db.transaction(async (tx) => {
      // The organisation's row serialises its pool writes, so two creates cannot both pass the cap.
      await organizationRepository(tx).lockById(principal.organizationId);
      await this.checkCap(tx, principal.organizationId, pool);
      const pools = organizationWarmPoolRepository(tx);
      const clash = await pools.findBySnapshot(principal.organizationId, input.snapshot, input.region);
      if (clash) throw new NestboxError('conflict', `a warm pool for snapshot "${input.snapshot}" in region "${input.region}" already exists (${clash.id})`, { kind: 'warm pool', id: clash.id });
      await pools.insert({ id, organizationId: principal.organizationId, snapshot: input.snapshot, region: input.region, launch, cpu: size.cpu, memoryMiB: size.memoryMiB, diskGiB: size.diskGiB, pool });
    });
    this.warmPool.start();
    this.warmPool.kick();
    return this.get(principal, id);
  }

  /** Changes the desired count; 0 drains the pool (its members are removed by the next pass, at once). */
  async update(principal: Principal, id: string, input: { pool: number }): Promise<OrganizationWarmPool> {
    requireScope(principal, 'sandboxes:create');
    await this.load(principal, id);
    const pool = this.validatePool(input.pool);
    await this.db.transaction(async (tx) => {
      await organizationRepository(tx).lockById(principal.organizationId);
      await this.checkCap(tx, principal.organizationId, pool, id);
      await organizationWarmPoolRepository(tx).setCount(principal.organizationId, id, pool);
    });
    this.warmPool.kick();
    return this.get(principal, id);
  }

  /** Removes the pool; its members are destroyed by the next pass (started now). */
  async delete(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'sandboxes:create');
    await this.load(principal, id);
    await organizationWarmPoolRepository(this.db).remove(principal.organizationId, id);
    this.warmPool.kick();
  }

  private requireEnabled(): void {
    if (this.warmPool.organizationMax <= 0) throw new NestboxError('not_supported', 'this server keeps no warm pools for organisations (NESTBOX_ORG_WARM_POOL_MAX is 0)');
  }

  /** Another organisation's pool is simply not found. */
  private async load(principal: Principal, id: string): Promise<OrganizationPoolRow> {
    const row = await organizationWarmPoolRepository(this.db).find(principal.organizationId, id);
    if (!row) throw errors.notFound('warm pool', id);
    return row;
  }

  private validatePool(pool: unknown): number {
    const max = this.warmPool.organizationMax;
    if (typeof pool !== 'number' || !Number.isInteger(pool) || pool < 0 || pool > max) throw errors.validation('pool', `must be an integer from 0 to ${max} (NESTBOX_ORG_WARM_POOL_MAX)`);
    return pool;
  }

  private validateSize(input: CreateOrganizationWarmPoolInput): { cpu: number; memoryMiB: number; diskGiB: number } {
    const l = this.limits;
    const cpu = input.cpu ?? l.defaultCpu;
    if (!Number.isInteger(cpu) || cpu < 1 || cpu > l.maxCpu) throw errors.validation('cpu', `must be an integer from 1 to ${l.maxCpu}`);
    const memoryMiB = input.memoryMiB ?? l.defaultMemoryMiB;
    if (!Number.isInteger(memoryMiB) || memoryMiB < l.minMemoryMiB || memoryMiB > l.maxMemoryMiB) throw errors.validation('memoryMiB', `must be an integer from ${l.minMemoryMiB} to ${l.maxMemoryMiB}`);
    const diskGiB = input.diskGiB ?? l.defaultDiskGiB;
    if (!Number.isInteger(diskGiB) || diskGiB < 1 || diskGiB > l.maxDiskGiB) throw errors.validation('diskGiB', `must be an integer from 1 to ${l.maxDiskGiB}`);
    return { cpu, memoryMiB, diskGiB };
  }

  private async checkCap(tx: DbOrTx, organizationId: string, pool: number, excludeId?: string): Promise<void> {
    const others = await organizationWarmPoolRepository(tx).desiredTotal(organizationId, excludeId);
    const max = this.warmPool.organizationMax;
    if (others + pool > max) throw errors.validation('pool', `an organisation keeps at most ${max} warm sandboxes over all its pools (NESTBOX_ORG_WARM_POOL_MAX); its other pools ask for ${others}`);
  }

  /**
   * What members of `reference` are launched from, as SandboxService.create resolves a create's
   * image (sourceOf): the key is the image's row id (a built-in's name), which is what a create's
   * claim matches on (organizationPoolsFor).
   */
  private async resolve(organizationId: string, reference: string) {
    const base = { image: this.limits.defaultImage, host_image: null as string | null, image_id: null as string | null, layers_snapshot_id: null as string | null, host_id: null as string | null, env: {} as Record<string, string> };
    if (reference === this.limits.defaultImage) return base;
    const image = await this.images.find(organizationId, reference, 'snapshot');
    if (!image) throw errors.validation('snapshot', `unknown snapshot or image "${reference.slice(0, 200)}"`);
    if (image.id === this.limits.defaultImage) return base;
    if (image.source.kind === 'builtin') return { ...base, image: image.id };
    const start = this.images.startPoint(image);
    if (start.snapshotId) {
      const layers = await snapshotRepository(this.db).findById(start.snapshotId);
      if (!layers || layers.state !== 'ready' || layers.deletedAt) throw errors.validation('snapshot', `image "${reference.slice(0, 200)}" is not ready`);
    }
    return { image: image.id, host_image: start.hostImage, image_id: image.id, layers_snapshot_id: start.snapshotId, host_id: start.hostId, env: start.env };
  }

  private async render(rows: OrganizationPoolRow[]): Promise<OrganizationWarmPool[]> {
    const ready = await this.warmPool.readyOf(rows.map((r) => r.id));
    return rows.map((r) => ({
      id: r.id,
      organizationId: r.organization_id,
      snapshot: r.snapshot,
      region: r.region,
      cpu: r.cpu,
      memoryMiB: r.memory_mib,
      diskGiB: r.disk_gib,
      env: typeof r.env === 'string' ? (JSON.parse(r.env) as Record<string, string>) : r.env,
      pool: r.pool,
      currentSize: ready.get(r.id) ?? 0,
      errorReason: r.error_reason,
      createdAt: new Date(r.created_at),
      updatedAt: new Date(r.updated_at),
    }));
  }
}
