// The local driver: sandboxes isolated with Linux namespaces, an overlayfs root, cgroups and a
// network namespace each (host-runtime.md §10), for hosts without KVM. Every sandbox keeps a
// record on disk so a restarted host agent adopts what still runs (`init()`), and every piece
// of runtime state (slot, cgroup, processes) can be found again from the sandbox id and owner
// alone, so destroy() also cleans half-created sandboxes.
import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { constants as fsConstants, existsSync } from 'node:fs';
import { lstat, mkdir, open, readdir, readFile, rm, stat } from 'node:fs/promises';
import { cpus } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { AgentClient } from '../../agent-protocol/client.js';
import { newAgentKey } from '../../agent-protocol/auth.js';
import { readAgentKeyFile, removeAgentKeyFile, writeAgentKeyFile } from '../../agent-protocol/key-file.js';
import { ensureBaseImage } from '../../images/base-image.js';
import { removeTree } from '../../util/fs.js';
import { mountPointsUnder } from '../../util/mounts.js';
import { processStartTime } from '../../util/process.js';
import { DriverError } from '../errors.js';
import type { Driver, DriverCapabilities, EgressPolicySpec, EgressResult, FileView, ForkResult, SandboxRuntime, SandboxSpec, SnapshotInfo, SnapshotResult, StartResult } from '../types.js';
import { Cgroups, type CgroupGroup } from './cgroups.js';
import { DiskStore, type ReflinkStoreOptions } from '../../storage/disk-store.js';
import { createDiskImage, diskImagePath, diskMountPoint, inodesFor, mountDiskImage, withDiskFrozen, type DiskQuota } from '../../storage/disk-quota.js';
import { FileViews, readTail } from './file-view.js';
import { assertSnapshotId, SnapshotStore, type SnapshotMeta } from '../../storage/snapshots.js';
import { SlotAllocator, enableIpForwarding, slotFor, teardownSlot, VETH_PREFIX, type Slot } from '../../network/slots.js';
import { sandboxDnsServers } from '../../network/dns.js';
import { applyNftRuleset, nftAvailable, renderNftRuleset, renderSlotEgress } from '../../network/nft.js';
import { SlotPool, type SlotPoolStats } from '../../network/slot-pool.js';
import { resolveEgress, systemResolver, type EgressResolver } from '../../network/egress.js';
import { newRecord, readRecord, removeRecordTempFiles, writeRecord, type SandboxRecord } from './records.js';
import { DEFAULT_ID_BASE, DEFAULT_MAX_ID_RANGES, IdRangeAllocator } from './id-ranges.js';
import { DEFAULT_RUNTIME_DIR, executeOnlyCopy, hostLoaderFor, runtimeCopy, type HostLoader } from './runtime-binaries.js';
import { lastCapability, launchSandbox, assertSafeHostPath, assertValidEnv, overlayLowerOption, SANDBOX_PATH, syscallNumbers } from './spawn.js';
import { KeyedLocks } from '../../keyed-locks.js';

export interface LocalDriverOptions {
  /** Sandboxes live in `<dataDir>/sandboxes/<id>/`. Keep it short: the agent socket path must fit in 108 bytes. */
  dataDir: string;
  imagesDir: string;
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
  log?: (message: string) => void;
}

const SANDBOX_ID = /^[a-z0-9]{1,32}$/;
/**
 * Tasks per sandbox. Generous for real work, and small enough that a fork bomb's tasks, all
 * runnable under the sandbox's CPU quota, die within seconds when they are killed.
 */
const DEFAULT_PIDS_MAX = 1024;
const SUN_PATH_MAX = 107; // 108 bytes including the terminating NUL
const HEALTH_TIMEOUT_MS = 2_000;
/** Mount options are passed in one page; the overlay's must fit. */
const MOUNT_OPTIONS_MAX = 4_000;
const MAX_FORK_CHILDREN = 64;
const DEFAULT_SLOT_POOL_SIZE = 8;
const DEFAULT_EGRESS_REFRESH_MS = 300_000;
const DEFAULT_DISK_GIB = 10;
const DEFAULT_DISK_INODES_PER_GIB = 65_536;
const MAX_DISK_GIB = 16_384;

export class LocalDriver implements Driver {
  readonly name = 'local' as const;
  private readonly dataDir: string;
  private readonly sandboxesDir: string;
  // Replaced by execute-only copies at init (runtime-binaries.ts).
  private nodeBinary: string;
  private tiniBinary: string;
  private ptyHelperBinary: string;
  private enterHelperBinary: string;
  private readonly rootfsHelperBinary: string;
  private seccompHelperBinary: string;
  private agentBundle: string;
  private hostLoader?: HostLoader;
  private readonly idRanges: IdRangeAllocator;
  private readonly subnet: string;
  private readonly ownerKey: string;
  private readonly slots: SlotAllocator;
  private readonly pool: SlotPool;
  /** What each live sandbox's allow list resolved to, to notice when a refresh changes it. */
  private readonly egressApplied = new Map<string, { addresses: string[]; unresolved: string[]; hasDomains: boolean }>();
  private egressTimer?: NodeJS.Timeout;
  private readonly log: (message: string) => void;
  private cgroups?: Cgroups;
  private capabilityProbes: Record<string, string | number | boolean> = {};
  private lastCap = 40;
  private dnsServers: string[] = [];
  private readonly records = new Map<string, SandboxRecord>();
  private readonly locks = new KeyedLocks();
  /** Each live sandbox's proof key for this boot (agent-protocol/auth.ts), also in its agent.key. */
  private readonly agentKeys = new Map<string, Buffer>();
  /** Launchers started by this process: their exit tells us at once that a sandbox died. */
  private readonly children = new Map<string, ChildProcess>();
  private watchTimer?: NodeJS.Timeout;
  private initialized = false;
  private diskStore?: DiskStore;
  private snapshotStore?: SnapshotStore;
  private fileViews?: FileViews;

  constructor(private readonly options: LocalDriverOptions) {
    this.dataDir = resolve(options.dataDir);
    this.sandboxesDir = join(this.dataDir, 'sandboxes');
    this.nodeBinary = options.nodeBinary ?? process.execPath;
    this.tiniBinary = options.tiniBinary ?? '/usr/bin/tini-static';
    this.ptyHelperBinary = options.ptyHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-pty');
    this.enterHelperBinary = options.enterHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-enter');
    this.rootfsHelperBinary = options.rootfsHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-rootfs');
    this.seccompHelperBinary = options.seccompHelperBinary ?? join(dirname(resolve(options.guestAgentBundle)), 'nestbox-seccomp');
    this.agentBundle = resolve(options.guestAgentBundle);
    this.idRanges = new IdRangeAllocator(options.userNamespaceBase ?? DEFAULT_ID_BASE, options.maxUserNamespaces ?? DEFAULT_MAX_ID_RANGES, options.idRangesDir);
    this.subnet = options.subnet ?? '10.200.0.0/16';
    this.ownerKey = ownerKeyFor(options.ownerId);
    this.slots = new SlotAllocator(this.subnet, options.slotsDir);
    this.log = options.log ?? (() => {});
    this.pool = new SlotPool({ allocator: this.slots, owner: options.ownerId, size: options.slotPoolSize ?? DEFAULT_SLOT_POOL_SIZE, vethPrefix: VETH_PREFIX, log: this.log });
  }

  // ---- Driver: setup --------------------------------------------------------------------------

  async init(): Promise<void> {
    await this.probe();
    // The programs that hold the agent's socket and the cgroup descriptors must not be
    // traceable by the sandbox's workloads (same uid), and nothing mounted into a sandbox may
    // come from the data dir (mountinfo shows a bind mount's source): see runtime-binaries.ts.
    const runtimeDir = this.options.runtimeDir ?? DEFAULT_RUNTIME_DIR;
    // node runs on the host's loader (exec'd, execute-only) and so is only mapped: readable.
    this.hostLoader = await hostLoaderFor(this.nodeBinary, runtimeDir);
    this.nodeBinary = await runtimeCopy(this.nodeBinary, runtimeDir, 'node-mapped', 0o755);
    this.tiniBinary = await executeOnlyCopy(this.tiniBinary, runtimeDir, 'tini');
    this.ptyHelperBinary = await executeOnlyCopy(this.ptyHelperBinary, runtimeDir, 'nestbox-pty');
    this.enterHelperBinary = await executeOnlyCopy(this.enterHelperBinary, runtimeDir, 'nestbox-enter');
    this.seccompHelperBinary = await executeOnlyCopy(this.seccompHelperBinary, runtimeDir, 'nestbox-seccomp');
    this.agentBundle = await runtimeCopy(resolve(this.options.guestAgentBundle), runtimeDir, 'guest-agent.mjs', 0o644);
    await enableIpForwarding();
    this.dnsServers = await sandboxDnsServers(this.options.dnsServers);
    await applyNftRuleset(renderNftRuleset({ subnet: this.subnet, vethPrefix: VETH_PREFIX, dnsServers: this.dnsServers }));
    await mkdir(this.sandboxesDir, { recursive: true, mode: 0o700 });
    this.diskStore = await DiskStore.open({ dataDir: this.dataDir, reflinkStore: this.options.reflinkStore, log: this.log });
    if (this.diskStore.root !== this.dataDir) await mkdir(join(this.diskStore.root, 'sandboxes'), { recursive: true, mode: 0o700 });
    if (this.diskStore.mode === 'copy') this.log('disk store: the data dir cannot reflink and NESTBOX_REFLINK_STORE is off, so every fork and snapshot writes a full copy of its source disk (disk quotas still hold)');
    this.snapshotStore = new SnapshotStore(join(this.diskStore.root, 'snapshots'));
    await this.snapshotStore.init();
    this.fileViews = new FileViews({
      cgroups: this.requireCgroups(),
      cgroupPath: (name) => this.cgroupPath(name),
      nodeBinary: this.nodeBinary,
      tiniBinary: this.tiniBinary,
      guestAgentBundle: this.agentBundle,
      rootfsHelperBinary: this.rootfsHelperBinary,
      seccompHelperBinary: this.seccompHelperBinary,
      hostLoader: this.hostLoader,
      enterHelperBinary: this.enterHelperBinary,
      idRanges: this.idRanges,
      owner: this.options.ownerId,
      lastCapability: this.lastCap,
      readyTimeoutMs: this.options.readyTimeoutMs ?? 20_000,
      idleMs: this.options.fileViewIdleMs ?? 60_000,
      onIdle: (id) => void this.closeIdleFileView(id),
      log: this.log,
    });
    await this.adoptAll();
    await this.reclaimOrphans();
    // Adopted sandboxes get their policy again: the rules may have been lost meanwhile (a
    // reboot of the firewall, an older host agent's table), and their domains re-resolved.
    for (const record of this.records.values()) {
      if (isLive(record) && record.slot) await this.applyEgress(record).catch((error) => this.log(`init: egress of ${record.id}: ${String(error)}`));
    }
    this.initialized = true;
    this.startWatching();
    // Slots for the next creates are built in the background: init does not wait for them.
    void this.pool.fill();
  }

  /** The slot pool's state (tests and benchmarks wait for it to be warm). */
  slotPoolStats(): SlotPoolStats {
    return this.pool.stats();
  }

  /** Changes the slot pool's size at run time (benchmarks and tests). */
  async resizeSlotPool(size: number, fill = true): Promise<SlotPoolStats> {
    await this.pool.resize(size, fill);
    return this.pool.stats();
  }

  /** Resolves once the pool holds its configured number of idle slots (or `timeoutMs` passed). */
  async waitForSlotPool(timeoutMs = 30_000): Promise<SlotPoolStats> {
    const deadline = Date.now() + timeoutMs;
    while (this.pool.stats().idle < this.pool.stats().size && Date.now() < deadline) {
      await this.pool.fill();
      await new Promise((resolveWait) => setTimeout(resolveWait, 20));
    }
    return this.pool.stats();
  }

  capabilities(): DriverCapabilities {
    return {
      memorySnapshot: false,
      fork: true,
      pause: true,
      nestedVirt: false,
      hotResize: false,
      maxVcpus: cpus().length,
      probes: { ...this.capabilityProbes, ...(this.diskStore?.probes ?? {}), slotPoolSize: this.pool.stats().size, slotPoolIdle: this.pool.stats().idle, egressPolicy: true },
    };
  }

  async close(): Promise<void> {
    if (this.watchTimer) clearInterval(this.watchTimer);
    this.watchTimer = undefined;
    if (this.egressTimer) clearInterval(this.egressTimer);
    this.egressTimer = undefined;
    await this.pool.close();
    await this.fileViews?.closeAll((id) => this.sandboxDir(id));
    for (const child of this.children.values()) child.removeAllListeners('exit');
    this.children.clear();
    // Running sandboxes outlive us and keep their groups; with none left, this owner's
    // directory (in every hierarchy) would stay behind empty forever.
    if (this.cgroups) {
      await this.cgroups.removeIfEmpty(join('nestbox', this.ownerKey)).catch((error) => this.log(`close: could not remove the empty cgroup of ${this.ownerKey}: ${String(error)}`));
    }
  }

  private async probe(): Promise<void> {
    const missing: string[] = [];
    this.cgroups = await Cgroups.detect(this.options.cgroupRoot);
    const filesystems = await readFile('/proc/filesystems', 'utf8');
    const nft = await nftAvailable();
    for (const [label, path] of [
      ['node', this.nodeBinary],
      ['tini', this.tiniBinary],
      ['pty helper (npm run build)', this.ptyHelperBinary],
      ['workload launcher (npm run build)', this.enterHelperBinary],
      ['root filesystem helper (npm run build)', this.rootfsHelperBinary],
      ['seccomp helper (npm run build; needs libseccomp-dev)', this.seccompHelperBinary],
      ['guest agent bundle', this.options.guestAgentBundle],
      ['perl', '/usr/bin/perl'],
      ['nsenter', '/usr/bin/nsenter'],
      ['unshare', '/usr/bin/unshare'],
    ] as const) {
      if (!existsSync(path)) missing.push(`${label} (${path})`);
    }
    if (!filesystems.includes('\toverlay\n')) missing.push('overlayfs');
    if (!nft) missing.push('nft');
    syscallNumbers(); // throws on an unsupported architecture
    this.lastCap = await lastCapability();
    this.capabilityProbes = {
      cgroupVersion: this.cgroups.version,
      cgroupSwapLimit: this.cgroups.swapLimit,
      overlayfs: filesystems.includes('\toverlay\n'),
      nft: nft ?? false,
      tini: this.tiniBinary,
      ptyHelper: this.ptyHelperBinary,
      node: this.nodeBinary,
      lastCapability: this.lastCap,
      memorySnapshot: 'unavailable: CRIU cannot dump processes on this kernel (host-runtime.md §10); stop keeps the disk only',
      freezer: true,
      subnet: this.subnet,
      userNamespaces: `host ids from ${this.idRanges.base}, ${this.idRanges.maxRanges} ranges of 65536`,
    };
    if (missing.length) throw new Error(`local driver cannot run on this host; missing: ${missing.join(', ')}`);
  }

  // ---- Driver: lifecycle ----------------------------------------------------------------------

  async create(spec: SandboxSpec, onProgress?: (line: string) => void): Promise<SandboxRuntime> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const dir = this.sandboxDir(spec.id);
      const existing = this.records.get(spec.id) ?? (await readRecord(dir));
      if (existing && existing.status !== 'creating') throw new DriverError('conflict', `sandbox ${spec.id} already exists`);
      // A directory without a usable record is the remains of a create that crashed.
      if (existsSync(dir) || existsSync(this.newDiskDir(spec.id))) await this.destroyUnlocked(spec.id);

      const started = Date.now();
      const image = await ensureBaseImage({ imagesDir: this.options.imagesDir, onProgress });
      const record = this.newSandboxRecord(spec);
      try {
        if (spec.snapshot) {
          // Under the snapshot's lock: deleteSnapshot() either sees this record or has finished.
          await this.withLock(snapshotLockKey(spec.snapshot), async () => {
            const meta = await this.requireSnapshot(spec.snapshot!);
            if (meta.image !== spec.image) throw new DriverError('validation_failed', `snapshot ${meta.snapshotId} is of image "${meta.image}", not "${spec.image}"`);
            record.layers = [meta.snapshotId, ...meta.parents];
            await this.makeSandboxDirs(record, { upper: true });
            await writeRecord(dir, record);
            this.records.set(spec.id, record);
          });
        } else {
          await this.makeSandboxDirs(record, { upper: true });
          await writeRecord(dir, record);
          this.records.set(spec.id, record);
        }
        await this.launch(record, image.rootfs, onProgress);
      } catch (error) {
        await this.destroyUnlocked(spec.id).catch((cleanupError) => this.log(`create ${spec.id}: cleanup after failure failed: ${String(cleanupError)}`));
        throw error;
      }
      this.log(`create ${spec.id}: running in ${Date.now() - started} ms (slot ${record.slot?.index})`);
      return this.runtimeOf(record);
    });
  }

  async stop(id: string): Promise<{ memorySaved: boolean }> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      await this.teardownRuntime(id, record);
      record.status = 'stopped';
      await writeRecord(this.sandboxDir(id), record);
      return { memorySaved: false };
    });
  }

  async start(spec: SandboxSpec): Promise<StartResult> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const record = this.requireRecord(spec.id);
      // Nothing was lost if it never stopped; a paused sandbox just continues.
      if (record.status === 'paused') await this.setPausedUnlocked(record, false);
      if (record.status === 'running') return { ...this.runtimeOf(record), memoryRestored: true };
      await this.closeFileView(spec.id);
      const image = await ensureBaseImage({ imagesDir: this.options.imagesDir });
      record.spec = spec;
      record.status = 'starting';
      await writeRecord(this.sandboxDir(spec.id), record);
      try {
        await this.launch(record, image.rootfs);
      } catch (error) {
        await this.teardownRuntime(spec.id, record).catch(() => {});
        record.status = 'stopped';
        await writeRecord(this.sandboxDir(spec.id), record);
        throw error;
      }
      return { ...this.runtimeOf(record), memoryRestored: false, resumeReason: 'driver_has_no_memory_snapshot' };
    });
  }

  async destroy(id: string): Promise<void> {
    assertSandboxId(id);
    await this.withLock(id, async () => {
      await this.closeFileView(id);
      await this.destroyUnlocked(id);
    });
  }

  async get(id: string): Promise<SandboxRuntime | undefined> {
    const record = this.records.get(id);
    return record ? this.runtimeOf(record) : undefined;
  }

  async list(): Promise<SandboxRuntime[]> {
    return [...this.records.values()].map((record) => this.runtimeOf(record));
  }

  // ---- Driver: pause ----------------------------------------------------------------------------

  async pause(id: string): Promise<SandboxRuntime> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      if (record.status !== 'paused') await this.setPausedUnlocked(record, true);
      return this.runtimeOf(record);
    });
  }

  async unpause(id: string): Promise<SandboxRuntime> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      if (record.status !== 'running') await this.setPausedUnlocked(record, false);
      return this.runtimeOf(record);
    });
  }

  /** Journal, freeze/thaw and wait for the kernel, then record the outcome (init() finishes a crashed one). */
  private async setPausedUnlocked(record: SandboxRecord, paused: boolean): Promise<void> {
    const from = paused ? 'running' : 'paused';
    if (record.status !== from) throw new DriverError('invalid_state', `sandbox ${record.id} is ${record.status}, not ${from}`);
    const started = Date.now();
    const dir = this.sandboxDir(record.id);
    record.operation = { kind: paused ? 'pause' : 'unpause', startedAt: new Date().toISOString() };
    await writeRecord(dir, record);
    try {
      await this.requireCgroups().setFrozenAndWait(this.cgroupGroup(record.id), paused);
    } catch (error) {
      // Put it back the way it was, so the record and the kernel agree.
      await this.requireCgroups().setFrozenAndWait(this.cgroupGroup(record.id), !paused).catch(() => {});
      record.operation = undefined;
      await writeRecord(dir, record);
      throw error;
    }
    record.status = paused ? 'paused' : 'running';
    record.operation = undefined;
    await writeRecord(dir, record);
    this.log(`${paused ? 'pause' : 'unpause'} ${record.id}: ${Date.now() - started} ms`);
  }

  /**
   * Runs `task` (a copy of the upper dir) with the sandbox's processes frozen if it runs, so the
   * copy is a consistent point in time; thaws afterwards even when the task fails. A paused
   * sandbox stays frozen, a stopped one has nothing to freeze.
   */
  private async withFrozen<T>(record: SandboxRecord, task: () => Promise<T>): Promise<T> {
    if (record.status !== 'running') return task();
    const dir = this.sandboxDir(record.id);
    const group = this.cgroupGroup(record.id);
    record.operation = { kind: 'copy', startedAt: new Date().toISOString() };
    await writeRecord(dir, record);
    try {
      await this.requireCgroups().setFrozenAndWait(group, true);
      return await task();
    } finally {
      await this.requireCgroups()
        .setFrozenAndWait(group, false)
        .catch((error) => this.log(`sandbox ${record.id}: thaw after copy failed: ${String(error)}`));
      record.operation = undefined;
      await writeRecord(dir, record);
    }
  }

  // ---- Driver: fork ---------------------------------------------------------------------------

  async fork(sourceId: string, children: SandboxSpec[]): Promise<ForkResult> {
    this.assertInitialized();
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
    // Every involved sandbox is locked, in one global order, so two forks cannot deadlock.
    return this.withLocks([sourceId, ...ids], async () => {
      const started = Date.now();
      const source = this.requireRecord(sourceId);
      if (!['running', 'paused', 'stopped'].includes(source.status)) throw new DriverError('invalid_state', `sandbox ${sourceId} is ${source.status}`);
      for (const child of children) {
        if (this.records.has(child.id) || (await readRecord(this.sandboxDir(child.id)))) throw new DriverError('conflict', `sandbox ${child.id} already exists`);
      }
      await this.closeFileView(sourceId);
      const image = await ensureBaseImage({ imagesDir: this.options.imagesDir });
      const made: SandboxRecord[] = [];
      try {
        for (const child of children) {
          if (existsSync(this.sandboxDir(child.id)) || existsSync(this.newDiskDir(child.id))) await this.destroyUnlocked(child.id);
          const record = this.newSandboxRecord(child);
          record.layers = source.layers ? [...source.layers] : undefined;
          record.forkedFrom = sourceId;
          // A child's disk is a clone of its source's: same size, same usage counted against it.
          if (source.disk) record.disk = { ...source.disk };
          else record.disk = undefined;
          await this.makeSandboxDirs(record, { upper: false });
          await writeRecord(this.sandboxDir(child.id), record);
          this.records.set(child.id, record);
          made.push(record);
        }
        const copyStarted = Date.now();
        // The source is frozen for one copy only; further children copy the first child's disk,
        // which nothing runs on yet.
        const [first, ...rest] = made;
        if (source.disk) {
          await this.withFrozen(source, () => this.cloneDisks(source, made));
        } else {
          await this.withFrozen(source, () => this.requireDiskStore().copyTree(this.upperDirOf(source), this.upperDirOf(first)));
          for (const record of rest) await this.requireDiskStore().copyTree(this.upperDirOf(first), this.upperDirOf(record));
        }
        const copyMs = Date.now() - copyStarted;
        const launches = await Promise.allSettled(made.map((record) => this.launch(record, image.rootfs)));
        const failed = launches.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected');
        if (failed) throw failed.reason;
        this.log(`fork ${sourceId} → ${made.map((record) => record.id).join(', ')}: copy ${copyMs} ms (${this.requireDiskStore().mode}), running in ${Date.now() - started} ms`);
      } catch (error) {
        for (const record of made) {
          await this.destroyUnlocked(record.id).catch((cleanupError) => this.log(`fork ${sourceId}: cleanup of ${record.id} failed: ${String(cleanupError)}`));
        }
        throw error;
      }
      return { children: made.map((record) => this.runtimeOf(record)), memoryCopied: false, diskCopy: this.requireDiskStore().mode };
    });
  }

  // ---- Driver: snapshots ------------------------------------------------------------------------

  async snapshot(id: string, snapshotId: string): Promise<SnapshotResult> {
    this.assertInitialized();
    assertSandboxId(id);
    assertSnapshotId(snapshotId);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      if (!['running', 'paused', 'stopped'].includes(record.status)) throw new DriverError('invalid_state', `sandbox ${id} is ${record.status}`);
      await this.closeFileView(id);
      return this.withLock(snapshotLockKey(snapshotId), async () => {
        const store = this.requireSnapshots();
        const existing = await store.get(snapshotId);
        // A retry of the same call gets the same snapshot; another sandbox cannot take the name.
        if (existing?.sourceId === id) return snapshotResult(existing);
        if (existing || existsSync(join(store.dir, snapshotId))) throw new DriverError('conflict', `snapshot ${snapshotId} already exists`);
        const started = Date.now();
        const meta = await store.create(
          { snapshotId, sourceId: id, image: record.spec.image, parents: record.layers ?? [], diskCopy: this.requireDiskStore().mode },
          (layerDir) =>
            this.withFrozen(record, () =>
              record.disk
                ? // The snapshot is a clone of the whole disk image, mounted read-only (snapshots.ts).
                  withDiskFrozen(this.diskDirOf(record), () => this.requireDiskStore().cloneImage(diskImagePath(this.diskDirOf(record)), join(dirname(layerDir), 'disk.img')))
                : this.requireDiskStore().copyTree(this.upperDirOf(record), layerDir),
            ),
        );
        this.log(`snapshot ${id} → ${snapshotId}: ${meta.sizeBytes} bytes in ${Date.now() - started} ms (${meta.diskCopy})`);
        return snapshotResult(meta);
      });
    });
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    this.assertInitialized();
    assertSnapshotId(snapshotId);
    await this.withLock(snapshotLockKey(snapshotId), async () => {
      const store = this.requireSnapshots();
      if (!existsSync(join(store.dir, snapshotId))) return;
      const users: string[] = [];
      const records = new Map([...this.records.values()].map((record) => [record.id, record]));
      // Records on disk too: a sandbox of another owner sharing this data dir counts as well.
      for (const entry of await readdir(this.sandboxesDir).catch(() => [] as string[])) {
        if (!records.has(entry) && SANDBOX_ID.test(entry)) {
          const record = await readRecord(this.sandboxDir(entry));
          if (record) records.set(entry, record);
        }
      }
      for (const record of records.values()) if (record.layers?.includes(snapshotId)) users.push(`sandbox ${record.id}`);
      for (const meta of await store.list()) if (meta.parents.includes(snapshotId)) users.push(`snapshot ${meta.snapshotId}`);
      if (users.length) throw new DriverError('conflict', `snapshot ${snapshotId} is in use by ${users.join(', ')}`);
      await store.remove(snapshotId);
    });
  }

  async listSnapshots(): Promise<SnapshotInfo[]> {
    this.assertInitialized();
    return (await this.requireSnapshots().list()).map((meta) => ({
      ...snapshotResult(meta),
      sourceId: meta.sourceId,
      image: meta.image,
      createdAt: meta.createdAt,
    }));
  }

  // ---- Driver: file views -------------------------------------------------------------------------

  async fileView(id: string): Promise<FileView> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      if (record.status !== 'stopped') {
        throw new DriverError('invalid_state', `sandbox ${id} is ${record.status}; file views are for stopped sandboxes (use its agent)`);
      }
      const image = await ensureBaseImage({ imagesDir: this.options.imagesDir });
      return this.requireFileViews().open({
        sandboxId: id,
        sandboxDir: this.sandboxDir(id),
        layerDirs: [this.upperDirOf(record), ...(await this.layerDirsOf(record))],
        baseRootfs: image.rootfs,
        env: record.spec.env ?? {},
      });
    });
  }

  touchFileView(id: string): void {
    this.fileViews?.touch(id);
  }

  /** Stops the sandbox's file view, if any (the caller holds the sandbox's lock). */
  private async closeFileView(id: string): Promise<void> {
    const views = this.requireFileViews();
    if (views.isOpen(id) || existsSync(join(this.sandboxDir(id), 'view'))) await views.close(id, this.sandboxDir(id));
  }

  private async closeIdleFileView(id: string): Promise<void> {
    await this.withLock(id, async () => {
      const views = this.requireFileViews();
      // Used again (or closed) while we waited for the lock: leave it.
      if (!views.isOpen(id)) return;
      if (!views.isIdle(id) && views.isRunning(id)) return;
      await views.close(id, this.sandboxDir(id));
      this.log(`file view of ${id}: stopped`);
    }).catch((error) => this.log(`file view of ${id}: stop failed: ${String(error)}`));
  }

  // ---- launch ---------------------------------------------------------------------------------

  /** Slot, cgroups, process, agent: everything a running sandbox has beyond its disk. */
  private async launch(record: SandboxRecord, lowerDir: string, onProgress?: (line: string) => void): Promise<void> {
    const { id } = record.spec;
    const dir = this.sandboxDir(id);
    const cgroups = this.requireCgroups();
    const layerDirs = await this.layerDirsOf(record);
    assertOverlayOptionsFit(lowerDir, layerDirs, this.upperDirOf(record), this.workDirOf(record));
    await writeSandboxEtc(this.upperDirOf(record), id, this.dnsServers, this.log);

    const taken = await this.pool.take(id);
    const slot = taken.slot;
    record.slot = { ...slot };
    await writeRecord(dir, record);
    // Before any process runs: the sandbox never has a moment under the default policy.
    await this.applyEgress(record);
    onProgress?.(`network slot ${slot.index} (${taken.pooled ? 'from the pool' : 'built now'}): ${slot.sandboxAddress} via ${slot.hostAddress}`);

    const { group, agent, work } = await cgroups.createSandbox(this.cgroupPath(id), {
      memoryBytes: record.spec.memoryMiB * 1024 * 1024,
      cpus: record.spec.cpu,
      pidsMax: this.options.pidsMax ?? DEFAULT_PIDS_MAX,
    });
    record.cgroup = { version: group.version, paths: group.paths };
    await writeRecord(dir, record);
    record.idRange = await this.idRanges.claim(this.options.ownerId, id);
    await writeRecord(dir, record);

    await rm(record.agentSocket, { force: true });
    // A fresh key per boot (create, start, fork child): stored before the agent exists, so a
    // host agent that dies from here on finds it when it adopts the sandbox.
    const agentKey = newAgentKey();
    await writeAgentKeyFile(dir, agentKey);
    this.agentKeys.set(id, agentKey);
    await appendLog(join(dir, 'sandbox.log'), `--- nestbox: starting ${id} at ${new Date().toISOString()} ---\n`);
    const child = launchSandbox({
      netnsPath: `/run/netns/${slot.netns}`,
      cgroupProcsFiles: cgroups.procsFiles(agent),
      workProcsFiles: cgroups.procsFiles(work),
      enterHelperBinary: this.enterHelperBinary,
      rootfsHelperBinary: this.rootfsHelperBinary,
      seccompHelperBinary: this.seccompHelperBinary,
      hostLoader: this.hostLoader,
      idRange: record.idRange,
      lowerDir,
      layerDirs,
      upperDir: this.upperDirOf(record),
      workDir: this.workDirOf(record),
      rootDir: join(dir, 'rootfs'),
      runDir: join(dir, 'run'),
      nodeBinary: this.nodeBinary,
      tiniBinary: this.tiniBinary,
      ptyHelperBinary: this.ptyHelperBinary,
      guestAgentBundle: this.agentBundle,
      hostname: id,
      env: { HOME: '/root', PATH: SANDBOX_PATH, ...record.spec.env, HOSTNAME: id },
      logFile: join(dir, 'sandbox.log'),
      lastCapability: this.lastCap,
      agentKey,
    });
    const exited = new Promise<never>((_, reject) => {
      child.once('exit', (code, signal) => reject(new Error(`sandbox ${id} exited during start (${signal ?? `exit ${code}`})`)));
      child.once('error', reject);
    });
    exited.catch(() => {});
    if (!child.pid) throw new Error(`could not spawn the launcher for sandbox ${id}`);
    record.pid = child.pid;
    record.pidStartTime = processStartTime(child.pid);
    await writeRecord(dir, record);

    try {
      const client = new AgentClient(record.agentSocket, { proofKey: agentKey });
      try {
        await Promise.race([this.waitReadySafely(client, record.agentSocket), exited]);
      } finally {
        client.close();
      }
    } catch (error) {
      const tail = await readTail(join(dir, 'sandbox.log'));
      throw new Error(`sandbox ${id} did not become ready: ${(error as Error).message}\n--- sandbox log (tail) ---\n${tail}`);
    }
    record.status = 'running';
    await writeRecord(dir, record);
    this.watchChild(id, child);
  }

  private async waitReadySafely(client: AgentClient, socketPath: string): Promise<void> {
    await client.waitReady({ timeoutMs: this.options.readyTimeoutMs ?? 20_000, intervalMs: 25 });
    await assertAgentSocket(socketPath);
  }

  /** `upper: false` when the upper dir is about to be made as a copy (fork). */
  private async makeSandboxDirs(record: SandboxRecord, options: { upper: boolean }): Promise<void> {
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
  private async cloneDisks(source: SandboxRecord, children: SandboxRecord[]): Promise<void> {
    const store = this.requireDiskStore();
    await withDiskFrozen(this.diskDirOf(source), async () => {
      for (const child of children) await store.cloneImage(diskImagePath(this.diskDirOf(source)), diskImagePath(this.diskDirOf(child)));
    });
    for (const child of children) await mountDiskImage(this.diskDirOf(child));
  }

  /** The disk a new sandbox gets: its spec's size (or the default) and inode limit. */
  private diskQuotaOf(spec: SandboxSpec): DiskQuota {
    const sizeBytes = (spec.diskGiB ?? this.options.defaultDiskGiB ?? DEFAULT_DISK_GIB) * 2 ** 30;
    return { sizeBytes, inodes: spec.diskInodes ?? inodesFor(sizeBytes, this.options.diskInodesPerGiB ?? DEFAULT_DISK_INODES_PER_GIB) };
  }

  private newSandboxRecord(spec: SandboxSpec): SandboxRecord {
    const record = newRecord(spec, this.options.ownerId, join(this.sandboxDir(spec.id), 'run', 'agent.sock'), 'creating');
    const diskDir = this.newDiskDir(spec.id);
    if (diskDir !== this.sandboxDir(spec.id)) record.diskDir = diskDir;
    record.disk = this.diskQuotaOf(spec);
    return record;
  }

  /** Where a new sandbox's upper/ and work/ go: the reflink store, or the sandbox dir itself. */
  private newDiskDir(id: string): string {
    const store = this.requireDiskStore();
    return store.root === this.dataDir ? this.sandboxDir(id) : join(store.root, 'sandboxes', id);
  }

  private diskDirOf(record: SandboxRecord): string {
    return record.diskDir ?? this.sandboxDir(record.id);
  }

  /** upper/ and work/: on the sandbox's own disk (disk-quota.ts), or in diskDir for sandboxes older than quotas. */
  private upperDirOf(record: SandboxRecord): string {
    return join(record.disk ? diskMountPoint(this.diskDirOf(record)) : this.diskDirOf(record), 'upper');
  }

  private workDirOf(record: SandboxRecord): string {
    return join(record.disk ? diskMountPoint(this.diskDirOf(record)) : this.diskDirOf(record), 'work');
  }

  /** The snapshot layers under the sandbox's upper dir, topmost first. */
  private async layerDirsOf(record: SandboxRecord): Promise<string[]> {
    const store = this.requireSnapshots();
    const dirs: string[] = [];
    for (const snapshotId of record.layers ?? []) {
      const dir = store.layerDir(snapshotId);
      if (!existsSync(dir)) throw new Error(`sandbox ${record.id}: its snapshot layer ${snapshotId} is missing (${dir})`);
      dirs.push(dir);
    }
    return dirs;
  }

  // ---- teardown -------------------------------------------------------------------------------

  /** Kills the processes and releases the slot and cgroups; the disk (upper/) stays. */
  private async teardownRuntime(id: string, record: SandboxRecord | undefined): Promise<void> {
    const cgroups = this.requireCgroups();
    const group = this.cgroupGroup(id);
    this.children.get(id)?.removeAllListeners('exit');
    this.children.delete(id);
    await cgroups.killAll(group);
    // Belt and braces: a launcher killed before it joined the cgroups is found by pid.
    if (record?.pid && record.pidStartTime && processStartTime(record.pid) === record.pidStartTime) {
      try {
        process.kill(record.pid, 'SIGKILL');
      } catch {
        // Gone meanwhile.
      }
      await waitForExit(record.pid, record.pidStartTime, 5_000);
    }
    for (const { slot, claimed } of await this.slotsOf(id, record)) {
      // A slot we hold the claim of is scrubbed back into the pool; one nobody claims (a crash
      // between teardown and record write) is only taken apart, never claimed again by us.
      if (claimed) await this.pool.release(slot);
      else await teardownSlot(slot);
    }
    this.egressApplied.delete(id);
    this.agentKeys.delete(id);
    await removeAgentKeyFile(this.sandboxDir(id));
    await cgroups.remove(group);
    // The id range goes last: no process of the sandbox is left that could still use it.
    for (const claim of await this.idRanges.claims()) {
      if (claim.owner === this.options.ownerId && claim.holder === id) await this.idRanges.release(claim.index, claim.owner, claim.holder);
    }
    if (record) {
      record.idRange = undefined;
      record.slot = undefined;
      record.cgroup = undefined;
      record.pid = undefined;
      record.pidStartTime = undefined;
      await rm(record.agentSocket, { force: true });
    }
  }

  /** The slots this sandbox holds: from its record and from our claim files (a crash can leave either). */
  private async slotsOf(id: string, record: SandboxRecord | undefined): Promise<{ slot: Slot; claimed: boolean }[]> {
    const found = new Map<number, boolean>();
    const claims = await this.slots.claims();
    for (const claim of claims) {
      if (claim.owner === this.options.ownerId && claim.sandboxId === id) found.set(claim.index, true);
    }
    if (record?.slot && !found.has(record.slot.index)) {
      // Never touch an index someone else claimed (or that went back to our pool) after this
      // sandbox let it go.
      if (!claims.some((claim) => claim.index === record.slot?.index)) found.set(record.slot.index, false);
    }
    return [...found].map(([index, claimed]) => ({ slot: slotFor(this.subnet, index), claimed }));
  }

  // ---- egress -----------------------------------------------------------------------------------

  /**
   * Changes a sandbox's egress policy: kept in its record (so a start, or the next host agent
   * after a restart, applies it again) and put in force at once when the sandbox holds a slot.
   */
  async setEgress(id: string, egress: EgressPolicySpec): Promise<EgressResult> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      record.spec = { ...record.spec, egress };
      await writeRecord(this.sandboxDir(id), record);
      if (!isLive(record) || !record.slot) return { egress, addresses: [], unresolved: [], applied: false };
      const applied = await this.applyEgress(record);
      return { egress, addresses: applied.addresses, unresolved: applied.unresolved, applied: true };
    });
  }

  /** Renders the sandbox's policy into its slot's chain (one atomic nft transaction). */
  private async applyEgress(record: SandboxRecord): Promise<{ addresses: string[]; unresolved: string[] }> {
    if (!record.slot) throw new Error(`sandbox ${record.id} has no network slot`);
    const resolved = await resolveEgress(record.spec.egress, this.options.egressResolver ?? systemResolver);
    await applyNftRuleset(renderSlotEgress(record.slot.index, VETH_PREFIX, resolved.rules));
    if (resolved.unresolved.length) this.log(`egress of ${record.id}: ${resolved.unresolved.join(', ')} resolved to nothing (retried at the next refresh)`);
    this.egressApplied.set(record.id, { addresses: resolved.rules.addresses, unresolved: resolved.unresolved, hasDomains: resolved.hasDomains });
    this.startEgressRefresh();
    return { addresses: resolved.rules.addresses, unresolved: resolved.unresolved };
  }

  /** Resolves the domains of every live allow list again; applies those whose addresses changed. */
  async refreshEgress(): Promise<number> {
    let changed = 0;
    for (const [id, applied] of [...this.egressApplied]) {
      if (!applied.hasDomains) continue;
      await this.withLock(id, async () => {
        const record = this.records.get(id);
        if (!record || !isLive(record) || !record.slot) return;
        const resolved = await resolveEgress(record.spec.egress, this.options.egressResolver ?? systemResolver);
        if (resolved.rules.addresses.join() === applied.addresses.join()) return;
        await applyNftRuleset(renderSlotEgress(record.slot.index, VETH_PREFIX, resolved.rules));
        this.egressApplied.set(id, { addresses: resolved.rules.addresses, unresolved: resolved.unresolved, hasDomains: true });
        this.log(`egress of ${id}: allow list now resolves to ${resolved.rules.addresses.join(', ') || 'nothing'}`);
        changed++;
      }).catch((error) => this.log(`egress refresh of ${id}: ${String(error)}`));
    }
    return changed;
  }

  private startEgressRefresh(): void {
    if (this.egressTimer) return;
    this.egressTimer = setInterval(() => void this.refreshEgress(), this.options.egressRefreshMs ?? DEFAULT_EGRESS_REFRESH_MS);
    this.egressTimer.unref();
  }

  private async destroyUnlocked(id: string): Promise<void> {
    const dir = this.sandboxDir(id);
    const record = this.records.get(id) ?? (await readRecord(dir));
    await this.teardownRuntime(id, record);
    // The disk goes first and the record last, so a crash in between leaves a record to retry from.
    for (const diskDir of new Set([record?.diskDir, this.newDiskDir(id)])) {
      if (diskDir && diskDir !== dir) await removeTree(diskDir);
    }
    // Mounts live in the sandbox's own namespace; anything on the host here is a leftover.
    const leftovers = mountPointsUnder(dir);
    await removeTree(dir);
    if (existsSync(dir)) throw new Error(`could not remove ${dir} (mounts: ${leftovers.join(', ') || 'none'})`);
    this.records.delete(id);
  }

  // ---- adoption and reclaim -------------------------------------------------------------------

  private async adoptAll(): Promise<void> {
    const entries = await readdir(this.sandboxesDir, { withFileTypes: true });
    for (const entry of entries) {
      if (!entry.isDirectory() || !SANDBOX_ID.test(entry.name)) continue;
      const id = entry.name;
      const dir = this.sandboxDir(id);
      await removeRecordTempFiles(dir);
      const record = await readRecord(dir);
      if (record && record.owner !== this.options.ownerId) continue;
      // After a reboot the sandbox's disk is a file again; mount it (a no-op when it still is).
      if (record?.disk && record.status !== 'creating') {
        await mountDiskImage(this.diskDirOf(record)).catch((error) => this.log(`init: sandbox ${id}: mounting its disk failed: ${String(error)}`));
      }
      await this.withLock(id, () => this.adoptOne(id, record));
    }
  }

  private async adoptOne(id: string, record: SandboxRecord | undefined): Promise<void> {
    if (!record || record.status === 'creating') {
      this.log(`init: removing half-created sandbox ${id}`);
      await this.destroyUnlocked(id);
      return;
    }
    this.records.set(id, record);
    const launcherAlive = !!record.pid && !!record.pidStartTime && processStartTime(record.pid) === record.pidStartTime;
    if (launcherAlive && (record.status === 'running' || record.status === 'paused')) {
      // Finish a pause or unpause the previous host agent was in the middle of, and undo the
      // freeze of an interrupted fork/snapshot copy; with no operation, the status decides.
      const operation = record.operation?.kind;
      const paused = operation === 'pause' ? true : operation === 'unpause' || operation === 'copy' ? false : record.status === 'paused';
      const settled = await this.requireCgroups()
        .setFrozenAndWait(this.cgroupGroup(id), paused)
        .then(() => true)
        .catch((error) => {
          this.log(`init: sandbox ${id}: could not ${paused ? 'freeze' : 'thaw'} it: ${String(error)}`);
          return false;
        });
      if (settled) {
        record.operation = undefined;
        record.status = paused ? 'paused' : 'running';
        // A frozen agent cannot answer; the live launcher and the frozen cgroup are the evidence
        // (its key is checked on every answer once it is thawed).
        if (paused ? await this.loadAgentKey(record) : await this.isAlive(record)) {
          await writeRecord(this.sandboxDir(id), record);
          this.log(`init: adopted ${record.status} sandbox ${id} (pid ${record.pid})`);
          return;
        }
      }
    }
    if (record.status !== 'stopped') this.log(`init: sandbox ${id} is no longer running; marking it stopped`);
    await this.teardownRuntime(id, record);
    record.status = 'stopped';
    record.operation = undefined;
    await writeRecord(this.sandboxDir(id), record);
  }

  private async loadAgentKey(record: SandboxRecord): Promise<boolean> {
    const key = await readAgentKeyFile(this.sandboxDir(record.id));
    if (key) this.agentKeys.set(record.id, key);
    else this.log(`init: sandbox ${record.id} has no readable agent key; not adopting it`);
    return !!key;
  }

  private async isAlive(record: SandboxRecord): Promise<boolean> {
    if (!record.pid || !record.pidStartTime || processStartTime(record.pid) !== record.pidStartTime) return false;
    const key = await readAgentKeyFile(this.sandboxDir(record.id));
    // Only an agent that proves it holds this boot's key is adopted: without the key (lost or
    // never written) a forged agent could not be told from the real one.
    if (!key) {
      this.log(`init: sandbox ${record.id} has no readable agent key; not adopting it`);
      return false;
    }
    const client = new AgentClient(record.agentSocket, { proofKey: key });
    try {
      await assertAgentSocket(record.agentSocket);
      await client.health({ timeoutMs: HEALTH_TIMEOUT_MS });
      this.agentKeys.set(record.id, key);
      return true;
    } catch (error) {
      this.log(`init: sandbox ${record.id}: its agent did not answer as itself: ${(error as Error).message}`);
      return false;
    } finally {
      client.close();
    }
  }

  /** Slots and cgroups of this owner that no running sandbox accounts for. */
  private async reclaimOrphans(): Promise<void> {
    const running = new Set([...this.records.values()].filter((record) => isLive(record)).map((record) => record.id));
    // Our claims whose sandbox is not live (and our pool of a previous run) are scrubbed into
    // the pool or taken apart; the claims of live sandboxes stay theirs.
    const liveSlots = new Map<number, string>();
    for (const record of this.records.values()) if (isLive(record) && record.slot) liveSlots.set(record.slot.index, record.id);
    await this.pool.reclaim(liveSlots);
    const cgroups = this.requireCgroups();
    // File views (`<id>-view`) are never adopted, so theirs go here too.
    for (const name of await cgroups.children(join('nestbox', this.ownerKey))) {
      if (running.has(name)) continue;
      this.log(`init: removing orphaned cgroup ${name}`);
      const group = this.cgroupGroup(name);
      await cgroups.killAll(group);
      await cgroups.remove(group);
    }
    for (const record of this.records.values()) await removeTree(join(this.sandboxDir(record.id), 'view'));
    // Id ranges of ours that no live sandbox holds (views included: they were just killed).
    for (const claim of await this.idRanges.claims()) {
      if (claim.owner === this.options.ownerId && !running.has(claim.holder)) await this.idRanges.release(claim.index, claim.owner, claim.holder);
    }
    // Disks in the reflink store whose sandbox dir is gone: a destroy that crashed half-way.
    const store = this.requireDiskStore();
    if (store.root !== this.dataDir) {
      for (const id of await readdir(join(store.root, 'sandboxes')).catch(() => [] as string[])) {
        if (!SANDBOX_ID.test(id) || existsSync(this.sandboxDir(id))) continue;
        this.log(`init: removing orphaned disk of sandbox ${id}`);
        await removeTree(join(store.root, 'sandboxes', id));
      }
    }
  }

  // ---- watching -------------------------------------------------------------------------------

  private watchChild(id: string, child: ChildProcess): void {
    this.children.set(id, child);
    child.once('exit', () => {
      if (this.children.get(id) === child) void this.checkStillRunning(id);
    });
  }

  private startWatching(): void {
    const interval = this.options.watchIntervalMs ?? 5_000;
    this.watchTimer = setInterval(() => {
      for (const record of this.records.values()) if (isLive(record)) void this.checkStillRunning(record.id);
    }, interval);
    this.watchTimer.unref();
  }

  /** A sandbox whose launcher died on its own (OOM of PID 1, external kill) becomes stopped. */
  private async checkStillRunning(id: string): Promise<void> {
    await this.withLock(id, async () => {
      const record = this.records.get(id);
      if (!record || !isLive(record)) return;
      if (record.pid && record.pidStartTime && processStartTime(record.pid) === record.pidStartTime) return;
      this.log(`sandbox ${id} exited on its own; releasing its runtime`);
      await this.teardownRuntime(id, record);
      record.status = 'stopped';
      await writeRecord(this.sandboxDir(id), record);
    }).catch((error) => this.log(`watch ${id}: ${String(error)}`));
  }

  // ---- helpers --------------------------------------------------------------------------------

  /** Takes several locks in sorted order (one global order: no deadlock between multi-lock calls). */
  private withLocks<T>(keys: string[], task: () => Promise<T>): Promise<T> {
    return this.locks.runAll(keys, task);
  }

  private withLock<T>(id: string, task: () => Promise<T>): Promise<T> {
    return this.locks.run(id, task);
  }

  private runtimeOf(record: SandboxRecord): SandboxRuntime {
    if (!isLive(record)) return { id: record.id, status: 'stopped' };
    return {
      id: record.id,
      status: record.status === 'paused' ? 'paused' : 'running',
      pid: record.pid,
      agentSocket: record.agentSocket,
      agentProofKey: this.agentKeys.get(record.id),
      network: record.slot ? { hostAddress: record.slot.hostAddress, sandboxAddress: record.slot.sandboxAddress, netns: record.slot.netns } : undefined,
    };
  }

  private validateSpec(spec: SandboxSpec): void {
    assertSandboxId(spec.id);
    const invalid = (message: string) => new DriverError('validation_failed', message);
    if (spec.image !== 'default') throw invalid(`unknown image "${spec.image}" (the local driver has only "default")`);
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
    assertSafeHostPath('data dir', this.sandboxDir(spec.id));
    const socket = join(this.sandboxDir(spec.id), 'run', 'agent.sock');
    if (Buffer.byteLength(socket) > SUN_PATH_MAX) {
      throw new Error(
        `agent socket path ${socket} is ${Buffer.byteLength(socket)} bytes, over the ${SUN_PATH_MAX}-byte Unix socket limit; use a shorter data dir than ${this.dataDir}`,
      );
    }
  }

  private assertInitialized(): void {
    if (!this.initialized) throw new Error('LocalDriver.init() must run first');
  }

  private requireDiskStore(): DiskStore {
    if (!this.diskStore) throw new Error('LocalDriver.init() must run first');
    return this.diskStore;
  }

  private requireSnapshots(): SnapshotStore {
    if (!this.snapshotStore) throw new Error('LocalDriver.init() must run first');
    return this.snapshotStore;
  }

  private requireFileViews(): FileViews {
    if (!this.fileViews) throw new Error('LocalDriver.init() must run first');
    return this.fileViews;
  }

  private requireRecord(id: string): SandboxRecord {
    const record = this.records.get(id);
    if (!record) throw new DriverError('not_found', `sandbox ${id} not found`);
    return record;
  }

  private async requireSnapshot(snapshotId: string): Promise<SnapshotMeta> {
    const meta = await this.requireSnapshots().get(snapshotId);
    if (!meta) throw new DriverError('not_found', `snapshot ${snapshotId} not found on this host`);
    return meta;
  }

  private requireCgroups(): Cgroups {
    if (!this.cgroups) throw new Error('LocalDriver.init() must run first');
    return this.cgroups;
  }

  private sandboxDir(id: string): string {
    return join(this.sandboxesDir, id);
  }

  private cgroupPath(id: string): string {
    return join('nestbox', this.ownerKey, id);
  }

  private cgroupGroup(id: string): CgroupGroup {
    return this.requireCgroups().groupFor(this.cgroupPath(id));
  }
}

// ---- free functions -----------------------------------------------------------------------------

/**
 * Defence in depth: the launcher binds the agent socket in run/, a host directory the sandbox
 * never sees (the agent inherits only the descriptor), so nothing inside can replace it. Should
 * that ever change, a symlink planted there would point the host agent, as root, at some other
 * host socket; refuse anything that is not a socket.
 */
export async function assertAgentSocket(path: string): Promise<void> {
  const info = await lstat(path);
  if (!info.isSocket()) throw new Error(`${path} is not a Unix socket (${info.isSymbolicLink() ? 'a symlink' : 'another file type'}); refusing to connect`);
}

function assertSandboxId(id: string): void {
  if (typeof id !== 'string' || !SANDBOX_ID.test(id)) throw new DriverError('validation_failed', `invalid sandbox id "${id}": lowercase letters and digits only, at most 32`);
}

function snapshotResult(meta: SnapshotMeta): SnapshotResult {
  return { snapshotId: meta.snapshotId, sizeBytes: meta.sizeBytes, diskCopy: meta.diskCopy, layers: [meta.snapshotId, ...meta.parents] };
}

/** Running or paused: it has processes, a slot and cgroups. */
function isLive(record: SandboxRecord): boolean {
  return record.status === 'running' || record.status === 'paused';
}

/** Lock key of a snapshot; sandbox ids never contain ':', so keys cannot collide. */
function snapshotLockKey(snapshotId: string): string {
  return `snapshot:${snapshotId}`;
}

function assertOverlayOptionsFit(lowerDir: string, layerDirs: string[], upperDir: string, workDir: string): void {
  const options = `lowerdir=${overlayLowerOption({ lowerDir, layerDirs })},upperdir=${upperDir},workdir=${workDir}`;
  if (Buffer.byteLength(options) > MOUNT_OPTIONS_MAX) {
    throw new DriverError('validation_failed', `the snapshot chain is too long to mount (${layerDirs.length} layers, ${Buffer.byteLength(options)} bytes of overlay options)`);
  }
}

/** Owner ids become a cgroup directory name; anything unusual is hashed. */
function ownerKeyFor(ownerId: string): string {
  if (/^[A-Za-z0-9_.-]{1,64}$/.test(ownerId) && ownerId !== '.' && ownerId !== '..') return ownerId;
  return createHash('sha256').update(ownerId).digest('hex').slice(0, 32);
}

/**
 * /etc/hostname, /etc/hosts and /etc/resolv.conf go straight into the upper layer before launch.
 * The sandbox owns that directory, so nothing here may follow a symlink it planted.
 */
async function writeSandboxEtc(upperDir: string, id: string, dnsServers: string[], log: (message: string) => void): Promise<void> {
  const etc = join(upperDir, 'etc');
  const etcStat = await lstat(etc).catch(() => undefined);
  if (!etcStat) await mkdir(etc, { mode: 0o755 });
  else if (!etcStat.isDirectory()) {
    log(`sandbox ${id}: /etc in the upper layer is not a directory; leaving it alone`);
    return;
  }
  await writeNoFollow(join(etc, 'hostname'), `${id}\n`);
  await writeNoFollow(join(etc, 'hosts'), `127.0.0.1\tlocalhost\n127.0.1.1\t${id}\n::1\tlocalhost ip6-localhost ip6-loopback\n`);
  await writeNoFollow(join(etc, 'resolv.conf'), dnsServers.map((server) => `nameserver ${server}\n`).join(''));
}

async function writeNoFollow(path: string, content: string): Promise<void> {
  const existing = await lstat(path).catch(() => undefined);
  if (existing && !existing.isFile()) await rm(path, { recursive: true, force: true });
  const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_TRUNC | fsConstants.O_NOFOLLOW, 0o644);
  try {
    await handle.writeFile(content);
  } finally {
    await handle.close();
  }
}

async function appendLog(path: string, line: string): Promise<void> {
  const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_APPEND | fsConstants.O_NOFOLLOW, 0o600);
  try {
    await handle.writeFile(line);
  } finally {
    await handle.close();
  }
}


async function waitForExit(pid: number, startTime: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (processStartTime(pid) === startTime) {
    if (Date.now() > deadline) throw new Error(`process ${pid} did not exit within ${timeoutMs} ms`);
    await new Promise((resolveSleep) => setTimeout(resolveSleep, 20));
  }
}
