import type { Db, DbOrTx } from '../store/db.js';
import { sandboxRepository, sortValueOf, SANDBOX_SORT_KEYS, type SandboxPatch, type SandboxSortKey } from '../store/repositories/sandboxes.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import { validateEgress } from '../egress.js';
import { newOperationId, newSandboxId } from '../ids.js';
import { assertCanBegin, assertRunning, isTransitional, OPERATIONS, type SandboxState } from '../state-machine.js';
import { failureMessage, Lifecycle, timeoutDeadline } from '../lifecycle.js';
import type { SandboxStateEvents } from '../sandbox-events.js';
import { snapshotRepository } from '../store/repositories/snapshots.js';
import type { HostTransferService } from './host-transfer.js';
import type { VolumeMountInput, VolumeService } from './volumes.js';
import { EVERY_PORT, portRepository } from '../store/repositories/ports.js';
import type { EgressPolicy, HostClient, HostSandboxSpec } from '../host-client.js';
import type { GuestClient } from '../guest.js';
import type { HostRecord, Principal, Sandbox, SandboxKind, Snapshot } from '../types.js';
import type { Image } from '../images/types.js';
import { canSeeSandbox, requireScope } from './auth.js';
import type { HostService, PlacementConstraints } from './hosts.js';
import type { SecretService } from './secrets.js';
import { checkWithinLimits, NO_ORGANIZATION_LIMITS, type OrganizationLimits } from './org-limits.js';
import { resizeSandbox, type ResizeSandboxInput } from './sandbox-resize.js';
import type { WarmPoolKey, WarmPoolMember, WarmPoolService } from './warm-pool.js';
import { hostRepository } from '../store/repositories/hosts.js';

export interface SandboxLimits {
  defaultImage: string;
  defaultCpu: number;
  maxCpu: number;
  defaultMemoryMiB: number;
  minMemoryMiB: number;
  maxMemoryMiB: number;
  defaultTimeoutSeconds: number;
  maxTimeoutSeconds: number;
  maxListLimit: number;
  maxForkCount: number;
  defaultDiskGiB: number;
  maxDiskGiB: number;
  /** Inode limit of a sandbox's disk per GiB of it. */
  diskInodesPerGiB: number;
}

/** Per-organisation limits (core/services/org-limits.ts), checked atomically at create, fork and resume. */
export type { OrganizationLimits } from './org-limits.js';

export interface LifecyclePolicy {
  /** 0 = never; otherwise pause (or stop) after this long without activity. */
  idleTimeoutSeconds?: number;
  idleAction?: 'pause' | 'stop';
  /** null = never; delete this long after the sandbox stops. */
  autoDeleteSeconds?: number | null;
}

export interface CreateSandboxInput extends LifecyclePolicy {
  image?: string;
  /** Name of a snapshot of this organisation to start from (its disk, not its processes). */
  snapshot?: string;
  cpu?: number;
  memoryMiB?: number;
  /** Size of the sandbox's disk (its writable layer), default and maximum from the config. */
  diskGiB?: number;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  timeoutSeconds?: number;
  /** Unique per organisation among live sandboxes; a taken name is a 409 conflict. */
  name?: string;
  /** Outbound network policy; default allow all. */
  egress?: EgressPolicy;
  /** Where it may run: a region, labels its host must carry, or (operators, platform:hosts) one host. */
  placement?: PlacementConstraints;
  /**
   * Every port the sandbox listens on is reachable through the hosted-port proxy, not only
   * published ones (E2B's rule; a public Daytona sandbox): to anyone when `public`, else with a
   * traffic token. Written in the same transaction as the sandbox, so it never exists without it.
   */
  everyPort?: { public: boolean };
  /** Volumes to mount at every start (core/services/volumes.ts): by id or name, a path, read-only or not. */
  volumes?: VolumeMountInput[];
  /**
   * Core only (image builds): start from a host image and layer snapshot directly, as a sandbox
   * of `kind` (a build's sandboxes are `build`, kept out of lists). Never set from a request.
   */
  internal?: { kind: SandboxKind; hostImage: string; snapshotId: string | null; hostId: string | null; imageLabel: string };
  /** Organisation secrets it is given, `[{name, env?, file?}]` (core/services/secrets.ts; checked there). */
  secrets?: unknown;
}

/** What a create starts from, resolved from `image`, `snapshot` or `internal`. */
interface CreateSource {
  /** What the sandbox row (and every DTO) calls its image: `default`, `name:tag`. */
  image: string;
  hostImage: string | null;
  imageId: string | null;
  snapshot: Snapshot | undefined;
  hostId: string | null;
  /** The image's environment, under the caller's. */
  env: Record<string, string>;
  kind: SandboxKind;
}

/** What SandboxService needs of images (core/services/images.ts), to resolve `image` at create. */
export interface SandboxImages {
  find(organizationId: string, reference: string, field?: string): Promise<Image | undefined>;
  startPoint(image: Image): { hostImage: string; snapshotId: string | null; hostId: string | null; env: Record<string, string> };
}

/**
 * Run after a sandbox of an image reached `running` by a create or a start (its start command
 * and readiness check, core/services/image-start.ts). A create whose hook fails is rolled back.
 */
export type SandboxStartHook = (sandbox: Sandbox, guest: GuestClient, phase: 'create' | 'start') => Promise<void>;

/** The organisation secrets sandboxes are given (core/services/secrets.ts), set by the composition root. */
export type SandboxSecrets = Pick<SecretService, 'validateRefs' | 'attach' | 'deliver' | 'inherit'>;

export interface UpdateSandboxInput extends LifecyclePolicy {
  labels?: Record<string, string>;
  /** A new timeout, counted from now for a running or paused sandbox (0 = none). */
  timeoutSeconds?: number;
  /**
   * `restart` (default): the deadline becomes now + timeoutSeconds. `extend`: it only ever moves
   * later; a sandbox whose deadline is further away, or that has none, keeps it (E2B's connect).
   */
  timeoutMode?: 'restart' | 'extend';
  /** A new outbound network policy, in force at once on a running or paused sandbox. */
  egress?: EgressPolicy;
}

export interface ForkInput {
  count?: number;
  /** Name of the child (only with count 1). */
  name?: string;
  labels?: Record<string, string>;
  timeoutSeconds?: number;
}

export interface ForkResult {
  sandboxes: Sandbox[];
  memoryCopied: boolean;
  diskCopy: string;
}

/** Activity is recorded at most this often per sandbox (idle timeouts are counted in seconds). */
const ACTIVITY_GRANULARITY_MS = 5_000;
/** How long a call waits for a sandbox another call is already waking. */
const WAKE_WAIT_MS = 60_000;

export interface ListSandboxesInput {
  labels?: Record<string, string>;
  states?: SandboxState[];
  limit?: number;
  cursor?: string;
  idPrefix?: string;
  namePrefix?: string;
  /** Started (or, never started, created) at or after / at or before this moment. */
  startedAfter?: Date;
  startedBefore?: Date;
  /** Created from this snapshot (its id); null: from the image. */
  sourceSnapshotId?: string | null;
  /** Default: createdAt desc. */
  sort?: { key: SandboxSortKey; order: 'asc' | 'desc' };
}

/** Sandbox names: like snapshot names, usable in a URL path segment as they are. */
const SANDBOX_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;

function validateName(name: string | undefined): string | undefined {
  if (name === undefined) return undefined;
  if (!SANDBOX_NAME.test(name)) throw errors.validation('name', 'must be 1-63 letters, digits, "_", "." or "-", starting with a letter or digit');
  return name;
}

/** A unique-index violation on the name becomes the conflict users can act on. */
function nameConflict(err: unknown, name: string | undefined): unknown {
  if (name !== undefined && /sandboxes_org_name_live|unique|duplicate/i.test(String((err as Error)?.message))) {
    return new NestboxError('conflict', `name: a sandbox named "${name}" already exists`, { field: 'name' });
  }
  return err;
}

/** Cursor of a list in another order than the default: the sort key, its value and the id. */
function encodeSortCursor(s: Sandbox, sort: { key: SandboxSortKey; order: 'asc' | 'desc' }): string {
  return Buffer.from(JSON.stringify({ k: sort.key, o: sort.order, v: sortValueOf(s, sort.key), id: s.id })).toString('base64url');
}

function decodeSortCursor(cursor: string, sort: { key: SandboxSortKey; order: 'asc' | 'desc' }): { value: string | number; id: string } {
  let parsed: { k?: unknown; o?: unknown; v?: unknown; id?: unknown };
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    throw errors.validation('cursor', 'is not a cursor returned by this API');
  }
  if (parsed.k !== sort.key || parsed.o !== sort.order || typeof parsed.id !== 'string' || (typeof parsed.v !== 'string' && typeof parsed.v !== 'number')) {
    throw errors.validation('cursor', 'does not belong to a list in this order');
  }
  return { value: parsed.v, id: parsed.id };
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Cursor = opaque base64url of the last item's position; stable under inserts. */
/** Paused sandboxes and idle-stopped ones are woken by the next call that needs them. */
export function isWakeable(s: Sandbox): boolean {
  return s.state === 'paused' || (s.state === 'stopped' && s.stopReason === 'idle');
}

export function encodeCursor(s: Pick<Sandbox, 'createdAt' | 'id'>): string {
  return Buffer.from(`${s.createdAt.toISOString()}|${s.id}`).toString('base64url');
}

/**
 * A sandbox its host's loss put in error: the call is answered 503 naming host_lost (not a
 * generic state conflict, and never a wait on a host that does not answer).
 */
function assertNotHostLost(sandbox: Sandbox, operation: string): void {
  if (sandbox.state !== 'error' || sandbox.stopReason !== 'host_lost') return;
  throw new NestboxError('host_unavailable', `cannot ${operation} sandbox ${sandbox.id}: its host ${sandbox.hostId} was lost (host_lost); it is in error until the host returns (it is then adopted if it still runs there) or it is resumed from its disk`, { reason: 'host_lost', hostId: sandbox.hostId, state: sandbox.state });
}

function decodeCursor(cursor: string): { createdAt: Date; id: string } {
  const [iso, id] = Buffer.from(cursor, 'base64url').toString('utf8').split('|');
  const createdAt = new Date(iso ?? '');
  if (!id || Number.isNaN(createdAt.getTime())) throw errors.validation('cursor', 'is not a cursor returned by this API');
  return { createdAt, id };
}

/**
 * The sandbox engine. Every lifecycle verb follows the same pattern: compare-and-set the row
 * into the operation's transitional state (so concurrent requests cannot both act), call the
 * host agent outside any transaction, then compare-and-set the outcome. A crash between the
 * two writes leaves a transitional row with an owner, which the reconciler finishes.
 */
export class SandboxService {
  /** Every state write goes through the engine, which takes it from the state table. */
  private readonly lifecycle: Lifecycle;
  /** Told of every deadline this process sets (the background jobs' timer, see onDeadline). */
  private deadlineListeners: ((at: Date) => void)[] = [];
  private images: SandboxImages | undefined;
  private startHook: SandboxStartHook | undefined;
  private secrets: SandboxSecrets | undefined;

  /** Snapshot copies and moves between hosts (host-transfer.ts); set by the composition root. */
  transfer?: HostTransferService;
  /** Volumes mounted at create (volumes.ts); set by the composition root. */
  volumes?: VolumeService;
  /** Ready sandboxes creates are answered from when they can be (warm-pool.ts); set by the composition root. */
  warmPool?: WarmPoolService;

  private requireVolumes(): VolumeService {
    if (!this.volumes) throw new NestboxError('not_supported', 'volumes are not available on this server');
    return this.volumes;
  }

  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly limits: SandboxLimits,
    /** Id of this control-plane instance, recorded as the owner of operations it runs. */
    instanceId: string,
    private readonly orgLimits: OrganizationLimits = NO_ORGANIZATION_LIMITS,
    /** Where every state this service writes is published (the server's one bus). */
    events?: SandboxStateEvents,
  ) {
    this.lifecycle = new Lifecycle(db, instanceId, events);
  }

  /**
   * Runs `task` (the inserts or the state change that makes sandboxes count) in one transaction
   * with the organisation's row locked, after checking that `ask` more sandboxes, vCPUs and
   * memory fit in its limits: two concurrent creates serialise on the lock, so they cannot both
   * pass on the same spare capacity. Nothing here waits for a host agent (PGlite has one
   * connection; see store/db.ts).
   */
  private async withinQuota<T>(organizationId: string, ask: { sandboxes: number; cpu: number; memoryMiB: number; diskGiB: number }, task: (tx: DbOrTx) => Promise<T>, excludeId?: string): Promise<T> {
    return this.db.transaction(async (tx) => {
      await checkWithinLimits(tx, organizationId, ask, this.orgLimits, excludeId);
      return task(tx);
    });
  }

  private repo() {
    return sandboxRepository(this.db);
  }

  /** Images sandboxes can be created from (set once by the composition root). */
  useImages(images: SandboxImages, startHook: SandboxStartHook): void {
    this.images = images;
    this.startHook = startHook;
  }

  /** Organisation secrets given to sandboxes (set once by the composition root). */
  useSecrets(secrets: SandboxSecrets): void {
    this.secrets = secrets;
  }

  /** Hands a running sandbox its secrets again (the takeover of an interrupted create, fork or start). */
  async deliverSecrets(sandbox: Sandbox): Promise<void> {
    if (!this.secrets || !sandbox.hostId) return;
    await this.secrets.deliver(sandbox, (await this.hosts.clientFor(sandbox.hostId)).guest(sandbox.id));
  }

  /** Subscribe to the deadlines this process writes (the background jobs arm their timer with them). */
  onDeadline(listener: (at: Date) => void): void {
    this.deadlineListeners.push(listener);
  }

  /** Pass on the deadline of a row this process just wrote, if it has one that counts now. */
  private noted<T extends Sandbox | undefined>(s: T): T {
    if (s?.expiresAt && (s.state === 'running' || s.state === 'paused')) for (const listener of this.deadlineListeners) listener(s.expiresAt);
    return s;
  }

  async create(principal: Principal, input: CreateSandboxInput): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:create');
    if (principal.sandboxIds !== null) throw errors.forbidden('this API key is limited to given sandboxes and cannot create new ones');
    const spec = this.validateCreate(input);
    const egress = input.egress === undefined ? { mode: 'allow-all' as const } : validateEgress(input.egress);
    const policy = this.validatePolicy(input);
    if (input.secrets !== undefined && !this.secrets) throw errors.validation('secrets', 'this server does not give sandboxes secrets');
    const secretRefs = this.secrets ? await this.secrets.validateRefs(principal, input.secrets, spec.env) : [];
    const constraints = this.hosts.validateConstraints(principal, input.placement);
    const source = await this.sourceOf(principal.organizationId, input);
    const snapshot = source.snapshot;
    const operationId = newOperationId();
    const name = validateName(input.name);
    if (input.everyPort !== undefined && typeof input.everyPort?.public !== 'boolean') throw errors.validation('everyPort.public', 'must be true or false');
    const snapshotHolders = snapshot && this.transfer && source.imageId === null && source.kind === 'user' ? await this.transfer.holdersOf(snapshot) : undefined;
    // Volumes: the sandbox runs on their host (volumes.ts), so their rows are held while it is placed.
    const volumeMounts = input.volumes === undefined ? undefined : await this.requireVolumes().resolveMounts(principal, input.volumes);
    if (volumeMounts && source.hostId && !snapshotHolders && source.hostId !== volumeMounts.hostId) {
      throw errors.validation('volumes', `${volumeMounts.what} is on host ${volumeMounts.hostId}, but ${snapshot ? `snapshot ${snapshot.name ?? snapshot.id}` : `image ${source.image}`} is on host ${source.hostId}; a sandbox runs where both are`);
    }
    // The warm pool answers creates whose every difference from a pool member can be given
    // after the fact: labels, name, metadata, timeout and lifecycle policy (rows only), env and
    // egress (the host's claim), secrets (delivered to the guest as after any create), ports;
    // placement constraints by claiming only on hosts that satisfy them. Anything decided at
    // launch goes cold: a snapshot or an organisation's image (another disk), volumes
    // (bind-mounted when the sandbox's mount namespace is made), image builds' sandboxes.
    const askedKey: WarmPoolKey = { image: source.image, cpu: spec.cpu, memoryMiB: spec.memoryMiB, diskGiB: spec.diskGiB };
    const poolKey = this.warmPool?.serves(askedKey) && !snapshot && !input.internal && !volumeMounts && source.imageId === null && source.hostImage === null && source.kind === 'user' ? askedKey : undefined;
    // The organisation's own pools (organization-warm-pools.ts) also serve its images, built
    // ones included (their members were launched from the same base and layers), but only
    // creates with nothing of their own a member lacks: Daytona's rule of no custom env or
    // secrets, and as above no named snapshot, volumes or builds. Read before the transaction.
    const orgPoolIds = this.warmPool && input.snapshot === undefined && !input.internal && !volumeMounts && source.kind === 'user' && Object.keys(spec.env).length === 0 && secretRefs.length === 0
      ? await this.warmPool.organizationPoolsFor(principal.organizationId, { image: source.imageId ?? source.image, cpu: spec.cpu, memoryMiB: spec.memoryMiB, diskGiB: spec.diskGiB })
      : [];
    const pooled = poolKey !== undefined || orgPoolIds.length > 0;
    // Read before the transaction, which must not wait on another connection (PGlite has one).
    const poolHosts = pooled && constraints ? await this.hosts.hostsSatisfying(constraints) : undefined;
    let member: WarmPoolMember | undefined;
    let host!: HostRecord;
    const created = await this.withinQuota(principal.organizationId, { sandboxes: 1, cpu: spec.cpu, memoryMiB: spec.memoryMiB, diskGiB: spec.diskGiB }, async (tx) => {
      // A snapshot's disk (and an image's layers) live on the host that made them, so their
      // sandboxes are placed there; the rest go where there is room (hosts.place).
      // A snapshot of the base image can go anywhere: its layers are copied to the host picked
      // when it holds none (host-transfer.ts); a snapshot of an OCI image stays where the image is.
      const what = snapshot ? `snapshot ${snapshot.name ?? snapshot.id}` : `the layers of image ${source.image}`;
      const where = volumeMounts ? { fixed: { hostId: volumeMounts.hostId, what: volumeMounts.what } } : snapshotHolders ? { preferred: { hostIds: snapshotHolders } } : source.hostId ? { fixed: { hostId: source.hostId, what } } : {};
      if (volumeMounts) await this.requireVolumes().lockForMount(tx, principal.organizationId, volumeMounts);
      // A claim moves the member's resources from the pool's row to this one in this
      // transaction, so its host needs no new room; both commit or neither (warm-pool.ts).
      member = orgPoolIds.length ? await this.warmPool!.claimForOrganization(tx, orgPoolIds, poolHosts) : undefined;
      member ??= poolKey ? await this.warmPool!.claim(tx, poolKey, poolHosts) : undefined;
      const claimedHost = member ? await hostRepository(tx).findById(member.hostId) : undefined;
      host = claimedHost ?? (await this.hosts.place(tx, { cpu: spec.cpu, memoryMiB: spec.memoryMiB, diskGiB: spec.diskGiB, constraints, ...where }));
      const inserted = await this.lifecycle.insert(tx, OPERATIONS.create, operationId, {
        id: member?.id ?? newSandboxId(),
        organizationId: principal.organizationId,
        hostId: host.id,
        name,
        ...spec,
        image: source.image,
        hostImage: source.hostImage,
        imageId: source.imageId,
        kind: source.kind,
        env: { ...source.env, ...spec.env },
        idleTimeoutSeconds: policy.idleTimeoutSeconds ?? 0,
        idleAction: policy.idleAction ?? 'pause',
        autoDeleteSeconds: policy.autoDeleteSeconds ?? null,
        sourceSnapshotId: snapshot?.id ?? null,
        egress,
        ...(volumeMounts ? { volumeMounts: volumeMounts.mounts } : {}),
      });
      if (secretRefs.length) await this.secrets!.attach(tx, inserted, secretRefs);
      if (input.everyPort) {
        await portRepository(tx).upsert({ sandboxId: inserted.id, port: EVERY_PORT, organizationId: inserted.organizationId, public: input.everyPort.public, tokenHash: null, tokenApiKeyId: null });
      }
      return inserted;
    }).catch((err) => {
      throw nameConflict(err, name);
    });
    if (pooled) this.warmPool!.counted(member);
    const client = this.hosts.clientForRecord(host);
    try {
      if (snapshot && snapshotHolders && !snapshotHolders.includes(host.id)) await this.transfer!.ensureSnapshotOn(snapshot, host);
      if (member) await client.claimWarm(this.hostSpec(created));
      else await client.createSandbox({ ...this.hostSpec(created), ...(snapshot ? { snapshot: snapshot.id } : {}) });
      // Before the image's start command, which may need them; values never go in the host spec.
      if (secretRefs.length) await this.secrets!.deliver(created, client.guest(created.id));
    } catch (err) {
      await this.rollBackCreate(created, OPERATIONS.create, client, operationId, err);
      throw toNestboxError(err);
    }
    if (created.imageId && this.startHook) {
      // The image's start command runs before the create answers, so a sandbox is handed over
      // ready; one that never gets ready is removed like any failed create.
      try {
        await this.startHook(created, client.guest(created.id), 'create');
      } catch (err) {
        await this.rollBackCreate(created, OPERATIONS.create, client, operationId, err);
        throw toNestboxError(err);
      }
    }
    const running = this.noted(await this.lifecycle.finish(created, OPERATIONS.create, 'succeeded', operationId));
    if (!running) {
      // Deleted while it was being created: the delete owns the cleanup; report what happened.
      throw errors.invalidState('sandbox', created.id, (await this.repo().findById(created.id))?.state ?? 'deleted', ['creating'], 'create');
    }
    return running;
  }

  /**
   * What a create starts from: a named snapshot (on the image its source had), an image of the
   * organisation (`name:tag`: its base, layers and environment), or the built-in image.
   */
  private async sourceOf(organizationId: string, input: CreateSandboxInput): Promise<CreateSource> {
    const base: CreateSource = { image: this.limits.defaultImage, hostImage: null, imageId: null, snapshot: undefined, hostId: null, env: {}, kind: 'user' };
    if (input.internal) {
      const i = input.internal;
      const snapshot = i.snapshotId ? await snapshotRepository(this.db).findById(i.snapshotId) : undefined;
      if (i.snapshotId && (!snapshot || snapshot.state !== 'ready' || snapshot.deletedAt || snapshot.organizationId !== organizationId)) throw errors.validation('snapshot', `layer ${i.snapshotId} is not ready`);
      return { ...base, image: i.imageLabel, hostImage: i.hostImage, snapshot, hostId: snapshot?.hostId ?? i.hostId, kind: i.kind };
    }
    if (input.snapshot !== undefined) {
      if (input.image !== undefined && input.image !== this.limits.defaultImage) throw errors.validation('image', 'give either an image or a snapshot, not both');
      const snapshot = await this.readySnapshot(organizationId, input.snapshot);
      // A snapshot sits on the image its source sandbox started from.
      const origin = snapshot.sourceSandboxId ? await this.repo().findById(snapshot.sourceSandboxId) : undefined;
      return { ...base, image: origin?.image ?? base.image, hostImage: origin?.hostImage ?? null, imageId: origin?.imageId ?? null, snapshot, hostId: snapshot.hostId };
    }
    const reference = input.image ?? this.limits.defaultImage;
    if (reference === this.limits.defaultImage) return base;
    const image = this.images ? await this.images.find(organizationId, reference, 'image') : undefined;
    if (!image) throw errors.validation('image', `unknown image "${reference.slice(0, 200)}" (build or pull it first, see POST /api/v1/builds; available: ${this.limits.defaultImage} and this organisation's images)`);
    if (image.id === this.limits.defaultImage) return base;
    // Another built-in image (`code-interpreter`): on every host under its own name, not a row.
    if (image.source.kind === 'builtin') return { ...base, image: image.id };
    const start = this.images!.startPoint(image);
    const snapshot = start.snapshotId ? await snapshotRepository(this.db).findById(start.snapshotId) : undefined;
    if (start.snapshotId && (!snapshot || snapshot.state !== 'ready' || snapshot.deletedAt)) throw errors.invalidState('image', reference, 'unavailable', ['ready'], 'create a sandbox from');
    const label = image.tags.length && !/^img[a-z0-9]{17}$/.test(reference) ? (reference.includes(':') ? reference : `${reference}:${image.tags.includes('latest') ? 'latest' : image.tags[0]}`) : image.id;
    return { ...base, image: label, hostImage: start.hostImage, imageId: image.id, snapshot, hostId: start.hostId, env: start.env };
  }

  /** A failed create or fork leaves nothing behind: the host removes what it built and the row is closed as deleted. */
  private async rollBackCreate(sandbox: Sandbox, op: typeof OPERATIONS.create | typeof OPERATIONS.fork, client: HostClient, operationId: string, cause: unknown): Promise<void> {
    const errorMessage = failureMessage(op, toNestboxError(cause));
    let removed = false;
    try {
      await client.destroySandbox(sandbox.id);
      removed = true;
    } catch {
      // Host unreachable: keep the row visible as error so the reconciler and the user can clean up.
    }
    await this.lifecycle.finish(sandbox, op, removed ? 'rolledBack' : 'failed', operationId, { errorMessage });
  }

  private validateCreate(input: CreateSandboxInput) {
    const l = this.limits;
    const cpu = input.cpu ?? l.defaultCpu;
    if (!Number.isInteger(cpu) || cpu < 1 || cpu > l.maxCpu) throw errors.validation('cpu', `must be an integer from 1 to ${l.maxCpu}`);
    const memoryMiB = input.memoryMiB ?? l.defaultMemoryMiB;
    if (!Number.isInteger(memoryMiB) || memoryMiB < l.minMemoryMiB || memoryMiB > l.maxMemoryMiB) {
      throw errors.validation('memoryMiB', `must be an integer from ${l.minMemoryMiB} to ${l.maxMemoryMiB}`);
    }
    const timeoutSeconds = this.validateTimeout(input.timeoutSeconds ?? l.defaultTimeoutSeconds);
    const env = input.env ?? {};
    for (const [name, value] of Object.entries(env)) {
      if (!ENV_NAME.test(name)) throw errors.validation(`env.${name}`, 'is not a valid environment variable name');
      if (value.includes('\0')) throw errors.validation(`env.${name}`, 'must not contain NUL');
    }
    if (input.image !== undefined && (typeof input.image !== 'string' || input.image.length > 300)) throw errors.validation('image', 'must be an image name, `name` or `name:tag`');
    const image = l.defaultImage;
    const diskGiB = input.diskGiB ?? l.defaultDiskGiB;
    if (!Number.isInteger(diskGiB) || diskGiB < 1 || diskGiB > l.maxDiskGiB) throw errors.validation('diskGiB', `must be an integer from 1 to ${l.maxDiskGiB}`);
    return { image, cpu, memoryMiB, diskGiB, env, labels: input.labels ?? {}, timeoutSeconds };
  }

  private validatePolicy(input: LifecyclePolicy): LifecyclePolicy {
    const max = this.limits.maxTimeoutSeconds;
    if (input.idleTimeoutSeconds !== undefined && (!Number.isInteger(input.idleTimeoutSeconds) || input.idleTimeoutSeconds < 0 || input.idleTimeoutSeconds > max)) {
      throw errors.validation('idleTimeoutSeconds', `must be an integer from 0 (never) to ${max}`);
    }
    if (input.idleAction !== undefined && input.idleAction !== 'pause' && input.idleAction !== 'stop') throw errors.validation('idleAction', 'must be "pause" or "stop"');
    if (input.autoDeleteSeconds !== undefined && input.autoDeleteSeconds !== null && (!Number.isInteger(input.autoDeleteSeconds) || input.autoDeleteSeconds < 0 || input.autoDeleteSeconds > max)) {
      throw errors.validation('autoDeleteSeconds', `must be null (never) or an integer from 0 to ${max}`);
    }
    return input;
  }

  private async readySnapshot(organizationId: string, name: string): Promise<Snapshot> {
    const snapshot = await snapshotRepository(this.db).findLiveByName(organizationId, name);
    if (!snapshot) throw errors.validation('snapshot', `no snapshot named "${name}"`);
    if (snapshot.state !== 'ready') throw errors.invalidState('snapshot', name, snapshot.state, ['ready'], 'create a sandbox from');
    return snapshot;
  }

  private validateTimeout(timeoutSeconds: number): number {
    const max = this.limits.maxTimeoutSeconds;
    if (!Number.isInteger(timeoutSeconds) || timeoutSeconds < 0 || timeoutSeconds > max) {
      throw errors.validation('timeoutSeconds', `must be an integer from 0 (no timeout) to ${max}`);
    }
    return timeoutSeconds;
  }

  /** What its host agent is told about a sandbox (also the spec a move's target records). */
  hostSpec(s: Sandbox): HostSandboxSpec {
    const disk = s.diskGiB === null ? {} : { diskGiB: s.diskGiB, diskInodes: Math.max(1024, s.diskGiB * this.limits.diskInodesPerGiB) };
    const volumes = s.volumeMounts?.length ? { volumes: s.volumeMounts.map((m) => ({ volumeId: m.volumeId, mountPath: m.mountPath, readOnly: m.readOnly, ...(m.subpath ? { subpath: m.subpath } : {}) })) } : {};
    return { id: s.id, image: s.hostImage ?? s.image, cpu: s.cpu, memoryMiB: s.memoryMiB, env: s.env, egress: s.egress, ...disk, ...volumes };
  }

  /** The only way handlers load a sandbox: another organisation's (or a key's unlisted) sandbox is simply not found. */
  async get(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:read');
    return this.load(principal, id);
  }

  /** Get by id, or else by name (Daytona's `GET /sandbox/{sandboxIdOrName}`). */
  async getByIdOrName(principal: Principal, idOrName: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:read');
    const byId = canSeeSandbox(principal, idOrName) ? await this.repo().findVisible(idOrName, principal.organizationId) : undefined;
    if (byId) return byId;
    const byName = await this.repo().findVisibleByName(idOrName, principal.organizationId);
    if (!byName || !canSeeSandbox(principal, byName.id)) throw errors.notFound('sandbox', idOrName);
    return byName;
  }

  private async load(principal: Principal, id: string): Promise<Sandbox> {
    const sandbox = canSeeSandbox(principal, id) ? await this.repo().findVisible(id, principal.organizationId) : undefined;
    if (!sandbox) throw errors.notFound('sandbox', id);
    return sandbox;
  }

  async list(principal: Principal, input: ListSandboxesInput): Promise<{ items: Sandbox[]; nextCursor: string | null }> {
    requireScope(principal, 'sandboxes:read');
    const limit = input.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > this.limits.maxListLimit) {
      throw errors.validation('limit', `must be an integer from 1 to ${this.limits.maxListLimit}`);
    }
    const sort = input.sort;
    if (sort && (!SANDBOX_SORT_KEYS.includes(sort.key) || (sort.order !== 'asc' && sort.order !== 'desc'))) {
      throw errors.validation('sort', `must be one of ${SANDBOX_SORT_KEYS.join(', ')}, ordered asc or desc`);
    }
    const items = await this.repo().list({
      organizationId: principal.organizationId,
      labels: input.labels,
      states: input.states,
      ids: principal.sandboxIds ? [...principal.sandboxIds] : undefined,
      limit: limit + 1,
      idPrefix: input.idPrefix,
      namePrefix: input.namePrefix,
      startedAfter: input.startedAfter,
      startedBefore: input.startedBefore,
      sourceSnapshotId: input.sourceSnapshotId,
      sort,
      after: input.cursor && !sort ? decodeCursor(input.cursor) : undefined,
      sortAfter: input.cursor && sort ? decodeSortCursor(input.cursor, sort) : undefined,
    });
    const page = items.slice(0, limit);
    const last = page[page.length - 1];
    const nextCursor = items.length > limit ? (sort ? encodeSortCursor(last, sort) : encodeCursor(last)) : null;
    return { items: page, nextCursor };
  }

  async update(principal: Principal, id: string, input: UpdateSandboxInput): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    const patch: SandboxPatch = {};
    if (input.labels !== undefined) patch.labels = input.labels;
    this.validatePolicy(input);
    if (input.idleTimeoutSeconds !== undefined) patch.idleTimeoutSeconds = input.idleTimeoutSeconds;
    if (input.idleAction !== undefined) patch.idleAction = input.idleAction;
    if (input.autoDeleteSeconds !== undefined) patch.autoDeleteSeconds = input.autoDeleteSeconds;
    if (input.egress !== undefined) {
      patch.egress = validateEgress(input.egress);
      // In force before we answer: a sandbox that holds a slot gets the new rules now; a stopped
      // one gets them with its next start (its spec carries them). While an operation runs, the
      // spec it sent may be the old one, so the change waits for a settled state.
      if (sandbox.state === 'running' || sandbox.state === 'paused') {
        await (await this.hosts.clientFor(sandbox.hostId!)).setEgress(sandbox.id, patch.egress);
      } else if (isTransitional(sandbox.state)) {
        throw errors.invalidState('sandbox', sandbox.id, sandbox.state, ['running', 'paused', 'stopped', 'error'], 'change the egress policy of');
      }
    }
    if (input.timeoutMode !== undefined && input.timeoutMode !== 'restart' && input.timeoutMode !== 'extend') throw errors.validation('timeoutMode', 'must be "restart" or "extend"');
    let extended: Sandbox | undefined;
    if (input.timeoutSeconds !== undefined) {
      const timeoutSeconds = this.validateTimeout(input.timeoutSeconds);
      // A new timeout counts from now for a live sandbox (a paused one's clock runs too): this
      // is the keep-alive call. A stopped one gets it with its next start.
      const live = sandbox.state === 'running' || sandbox.state === 'paused';
      const deadline = timeoutDeadline(timeoutSeconds, new Date());
      if (live && input.timeoutMode === 'extend') {
        // Only later: none (never) stays none; a shorter one changes nothing.
        if (deadline === null) {
          if (sandbox.expiresAt !== null) Object.assign(patch, { timeoutSeconds, expiresAt: null });
        } else {
          extended = await this.repo().extendDeadline(id, deadline, timeoutSeconds);
        }
      } else {
        patch.timeoutSeconds = timeoutSeconds;
        if (live) patch.expiresAt = deadline;
      }
    }
    if (Object.keys(patch).length === 0) return this.noted(extended) ?? (await this.repo().findById(id)) ?? sandbox;
    return this.noted(await this.repo().update(id, patch)) ?? sandbox;
  }

  /** Resize: new vCPUs, memory and disk (sandbox-resize.ts). */
  resize(principal: Principal, id: string, input: ResizeSandboxInput): Promise<Sandbox> {
    return resizeSandbox({ db: this.db, hosts: this.hosts, limits: this.limits, orgLimits: this.orgLimits, load: (p, i) => this.load(p, i), clientFor: (hostId) => this.hosts.clientFor(hostId) }, principal, id, input);
  }

  /**
   * The timeout of a running sandbox ends now (E2B's setTimeout(0)): its deadline becomes the
   * present and the deadline timer acts on it as on any timeout (stop, or delete with
   * auto-delete 0), on whichever replica claims it first.
   */
  async expireNow(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state !== 'running') throw errors.invalidState('sandbox', id, sandbox.state, ['running'], 'end the timeout of');
    const expired = await this.repo().transition(id, ['running'], { expiresAt: new Date() });
    if (!expired) throw errors.invalidState('sandbox', id, (await this.repo().findById(id))?.state ?? 'deleted', ['running'], 'end the timeout of');
    return this.noted(expired);
  }

  /**
   * Start of a stopped sandbox: it begins to count again (a stopped sandbox holds no runtime),
   * so the organisation's limits are checked under the same lock as creates. A paused sandbox
   * never stopped counting, so its unpause needs no check.
   */
  private async beginStart(sandbox: Sandbox): Promise<{ sandbox: Sandbox; operationId: string }> {
    assertCanBegin(OPERATIONS.start, sandbox.id, sandbox.state);
    await this.transfer?.assertNotMoving(sandbox.id);
    return this.withinQuota(sandbox.organizationId, { sandboxes: 1, cpu: sandbox.cpu, memoryMiB: sandbox.memoryMiB, diskGiB: 0 }, async (tx) => {
      // Its disk is on its host: that host must be live and have room for its vCPUs and memory again.
      await this.hosts.place(tx, { cpu: sandbox.cpu, memoryMiB: sandbox.memoryMiB, diskGiB: 0, fixed: { hostId: sandbox.hostId!, what: `sandbox ${sandbox.id}'s disk`, existing: sandbox.id } });
      return this.lifecycle.begin(sandbox, OPERATIONS.start, tx);
    }, sandbox.id);
  }

  async stop(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state === 'stopped') return sandbox; // retry-safe
    const { operationId } = await this.lifecycle.begin(sandbox, OPERATIONS.stop);
    return this.finishStop(sandbox, operationId, 'user');
  }

  /** Used by the API, the timeout and idle sweepers and the reconciler alike. */
  async finishStop(sandbox: Sandbox, operationId: string, reason: string): Promise<Sandbox> {
    try {
      const client = await this.hosts.clientFor(sandbox.hostId!);
      await client.stopSandbox(sandbox.id);
    } catch (err) {
      const e = toNestboxError(err);
      await this.lifecycle.finish(sandbox, OPERATIONS.stop, 'failed', operationId, { errorMessage: failureMessage(OPERATIONS.stop, e) });
      throw e;
    }
    const stopped = await this.lifecycle.finish(sandbox, OPERATIONS.stop, 'succeeded', operationId, { stopReason: reason });
    return stopped ?? (await this.repo().findById(sandbox.id))!;
  }

  async resume(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state === 'running') return sandbox; // retry-safe
    if (sandbox.state === 'paused') return this.unpause(principal, id);
    const { operationId } = await this.beginStart(sandbox);
    return this.finishStart(sandbox, operationId);
  }

  private async finishStart(sandbox: Sandbox, operationId: string): Promise<Sandbox> {
    let result;
    try {
      const client = await this.hosts.clientFor(sandbox.hostId!);
      result = await client.startSandbox(this.hostSpec(sandbox));
      // Re-resolved at every start: a secret changed or deleted since takes effect now.
      if (this.secrets) await this.secrets.deliver(sandbox, client.guest(sandbox.id));
    } catch (err) {
      const e = toNestboxError(err);
      await this.lifecycle.finish(sandbox, OPERATIONS.start, 'failed', operationId, { errorMessage: failureMessage(OPERATIONS.start, e) });
      throw e;
    }
    if (sandbox.imageId && this.startHook && !result.memoryRestored) {
      // Its processes did not survive the stop: the image's start command runs again. The disk
      // is the user's now, so a start command that fails leaves the sandbox running (as a
      // container whose entrypoint failed can still be inspected); the reason is logged.
      await this.startHook(sandbox, (await this.hosts.clientFor(sandbox.hostId!)).guest(sandbox.id), 'start').catch(() => {});
    }
    const running = this.noted(await this.lifecycle.finish(sandbox, OPERATIONS.start, 'succeeded', operationId, {
      memoryRestored: result.memoryRestored,
      resumeReason: result.memoryRestored ? null : (result.resumeReason ?? 'unknown'),
    }));
    return running ?? (await this.repo().findById(sandbox.id))!;
  }

  async delete(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'sandboxes:delete');
    const sandbox = await this.load(principal, id);
    const { operationId } = await this.lifecycle.begin(sandbox, OPERATIONS.delete);
    await this.finishDelete(sandbox, operationId);
  }

  async finishDelete(sandbox: Sandbox, operationId: string): Promise<void> {
    try {
      // A lost host cannot be asked; it destroys the sandbox when it returns (HostService.hostReturned).
      if (sandbox.hostId && !(await this.hosts.isLost(sandbox.hostId))) await (await this.hosts.clientFor(sandbox.hostId)).destroySandbox(sandbox.id);
    } catch (err) {
      const e = toNestboxError(err);
      await this.lifecycle.finish(sandbox, OPERATIONS.delete, 'failed', operationId, { errorMessage: failureMessage(OPERATIONS.delete, e) });
      throw e;
    }
    await this.lifecycle.finish(sandbox, OPERATIONS.delete, 'succeeded', operationId);
  }

  /**
   * Resolve a sandbox that must be running for `operation`, plus its host client. A paused
   * sandbox, or one the idle policy stopped, is woken first, so the caller never notices; one
   * stopped by its user or its timeout stays stopped (409 with the state).
   */
  private async runningSandbox(principal: Principal, id: string, operation: string): Promise<{ sandbox: Sandbox; client: HostClient }> {
    let sandbox = await this.load(principal, id);
    if (sandbox.state !== 'running' && isWakeable(sandbox)) sandbox = await this.wake(sandbox);
    assertNotHostLost(sandbox, operation);
    assertRunning(sandbox.id, sandbox.state, operation);
    await this.noteActivityOf(sandbox);
    return { sandbox, client: await this.hosts.clientFor(sandbox.hostId!) };
  }

  /**
   * A hosted-port request for sandbox `id` (already authorised by its port token, or public):
   * a paused or idle-stopped sandbox is woken, one in the middle of an operation is waited for,
   * and the traffic counts as activity. Undefined when there is no such sandbox; otherwise the
   * sandbox as it is now, which the caller reports when it is not running.
   */
  async wakeForTraffic(id: string): Promise<Sandbox | undefined> {
    let sandbox = await this.repo().findById(id);
    if (!sandbox || sandbox.state === 'deleted') return undefined;
    if (sandbox.state !== 'running' && (isWakeable(sandbox) || isTransitional(sandbox.state))) sandbox = await this.wake(sandbox);
    if (sandbox.state === 'running') await this.noteActivity(id);
    return sandbox;
  }

  /** Counts toward the idle timeout (see README "Idle policy" for what is activity). */
  async noteActivity(id: string): Promise<void> {
    await this.repo().touchActivity(id, new Date(), ACTIVITY_GRANULARITY_MS);
  }

  /**
   * noteActivity for a row just read: the update's own condition (nothing newer than the
   * granularity) is checked against the row first, so most calls (an exec, a file read every
   * few seconds or more often) cost no write at all.
   */
  private async noteActivityOf(sandbox: Sandbox): Promise<void> {
    const now = new Date();
    if (sandbox.lastActivityAt && now.getTime() - sandbox.lastActivityAt.getTime() < ACTIVITY_GRANULARITY_MS) return;
    await this.repo().touchActivity(sandbox.id, now, ACTIVITY_GRANULARITY_MS);
  }

  /** Bring a paused or idle-stopped sandbox back; concurrent callers wait for the one that acts. */
  private async wake(initial: Sandbox): Promise<Sandbox> {
    const deadline = Date.now() + WAKE_WAIT_MS;
    let sandbox = initial;
    while (Date.now() < deadline) {
      if (sandbox.state === 'running' || !isWakeable(sandbox) && !isTransitional(sandbox.state)) return sandbox;
      try {
        if (sandbox.state === 'paused') return await this.finishUnpause(sandbox, (await this.lifecycle.begin(sandbox, OPERATIONS.unpause)).operationId);
        if (sandbox.state === 'stopped') return await this.finishStart(sandbox, (await this.beginStart(sandbox)).operationId);
      } catch (err) {
        // Another call won the race to wake it; wait for that one below.
        if (!(err instanceof NestboxError && err.code === 'invalid_state')) throw err;
      }
      await new Promise((r) => setTimeout(r, 100));
      sandbox = (await this.repo().findById(sandbox.id)) ?? sandbox;
    }
    return sandbox;
  }

  async pause(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state === 'paused') return sandbox; // retry-safe
    const { operationId } = await this.lifecycle.begin(sandbox, OPERATIONS.pause);
    return this.finishPause(sandbox, operationId, 'user');
  }

  async finishPause(sandbox: Sandbox, operationId: string, reason: string): Promise<Sandbox> {
    try {
      await (await this.hosts.clientFor(sandbox.hostId!)).pauseSandbox(sandbox.id);
    } catch (err) {
      const e = toNestboxError(err);
      await this.lifecycle.finish(sandbox, OPERATIONS.pause, 'failed', operationId, { errorMessage: failureMessage(OPERATIONS.pause, e) });
      throw e;
    }
    const paused = await this.lifecycle.finish(sandbox, OPERATIONS.pause, 'succeeded', operationId, { pauseReason: reason });
    return paused ?? (await this.repo().findById(sandbox.id))!;
  }

  async unpause(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state === 'running') return sandbox; // retry-safe
    const { operationId } = await this.lifecycle.begin(sandbox, OPERATIONS.unpause);
    return this.finishUnpause(sandbox, operationId);
  }

  private async finishUnpause(sandbox: Sandbox, operationId: string): Promise<Sandbox> {
    try {
      await (await this.hosts.clientFor(sandbox.hostId!)).unpauseSandbox(sandbox.id);
    } catch (err) {
      const e = toNestboxError(err);
      await this.lifecycle.finish(sandbox, OPERATIONS.unpause, 'failed', operationId, { errorMessage: failureMessage(OPERATIONS.unpause, e) });
      throw e;
    }
    // Memory stayed in place the whole time (the table's unpause outcome says memoryRestored).
    const running = this.noted(await this.lifecycle.finish(sandbox, OPERATIONS.unpause, 'succeeded', operationId));
    return running ?? (await this.repo().findById(sandbox.id))!;
  }

  /** Keep-alive: the timeout counts again from now, and it is activity. */
  async keepAlive(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    const now = new Date();
    const patch: SandboxPatch = { lastActivityAt: now };
    if (sandbox.state === 'running' || sandbox.state === 'paused') patch.expiresAt = timeoutDeadline(sandbox.timeoutSeconds, now);
    return this.noted(await this.repo().update(id, patch)) ?? sandbox;
  }

  /**
   * Fork into `count` new sandboxes with copies of the source's disk (copy-on-write where the
   * host's store allows). Children get new ids and network slots, the default timeout, the
   * source's image, size, environment and labels (plus `labels` given here), no hosted ports.
   */
  async fork(principal: Principal, id: string, input: ForkInput): Promise<ForkResult> {
    requireScope(principal, 'sandboxes:create');
    if (principal.sandboxIds !== null) throw errors.forbidden('this API key is limited to given sandboxes and cannot create new ones');
    const source = await this.load(principal, id);
    const count = input.count ?? 1;
    if (!Number.isInteger(count) || count < 1 || count > this.limits.maxForkCount) throw errors.validation('count', `must be an integer from 1 to ${this.limits.maxForkCount}`);
    const name = validateName(input.name);
    if (name !== undefined && count !== 1) throw errors.validation('name', 'can only be given when forking one sandbox');
    if (!['running', 'paused', 'stopped'].includes(source.state)) throw errors.invalidState('sandbox', id, source.state, ['running', 'paused', 'stopped'], 'fork');
    if (source.volumeMounts?.length) throw new NestboxError('conflict', `sandbox ${id} mounts volumes (${source.volumeMounts.map((m) => m.name).join(', ')}); a sandbox with volume mounts cannot be forked (create a new sandbox that mounts them instead)`, { field: 'volumes' });
    const timeoutSeconds = this.validateTimeout(input.timeoutSeconds ?? this.limits.defaultTimeoutSeconds);
    const operationId = newOperationId();
    const children: Sandbox[] = [];
    let inheritsSecrets = false;
    await this.withinQuota(source.organizationId, { sandboxes: count, cpu: source.cpu * count, memoryMiB: source.memoryMiB * count, diskGiB: (source.diskGiB ?? this.limits.defaultDiskGiB) * count }, async (tx) => {
    // Children are copies of the source's disk, so they go to its host, which must take them.
    const childDiskGiB = source.diskGiB ?? this.limits.defaultDiskGiB;
    await this.hosts.place(tx, { cpu: source.cpu * count, memoryMiB: source.memoryMiB * count, diskGiB: childDiskGiB * count, fixed: { hostId: source.hostId!, what: `the disk of sandbox ${source.id}` } });
    for (let i = 0; i < count; i++) {
      children.push(
        await this.lifecycle.insert(tx, OPERATIONS.fork, operationId, {
          id: newSandboxId(),
          organizationId: source.organizationId,
          hostId: source.hostId!,
          image: source.image,
          hostImage: source.hostImage,
          imageId: source.imageId,
          kind: source.kind,
          cpu: source.cpu,
          memoryMiB: source.memoryMiB,
          // A child's disk is a clone of its source's, so it has the same size (and usage).
          diskGiB: source.diskGiB ?? this.limits.defaultDiskGiB,
          env: source.env,
          labels: { ...source.labels, ...input.labels },
          timeoutSeconds,
          idleTimeoutSeconds: source.idleTimeoutSeconds,
          idleAction: source.idleAction,
          autoDeleteSeconds: source.autoDeleteSeconds,
          // The child's disk sits on the same snapshot layers as its source.
          sourceSnapshotId: source.sourceSnapshotId,
          forkedFrom: source.id,
          // A fork is no way around its source's network policy.
          egress: source.egress,
          name,
        }).catch((err) => {
          throw nameConflict(err, name);
        }),
      );
    }
    if (this.secrets) inheritsSecrets = await this.secrets.inherit(tx, source, children);
    });
    const client = await this.hosts.clientFor(source.hostId!);
    let result;
    try {
      result = await client.forkSandbox(source.id, children.map((c) => this.hostSpec(c)));
      // The children's processes start afresh (no memory copied here): they get the source's secrets again.
      if (inheritsSecrets) for (const child of children) await this.secrets!.deliver(child, client.guest(child.id));
    } catch (err) {
      for (const child of children) await this.rollBackCreate(child, OPERATIONS.fork, client, operationId, err);
      throw toNestboxError(err);
    }
    const running: Sandbox[] = [];
    for (const child of children) {
      const row = this.noted(await this.lifecycle.finish(child, OPERATIONS.fork, 'succeeded', operationId, {
        memoryRestored: result.memoryCopied,
        resumeReason: result.memoryCopied ? null : 'driver_has_no_memory_snapshot',
      }));
      running.push(row ?? (await this.repo().findById(child.id))!);
    }
    await this.noteActivity(source.id);
    return { sandboxes: running, memoryCopied: result.memoryCopied, diskCopy: result.diskCopy };
  }

  /** Several sandboxes by id, as the principal may see them (for idempotent replays). */
  async getMany(principal: Principal, ids: string[]): Promise<Sandbox[]> {
    const out: Sandbox[] = [];
    for (const id of ids) {
      const s = await this.repo().findById(id);
      if (s && s.organizationId === principal.organizationId) out.push(s);
    }
    return out;
  }

  /**
   * The guest agent of sandbox `id` for the toolbox (core/services/toolbox.ts), which has
   * checked the scope: a paused or idle-stopped sandbox is woken first and the call counts as
   * activity. With `stoppedDisk`, a sandbox that stays stopped (or failed) is answered from its
   * host's read-only view of its kept disk instead, without resuming it.
   */
  async guestFor(principal: Principal, id: string, operation: string, stoppedDisk = false): Promise<GuestClient> {
    if (stoppedDisk) {
      const sandbox = await this.load(principal, id);
      assertNotHostLost(sandbox, operation);
      if ((sandbox.state === 'stopped' || sandbox.state === 'error') && !isWakeable(sandbox)) {
        return (await this.hosts.clientFor(sandbox.hostId!)).guest(id, 'stopped-disk');
      }
    }
    const { client } = await this.runningSandbox(principal, id, operation);
    return client.guest(id);
  }
}
