// The Cloud Hypervisor driver: every sandbox is a microVM (host-runtime.md, "Recommended
// design"). One VMM process per sandbox, in the slot's network namespace; the guest agent is
// reached over hybrid vsock, and re-exposed on a host Unix socket (`agentSocket`) so the host
// agent talks to VMs exactly as to local sandboxes. Stop keeps memory (pause → snapshot →
// reflink disk → shutdown), start restores it, fork restores N children from one snapshot.
// Every on-disk step is recorded first, so init() after a kill -9 adopts or cleans up.
import { randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { constants as fsConstants, existsSync } from 'node:fs';
import { access, link, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join, resolve } from 'node:path';
import { AgentClient } from '../../agent-protocol/client.js';
import { newAgentKey } from '../../agent-protocol/auth.js';
import { readAgentKeyFile, removeAgentKeyFile, writeAgentKeyFile } from '../../agent-protocol/key-file.js';
import { removeTree } from '../../util/fs.js';
import { readCompleteVmImage, VM_IMAGE_NAME, type VmImage } from '../../images/vm-image.js';
import { DriverError } from '../errors.js';
import { DiskStore, type ReflinkStoreOptions } from '../../storage/disk-store.js';
import { SlotAllocator, buildSlot, enableIpForwarding, slotFor, teardownSlot, VETH_PREFIX, type Slot } from '../../network/slots.js';
import { sandboxDnsServers } from '../../network/dns.js';
import { applyNftRuleset, renderNftRuleset } from '../../network/nft.js';
import { assertSnapshotId, SnapshotStore, type SnapshotMeta } from '../../storage/snapshots.js';
import type { Driver, DriverCapabilities, FileView, ForkResult, SandboxRuntime, SandboxSpec, SnapshotInfo, SnapshotResult, StartResult } from '../types.js';
import { ChApi, ChApiError, type RestoreConfig, type VmConfig } from './api.js';
import { AGENT_VSOCK_PORT, buildVmConfig, patchSnapshotConfig } from './config.js';
import { expectState, observeState, runtimeStatusFor, transition, VmOperationError } from './lifecycle.js';
import { addVmNetworking } from './network.js';
import { adoptVmm, EventFileReader, isProcessAlive, killProcess, launchVmm, readPidFile, readTail, stopVmm, type VmmPaths } from './process.js';
import { readChRecord, writeChRecord, CH_RECORD_VERSION, type ChLastError, type ChRecord } from './records.js';
import { HybridVsockAgent, VsockForwarder } from './vsock.js';
import { KeyedLocks } from '../../keyed-locks.js';

export interface ChDriverOptions {
  dataDir: string;
  imagesDir: string;
  ownerId: string;
  /** The cloud-hypervisor executable (a pinned static release; the simulator in tests). */
  chBinary: string;
  /** Name of the VM image under imagesDir (built by `nestbox image build --vm`). */
  vmImage?: string;
  subnet?: string;
  slotsDir?: string;
  /** Refuse to start without /dev/kvm (default true; the simulator needs none). */
  requireKvm?: boolean;
  /** `auto`: OnDemand when userfaultfd is usable, else Copy. */
  memoryRestoreMode?: 'auto' | 'Copy' | 'OnDemand';
  /** Pass VMX/SVM through to guests when the host allows nesting (default true). */
  nested?: boolean;
  readyTimeoutMs?: number;
  vmmReadyTimeoutMs?: number;
  watchIntervalMs?: number;
  reflinkStore?: ReflinkStoreOptions | 'off';
  dnsServers?: string[];
  /** Environment of the VMM processes (tests use it to configure the simulator). */
  vmmEnv?: NodeJS.ProcessEnv;
  /** Skip the host nftables table (tests that run beside other host agents). */
  manageHostFirewall?: boolean;
  log?: (message: string) => void;
}

const SANDBOX_ID = /^[a-z0-9]{1,32}$/;
const SUN_PATH_MAX = 107;
const MAX_FORK_CHILDREN = 64;
const SNAPSHOT_TIMEOUT_MS = 120_000;

interface LiveVm {
  api: ChApi;
  forwarder: VsockForwarder;
  events: EventFileReader;
}

export class ChDriver implements Driver {
  readonly name = 'cloud-hypervisor' as const;
  private readonly dataDir: string;
  private readonly sandboxesDir: string;
  private readonly subnet: string;
  private readonly slots: SlotAllocator;
  private readonly log: (message: string) => void;
  private readonly records = new Map<string, ChRecord>();
  private readonly live = new Map<string, LiveVm>();
  /** Each live VM's proof key for this boot (agent-protocol/auth.ts), also in its agent.key. */
  private readonly agentKeys = new Map<string, Buffer>();
  private readonly locks = new KeyedLocks();
  private diskStore?: DiskStore;
  private snapshotStore?: SnapshotStore;
  private probes: Record<string, string | number | boolean> = {};
  private restoreMode: 'Copy' | 'OnDemand' = 'Copy';
  private nestedVirt = false;
  private chVersion = 'unknown';
  private watchTimer?: NodeJS.Timeout;
  private initialized = false;

  constructor(private readonly options: ChDriverOptions) {
    this.dataDir = resolve(options.dataDir);
    this.sandboxesDir = join(this.dataDir, 'sandboxes');
    this.subnet = options.subnet ?? '10.200.0.0/16';
    this.slots = new SlotAllocator(this.subnet, options.slotsDir);
    this.log = options.log ?? (() => {});
  }

  // ---- setup ----------------------------------------------------------------------------------

  async init(): Promise<void> {
    await this.probe();
    await enableIpForwarding();
    if (this.options.manageHostFirewall !== false) {
      await applyNftRuleset(renderNftRuleset({ subnet: this.subnet, vethPrefix: VETH_PREFIX, dnsServers: await sandboxDnsServers(this.options.dnsServers) }));
    }
    await mkdir(this.sandboxesDir, { recursive: true, mode: 0o700 });
    this.diskStore = await DiskStore.open({ dataDir: this.dataDir, reflinkStore: this.options.reflinkStore, log: this.log });
    this.snapshotStore = new SnapshotStore(join(this.diskStore.root, 'vm-snapshots'));
    await this.snapshotStore.init();
    await this.adoptAll();
    await this.reclaimOrphanSlots();
    this.initialized = true;
    const interval = this.options.watchIntervalMs ?? 2_000;
    this.watchTimer = setInterval(() => void this.watchAll(), interval);
    this.watchTimer.unref();
  }

  /** Capabilities come from probes (host-runtime.md rule 7), never from assumptions. */
  private async probe(): Promise<void> {
    const binary = this.options.chBinary;
    await access(binary, fsConstants.X_OK).catch(() => {
      throw new Error(`cloud-hypervisor driver: ${binary} is not an executable (set NESTBOX_CH_BIN)`);
    });
    this.chVersion = (await runText(binary, ['--version']).catch((error: Error) => `unknown (${error.message})`)).trim();
    const kvm = await access('/dev/kvm', fsConstants.R_OK | fsConstants.W_OK).then(() => true, () => false);
    if (!kvm && this.options.requireKvm !== false) throw new Error('cloud-hypervisor driver: /dev/kvm is missing or not accessible; use NESTBOX_DRIVER=local on this host');
    const nestedParam = await readNestedParam();
    this.nestedVirt = kvm && nestedParam === true && this.options.nested !== false;
    const uffd = await userfaultfdUsable();
    const configured = this.options.memoryRestoreMode ?? 'auto';
    this.restoreMode = configured === 'auto' ? (uffd ? 'OnDemand' : 'Copy') : configured;
    this.probes = {
      chBinary: binary,
      chVersion: this.chVersion,
      kvm,
      nestedParam: nestedParam ?? 'no kvm_intel/kvm_amd module',
      userfaultfd: uffd,
      memoryRestoreMode: this.restoreMode,
      subnet: this.subnet,
    };
  }

  capabilities(): DriverCapabilities {
    return {
      memorySnapshot: true,
      fork: true,
      pause: true,
      nestedVirt: this.nestedVirt,
      hotResize: false,
      maxVcpus: cpus().length,
      probes: { ...this.probes, ...(this.diskStore?.probes ?? {}) },
    };
  }

  async close(): Promise<void> {
    if (this.watchTimer) clearInterval(this.watchTimer);
    this.watchTimer = undefined;
    // VMs keep running; only our host-side forwarders go (the next host agent recreates them).
    for (const vm of this.live.values()) await vm.forwarder.close().catch(() => {});
    this.live.clear();
  }

  // ---- create / start / stop --------------------------------------------------------------------

  async create(spec: SandboxSpec, onProgress?: (line: string) => void): Promise<SandboxRuntime> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const dir = this.sandboxDir(spec.id);
      const existing = this.records.get(spec.id) ?? (await readChRecord(dir));
      if (existing && existing.status !== 'creating') throw new DriverError('conflict', `sandbox ${spec.id} already exists`);
      if (existsSync(dir) || existsSync(this.newDiskDir(spec.id))) await this.destroyUnlocked(spec.id);
      const started = Date.now();
      const image = await this.requireImage();
      const record = this.newRecord(spec);
      try {
        await this.makeDirs(record);
        await writeChRecord(dir, record);
        this.records.set(spec.id, record);
        const source = spec.snapshot ? join((await this.requireSnapshot(spec.snapshot)).layerDir, 'rootfs.img') : image.rootfs;
        await this.copyDisk(source, this.diskPath(record));
        onProgress?.(`disk: ${this.requireDiskStore().mode} of ${source}`);
        await this.bootVm(record, image, onProgress);
      } catch (error) {
        await this.destroyUnlocked(spec.id).catch((cleanup) => this.log(`create ${spec.id}: cleanup failed: ${String(cleanup)}`));
        throw error;
      }
      this.log(`create ${spec.id}: running in ${Date.now() - started} ms (slot ${record.slot?.index})`);
      return this.runtimeOf(record);
    });
  }

  /** Memory-preserving stop: pause → snapshot → reflink the disk → shut the VMM down. */
  async stop(id: string): Promise<{ memorySaved: boolean }> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      if (record.status === 'stopped') return { memorySaved: !!record.memorySnapshot };
      const started = Date.now();
      const vm = this.live.get(id);
      let memorySaved = false;
      if (vm && isProcessAlive(record.pid, record.pidStartTime)) {
        record.operation = { kind: 'stop', startedAt: new Date().toISOString() };
        await writeChRecord(this.sandboxDir(id), record);
        try {
          record.memorySnapshot = await this.takeMemorySnapshot(record, vm, 'stop');
          memorySaved = true;
        } catch (error) {
          // The disk is still there; a cold start is all we can offer now.
          this.noteError(record, 'stop', error);
          this.log(`stop ${id}: memory snapshot failed, stopping cold: ${(error as Error).message}`);
          record.memorySnapshot = undefined;
        }
      }
      await this.teardownRuntime(record);
      await this.pruneGenerations(record);
      record.status = 'stopped';
      record.operation = undefined;
      await writeChRecord(this.sandboxDir(id), record);
      this.log(`stop ${id}: ${memorySaved ? 'memory saved' : 'cold'} in ${Date.now() - started} ms`);
      return { memorySaved };
    });
  }

  async start(spec: SandboxSpec): Promise<StartResult> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const record = this.requireRecord(spec.id);
      // Nothing was lost if it never stopped; a paused VM just continues.
      if (this.effectiveStatus(record) === 'paused') await this.setPaused(record, false);
      if (this.effectiveStatus(record) === 'running') return { ...this.runtimeOf(record), memoryRestored: true };
      if (record.status !== 'stopped') throw new DriverError('invalid_state', `sandbox ${spec.id} is ${record.status}`);
      const image = await this.requireImage();
      record.spec = spec;
      record.status = 'starting';
      await writeChRecord(this.sandboxDir(spec.id), record);
      let reason: string;
      const snapshot = record.memorySnapshot;
      if (snapshot && existsSync(join(snapshot.dir, 'snapshot.json'))) {
        try {
          const started = Date.now();
          await this.copyDisk(join(snapshot.dir, 'rootfs.img'), this.diskPath(record), { replace: true });
          await this.restoreVm(record, snapshot.dir);
          record.restoredFrom = snapshot.dir;
          record.memorySnapshot = undefined;
          record.status = 'running';
          await writeChRecord(this.sandboxDir(spec.id), record);
          this.log(`start ${spec.id}: memory restored (${this.restoreMode}) in ${Date.now() - started} ms`);
          return { ...this.runtimeOf(record), memoryRestored: true };
        } catch (error) {
          this.noteError(record, 'restore', error);
          await this.teardownRuntime(record).catch(() => {});
          reason = `restore_failed: ${lastChainElement(error)}`;
          this.log(`start ${spec.id}: restore failed, cold boot instead: ${(error as Error).message}`);
        }
      } else {
        reason = snapshot ? 'memory_snapshot_missing' : 'stopped_without_memory_snapshot';
      }
      try {
        await this.bootVm(record, image);
      } catch (error) {
        await this.teardownRuntime(record).catch(() => {});
        record.status = 'stopped';
        await writeChRecord(this.sandboxDir(spec.id), record);
        throw error;
      }
      // The guest booted fresh from the disk: an older memory image no longer matches it.
      if (record.memorySnapshot) {
        await removeTree(record.memorySnapshot.dir).catch(() => {});
        record.memorySnapshot = undefined;
        await writeChRecord(this.sandboxDir(spec.id), record);
      }
      return { ...this.runtimeOf(record), memoryRestored: false, resumeReason: reason };
    });
  }

  async destroy(id: string): Promise<void> {
    assertSandboxId(id);
    await this.withLock(id, () => this.destroyUnlocked(id));
  }

  async get(id: string): Promise<SandboxRuntime | undefined> {
    const record = this.records.get(id);
    return record ? this.runtimeOf(record) : undefined;
  }

  async list(): Promise<SandboxRuntime[]> {
    return [...this.records.values()].map((record) => this.runtimeOf(record));
  }

  /** The record (status, CH error chain of the last failure, …), for diagnostics and tests. */
  inspect(id: string): ChRecord | undefined {
    const record = this.records.get(id);
    return record ? structuredClone(record) : undefined;
  }

  /** A client that speaks to the guest agent directly over hybrid vsock, checking its proofs. */
  agentClient(id: string): AgentClient {
    const record = this.requireRecord(id);
    return this.vsockClient(record.id, this.agentKeys.get(record.id));
  }

  /** `proofKey` undefined: answers are not checked (only before the key handoff of a boot). */
  private vsockClient(id: string, proofKey: Buffer | undefined): AgentClient {
    const runDir = this.runDir(id);
    return new AgentClient(`${join(runDir, 'vsock.sock')}:${AGENT_VSOCK_PORT}`, { agent: new HybridVsockAgent(join(runDir, 'vsock.sock'), AGENT_VSOCK_PORT), proofKey });
  }

  /**
   * A fresh proof key for this boot, stored host-side first (adoption after a restart needs
   * it), then handed to the agent over vsock before anything else is asked of it. After a cold
   * boot the agent has no key and takes the first one; a restored (or forked) VM's agent still
   * holds the key of the boot its snapshot was taken of, `previousKey`, without which it refuses.
   * What this cannot do inside a VM: root in the guest can read the agent's memory, so the
   * scheme stops impersonation by anyone who cannot (see auth.ts); the VM boundary, not this
   * key, is what protects the host.
   */
  private async handOverAgentKey(record: ChRecord, previousKey: Buffer | undefined): Promise<void> {
    const key = newAgentKey();
    await writeAgentKeyFile(this.sandboxDir(record.id), key);
    this.agentKeys.set(record.id, key);
    const client = this.vsockClient(record.id, key);
    try {
      await client.installKey(previousKey);
    } catch (error) {
      throw new Error(`sandbox ${record.id}: could not hand the guest agent its key: ${(error as Error).message}`);
    } finally {
      client.close();
    }
  }

  // ---- pause ------------------------------------------------------------------------------------

  async pause(id: string): Promise<SandboxRuntime> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      await this.setPaused(record, true);
      return this.runtimeOf(record);
    });
  }

  async unpause(id: string): Promise<SandboxRuntime> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      await this.setPaused(record, false);
      return this.runtimeOf(record);
    });
  }

  private async setPaused(record: ChRecord, paused: boolean): Promise<void> {
    const current = this.effectiveStatus(record);
    if (current === (paused ? 'paused' : 'running')) {
      if (record.status === 'error') await this.settleStatus(record);
      return;
    }
    if (current !== (paused ? 'running' : 'paused')) throw new DriverError('invalid_state', `sandbox ${record.id} is ${current}`);
    const vm = this.requireLive(record);
    const started = Date.now();
    record.operation = { kind: paused ? 'pause' : 'unpause', startedAt: new Date().toISOString() };
    await writeChRecord(this.sandboxDir(record.id), record);
    try {
      if (paused) await transition(vm.api, 'vm.pause', () => vm.api.pauseVm(), 'Paused');
      else await transition(vm.api, 'vm.resume', () => vm.api.resumeVm(), 'Running');
      if (!paused && !this.agentKeys.has(record.id)) await this.handOverAgentKey(record, undefined);
    } catch (error) {
      record.operation = undefined;
      await this.failOperation(record, paused ? 'pause' : 'unpause', error);
      throw error;
    }
    record.status = paused ? 'paused' : 'running';
    record.operation = undefined;
    record.lastError = undefined;
    await writeChRecord(this.sandboxDir(record.id), record);
    this.log(`${paused ? 'pause' : 'unpause'} ${record.id}: ${Date.now() - started} ms`);
  }

  // ---- fork -------------------------------------------------------------------------------------

  async fork(sourceId: string, children: SandboxSpec[]): Promise<ForkResult> {
    this.assertInitialized();
    assertSandboxId(sourceId);
    if (!Array.isArray(children) || children.length === 0 || children.length > MAX_FORK_CHILDREN) {
      throw new DriverError('validation_failed', `fork needs 1 to ${MAX_FORK_CHILDREN} children`);
    }
    const ids = new Set<string>();
    for (const child of children) {
      this.validateSpec(child);
      if (child.snapshot !== undefined) throw new DriverError('validation_failed', `child ${child.id}: a fork takes its disk from the source, not from a snapshot`);
      if (child.id === sourceId || ids.has(child.id)) throw new DriverError('validation_failed', `child id ${child.id} is used twice`);
      ids.add(child.id);
    }
    return this.withLocks([sourceId, ...ids], async () => {
      const started = Date.now();
      const source = this.requireRecord(sourceId);
      const sourceStatus = this.effectiveStatus(source);
      for (const child of children) {
        if (this.records.has(child.id) || (await readChRecord(this.sandboxDir(child.id)))) throw new DriverError('conflict', `sandbox ${child.id} already exists`);
      }
      const image = await this.requireImage();
      // A snapshot of the source's memory + disk: taken now (running/paused), or the one its
      // stop left. Without one (a cold-stopped source), children boot cold from a disk copy.
      let snapshotDir: string | undefined;
      let temporary = false;
      if (sourceStatus === 'running' || sourceStatus === 'paused') {
        snapshotDir = (await this.takeMemorySnapshot(source, this.requireLive(source), 'fork', { resumeAfter: sourceStatus === 'running' })).dir;
        temporary = true;
      } else if (source.memorySnapshot && existsSync(join(source.memorySnapshot.dir, 'snapshot.json'))) {
        snapshotDir = source.memorySnapshot.dir;
      }
      const made: ChRecord[] = [];
      try {
        for (const spec of children) {
          if (existsSync(this.sandboxDir(spec.id)) || existsSync(this.newDiskDir(spec.id))) await this.destroyUnlocked(spec.id);
          const record = this.newRecord(spec);
          record.forkedFrom = sourceId;
          await this.makeDirs(record);
          await writeChRecord(this.sandboxDir(spec.id), record);
          this.records.set(spec.id, record);
          made.push(record);
          await this.copyDisk(snapshotDir ? join(snapshotDir, 'rootfs.img') : this.diskPath(source), this.diskPath(record));
        }
        const launches = await Promise.allSettled(
          made.map(async (record) => {
            if (!snapshotDir) return this.bootVm(record, image);
            const childSnapshot = await this.childSnapshotDir(record, snapshotDir);
            await this.restoreVm(record, childSnapshot);
            record.restoredFrom = childSnapshot;
            record.status = 'running';
            await writeChRecord(this.sandboxDir(record.id), record);
          }),
        );
        const failed = launches.find((outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected');
        if (failed) throw failed.reason;
      } catch (error) {
        for (const record of made) await this.destroyUnlocked(record.id).catch((cleanup) => this.log(`fork ${sourceId}: cleanup of ${record.id} failed: ${String(cleanup)}`));
        throw error;
      } finally {
        // Children hold hard links to state.json and memory-ranges, so the shared dir can go.
        if (temporary && snapshotDir) await removeTree(snapshotDir).catch(() => {});
      }
      this.log(`fork ${sourceId} → ${made.map((record) => record.id).join(', ')} in ${Date.now() - started} ms`);
      return { children: made.map((record) => this.runtimeOf(record)), memoryCopied: !!snapshotDir, diskCopy: this.requireDiskStore().mode };
    });
  }

  /** A per-child restore dir: patched config.json, hard links to the shared state and memory. */
  private async childSnapshotDir(record: ChRecord, shared: string): Promise<string> {
    const dir = join(record.diskDir, 'generations', `fork-${Date.now()}-${randomBytes(3).toString('hex')}`);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    for (const name of ['state.json', 'memory-ranges', 'snapshot.json']) {
      await link(join(shared, name), join(dir, name)).catch(async () => this.requireDiskStore().copyTree(join(shared, name), join(dir, name)));
    }
    const sourceKey = await readAgentKeyFile(shared);
    if (sourceKey) await writeAgentKeyFile(dir, sourceKey);
    const original = JSON.parse(await readFile(join(shared, 'config.json'), 'utf8')) as VmConfig;
    await writeFile(join(dir, 'config.json'), JSON.stringify(patchSnapshotConfig(original, this.patchFor(record))), { mode: 0o600 });
    return dir;
  }

  // ---- named snapshots (disk only) --------------------------------------------------------------

  async snapshot(id: string, snapshotId: string): Promise<SnapshotResult> {
    this.assertInitialized();
    assertSandboxId(id);
    assertSnapshotId(snapshotId);
    return this.withLock(id, async () => {
      const record = this.requireRecord(id);
      const store = this.requireSnapshots();
      const existing = await store.get(snapshotId);
      if (existing?.sourceId === id) return snapshotResult(existing);
      if (existing) throw new DriverError('conflict', `snapshot ${snapshotId} already exists`);
      const status = this.effectiveStatus(record);
      const meta = await store.create(
        { snapshotId, sourceId: id, image: record.spec.image, parents: [], diskCopy: this.requireDiskStore().mode },
        async (layerDir) => {
          await mkdir(layerDir, { mode: 0o700 });
          // A running VM is paused for the copy so the disk is one point in time.
          if (status !== 'running') return this.copyDisk(this.diskPath(record), join(layerDir, 'rootfs.img'));
          const vm = this.requireLive(record);
          await transition(vm.api, 'vm.pause', () => vm.api.pauseVm(), 'Paused');
          try {
            await this.copyDisk(this.diskPath(record), join(layerDir, 'rootfs.img'));
          } finally {
            await transition(vm.api, 'vm.resume', () => vm.api.resumeVm(), 'Running').catch((error) => this.failOperation(record, 'snapshot', error));
          }
        },
      );
      return snapshotResult(meta);
    });
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    this.assertInitialized();
    assertSnapshotId(snapshotId);
    // Sandboxes got a copy of the disk at create, so nothing references a named snapshot.
    await this.requireSnapshots().remove(snapshotId);
  }

  async listSnapshots(): Promise<SnapshotInfo[]> {
    this.assertInitialized();
    return (await this.requireSnapshots().list()).map((meta) => ({ ...snapshotResult(meta), sourceId: meta.sourceId, image: meta.image, createdAt: meta.createdAt }));
  }

  async fileView(id: string): Promise<FileView> {
    assertSandboxId(id);
    this.requireRecord(id);
    throw new DriverError('invalid_state', 'file views of stopped VMs are not implemented by the cloud-hypervisor driver yet; start the sandbox to read its files');
  }

  touchFileView(): void {}

  // ---- the VM itself ------------------------------------------------------------------------------

  /** Slot + TAP, VMM, vm.create → Created, vm.boot → Running, guest agent answers. */
  private async bootVm(record: ChRecord, image: VmImage, onProgress?: (line: string) => void): Promise<void> {
    const vm = await this.launchRuntime(record, onProgress);
    const config = buildVmConfig(
      { cpu: record.spec.cpu, memoryMiB: record.spec.memoryMiB, nested: this.nestedVirt },
      { kernel: image.kernel, initramfs: image.initramfs, rootfsDisk: this.diskPath(record), vsockSocket: this.vsockPath(record.id), serialLog: this.serialPath(record.id) },
    );
    await transition(vm.api, 'vm.create', () => vm.api.createVm(config), 'Created');
    await transition(vm.api, 'vm.boot', () => vm.api.bootVm(), 'Running');
    onProgress?.('vm booted; waiting for the guest agent');
    await this.waitForAgent(record);
    await this.handOverAgentKey(record, undefined);
    await this.postBootFixups(record);
    record.status = 'running';
    record.lastError = undefined;
    await writeChRecord(this.sandboxDir(record.id), record);
  }

  /** New VMM, vm.restore → Paused, vm.resume → Running, guest agent answers, clock + entropy resync. */
  private async restoreVm(record: ChRecord, snapshotDir: string): Promise<void> {
    // The snapshot names the paths of the VM it was taken of; this VM's are what count.
    const configPath = join(snapshotDir, 'config.json');
    const original = JSON.parse(await readFile(configPath, 'utf8')) as VmConfig;
    await writeFile(configPath, JSON.stringify(patchSnapshotConfig(original, this.patchFor(record))), { mode: 0o600 });
    await rm(this.vsockPath(record.id), { force: true });
    const vm = await this.launchRuntime(record);
    const restore: RestoreConfig = { source_url: `file://${snapshotDir}`, memory_restore_mode: this.restoreMode, resume: false };
    await transition(vm.api, 'vm.restore', () => vm.api.restoreVm(restore, SNAPSHOT_TIMEOUT_MS), 'Paused');
    await transition(vm.api, 'vm.resume', () => vm.api.resumeVm(), 'Running');
    await this.waitForAgent(record);
    await this.handOverAgentKey(record, await readAgentKeyFile(snapshotDir));
    await this.postBootFixups(record);
  }

  /** Slot, TAP, VMM process, forwarder: everything before the first VM call. */
  private async launchRuntime(record: ChRecord, onProgress?: (line: string) => void): Promise<LiveVm> {
    const dir = this.sandboxDir(record.id);
    const slot = await this.slots.claim(this.options.ownerId, record.id);
    record.slot = { ...slot };
    await writeChRecord(dir, record);
    await buildSlot(slot);
    await addVmNetworking(slot);
    onProgress?.(`network slot ${slot.index}: ${slot.sandboxAddress} via ${slot.hostAddress}, tap0 in ${slot.netns}`);
    const paths = this.vmmPaths(record.id);
    await writeFile(paths.stdioLog, `--- nestbox: starting cloud-hypervisor for ${record.id} at ${new Date().toISOString()} ---\n`, { flag: 'a', mode: 0o600 });
    const vmm = await launchVmm({
      binary: this.options.chBinary,
      paths,
      netns: `/run/netns/${slot.netns}`,
      readyTimeoutMs: this.options.vmmReadyTimeoutMs ?? 10_000,
      // Never the host agent's own environment: it holds the host secret.
      env: this.options.vmmEnv ?? { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' },
    });
    record.pid = vmm.pid;
    record.pidStartTime = vmm.startTime;
    record.chVersion = vmm.version;
    await writeChRecord(dir, record);
    return this.attach(record);
  }

  /** In-memory handles of a running VMM (after launch or adoption). */
  private async attach(record: ChRecord): Promise<LiveVm> {
    const old = this.live.get(record.id);
    if (old) await old.forwarder.close();
    const forwarder = new VsockForwarder(join(this.runDir(record.id), 'agent.sock'), this.vsockPath(record.id), AGENT_VSOCK_PORT);
    await forwarder.start();
    const vm: LiveVm = { api: new ChApi(join(this.runDir(record.id), 'api.sock')), forwarder, events: new EventFileReader(join(this.runDir(record.id), 'events.json')) };
    this.live.set(record.id, vm);
    return vm;
  }

  /** Liveness only (the agent may not have this boot's key yet): the key handoff comes next. */
  private async waitForAgent(record: ChRecord): Promise<void> {
    const client = this.vsockClient(record.id, undefined);
    try {
      await client.waitReady({ timeoutMs: this.options.readyTimeoutMs ?? 30_000, intervalMs: 50 });
    } catch (error) {
      const serial = await readTail(this.serialPath(record.id), 2_000);
      throw new Error(`sandbox ${record.id}: guest agent did not answer over vsock: ${(error as Error).message}\n--- serial console (tail) ---\n${serial}`);
    } finally {
      client.close();
    }
  }

  /**
   * After a boot or restore: wall clock (a restored guest's clock stands still while stopped),
   * fresh entropy (clones must not share RNG state), hostname. `nestbox-resync` is part of the
   * VM image; a failure is logged, not fatal (the sandbox works, just with a stale clock).
   */
  private async postBootFixups(record: ChRecord): Promise<void> {
    const client = this.agentClient(record.id);
    // The VM's agent is started by the image, not with the sandbox's environment: hand it over.
    // Unlike the resync, a failure here fails the boot (processes would silently lack the env).
    if (Object.keys(record.spec.env).length > 0) {
      try {
        const res = await client.request({ method: 'PUT', path: '/env', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ env: record.spec.env }) });
        res.resume();
        if (res.statusCode !== 204) throw new Error(`guest agent answered ${res.statusCode} to PUT /env`);
      } catch (error) {
        client.close();
        throw new Error(`sandbox ${record.id}: could not set its environment: ${(error as Error).message}`);
      }
    }
    try {
      const result = await client.exec({
        argv: ['nestbox-resync', '--time-ms', String(Date.now()), '--entropy', randomBytes(64).toString('hex'), '--hostname', record.id],
        timeoutMs: 10_000,
      });
      if (result.exitCode !== 0) this.log(`sandbox ${record.id}: nestbox-resync exited ${result.exitCode}: ${result.stderr.trim()}`);
    } catch (error) {
      this.log(`sandbox ${record.id}: resync failed: ${(error as Error).message}`);
    } finally {
      client.close();
    }
  }

  /**
   * Pause (if running) → snapshot → reflink the disk while still paused. For `stop` the VMM is
   * shut down by the caller; for `fork` the source resumes when it was running.
   */
  private async takeMemorySnapshot(record: ChRecord, vm: LiveVm, purpose: 'stop' | 'fork', options: { resumeAfter?: boolean } = {}) {
    const wasRunning = this.effectiveStatus(record) === 'running';
    const started = Date.now();
    // Flush the guest's page cache first so the disk copy is as complete as the memory image.
    if (wasRunning) {
      const client = this.agentClient(record.id);
      await client.exec({ argv: ['sync'], timeoutMs: 10_000 }).catch(() => {});
      client.close();
      await transition(vm.api, 'vm.pause', () => vm.api.pauseVm(), 'Paused');
      record.status = 'paused';
    }
    const dir = join(record.diskDir, 'generations', `${purpose}-${Date.now()}-${randomBytes(3).toString('hex')}`);
    try {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      await transition(vm.api, 'vm.snapshot', () => vm.api.snapshotVm(dir, SNAPSHOT_TIMEOUT_MS), 'Paused');
      // The memory image holds the agent with this boot's key: a restore must prove it to rekey.
      const key = this.agentKeys.get(record.id);
      if (key) await writeAgentKeyFile(dir, key);
      await this.copyDisk(this.diskPath(record), join(dir, 'rootfs.img'));
      const meta = { chVersion: record.chVersion ?? this.chVersion, cpuModel: await cpuModel(), image: record.spec.image, memoryMiB: record.spec.memoryMiB, takenAt: new Date().toISOString(), sourceId: record.id };
      // Written last: its presence marks the generation complete.
      await writeFile(join(dir, 'snapshot.json'), `${JSON.stringify(meta, null, 2)}\n`, { mode: 0o600 });
    } catch (error) {
      await removeTree(dir).catch(() => {});
      if (wasRunning && purpose === 'fork') await transition(vm.api, 'vm.resume', () => vm.api.resumeVm(), 'Running').then(() => (record.status = 'running')).catch(() => {});
      throw error;
    } finally {
      if (options.resumeAfter && existsSync(join(dir, 'snapshot.json'))) {
        await transition(vm.api, 'vm.resume', () => vm.api.resumeVm(), 'Running');
        record.status = 'running';
      }
    }
    this.log(`${purpose} ${record.id}: snapshot in ${Date.now() - started} ms`);
    return { dir, takenAt: new Date().toISOString(), chVersion: record.chVersion ?? this.chVersion };
  }

  // ---- errors and state ---------------------------------------------------------------------------

  private noteError(record: ChRecord, operation: string, error: unknown): ChLastError {
    const lastError: ChLastError = {
      operation,
      message: (error as Error)?.message ?? String(error),
      chain: error instanceof VmOperationError || error instanceof ChApiError ? error.chain : [],
      status: error instanceof VmOperationError || error instanceof ChApiError ? error.status : undefined,
      observedState: error instanceof VmOperationError ? error.observedState : undefined,
      at: new Date().toISOString(),
    };
    record.lastError = lastError;
    return lastError;
  }

  /** A transition failed: keep CH's chain; a VMM that is gone means the sandbox stopped. */
  private async failOperation(record: ChRecord, operation: string, error: unknown): Promise<void> {
    const lastError = this.noteError(record, operation, error);
    if (lastError.observedState === 'unreachable' || !isProcessAlive(record.pid, record.pidStartTime)) {
      this.log(`sandbox ${record.id}: cloud-hypervisor is gone during ${operation}; tearing down`);
      await this.teardownRuntime(record).catch(() => {});
      record.status = 'stopped';
    } else {
      record.status = 'error';
    }
    await writeChRecord(this.sandboxDir(record.id), record);
  }

  /** Running/paused/stopped as far as we know (an `error` record reports what vm.info last said). */
  private effectiveStatus(record: ChRecord): 'running' | 'paused' | 'stopped' | 'busy' {
    if (record.status === 'running' || record.status === 'paused' || record.status === 'stopped') return record.status;
    if (record.status === 'error') return runtimeStatusFor(record.lastError?.observedState);
    return 'busy';
  }

  /** Re-reads vm.info for an `error` record and adopts that state when it is a normal one. */
  private async settleStatus(record: ChRecord): Promise<void> {
    const vm = this.live.get(record.id);
    if (!vm) return;
    const state = await observeState(vm.api);
    if (state === 'Running' || state === 'Paused') {
      record.status = runtimeStatusFor(state);
      await writeChRecord(this.sandboxDir(record.id), record);
    }
  }

  // ---- teardown, destroy ----------------------------------------------------------------------------

  /** VMM, forwarder, slot; the disk and generations stay. */
  private async teardownRuntime(record: ChRecord): Promise<void> {
    const vm = this.live.get(record.id);
    this.live.delete(record.id);
    await vm?.forwarder.close().catch(() => {});
    const pidFile = await readPidFile(this.vmmPaths(record.id).pidFile);
    const pid = record.pid ?? pidFile?.pid;
    const startTime = record.pidStartTime ?? pidFile?.startTime;
    if (pid && startTime && isProcessAlive(pid, startTime)) {
      const api = vm?.api ?? new ChApi(join(this.runDir(record.id), 'api.sock'));
      await stopVmm(api, pid, startTime, { graceMs: 3_000 }).catch(async () => killProcess(pid, startTime, 1_000));
    }
    for (const slot of await this.slotsOf(record)) {
      await teardownSlot(slot);
      await this.slots.release(slot.index);
    }
    record.slot = undefined;
    record.pid = undefined;
    record.pidStartTime = undefined;
    // OnDemand restores read memory-ranges until the VMM exits; now that it has, it can go.
    if (record.restoredFrom) {
      await removeTree(record.restoredFrom).catch(() => {});
      record.restoredFrom = undefined;
    }
    const run = this.runDir(record.id);
    for (const name of ['api.sock', 'vsock.sock', 'agent.sock', 'vmm.pid']) await rm(join(run, name), { force: true });
    this.agentKeys.delete(record.id);
    await removeAgentKeyFile(this.sandboxDir(record.id));
    await removeTree(join(run, 'sim')).catch(() => {});
  }

  private async destroyUnlocked(id: string): Promise<void> {
    const dir = this.sandboxDir(id);
    const record = this.records.get(id) ?? (await readChRecord(dir));
    const stub: ChRecord = record ?? this.newRecord({ id, image: 'default', cpu: 1, memoryMiB: 64, env: {} });
    await this.teardownRuntime(stub);
    for (const diskDir of new Set([record?.diskDir, this.newDiskDir(id)])) if (diskDir && diskDir !== dir) await removeTree(diskDir);
    await removeTree(dir);
    if (existsSync(dir)) throw new Error(`could not remove ${dir}`);
    this.records.delete(id);
  }

  private async slotsOf(record: ChRecord): Promise<Slot[]> {
    const indices = new Set<number>();
    const claims = await this.slots.claims();
    for (const claim of claims) if (claim.owner === this.options.ownerId && claim.sandboxId === record.id) indices.add(claim.index);
    if (record.slot) {
      const claim = claims.find((entry) => entry.index === record.slot?.index);
      if (!claim || (claim.owner === this.options.ownerId && claim.sandboxId === record.id)) indices.add(record.slot.index);
    }
    return [...indices].map((index) => slotFor(this.subnet, index));
  }

  /** Keeps only the newest complete memory snapshot (the one the record points at). */
  private async pruneGenerations(record: ChRecord): Promise<void> {
    const generations = join(record.diskDir, 'generations');
    for (const entry of await readdir(generations).catch(() => [] as string[])) {
      const path = join(generations, entry);
      if (path !== record.memorySnapshot?.dir && path !== record.restoredFrom) await removeTree(path);
    }
  }

  // ---- adoption and watching -------------------------------------------------------------------------

  private async adoptAll(): Promise<void> {
    for (const entry of await readdir(this.sandboxesDir, { withFileTypes: true })) {
      if (!entry.isDirectory() || !SANDBOX_ID.test(entry.name)) continue;
      const record = await readChRecord(this.sandboxDir(entry.name));
      if (record && record.owner !== this.options.ownerId) continue;
      await this.withLock(entry.name, () => this.adoptOne(entry.name, record)).catch((error) => this.log(`init: ${entry.name}: ${String(error)}`));
    }
  }

  private async adoptOne(id: string, record: ChRecord | undefined): Promise<void> {
    if (!record || record.status === 'creating') {
      this.log(`init: removing half-created VM ${id}`);
      await this.destroyUnlocked(id);
      return;
    }
    this.records.set(id, record);
    const vmm = await adoptVmm(this.vmmPaths(id).pidFile);
    if (vmm && vmm.pid === record.pid) {
      const state = await observeState(vmm.api);
      if (state === 'Running' || state === 'Paused') {
        await this.attach(record);
        const key = await readAgentKeyFile(this.sandboxDir(id));
        if (key) this.agentKeys.set(id, key);
        // Without its key (lost, or a VM booted before keys existed), a running VM's agent gets
        // a new one now; a paused one at its unpause.
        else if (state === 'Running') await this.handOverAgentKey(record, undefined).catch((error) => this.log(`init: ${String(error)}`));
        // An interrupted stop whose snapshot completed can simply be finished.
        if (record.operation?.kind === 'stop' && record.memorySnapshot) {
          await this.teardownRuntime(record);
          record.status = 'stopped';
        } else {
          record.status = runtimeStatusFor(state);
        }
        record.operation = undefined;
        await writeChRecord(this.sandboxDir(id), record);
        this.log(`init: adopted ${record.status} VM ${id} (pid ${vmm.pid}, ${vmm.version})`);
        return;
      }
    }
    if (record.status !== 'stopped') this.log(`init: VM ${id} is no longer running; marking it stopped`);
    await this.teardownRuntime(record);
    // A stop that died before snapshot.json was written has no usable memory snapshot.
    if (record.memorySnapshot && !existsSync(join(record.memorySnapshot.dir, 'snapshot.json'))) record.memorySnapshot = undefined;
    record.status = 'stopped';
    record.operation = undefined;
    await writeChRecord(this.sandboxDir(id), record);
  }

  private async reclaimOrphanSlots(): Promise<void> {
    const live = new Set([...this.records.values()].filter((record) => record.slot).map((record) => record.id));
    for (const claim of await this.slots.claims()) {
      if (claim.owner !== this.options.ownerId || live.has(claim.sandboxId)) continue;
      this.log(`init: releasing orphaned network slot ${claim.index} (sandbox ${claim.sandboxId})`);
      await teardownSlot(slotFor(this.subnet, claim.index));
      await this.slots.release(claim.index);
    }
  }

  /** A VMM that exited on its own (crash, guest poweroff, OOM kill) leaves a stopped sandbox. */
  private async watchAll(): Promise<void> {
    for (const record of this.records.values()) {
      if (!record.pid || this.locks.busy(record.id)) continue;
      const vm = this.live.get(record.id);
      const events = (await vm?.events.readNew().catch(() => [])) ?? [];
      for (const event of events) if (event.event === 'panic' || event.source === 'guest') this.log(`sandbox ${record.id}: guest event ${event.source}/${event.event}`);
      if (isProcessAlive(record.pid, record.pidStartTime)) continue;
      await this.withLock(record.id, () => this.handleVmmExit(record)).catch((error) => this.log(`watch ${record.id}: ${String(error)}`));
    }
  }

  /** Checks now whether the VMM is still there (the watcher does this periodically). */
  async checkAlive(id: string): Promise<boolean> {
    const record = this.requireRecord(id);
    if (!record.pid || isProcessAlive(record.pid, record.pidStartTime)) return !!record.pid;
    await this.withLock(id, () => this.handleVmmExit(record));
    return false;
  }

  private async handleVmmExit(record: ChRecord): Promise<void> {
    if (!record.pid || isProcessAlive(record.pid, record.pidStartTime)) return;
    const tail = await readTail(this.vmmPaths(record.id).stdioLog, 1_000);
    this.log(`sandbox ${record.id}: cloud-hypervisor ${record.pid} exited on its own; releasing its runtime`);
    record.lastError = { operation: 'watch', message: 'cloud-hypervisor exited unexpectedly', chain: ['cloud-hypervisor exited unexpectedly', tail.trim()], observedState: 'unreachable', at: new Date().toISOString() };
    await this.teardownRuntime(record);
    record.status = 'stopped';
    await writeChRecord(this.sandboxDir(record.id), record);
  }

  // ---- helpers ----------------------------------------------------------------------------------------

  private runtimeOf(record: ChRecord): SandboxRuntime {
    const status = this.effectiveStatus(record);
    if (status !== 'running' && status !== 'paused') return { id: record.id, status: 'stopped' };
    return {
      id: record.id,
      status,
      pid: record.pid,
      agentSocket: join(this.runDir(record.id), 'agent.sock'),
      agentProofKey: this.agentKeys.get(record.id),
      network: record.slot ? { hostAddress: record.slot.hostAddress, sandboxAddress: record.slot.sandboxAddress, netns: record.slot.netns } : undefined,
    };
  }

  private newRecord(spec: SandboxSpec): ChRecord {
    const now = new Date().toISOString();
    return { version: CH_RECORD_VERSION, driver: 'cloud-hypervisor', id: spec.id, owner: this.options.ownerId, spec, status: 'creating', diskDir: this.newDiskDir(spec.id), createdAt: now, updatedAt: now };
  }

  private async makeDirs(record: ChRecord): Promise<void> {
    await mkdir(this.runDir(record.id), { recursive: true, mode: 0o700 });
    await mkdir(join(record.diskDir, 'generations'), { recursive: true, mode: 0o700 });
  }

  private async copyDisk(source: string, target: string, options: { replace?: boolean } = {}): Promise<void> {
    if (!existsSync(source)) throw new Error(`disk image ${source} is missing`);
    if (options.replace) await rm(target, { force: true });
    await this.requireDiskStore().copyTree(source, target);
  }

  private patchFor(record: ChRecord) {
    return { rootfsDisk: this.diskPath(record), vsockSocket: this.vsockPath(record.id), serialLog: this.serialPath(record.id) };
  }

  private async requireImage(): Promise<VmImage> {
    const name = this.options.vmImage ?? VM_IMAGE_NAME;
    const image = await readCompleteVmImage(join(this.options.imagesDir, name));
    if (!image) throw new Error(`VM image "${name}" is not built under ${this.options.imagesDir}; run \`nestbox image build --vm\``);
    return image;
  }

  private validateSpec(spec: SandboxSpec): void {
    assertSandboxId(spec.id);
    const invalid = (message: string) => new DriverError('validation_failed', message);
    if (spec.image !== 'default') throw invalid(`unknown image "${spec.image}" (the cloud-hypervisor driver has only "default")`);
    if (!(spec.cpu > 0) || spec.cpu > 256) throw invalid(`cpu must be between 0 and 256 vCPUs, got ${spec.cpu}`);
    if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < 128) throw invalid(`memoryMiB must be an integer of at least 128, got ${spec.memoryMiB}`);
    if (spec.snapshot !== undefined) assertSnapshotId(spec.snapshot);
    // Egress rules live with the local driver's slot code; until they cover VMs, refuse rather than ignore.
    if (spec.egress && spec.egress.mode !== 'allow-all') throw invalid(`egress mode "${spec.egress.mode}" is not supported by the cloud-hypervisor driver yet`);
    // The guest → host vsock socket is `<vsock.socket>_<port>`: the longest path we create.
    const longest = `${this.vsockPath(spec.id)}_4294967295`;
    if (Buffer.byteLength(longest) > SUN_PATH_MAX) throw new Error(`socket path ${longest} exceeds the Unix socket limit; use a shorter data dir than ${this.dataDir}`);
  }

  private withLocks<T>(keys: string[], task: () => Promise<T>): Promise<T> {
    return this.locks.runAll(keys, task);
  }

  private withLock<T>(key: string, task: () => Promise<T>): Promise<T> {
    return this.locks.run(key, task);
  }

  private assertInitialized(): void {
    if (!this.initialized) throw new Error('ChDriver.init() must run first');
  }
  private requireDiskStore(): DiskStore {
    if (!this.diskStore) throw new Error('ChDriver.init() must run first');
    return this.diskStore;
  }
  private requireSnapshots(): SnapshotStore {
    if (!this.snapshotStore) throw new Error('ChDriver.init() must run first');
    return this.snapshotStore;
  }
  private async requireSnapshot(snapshotId: string): Promise<SnapshotMeta & { layerDir: string }> {
    const meta = await this.requireSnapshots().get(snapshotId);
    if (!meta) throw new DriverError('not_found', `snapshot ${snapshotId} not found on this host`);
    return { ...meta, layerDir: this.requireSnapshots().layerDir(snapshotId) };
  }
  private requireRecord(id: string): ChRecord {
    const record = this.records.get(id);
    if (!record) throw new DriverError('not_found', `sandbox ${id} not found`);
    return record;
  }
  private requireLive(record: ChRecord): LiveVm {
    const vm = this.live.get(record.id);
    if (!vm) throw new DriverError('invalid_state', `sandbox ${record.id} has no running VMM`);
    return vm;
  }
  private sandboxDir(id: string): string {
    return join(this.sandboxesDir, id);
  }
  private runDir(id: string): string {
    return join(this.sandboxDir(id), 'run');
  }
  private newDiskDir(id: string): string {
    const store = this.requireDiskStore();
    return store.root === this.dataDir ? join(this.sandboxDir(id), 'disk') : join(store.root, 'vm-disks', id);
  }
  private diskPath(record: ChRecord): string {
    return join(record.diskDir, 'rootfs.img');
  }
  private vsockPath(id: string): string {
    return join(this.runDir(id), 'vsock.sock');
  }
  private serialPath(id: string): string {
    return join(this.sandboxDir(id), 'serial.log');
  }
  private vmmPaths(id: string): VmmPaths {
    const run = this.runDir(id);
    return {
      apiSocket: join(run, 'api.sock'),
      eventMonitor: join(run, 'events.json'),
      logFile: join(this.sandboxDir(id), 'ch.log'),
      stdioLog: join(this.sandboxDir(id), 'vmm.out'),
      pidFile: join(run, 'vmm.pid'),
    };
  }
}

// ---- free functions -------------------------------------------------------------------------------

function assertSandboxId(id: string): void {
  if (typeof id !== 'string' || !SANDBOX_ID.test(id)) throw new DriverError('validation_failed', `invalid sandbox id "${id}": lowercase letters and digits only, at most 32`);
}

function snapshotResult(meta: SnapshotMeta): SnapshotResult {
  return { snapshotId: meta.snapshotId, sizeBytes: meta.sizeBytes, diskCopy: meta.diskCopy, layers: [meta.snapshotId] };
}

function lastChainElement(error: unknown): string {
  if (error instanceof VmOperationError || error instanceof ChApiError) return error.chain[error.chain.length - 1] ?? error.message;
  return (error as Error)?.message?.split('\n')[0] ?? String(error);
}

/** `Y`/`1` in the loaded KVM vendor module's `nested` parameter; undefined without one. */
export async function readNestedParam(): Promise<boolean | undefined> {
  for (const module of ['kvm_intel', 'kvm_amd']) {
    const value = await readFile(`/sys/module/${module}/parameters/nested`, 'utf8').catch(() => undefined);
    if (value !== undefined) return /^(Y|1)/.test(value.trim());
  }
  return undefined;
}

/** Whether a VMM running as us can use userfaultfd (OnDemand restore). */
export async function userfaultfdUsable(): Promise<boolean> {
  if (await access('/dev/userfaultfd', fsConstants.R_OK | fsConstants.W_OK).then(() => true, () => false)) return true;
  const unprivileged = (await readFile('/proc/sys/vm/unprivileged_userfaultfd', 'utf8').catch(() => '0')).trim();
  return unprivileged === '1' || process.getuid?.() === 0;
}

async function cpuModel(): Promise<string> {
  return cpus()[0]?.model ?? 'unknown';
}

function runText(file: string, args: string[]): Promise<string> {
  return new Promise((resolveRun, reject) => {
    execFile(file, args, { timeout: 10_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(stderr.trim() || error.message));
      else resolveRun(stdout);
    });
  });
}

