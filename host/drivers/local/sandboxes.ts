// The local driver's state and where everything of a sandbox lives: the options, the records,
// the helper binaries, the cgroup, slot and id-range handles, the sandbox and disk directories
// (upper/ and work/ on the sandbox's own disk, snapshot layers below them), and the checks
// every call makes. The lifecycle builds on it: runtime.ts (launch, teardown, egress,
// watching), recovery.ts (adoption at init), driver.ts (the Driver methods).
import { validateVolumeMounts } from '../base/volume-mounts.js';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { lstat, mkdir } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { Logger } from '../../../core/logger.js';
import { DriverBase, assertSandboxId, SUN_PATH_MAX } from '../base/driver-base.js';
import { DriverError } from '../errors.js';
import type { SandboxRuntime, SandboxSpec, SnapshotResult } from '../types.js';
import { SlotAllocator, VETH_PREFIX } from '../../network/slots.js';
import { SlotPool } from '../../network/slot-pool.js';
import type { EgressResolver } from '../../network/egress.js';
import type { ReflinkStoreOptions } from '../../storage/disk-store.js';
import { createDiskImage, diskImagePath, diskMountPoint, inodesFor, mountDiskImage, withDiskFrozen, type DiskQuota } from '../../storage/disk-quota.js';
import { assertSnapshotId, type SnapshotMeta } from '../../storage/snapshots.js';
import type { Cgroups, CgroupGroup } from './cgroups.js';
import type { FileViews } from './file-view.js';
import type { LxcfsDaemon } from './lxcfs.js';
import { DEFAULT_ID_BASE, DEFAULT_MAX_ID_RANGES, IdRangeAllocator } from './id-ranges.js';
import { newRecord, readRecord, type SandboxRecord } from './records.js';
import type { HostLoader } from './runtime-binaries.js';
import { assertSafeHostPath } from '../../util/fs.js';
import { assertValidEnv } from './spawn.js';
import { ensureBaseImage } from '../../images/base-image.js';
import { CODE_INTERPRETER_IMAGE, ensureCodeInterpreterImage } from '../../images/code-interpreter-image.js';
import { IMAGE_ID } from '../../images/oci/store.js';
import { imageEnvironment } from '../../images/oci/image-environment.js';

export interface LocalDriverOptions {
  /** Sandboxes live in `<dataDir>/sandboxes/<id>/`. Keep it short: the agent socket path must fit in 108 bytes. */
  dataDir: string;
  imagesDir: string;
  /** The OCI image store (host/images/oci) whose images sandboxes may start from (default <imagesDir>/oci). */
  ociStoreDir?: string;
  /** The bundled guest agent (dist/guest-agent.mjs). */
  guestAgentBundle: string;
  /** Identifies this host agent, so agents sharing a machine never reclaim each other's slots or cgroups. */
  ownerId: string;
  nodeBinary?: string;
  tiniBinary?: string;
  /** The static PTY helper (default: nestbox-pty next to the guest agent bundle). */
  ptyHelperBinary?: string;
  /** The static workload launcher (dist/nestbox-enter next to the bundle by default). */
  enterHelperBinary?: string;
  /** The static user-namespace and root-filesystem helper (dist/nestbox-rootfs by default). */
  rootfsHelperBinary?: string;
  /** The static seccomp helper (dist/nestbox-seccomp by default). */
  seccompHelperBinary?: string;
  /**
   * Host ids for sandbox user namespaces: root of the n-th concurrently running sandbox is host
   * uid `userNamespaceBase + n × 65536`; at most `maxUserNamespaces` at once (id-ranges.ts).
   * Every host agent on the machine must use the same values.
   */
  userNamespaceBase?: number;
  maxUserNamespaces?: number;
  /** Where id range claims live (default /run/nestbox/idranges; tests). */
  idRangesDir?: string;
  /** Where the copies of what is mounted into sandboxes live (default /var/lib/nestbox/runtime). */
  runtimeDir?: string;
  /** Sandbox subnet; every host agent on the machine must use the same one. */
  subnet?: string;
  pidsMax?: number;
  readyTimeoutMs?: number;
  /** Resolvers handed to sandboxes (default: the host's non-loopback IPv4 nameservers). */
  dnsServers?: string[];
  /** How often running sandboxes are checked for having died on their own. */
  watchIntervalMs?: number;
  slotsDir?: string;
  cgroupRoot?: string;
  /**
   * Where disks and snapshots live when the data dir cannot reflink: a sparse file formatted as
   * XFS (reflink=1) and loop-mounted at `<dataDir>/store`. Default `off` (plain copies).
   */
  reflinkStore?: ReflinkStoreOptions | 'off';
  /** Disk of a sandbox whose spec names no diskGiB (default 10 GiB). */
  defaultDiskGiB?: number;
  /** Inode limit per GiB of disk when the spec names none (default 65536, ext4's ratio). */
  diskInodesPerGiB?: number;
  /** A file view of a stopped sandbox stops after this long without use (default 60 s). */
  fileViewIdleMs?: number;
  /** Network slots kept built and ready for the next create (default 8; 0 = build on demand). */
  slotPoolSize?: number;
  /** How domains of allow-list egress policies are resolved (default: getaddrinfo on the host). */
  egressResolver?: EgressResolver;
  /** How often domains in egress allow lists are resolved again (default 5 min). */
  egressRefreshMs?: number;
  /** Where the driver's lines go (none when unset). */
  logger?: Logger;
  /** Sandboxes see their own limits in /proc through LXCFS (lxcfs.ts); default: when lxcfs and /dev/fuse exist. */
  lxcfs?: boolean;
}

/**
 * Tasks per sandbox. Generous for real work, and small enough that a fork bomb's tasks, all
 * runnable under the sandbox's CPU quota, die within seconds when they are killed.
 */
export const DEFAULT_PIDS_MAX = 1024;
export const HEALTH_TIMEOUT_MS = 2_000;
/** Mount options are passed in one page; the overlay's must fit. */
export const MOUNT_OPTIONS_MAX = 4_000;
export const DEFAULT_SLOT_POOL_SIZE = 8;
export const DEFAULT_EGRESS_REFRESH_MS = 300_000;
export const DEFAULT_DISK_GIB = 10;
export const DEFAULT_DISK_INODES_PER_GIB = 65_536;
export const MAX_DISK_GIB = 16_384;

export abstract class LocalSandboxes extends DriverBase<SandboxRecord> {
  // Replaced by execute-only copies at init (runtime-binaries.ts).
  protected nodeBinary: string;
  protected tiniBinary: string;
  protected ptyHelperBinary: string;
  protected enterHelperBinary: string;
  protected readonly rootfsHelperBinary: string;
  protected seccompHelperBinary: string;
  protected agentBundle: string;
  protected hostLoader?: HostLoader;
  protected readonly idRanges: IdRangeAllocator;
  protected readonly subnet: string;
  protected readonly ownerKey: string;
  protected readonly slots: SlotAllocator;
  protected readonly pool: SlotPool;
  protected cgroups?: Cgroups;
  protected capabilityProbes: Record<string, string | number | boolean> = {};
  protected lastCap = 40;
  protected dnsServers: string[] = [];
  protected fileViews?: FileViews;
  /** The host's LXCFS daemon (lxcfs.ts), when sandboxes get their own /proc files. */
  protected lxcfs?: LxcfsDaemon;

  constructor(protected readonly options: LocalDriverOptions) {
    super('LocalDriver', options.dataDir, options.logger);
    this.nodeBinary = options.nodeBinary ?? process.execPath;
    this.tiniBinary = options.tiniBinary ?? '/usr/bin/tini-static';
    this.ptyHelperBinary = options.ptyHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-pty');
    this.enterHelperBinary = options.enterHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-enter');
    this.rootfsHelperBinary = options.rootfsHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-rootfs');
    this.seccompHelperBinary = options.seccompHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-seccomp');
    this.agentBundle = resolve(options.guestAgentBundle);
    this.ociStoreDir = options.ociStoreDir ?? join(options.imagesDir, 'oci');
    this.idRanges = new IdRangeAllocator(options.userNamespaceBase ?? DEFAULT_ID_BASE, options.maxUserNamespaces ?? DEFAULT_MAX_ID_RANGES, options.idRangesDir);
    this.subnet = options.subnet ?? '10.200.0.0/16';
    this.ownerKey = ownerKeyFor(options.ownerId);
    this.slots = new SlotAllocator(this.subnet, options.slotsDir);
    this.pool = new SlotPool({ allocator: this.slots, owner: options.ownerId, size: options.slotPoolSize ?? DEFAULT_SLOT_POOL_SIZE, vethPrefix: VETH_PREFIX, logger: this.log });
  }

  // ---- helpers --------------------------------------------------------------------------------

  protected runtimeOf(record: SandboxRecord): SandboxRuntime {
    if (!isLive(record)) return { id: record.id, status: 'stopped' };
    const runtime = this.liveRuntime(record, record.status === 'paused' ? 'paused' : 'running', record.agentSocket);
    return record.spec.warm ? { ...runtime, warm: true } : runtime;
  }

  protected readRecord(sandboxDir: string): Promise<SandboxRecord | undefined> {
    return readRecord(sandboxDir);
  }

  protected snapshotResult(meta: SnapshotMeta): SnapshotResult {
    return { snapshotId: meta.snapshotId, sizeBytes: meta.sizeBytes, diskCopy: meta.diskCopy, layers: [meta.snapshotId, ...meta.parents] };
  }

  protected validateSpec(spec: SandboxSpec): void {
    assertSandboxId(spec.id);
    const invalid = (message: string) => new DriverError('validation_failed', message);
    if (spec.image !== 'default' && spec.image !== CODE_INTERPRETER_IMAGE && !IMAGE_ID.test(spec.image)) throw invalid(`unknown image "${spec.image}" (the local driver knows "default", "${CODE_INTERPRETER_IMAGE}" and pulled OCI images by id, sha256:<64 hex>)`);
    if (!(spec.cpu > 0) || spec.cpu > 1024) throw invalid(`cpu must be a positive number of vCPUs, got ${spec.cpu}`);
    if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < 64) throw invalid(`memoryMiB must be an integer of at least 64, got ${spec.memoryMiB}`);
    if (spec.snapshot !== undefined) assertSnapshotId(spec.snapshot);
    if (spec.diskGiB !== undefined && (!Number.isInteger(spec.diskGiB) || spec.diskGiB < 1 || spec.diskGiB > MAX_DISK_GIB)) throw invalid(`diskGiB must be an integer from 1 to ${MAX_DISK_GIB}, got ${spec.diskGiB}`);
    if (spec.diskInodes !== undefined && (!Number.isInteger(spec.diskInodes) || spec.diskInodes < 1024)) throw invalid(`diskInodes must be an integer of at least 1024, got ${spec.diskInodes}`);
    try {
      assertValidEnv(spec.env ?? {});
    } catch (error) {
      throw invalid((error as Error).message);
    }
    validateVolumeMounts(spec, this.volumes);
    assertSafeHostPath('data dir', this.sandboxDir(spec.id));
    const socket = join(this.sandboxDir(spec.id), 'run', 'agent.sock');
    if (Buffer.byteLength(socket) > SUN_PATH_MAX) {
      throw new Error(
        `agent socket path ${socket} is ${Buffer.byteLength(socket)} bytes, over the ${SUN_PATH_MAX}-byte Unix socket limit; use a shorter data dir than ${this.dataDir}`,
      );
    }
  }

  /**
   * The bottom layer of a sandbox and what its image says processes start with: a built-in image
   * (`default`, `code-interpreter`), or a pulled OCI image (host/images/oci) whose Env is the agent's environment and whose
   * WorkingDir is its home (the default cwd, and HOME unless the image sets one).
   */
  protected async imageOf(spec: Pick<SandboxSpec, 'image'>, onProgress?: (line: string) => void): Promise<SandboxImage> {
    if (spec.image === 'default') {
      const base = await ensureBaseImage({ imagesDir: this.options.imagesDir, onProgress });
      return { rootfs: base.rootfs, env: {} };
    }
    if (spec.image === CODE_INTERPRETER_IMAGE) {
      // Built from the default image on first use when the host agent has not built it yet.
      const image = await ensureCodeInterpreterImage({ imagesDir: this.options.imagesDir, onProgress });
      return { rootfs: image.rootfs, env: {} };
    }
    const image = await this.imageStore().get(spec.image);
    if (!image) throw new DriverError('not_found', `image ${spec.image} is not in this host's image store (pull it first)`);
    const hasRootHome = (await lstat(join(image.rootfs, 'root')).catch(() => undefined))?.isDirectory() ?? false;
    return { rootfs: image.rootfs, env: imageEnvironment(image.meta.config, hasRootHome, (message) => this.log.warn({ image: spec.image }, message)) };
  }

  protected requireFileViews(): FileViews {
    return this.afterInit(this.fileViews);
  }

  protected requireCgroups(): Cgroups {
    return this.afterInit(this.cgroups);
  }

  protected cgroupPath(id: string): string {
    return join('nestbox', this.ownerKey, id);
  }

  protected cgroupGroup(id: string): CgroupGroup {
    return this.requireCgroups().groupFor(this.cgroupPath(id));
  }

  // ---- disk layout ------------------------------------------------------------------------------

  /** `upper: false` when the upper dir is about to be made as a copy (fork). */
  protected async makeSandboxDirs(record: SandboxRecord, options: { upper: boolean }): Promise<void> {
    const dir = this.sandboxDir(record.id);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await mkdir(join(dir, 'rootfs'), { recursive: true, mode: 0o755 });
    // The launcher binds the agent socket here; only root on the host may connect, and the
    // sandbox never sees this directory.
    await mkdir(join(dir, 'run'), { recursive: true, mode: 0o700 });
    const diskDir = this.diskDirOf(record);
    await mkdir(diskDir, { recursive: true, mode: 0o700 });
    // A fork's disk image is cloned from its source (cloneDisks), work/ and upper/ included.
    if (record.disk && !options.upper) return;
    if (record.disk) await createDiskImage(diskDir, record.disk);
    await mkdir(this.workDirOf(record), { recursive: true, mode: 0o755 });
    if (options.upper) await mkdir(this.upperDirOf(record), { recursive: true, mode: 0o755 });
  }

  /**
   * Fork: every child's disk image is a clone of the source's, taken while the source's file
   * system is frozen (so each clone is a clean file system), then mounted. On the reflink store
   * a clone costs no data blocks; the child's `df` shows the source's usage from the start.
   */
  protected async cloneDisks(source: SandboxRecord, children: SandboxRecord[]): Promise<void> {
    const store = this.requireDiskStore();
    await withDiskFrozen(this.diskDirOf(source), async () => {
      for (const child of children) await store.cloneImage(diskImagePath(this.diskDirOf(source)), diskImagePath(this.diskDirOf(child)));
    });
    for (const child of children) await mountDiskImage(this.diskDirOf(child));
  }

  /** The disk a new sandbox gets: its spec's size (or the default) and inode limit. */
  protected diskQuotaOf(spec: SandboxSpec): DiskQuota {
    const sizeBytes = (spec.diskGiB ?? this.options.defaultDiskGiB ?? DEFAULT_DISK_GIB) * 2 ** 30;
    return { sizeBytes, inodes: spec.diskInodes ?? inodesFor(sizeBytes, this.options.diskInodesPerGiB ?? DEFAULT_DISK_INODES_PER_GIB) };
  }

  protected newSandboxRecord(spec: SandboxSpec): SandboxRecord {
    const record = newRecord(spec, this.options.ownerId, join(this.sandboxDir(spec.id), 'run', 'agent.sock'), 'creating');
    const diskDir = this.newDiskDir(spec.id);
    if (diskDir !== this.sandboxDir(spec.id)) record.diskDir = diskDir;
    record.disk = this.diskQuotaOf(spec);
    return record;
  }

  /** Where a new sandbox's upper/ and work/ go: the reflink store, or the sandbox dir itself. */
  protected newDiskDir(id: string): string {
    const store = this.requireDiskStore();
    return store.root === this.dataDir ? this.sandboxDir(id) : join(store.root, 'sandboxes', id);
  }

  protected diskDirOf(record: SandboxRecord): string {
    return record.diskDir ?? this.sandboxDir(record.id);
  }

  /** upper/ and work/: on the sandbox's own disk (disk-quota.ts), or in diskDir for sandboxes older than quotas. */
  protected upperDirOf(record: SandboxRecord): string {
    return join(record.disk ? diskMountPoint(this.diskDirOf(record)) : this.diskDirOf(record), 'upper');
  }

  protected workDirOf(record: SandboxRecord): string {
    return join(record.disk ? diskMountPoint(this.diskDirOf(record)) : this.diskDirOf(record), 'work');
  }

  /** The snapshot layers under the sandbox's upper dir, topmost first. */
  protected async layerDirsOf(record: SandboxRecord): Promise<string[]> {
    const store = this.requireSnapshots();
    const dirs: string[] = [];
    for (const snapshotId of record.layers ?? []) {
      const dir = store.layerDir(snapshotId);
      if (!existsSync(dir)) throw new Error(`sandbox ${record.id}: its snapshot layer ${snapshotId} is missing (${dir})`);
      dirs.push(dir);
    }
    return dirs;
  }
}

// ---- free functions -----------------------------------------------------------------------------

/** What a sandbox starts from: the overlay's bottom layer and the environment its image sets. */
export interface SandboxImage {
  rootfs: string;
  /** Variables under the sandbox's own (spec.env wins); HOME here is the agent's home. */
  env: Record<string, string>;
}

/** Running or paused: it has processes, a slot and cgroups. */
export function isLive(record: SandboxRecord): boolean {
  return record.status === 'running' || record.status === 'paused';
}

/** Lock key of a snapshot; sandbox ids never contain ':', so keys cannot collide. */
export function snapshotLockKey(snapshotId: string): string {
  return `snapshot:${snapshotId}`;
}

/** Owner ids become a cgroup directory name; anything unusual is hashed. */
export function ownerKeyFor(ownerId: string): string {
  if (/^[A-Za-z0-9_.-]{1,64}$/.test(ownerId) && ownerId !== '.' && ownerId !== '..') return ownerId;
  return createHash('sha256').update(ownerId).digest('hex').slice(0, 32);
}
