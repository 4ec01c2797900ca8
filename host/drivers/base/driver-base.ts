// What both drivers do the same way: one record per sandbox in memory and on disk, one lock per
// sandbox (and per snapshot), the checks every Driver method starts with, the disk and snapshot
// stores, and the shape of the runtime they report. A driver subclass supplies what differs
// (how a sandbox runs, pauses, is torn down and adopted); the Driver interface stays its own.
import { VolumeStore } from '../../storage/volumes.js';
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { silentLogger, type Logger } from '../../../core/logger.js';
import { KeyedLocks } from '../../keyed-locks.js';
import type { DiskStore } from '../../storage/disk-store.js';
import type { SnapshotMeta, SnapshotStore } from '../../storage/snapshots.js';
import { removeTree } from '../../util/fs.js';
import { IMAGE_ID, OciImageStore, type OciImageMeta } from '../../images/oci/store.js';
import { DriverError } from '../errors.js';
import type { ImageInfo, PullImageOptions, SandboxRuntime, SandboxSpec, SnapshotInfo, SnapshotResult } from '../types.js';

export const SANDBOX_ID = /^[a-z0-9]{1,32}$/;
/** 108 bytes of `sun_path` including the terminating NUL. */
export const SUN_PATH_MAX = 107;
export const MAX_FORK_CHILDREN = 64;

/** deleteImage's lock key (apart from sandbox ids, which have no ':'). */
function imageLockKey(id: string): string {
  return `image:${id}`;
}

export function assertSandboxId(id: string): void {
  if (typeof id !== 'string' || !SANDBOX_ID.test(id)) throw new DriverError('validation_failed', `invalid sandbox id "${id}": lowercase letters and digits only, at most 32`);
}

/** What the base needs of a driver's record. */
export interface BaseRecord {
  id: string;
  owner: string;
  status: string;
  pid?: number;
  /** The network slot while the sandbox runs. */
  slot?: { index: number; netns: string; hostAddress: string; sandboxAddress: string };
  /** Where the sandbox's disk lives when not in its sandbox dir (the reflink store). */
  diskDir?: string;
  /** What it was created as: `spec.image` is the image it starts from (an OCI image's id, or a name). */
  spec: Pick<SandboxSpec, 'image'>;
}

function imageInfoOf(meta: OciImageMeta): ImageInfo {
  return {
    id: meta.id,
    reference: meta.reference,
    sizeBytes: meta.sizeBytes,
    compressedBytes: meta.compressedBytes,
    layers: meta.layers,
    created: meta.created,
    pulledAt: meta.pulledAt,
    config: meta.config,
  };
}

export abstract class DriverBase<R extends BaseRecord> {
  protected readonly dataDir: string;
  protected readonly sandboxesDir: string;
  /** Persistent named volumes on this host (host/storage/volumes.ts), `<dataDir>/volumes`. */
  readonly volumes: VolumeStore;
  /** Lines about one sandbox carry its id as `sandboxId` (and the `operation` when there is one). */
  protected readonly log: Logger;
  protected readonly records = new Map<string, R>();
  protected readonly locks = new KeyedLocks();
  /** Each live sandbox's proof key for this boot (agent-protocol/auth.ts), also in its agent.key. */
  protected readonly agentKeys = new Map<string, Buffer>();
  protected diskStore?: DiskStore;
  protected snapshotStore?: SnapshotStore;
  protected initialized = false;
  /**
   * The OCI image store (host/images/oci) sandboxes start from, set by the driver's constructor;
   * without one the image methods answer not_supported.
   */
  protected ociStoreDir?: string;
  private ociImageStore?: OciImageStore;
  /** Creates in flight per image: deleteImage refuses an image a create is about to mount or copy. */
  private readonly imageCreates = new Map<string, number>();

  /** `className` names the driver in "init() must run first". */
  protected constructor(
    private readonly className: string,
    dataDir: string,
    logger: Logger | undefined,
  ) {
    this.dataDir = resolve(dataDir);
    this.sandboxesDir = join(this.dataDir, 'sandboxes');
    this.volumes = new VolumeStore(join(this.dataDir, 'volumes'));
    this.log = logger ?? silentLogger;
  }

  // ---- what each driver supplies -----------------------------------------------------------

  protected abstract readRecord(sandboxDir: string): Promise<R | undefined>;
  protected abstract runtimeOf(record: R): SandboxRuntime;
  protected abstract validateSpec(spec: SandboxSpec): void;
  /** Where a new sandbox's disk goes: the reflink store, or under the sandbox dir. */
  protected abstract newDiskDir(id: string): string;
  /** Runtime, disk and record of a sandbox (the caller holds its lock). */
  protected abstract destroyUnlocked(id: string): Promise<void>;
  protected abstract setPaused(record: R, paused: boolean): Promise<void>;
  protected abstract snapshotResult(meta: SnapshotMeta): SnapshotResult;

  // ---- Driver methods that are the same for both -----------------------------------------------

  async get(id: string): Promise<SandboxRuntime | undefined> {
    const record = this.records.get(id);
    return record ? this.runtimeOf(record) : undefined;
  }

  async list(): Promise<SandboxRuntime[]> {
    return [...this.records.values()].map((record) => this.runtimeOf(record));
  }

  async pause(id: string): Promise<SandboxRuntime> {
    return this.withRecord(id, async (record) => {
      await this.setPaused(record, true);
      return this.runtimeOf(record);
    });
  }

  async unpause(id: string): Promise<SandboxRuntime> {
    return this.withRecord(id, async (record) => {
      await this.setPaused(record, false);
      return this.runtimeOf(record);
    });
  }

  async listSnapshots(): Promise<SnapshotInfo[]> {
    this.assertInitialized();
    return (await this.requireSnapshots().list()).map((meta) => ({ ...this.snapshotResult(meta), sourceId: meta.sourceId, image: meta.image, createdAt: meta.createdAt }));
  }

  // ---- images (the OCI store; the same for both drivers) -----------------------------------------

  /** The driver's OCI image store, opened at first use. */
  protected imageStore(): OciImageStore {
    if (!this.ociStoreDir) throw new DriverError('not_supported', `the ${this.className} has no OCI image store configured`);
    this.ociImageStore ??= new OciImageStore({ storeDir: this.ociStoreDir });
    return this.ociImageStore;
  }

  async pullImage(reference: string, options: PullImageOptions = {}): Promise<ImageInfo> {
    const image = await this.imageStore().pull(reference, { credentials: options.credentials, onProgress: options.onProgress, signal: options.signal });
    return imageInfoOf(image.meta);
  }

  async listImages(): Promise<ImageInfo[]> {
    return (await this.imageStore().list()).map(imageInfoOf).sort((a, b) => a.pulledAt.localeCompare(b.pulledAt) || a.id.localeCompare(b.id));
  }

  /**
   * Removes an image unless something on this host needs it: a sandbox record of any status
   * (a stopped sandbox starts from it again), a create in flight, or a snapshot taken of a
   * sandbox of it. Records on disk count too (another owner sharing this data dir).
   */
  async deleteImage(id: string): Promise<void> {
    this.assertInitialized();
    const store = this.imageStore();
    if (typeof id !== 'string' || !IMAGE_ID.test(id)) throw new DriverError('validation_failed', `image id "${id}" must be sha256: followed by 64 hex digits`);
    await this.withLock(imageLockKey(id), async () => {
      if (!(await store.get(id))) return;
      const users = new Set<string>();
      for (const record of this.records.values()) if (record.spec.image === id) users.add(`sandbox ${record.id}`);
      for (const entry of await readdir(this.sandboxesDir).catch(() => [] as string[])) {
        if (this.records.has(entry) || !SANDBOX_ID.test(entry)) continue;
        const record = await this.readRecord(this.sandboxDir(entry));
        if (record?.spec?.image === id) users.add(`sandbox ${entry}`);
      }
      for (const meta of this.snapshotStore ? await this.snapshotStore.list() : []) if (meta.image === id) users.add(`snapshot ${meta.snapshotId}`);
      // Checked last, with no await until the store's rename is issued: a create that counts
      // itself after this point finds the image gone.
      if (this.imageCreates.get(id)) users.add(`${this.imageCreates.get(id)} sandbox create(s) in progress`);
      if (users.size) throw new DriverError('conflict', `image ${id} is in use on this host by ${[...users].slice(0, 5).join(', ')}${users.size > 5 ? ', …' : ''}`);
      await store.remove(id);
    });
  }

  // ---- locks -------------------------------------------------------------------------------------

  protected withLock<T>(key: string, task: () => Promise<T>): Promise<T> {
    return this.locks.run(key, task);
  }

  /**
   * Most calls on one sandbox: after init, a valid id (and whatever `checkArguments` checks of
   * the call's other arguments), under its lock, with its record (or `not_found`).
   */
  protected async withRecord<T>(id: string, task: (record: R) => Promise<T>, checkArguments?: () => void): Promise<T> {
    this.assertInitialized();
    assertSandboxId(id);
    checkArguments?.();
    return this.withLock(id, () => task(this.requireRecord(id)));
  }

  /**
   * create(): under the new sandbox's lock, once the remains of a crashed create of that id are
   * gone. `prepare` makes the record (and fetches what the build needs); a failing `build`
   * takes everything down again, record included.
   */
  protected async createUnder(spec: SandboxSpec, prepare: () => Promise<{ record: R; build: () => Promise<void> }>): Promise<SandboxRuntime> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      await this.assertCreatable(spec.id);
      await this.removeRemains(spec.id);
      const started = Date.now();
      // Until the record exists (it names the image), the image is held by this count.
      this.imageCreates.set(spec.image, (this.imageCreates.get(spec.image) ?? 0) + 1);
      try {
        const { record, build } = await prepare();
        try {
          await build();
        } catch (error) {
          await this.destroyUnlocked(spec.id).catch((cleanupError) => this.log.warn({ sandboxId: spec.id, operation: 'create' }, `create: cleanup after failure failed: ${String(cleanupError)}`));
          throw error;
        }
        this.log.info({ sandboxId: spec.id, operation: 'create', ms: Date.now() - started, slot: record.slot?.index }, `create: running in ${Date.now() - started} ms (slot ${record.slot?.index})`);
        return this.runtimeOf(record);
      } finally {
        const left = (this.imageCreates.get(spec.image) ?? 1) - 1;
        if (left > 0) this.imageCreates.set(spec.image, left);
        else this.imageCreates.delete(spec.image);
      }
    });
  }

  /** Takes several locks in sorted order (one global order: no deadlock between multi-lock calls). */
  protected withLocks<T>(keys: string[], task: () => Promise<T>): Promise<T> {
    return this.locks.runAll(keys, task);
  }

  // ---- assertions ------------------------------------------------------------------------------

  protected assertInitialized(): void {
    if (!this.initialized) throw new Error(`${this.className}.init() must run first`);
  }

  /** A part init() sets up. */
  protected afterInit<T>(value: T | undefined): T {
    if (value === undefined) throw new Error(`${this.className}.init() must run first`);
    return value;
  }

  protected requireDiskStore(): DiskStore {
    return this.afterInit(this.diskStore);
  }

  protected requireSnapshots(): SnapshotStore {
    return this.afterInit(this.snapshotStore);
  }

  protected async requireSnapshot(snapshotId: string): Promise<SnapshotMeta> {
    const meta = await this.requireSnapshots().get(snapshotId);
    if (!meta) throw new DriverError('not_found', `snapshot ${snapshotId} not found on this host`);
    return meta;
  }

  protected requireRecord(id: string): R {
    const record = this.records.get(id);
    if (!record) throw new DriverError('not_found', `sandbox ${id} not found`);
    return record;
  }

  /** A create may go ahead: no sandbox of that id exists beyond a crashed create's remains. */
  protected async assertCreatable(id: string): Promise<void> {
    const existing = this.records.get(id) ?? (await this.readRecord(this.sandboxDir(id)));
    if (existing && existing.status !== 'creating') throw new DriverError('conflict', `sandbox ${id} already exists`);
  }

  /** The children of a fork: 1 to MAX_FORK_CHILDREN valid specs, no id twice, none a snapshot; their ids. */
  private assertForkChildren(sourceId: string, children: SandboxSpec[]): Set<string> {
    assertSandboxId(sourceId);
    if (!Array.isArray(children) || children.length === 0 || children.length > MAX_FORK_CHILDREN) {
      throw new DriverError('validation_failed', `fork needs 1 to ${MAX_FORK_CHILDREN} children, got ${Array.isArray(children) ? children.length : 'none'}`);
    }
    const ids = new Set<string>();
    for (const child of children) {
      this.validateSpec(child);
      if (child.snapshot !== undefined) throw new DriverError('validation_failed', `child ${child.id}: a fork takes its disk from the source, not from a snapshot`);
      if (child.id === sourceId || ids.has(child.id)) throw new DriverError('validation_failed', `child id ${child.id} is used twice`);
      ids.add(child.id);
    }
    return ids;
  }

  /**
   * fork(): valid children, then every involved sandbox locked in one global order (so two forks
   * cannot deadlock), the source's record found (and passing `checkSource`) and no child
   * existing yet.
   */
  protected async forkUnder<T>(sourceId: string, children: SandboxSpec[], task: (source: R) => Promise<T>, checkSource?: (source: R) => void): Promise<T> {
    this.assertInitialized();
    const ids = this.assertForkChildren(sourceId, children);
    return this.withLocks([sourceId, ...ids], async () => {
      const source = this.requireRecord(sourceId);
      checkSource?.(source);
      await this.assertChildrenFree(children);
      return task(source);
    });
  }

  /** Under the children's locks: none of them exists yet. */
  private async assertChildrenFree(children: SandboxSpec[]): Promise<void> {
    for (const child of children) {
      if (this.records.has(child.id) || (await this.readRecord(this.sandboxDir(child.id)))) throw new DriverError('conflict', `sandbox ${child.id} already exists`);
    }
  }

  // ---- shared steps ------------------------------------------------------------------------------

  /** A directory (or disk) without a usable record is the remains of a create that crashed. */
  protected async removeRemains(id: string): Promise<void> {
    if (existsSync(this.sandboxDir(id)) || existsSync(this.newDiskDir(id))) await this.destroyUnlocked(id);
  }

  /** The disk dirs a sandbox may have outside its sandbox dir: its record's and where a new one would go. */
  protected async removeDiskDirs(id: string, record: R | undefined): Promise<void> {
    const dir = this.sandboxDir(id);
    for (const diskDir of new Set([record?.diskDir, this.newDiskDir(id)])) if (diskDir && diskDir !== dir) await removeTree(diskDir);
  }

  /** Sandbox dirs on disk whose record is absent or this owner's, with that record (adoption at init). */
  protected async ownSandboxesOnDisk(owner: string, beforeRead?: (sandboxDir: string) => Promise<void>): Promise<{ id: string; record: R | undefined }[]> {
    const found: { id: string; record: R | undefined }[] = [];
    for (const entry of await readdir(this.sandboxesDir, { withFileTypes: true })) {
      if (!entry.isDirectory() || !SANDBOX_ID.test(entry.name)) continue;
      await beforeRead?.(this.sandboxDir(entry.name));
      const record = await this.readRecord(this.sandboxDir(entry.name));
      if (record && record.owner !== owner) continue;
      found.push({ id: entry.name, record });
    }
    return found;
  }

  /** The runtime of a running or paused sandbox as the host agent sees it. */
  protected liveRuntime(record: R, status: 'running' | 'paused', agentSocket: string): SandboxRuntime {
    return {
      id: record.id,
      status,
      pid: record.pid,
      agentSocket,
      agentProofKey: this.agentKeys.get(record.id),
      network: record.slot ? { hostAddress: record.slot.hostAddress, sandboxAddress: record.slot.sandboxAddress, netns: record.slot.netns } : undefined,
    };
  }

  protected sandboxDir(id: string): string {
    return join(this.sandboxesDir, id);
  }
}
