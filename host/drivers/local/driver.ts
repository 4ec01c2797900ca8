// The local driver: sandboxes isolated with Linux namespaces, an overlayfs root, cgroups and a
// network namespace each (host-runtime.md §10), for hosts without KVM. Every sandbox keeps a
// record on disk so a restarted host agent adopts what still runs (`init()`), and every piece
// of runtime state (slot, cgroup, processes) can be found again from the sandbox id and owner
// alone, so destroy() also cleans half-created sandboxes.
//
// This file is the Driver surface (setup, lifecycle, pause, fork, snapshots, file views,
// egress); it builds on recovery.ts (adoption at init), runtime.ts (launch, teardown, egress
// rules, watching) and sandboxes.ts (state, layout and checks), over ../base/driver-base.ts.
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { sandboxDnsServers } from '../../network/dns.js';
import { applyNftRuleset, nftAvailable, renderNftRuleset } from '../../network/nft.js';
import type { SlotPoolStats } from '../../network/slot-pool.js';
import { assertMachineNetnsMounts, enableIpForwarding, slotTrafficBytes, VETH_PREFIX } from '../../network/slots.js';
import { DiskStore } from '../../storage/disk-store.js';
import { diskImagePath, DISK_IMAGE_FILE, mountDiskImage, readDiskUsage, withDiskFrozen } from '../../storage/disk-quota.js';
import { packEntries, unpackInto } from '../../storage/transfer.js';
import { assertSnapshotId, SnapshotStore } from '../../storage/snapshots.js';
import { assertSandboxId, SANDBOX_ID } from '../base/driver-base.js';
import { DriverError } from '../errors.js';
import { AgentClient } from '../../agent-protocol/client.js';
import type { Driver, DriverCapabilities, EgressPolicySpec, EgressResult, FileView, ForkResult, SandboxDiskInfo, ResizeResult, ResizeSpec, SandboxRuntime, SandboxSpec, SnapshotInfo, SandboxUsageCounters, SnapshotResult, StartResult } from '../types.js';
import { Cgroups } from './cgroups.js';
import { FileViews } from './file-view.js';
import { LxcfsDaemon, lxcfsAvailable } from './lxcfs.js';
import { readRecord, writeRecord, type SandboxRecord } from './records.js';
import { LocalRecovery } from './recovery.js';
import { DEFAULT_RUNTIME_DIR, executeOnlyCopy, hostLoaderFor, runtimeAgentBundleCopy, runtimeCopy } from './runtime-binaries.js';
import { DEFAULT_PIDS_MAX, isLive, snapshotLockKey } from './sandboxes.js';
import { resizeRecord, type ResizeContext } from './resize.js';
import { lastCapability, syscallNumbers } from './spawn.js';

export type { LocalDriverOptions } from './sandboxes.js';
export { assertAgentSocket } from './runtime.js';

export class LocalDriver extends LocalRecovery implements Driver {
  readonly name = 'local' as const;

  // ---- Driver: setup --------------------------------------------------------------------------

  async init(): Promise<void> {
    // First: under `ip netns exec` the probe would fail on a missing cgroup tree, not say why.
    assertMachineNetnsMounts();
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
    this.agentBundle = await runtimeAgentBundleCopy(resolve(this.options.guestAgentBundle), runtimeDir);
    await enableIpForwarding();
    this.dnsServers = await sandboxDnsServers(this.options.dnsServers);
    await applyNftRuleset(renderNftRuleset({ subnet: this.subnet, vethPrefix: VETH_PREFIX, dnsServers: this.dnsServers }));
    await mkdir(this.sandboxesDir, { recursive: true, mode: 0o700 });
    this.diskStore = await DiskStore.open({ dataDir: this.dataDir, reflinkStore: this.options.reflinkStore, logger: this.log });
    if (this.diskStore.root !== this.dataDir) await mkdir(join(this.diskStore.root, 'sandboxes'), { recursive: true, mode: 0o700 });
    if (this.diskStore.mode === 'copy') this.log.warn('disk store: the data dir cannot reflink and NESTBOX_REFLINK_STORE is off, so every fork and snapshot writes a full copy of its source disk (disk quotas still hold)');
    if (this.options.lxcfs ?? lxcfsAvailable()) {
      const daemon = new LxcfsDaemon(join(this.dataDir, 'lxcfs'), this.log);
      await daemon.start();
      this.lxcfs = daemon;
    }
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
      logger: this.log,
    });
    await this.adoptAll();
    await this.reclaimOrphans();
    // Adopted sandboxes get their policy again: the rules may have been lost meanwhile (a
    // reboot of the firewall, an older host agent's table), and their domains re-resolved.
    for (const record of this.records.values()) {
      if (isLive(record) && record.slot) await this.applyEgress(record).catch((error) => this.log.warn({ sandboxId: record.id, operation: 'init' }, `init: egress: ${String(error)}`));
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
      hotResize: true,
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
    // LXCFS serves running sandboxes (they outlive us); with none left it goes too.
    // (Records on disk, not in memory: another driver instance on this data dir may have destroyed them.)
    if (this.lxcfs) await this.lxcfs.close(!(await this.anyLiveOnDisk()));
    // Running sandboxes outlive us and keep their groups; with none left, this owner's
    // directory (in every hierarchy) would stay behind empty forever.
    if (this.cgroups) {
      await this.cgroups.removeIfEmpty(join('nestbox', this.ownerKey)).catch((error) => this.log.warn({ owner: this.ownerKey }, `close: could not remove the empty cgroup of ${this.ownerKey}: ${String(error)}`));
    }
  }

  private async anyLiveOnDisk(): Promise<boolean> {
    for (const entry of await readdir(this.sandboxesDir).catch(() => [] as string[])) {
      if (!SANDBOX_ID.test(entry)) continue;
      const record = await readRecord(this.sandboxDir(entry)).catch(() => undefined);
      if (record && (isLive(record) || record.status === 'starting' || record.status === 'creating')) return true;
    }
    return false;
  }

  protected async probe(): Promise<void> {
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
    return this.createUnder(spec, async () => {
      const dir = this.sandboxDir(spec.id);
      const image = await this.imageOf(spec, onProgress);
      const record = this.newSandboxRecord(spec);
      const build = async () => {
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
        await this.launch(record, image, onProgress);
      };
      return { record, build };
    });
  }

  async stop(id: string): Promise<{ memorySaved: boolean }> {
    return this.withRecord(id, async (record) => {
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
      if (record.status === 'paused') await this.setPaused(record, false);
      if (record.status === 'running') return { ...this.runtimeOf(record), memoryRestored: true };
      await this.closeFileView(spec.id);
      const image = await this.imageOf(record.spec);
      record.spec = spec;
      record.status = 'starting';
      await writeRecord(this.sandboxDir(spec.id), record);
      try {
        await this.launch(record, image);
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

  // ---- Driver: pause ----------------------------------------------------------------------------

  /** Journal, freeze/thaw and wait for the kernel, then record the outcome (init() finishes a crashed one). */
  protected async setPaused(record: SandboxRecord, paused: boolean): Promise<void> {
    if (record.status === (paused ? 'paused' : 'running')) return;
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
    this.log.info({ sandboxId: record.id, operation: paused ? 'pause' : 'unpause', ms: Date.now() - started }, `${paused ? 'pause' : 'unpause'}: ${Date.now() - started} ms`);
  }

  /**
   * Runs `task` (a copy of the upper dir) with the sandbox's processes frozen if it runs, so the
   * copy is a consistent point in time; thaws afterwards even when the task fails. A paused
   * sandbox stays frozen, a stopped one has nothing to freeze.
   */
  protected async withFrozen<T>(record: SandboxRecord, task: () => Promise<T>): Promise<T> {
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
        .catch((error) => this.log.warn({ sandboxId: record.id }, `thaw after copy failed: ${String(error)}`));
      record.operation = undefined;
      await writeRecord(dir, record);
    }
  }

  // ---- Driver: fork ---------------------------------------------------------------------------

  async fork(sourceId: string, children: SandboxSpec[]): Promise<ForkResult> {
    const checkSource = (source: SandboxRecord) => {
      if (!['running', 'paused', 'stopped'].includes(source.status)) throw new DriverError('invalid_state', `sandbox ${sourceId} is ${source.status}`);
    };
    return this.forkUnder(sourceId, children, async (source) => {
      const started = Date.now();
      await this.closeFileView(sourceId);
      // Children run on their source's image, whatever their specs name.
      const image = await this.imageOf(source.spec);
      const made: SandboxRecord[] = [];
      try {
        for (const child of children) {
          await this.removeRemains(child.id);
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
        const launches = await Promise.allSettled(made.map((record) => this.launch(record, image)));
        const failed = launches.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected');
        if (failed) throw failed.reason;
        this.log.info({ sandboxId: sourceId, operation: 'fork', childIds: made.map((record) => record.id), copyMs, ms: Date.now() - started }, `fork → ${made.map((record) => record.id).join(', ')}: copy ${copyMs} ms (${this.requireDiskStore().mode}), running in ${Date.now() - started} ms`);
      } catch (error) {
        for (const record of made) {
          await this.destroyUnlocked(record.id).catch((cleanupError) => this.log.warn({ sandboxId: sourceId, operation: 'fork', childId: record.id }, `fork: cleanup of ${record.id} failed: ${String(cleanupError)}`));
        }
        throw error;
      }
      return { children: made.map((record) => this.runtimeOf(record)), memoryCopied: false, diskCopy: this.requireDiskStore().mode };
    }, checkSource);
  }

  // ---- Driver: snapshots ------------------------------------------------------------------------

  async snapshot(id: string, snapshotId: string): Promise<SnapshotResult> {
    const checkArguments = () => assertSnapshotId(snapshotId);
    return this.withRecord(id, async (record) => {
      if (!['running', 'paused', 'stopped'].includes(record.status)) throw new DriverError('invalid_state', `sandbox ${id} is ${record.status}`);
      await this.closeFileView(id);
      return this.withLock(snapshotLockKey(snapshotId), async () => {
        const store = this.requireSnapshots();
        const existing = await store.get(snapshotId);
        // A retry of the same call gets the same snapshot; another sandbox cannot take the name.
        if (existing?.sourceId === id) return this.snapshotResult(existing);
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
        this.log.info({ sandboxId: id, operation: 'snapshot', snapshotId, bytes: meta.sizeBytes, ms: Date.now() - started }, `snapshot → ${snapshotId}: ${meta.sizeBytes} bytes in ${Date.now() - started} ms (${meta.diskCopy})`);
        return this.snapshotResult(meta);
      });
    }, checkArguments);
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

  // ---- Driver: host-to-host transfers ------------------------------------------------------------

  /** Streams a snapshot's meta and layer (or disk image) as tar, under its lock (no delete meanwhile). */
  async exportSnapshot(snapshotId: string, begin: (parents: string[]) => NodeJS.WritableStream): Promise<void> {
    this.assertInitialized();
    assertSnapshotId(snapshotId);
    await this.withLock(snapshotLockKey(snapshotId), async () => {
      const store = this.requireSnapshots();
      const meta = await store.get(snapshotId);
      if (!meta) throw new DriverError('not_found', `snapshot ${snapshotId} not found`);
      await this.streamTar(join(store.dir, snapshotId), store.transferEntries(snapshotId), begin(meta.parents));
    });
  }

  /** Takes in a snapshot streamed from another host (all or nothing: SnapshotStore.adopt). */
  async importSnapshot(snapshotId: string, source: NodeJS.ReadableStream): Promise<SnapshotInfo> {
    this.assertInitialized();
    assertSnapshotId(snapshotId);
    return this.withLock(snapshotLockKey(snapshotId), async () => {
      const store = this.requireSnapshots();
      const existing = await store.get(snapshotId);
      const meta = existing ?? (await store.adopt(snapshotId, (temp) => unpackInto(temp, source as import('node:stream').Readable)));
      this.log.info({ operation: 'import-snapshot', snapshotId, bytes: meta.sizeBytes }, `snapshot ${snapshotId}: ${existing ? 'already here' : 'taken in from another host'}`);
      return { ...this.snapshotResult(meta), sourceId: meta.sourceId, image: meta.image, createdAt: meta.createdAt };
    });
  }

  /**
   * Streams a stopped sandbox's disk (its disk image, sparse, with its file system frozen so
   * the image is clean; or an old sandbox's upper dir) under its lock, so it cannot start or be
   * destroyed while the copy is read.
   */
  async exportSandbox(id: string, begin: (info: SandboxDiskInfo) => NodeJS.WritableStream): Promise<void> {
    await this.withRecord(id, async (record) => {
      if (record.status !== 'stopped') throw new DriverError('invalid_state', `sandbox ${id} is ${record.status}; only a stopped sandbox's disk is sent to another host`);
      await this.closeFileView(id);
      const info: SandboxDiskInfo = { layers: record.layers ?? [], disk: record.disk ? { ...record.disk } : null };
      const diskDir = this.diskDirOf(record);
      if (record.disk) await withDiskFrozen(diskDir, () => this.streamTar(diskDir, [DISK_IMAGE_FILE], begin(info)));
      else await this.streamTar(diskDir, ['upper'], begin(info));
    });
  }

  /**
   * A stopped sandbox from another host's export. Its record is written as `creating` before any
   * byte arrives, so a failure, or a crash of this host agent half-way, leaves nothing behind:
   * the failure destroys it, and init() removes a never-finished create entirely. Only when the
   * disk is complete and mounted does the record say `stopped`.
   */
  async importSandbox(spec: SandboxSpec, info: SandboxDiskInfo, source: NodeJS.ReadableStream): Promise<SandboxRuntime> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const existing = this.records.get(spec.id);
      if (existing?.status === 'stopped') return this.runtimeOf(existing); // a retry of a complete import
      if (existing) throw new DriverError('conflict', `sandbox ${spec.id} already exists here (${existing.status})`);
      const store = this.requireSnapshots();
      for (const layer of info.layers) if (!(await store.get(layer))) throw new DriverError('validation_failed', `snapshot layer ${layer} of sandbox ${spec.id} is not on this host; send it first`);
      await this.removeRemains(spec.id);
      const started = Date.now();
      const record = this.newSandboxRecord(spec);
      record.layers = info.layers.length ? [...info.layers] : undefined;
      record.disk = info.disk ? { ...info.disk } : undefined;
      const diskDir = this.diskDirOf(record);
      try {
        await mkdir(join(this.sandboxDir(spec.id), 'rootfs'), { recursive: true, mode: 0o755 });
        await mkdir(join(this.sandboxDir(spec.id), 'run'), { recursive: true, mode: 0o700 });
        await mkdir(diskDir, { recursive: true, mode: 0o700 });
        await writeRecord(this.sandboxDir(spec.id), record);
        this.records.set(spec.id, record);
        await unpackInto(diskDir, source as import('node:stream').Readable);
        if (record.disk) await mountDiskImage(diskDir);
        await mkdir(this.workDirOf(record), { recursive: true, mode: 0o755 });
        record.status = 'stopped';
        await writeRecord(this.sandboxDir(spec.id), record);
      } catch (error) {
        await this.destroyUnlocked(spec.id).catch((cleanupError) => this.log.warn({ sandboxId: spec.id, operation: 'import' }, `import: cleanup after failure failed: ${String(cleanupError)}`));
        throw error;
      }
      this.log.info({ sandboxId: spec.id, operation: 'import', ms: Date.now() - started }, `import: disk taken in from another host in ${Date.now() - started} ms`);
      return this.runtimeOf(record);
    });
  }

  /** tar of `entries` under `dir` into `sink`; the tar process dies if the sink goes away. */
  private async streamTar(dir: string, entries: string[], sink: NodeJS.WritableStream): Promise<void> {
    const packed = packEntries(dir, entries);
    const { pipeline } = await import('node:stream/promises');
    try {
      await pipeline(packed.stream, sink);
      await packed.done;
    } catch (error) {
      packed.kill();
      await packed.done.catch(() => {});
      throw error;
    }
  }

  // ---- Driver: file views -------------------------------------------------------------------------

  async fileView(id: string): Promise<FileView> {
    return this.withRecord(id, async (record) => {
      if (record.status !== 'stopped') {
        throw new DriverError('invalid_state', `sandbox ${id} is ${record.status}; file views are for stopped sandboxes (use its agent)`);
      }
      const image = await this.imageOf(record.spec);
      return this.requireFileViews().open({
        sandboxId: id,
        sandboxDir: this.sandboxDir(id),
        layerDirs: [this.upperDirOf(record), ...(await this.layerDirsOf(record))],
        baseRootfs: image.rootfs,
        env: { ...image.env, ...(record.spec.env ?? {}) },
      });
    });
  }

  touchFileView(id: string): void {
    this.fileViews?.touch(id);
  }

  /** Stops the sandbox's file view, if any (the caller holds the sandbox's lock). */
  protected async closeFileView(id: string): Promise<void> {
    const views = this.requireFileViews();
    if (views.isOpen(id) || existsSync(join(this.sandboxDir(id), 'view'))) await views.close(id, this.sandboxDir(id));
  }

  protected async closeIdleFileView(id: string): Promise<void> {
    await this.withLock(id, async () => {
      const views = this.requireFileViews();
      // Used again (or closed) while we waited for the lock: leave it.
      if (!views.isOpen(id)) return;
      if (!views.isIdle(id) && views.isRunning(id)) return;
      await views.close(id, this.sandboxDir(id));
      this.log.info({ sandboxId: id }, 'file view: stopped');
    }).catch((error) => this.log.warn({ sandboxId: id }, `file view: stop failed: ${String(error)}`));
  }

  // ---- Driver: egress ---------------------------------------------------------------------------

  /**
   * Changes a sandbox's egress policy: kept in its record (so a start, or the next host agent
   * after a restart, applies it again) and put in force at once when the sandbox holds a slot.
   */
  async setEgress(id: string, egress: EgressPolicySpec): Promise<EgressResult> {
    return this.withRecord(id, async (record) => {
      record.spec = { ...record.spec, egress };
      await writeRecord(this.sandboxDir(id), record);
      if (!isLive(record) || !record.slot) return { egress, addresses: [], denied: [], unresolved: [], applied: false };
      const applied = await this.applyEgress(record);
      return { egress, addresses: applied.addresses, denied: applied.denied, unresolved: applied.unresolved, applied: true };
    });
  }

  // ---- Driver: warm pool (issue 20) -------------------------------------------------------------

  /**
   * A warm member was launched like any create (runtime.ts), with no environment of its own
   * beyond the image's and the default egress policy, and nothing ran in it but its guest agent:
   * what makes it someone's is the create's environment (the agent's base environment for
   * every later process, PUT /env) and egress policy (its slot's rules). The record keeps
   * `warm` until both are in force, so a host agent that dies in between is found with a
   * member still warm and the control plane's takeover claims it again.
   */
  async claimWarm(spec: SandboxSpec): Promise<SandboxRuntime> {
    this.validateSpec(spec);
    return this.withRecord(spec.id, async (record) => {
      const was = record.spec;
      if (record.status !== 'running') throw new DriverError('invalid_state', `sandbox ${spec.id} is ${record.status}; only a running warm sandbox can be claimed`);
      if (was.image !== spec.image || was.cpu !== spec.cpu || was.memoryMiB !== spec.memoryMiB || (was.diskGiB ?? null) !== (spec.diskGiB ?? null) || spec.snapshot || spec.volumes?.length) {
        throw new DriverError('validation_failed', `sandbox ${spec.id} is a warm ${was.image} sandbox of ${was.cpu} vCPU, ${was.memoryMiB} MiB, ${was.diskGiB ?? '-'} GiB; a claim cannot change its image, size, snapshot or volumes`);
      }
      const { warm: _warm, ...claimed } = { ...was, env: spec.env, egress: spec.egress };
      // The egress rules first: the user's first process must never run under the pool's policy.
      await this.applyEgressIfChanged({ ...record, spec: claimed });
      const key = this.agentKeys.get(spec.id);
      const client = new AgentClient(record.agentSocket, key ? { proofKey: key } : {});
      try {
        // HOSTNAME is the sandbox id in any sandbox (launch sets it last); the rest replaces the
        // pool-era environment, which had only the image's.
        const { HOSTNAME: _hostname, ...env } = spec.env;
        const response = await client.request({ method: 'PUT', path: '/env', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ env, unset: Object.keys(was.env).filter((name) => !(name in env) && name !== 'HOSTNAME') }) });
        response.resume();
        if (response.statusCode !== 204) throw new Error(`sandbox ${spec.id}: its guest agent refused the environment of the claim (HTTP ${response.statusCode})`);
      } finally {
        client.close();
      }
      record.spec = claimed;
      await writeRecord(this.sandboxDir(spec.id), record);
      this.log.info({ sandboxId: spec.id, operation: 'claim' }, 'warm sandbox claimed');
      return this.runtimeOf(record);
    });
  }

  // ---- Driver: resize (resize.ts) ------------------------------------------------------------------

  async resize(id: string, change: ResizeSpec): Promise<ResizeResult> {
    return this.withRecord(id, async (record) => {
      if (change.cpu !== undefined || change.memoryMiB !== undefined) this.validateSpec({ ...record.spec, ...change });
      if (change.diskGiB !== undefined) await this.closeFileView(id);
      const result = await resizeRecord(this.resizeContext(record), record, change);
      this.log.info({ sandboxId: id, operation: 'resize', ...result }, `resize: ${result.cpu} vCPU, ${result.memoryMiB} MiB, ${result.diskGiB ?? '-'} GiB disk (${result.live ? 'live' : 'stopped'})`);
      return result;
    });
  }

  protected resizeContext(record: SandboxRecord): ResizeContext {
    return { cgroups: this.requireCgroups(), cgroupPath: this.cgroupPath(record.id), sandboxDir: this.sandboxDir(record.id), diskDir: this.diskDirOf(record), pidsMax: this.options.pidsMax ?? DEFAULT_PIDS_MAX };
  }

  // ---- Driver: usage ----------------------------------------------------------------------------

  /**
   * Counters of every live sandbox: its cgroup (CPU time, memory), its own disk (statfs) and its
   * slot's veth. No lock: a sandbox torn down meanwhile just lacks the counters it lost.
   */
  async usage(): Promise<SandboxUsageCounters[]> {
    const cgroups = this.requireCgroups();
    const live = [...this.records.values()].filter((record) => isLive(record));
    return Promise.all(
      live.map(async (record): Promise<SandboxUsageCounters> => {
        const [cgroup, disk, traffic] = await Promise.all([
          cgroups.usage(this.cgroupGroup(record.id)),
          record.disk ? readDiskUsage(this.diskDirOf(record)).catch(() => undefined) : undefined,
          record.slot ? slotTrafficBytes(record.slot) : undefined,
        ]);
        return {
          id: record.id,
          status: record.status === 'paused' ? 'paused' : 'running',
          cpuNs: cgroup.cpuNs,
          cpuLimit: record.spec.cpu,
          memoryUsedBytes: cgroup.memoryUsedBytes,
          memoryCacheBytes: cgroup.memoryCacheBytes,
          // The workloads' limit (the sandbox group adds the agent's reserve: cgroups.ts).
          memoryLimitBytes: record.spec.memoryMiB * 2 ** 20,
          diskUsedBytes: disk?.usedBytes,
          diskTotalBytes: disk?.sizeBytes,
          netRxBytes: traffic?.rxBytes,
          netTxBytes: traffic?.txBytes,
        };
      }),
    );
  }
}
