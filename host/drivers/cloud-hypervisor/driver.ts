// The Cloud Hypervisor driver: every sandbox is a microVM (host-runtime.md, "Recommended
// design"). One VMM process per sandbox, in the slot's network namespace; the guest agent is
// reached over hybrid vsock, and re-exposed on a host Unix socket (`agentSocket`) so the host
// agent talks to VMs exactly as to local sandboxes. Stop keeps memory (pause → snapshot →
// reflink disk → shutdown), start restores it, fork restores N children from one snapshot.
// Every on-disk step is recorded first, so init() after a kill -9 adopts or cleans up.
//
// This file is the Driver surface (setup, lifecycle, pause, fork, snapshots); it builds on
// recovery.ts (adoption, watching), vm.ts (boot, restore, memory snapshots, teardown) and
// sandboxes.ts (state, paths, checks, error recording), over ../base/driver-base.ts.
import { randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { constants as fsConstants, existsSync } from 'node:fs';
import { access, link, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { readAgentKeyFile, writeAgentKeyFile } from '../../agent-protocol/key-file.js';
import { sandboxDnsServers } from '../../network/dns.js';
import { applyNftRuleset, renderNftRuleset } from '../../network/nft.js';
import { assertMachineNetnsMounts, enableIpForwarding, slotTrafficBytes, VETH_PREFIX } from '../../network/slots.js';
import { DiskStore } from '../../storage/disk-store.js';
import { assertSnapshotId, SnapshotStore } from '../../storage/snapshots.js';
import { removeTree } from '../../util/fs.js';
import { isProcessAlive, processCpuNs } from '../../util/process.js';
import { assertSandboxId } from '../base/driver-base.js';
import { DriverError } from '../errors.js';
import type { Driver, DriverCapabilities, FileView, ForkResult, ResizeResult, ResizeSpec, SandboxRuntime, SandboxSpec, SandboxUsageCounters, SnapshotResult, StartResult } from '../types.js';
import { ChApiError, type VmConfig } from './api.js';
import { patchSnapshotConfig, VIRTIO_MEM_BLOCK_MIB } from './config.js';
import { transition } from './lifecycle.js';
import { writeChRecord, type ChRecord } from './records.js';
import { ChRecovery } from './recovery.js';
import { findVirtiofsd } from './virtiofs.js';
import { isOciImage, lastChainElement, resizeExt4 } from './sandboxes.js';
import { OCI_VM_BUSYBOX, removeOciVmDisk } from '../../images/vm-image-oci.js';
import { CODE_INTERPRETER_IMAGE } from '../../images/code-interpreter-image.js';

export type { ChDriverOptions } from './sandboxes.js';

export class ChDriver extends ChRecovery implements Driver {
  readonly name = 'cloud-hypervisor' as const;

  // ---- setup ----------------------------------------------------------------------------------

  async init(): Promise<void> {
    // First: under `ip netns exec` the probe would fail on a missing cgroup tree, not say why.
    assertMachineNetnsMounts();
    await this.probe();
    await enableIpForwarding();
    if (this.options.manageHostFirewall !== false) {
      await applyNftRuleset(renderNftRuleset({ subnet: this.subnet, vethPrefix: VETH_PREFIX, dnsServers: await sandboxDnsServers(this.options.dnsServers) }));
    }
    await mkdir(this.sandboxesDir, { recursive: true, mode: 0o700 });
    this.diskStore = await DiskStore.open({ dataDir: this.dataDir, reflinkStore: this.options.reflinkStore, logger: this.log });
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
  protected async probe(): Promise<void> {
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
      // Volumes need one (virtiofs.ts); without it a create with volumes is refused (501).
      virtiofsd: (await findVirtiofsd(this.options.virtiofsdBinary)) ?? 'missing',
      resizeMaxVcpus: this.resizeCeiling().maxVcpus,
      resizeMaxMemoryMiB: this.resizeCeiling().maxMemoryMiB,
    };
  }

  capabilities(): DriverCapabilities {
    return {
      memorySnapshot: true,
      fork: true,
      pause: true,
      nestedVirt: this.nestedVirt,
      hotResize: true,
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
    return this.createUnder(spec, async () => {
      const dir = this.sandboxDir(spec.id);
      const image = await this.requireImage();
      const record = this.newRecord(spec);
      // The disk's source, resolved before anything is written: a missing image or snapshot
      // fails the create with nothing to clean up. A snapshot's disk keeps its image's boot.
      let source: string;
      let minimumBytes = 0;
      if (spec.snapshot) {
        source = await this.snapshotDisk(spec.snapshot);
        record.diskImage = (await this.requireSnapshot(spec.snapshot)).image;
      } else if (isOciImage(spec.image)) {
        const disk = await this.ociImageDisk(spec.image, image, onProgress);
        source = disk.rootfs;
        minimumBytes = disk.manifest.sizeMiB * 2 ** 20;
      } else if (spec.image === CODE_INTERPRETER_IMAGE) {
        source = (await this.requireCodeInterpreterImage(image)).rootfs;
      } else {
        source = image.rootfs;
      }
      const build = async () => {
        await this.makeDirs(record);
        await writeChRecord(dir, record);
        this.records.set(spec.id, record);
        await this.copyDisk(source, this.diskPath(record));
        await this.growDisk(record, minimumBytes);
        onProgress?.(`disk: ${this.requireDiskStore().mode} of ${source}`);
        await this.bootVm(record, image, onProgress);
      };
      return { record, build };
    });
  }

  /** Memory-preserving stop: pause → snapshot → reflink the disk → shut the VMM down. */
  async stop(id: string): Promise<{ memorySaved: boolean }> {
    return this.withRecord(id, async (record) => {
      if (record.status === 'stopped') return { memorySaved: !!record.memorySnapshot };
      const started = Date.now();
      const vm = this.live.get(id);
      let memorySaved = false;
      // A VM with volumes stops cold: its virtiofsds hold the FUSE state of the guest's open
      // files (inode handles) outside the VM's snapshot, and a restored guest would talk to
      // fresh ones that know none of it. Its disk and its volumes keep everything written.
      if (vm && isProcessAlive(record.pid, record.pidStartTime) && record.spec.volumes?.length) {
        const client = this.agentClient(id);
        await client.exec({ argv: this.guestHelper(record, 'sync'), timeoutMs: 10_000 }).catch(() => {});
        client.close();
      } else if (vm && isProcessAlive(record.pid, record.pidStartTime)) {
        record.operation = { kind: 'stop', startedAt: new Date().toISOString() };
        await writeChRecord(this.sandboxDir(id), record);
        try {
          record.memorySnapshot = await this.takeMemorySnapshot(record, vm, 'stop');
          memorySaved = true;
        } catch (error) {
          // The disk is still there; a cold start is all we can offer now.
          this.noteError(record, 'stop', error);
          this.log.warn({ sandboxId: id, operation: 'stop' }, `stop: memory snapshot failed, stopping cold: ${(error as Error).message}`);
          record.memorySnapshot = undefined;
        }
      }
      await this.teardownRuntime(record);
      await this.pruneGenerations(record);
      record.status = 'stopped';
      record.operation = undefined;
      await writeChRecord(this.sandboxDir(id), record);
      this.log.info({ sandboxId: id, operation: 'stop', ms: Date.now() - started }, `stop: ${memorySaved ? 'memory saved' : 'cold'} in ${Date.now() - started} ms`);
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
      const resized = snapshot ? await this.resizedSince(snapshot.dir, spec) : false;
      if (snapshot && existsSync(join(snapshot.dir, 'snapshot.json')) && !resized) {
        try {
          const started = Date.now();
          await this.copyDisk(join(snapshot.dir, 'rootfs.img'), this.diskPath(record), { replace: true });
          await this.restoreVm(record, snapshot.dir);
          record.restoredFrom = snapshot.dir;
          record.memorySnapshot = undefined;
          record.status = 'running';
          await writeChRecord(this.sandboxDir(spec.id), record);
          this.log.info({ sandboxId: spec.id, operation: 'start', ms: Date.now() - started }, `start: memory restored (${this.restoreMode}) in ${Date.now() - started} ms`);
          return { ...this.runtimeOf(record), memoryRestored: true };
        } catch (error) {
          this.noteError(record, 'restore', error);
          await this.teardownRuntime(record).catch(() => {});
          reason = `restore_failed: ${lastChainElement(error)}`;
          this.log.warn({ sandboxId: spec.id, operation: 'start' }, `start: restore failed, cold boot instead: ${(error as Error).message}`);
        }
      } else {
        reason = resized ? 'resized_while_stopped' : snapshot ? 'memory_snapshot_missing' : 'stopped_without_memory_snapshot';
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

  /**
   * Whether a stopped VM's sizes changed since its memory snapshot (a resize while stopped only
   * changes its spec): its memory image is of another machine then, so it boots cold.
   */
  private async resizedSince(snapshotDir: string, spec: SandboxSpec): Promise<boolean> {
    const config = await readFile(join(snapshotDir, 'config.json'), 'utf8').then((text) => JSON.parse(text) as VmConfig, () => undefined);
    if (!config?.cpus || !config.memory) return false;
    const memoryMiB = (config.memory.size + (config.memory.hotplugged_size ?? 0)) / 2 ** 20;
    return config.cpus.boot_vcpus !== Math.max(1, Math.ceil(spec.cpu)) || memoryMiB !== spec.memoryMiB;
  }

  // ---- resize -----------------------------------------------------------------------------------

  /**
   * CPU and memory of a running VM change live with vm.resize: vCPUs are hotplugged up to the
   * max_vcpus it was created with, memory is plugged by virtio-mem above its boot size up to its
   * hotplug room (vm.ts resizeCeiling). Memory below the boot size cannot be unplugged: that is
   * refused, and a stop/start (cold boot at the new size) does it. The disk grows only while the
   * VM is stopped: the image file and its ext4 are grown offline (resizeExt4), the memory
   * snapshot is dropped (it holds the old file system's size), and the next start boots cold.
   */
  async resize(id: string, change: ResizeSpec): Promise<ResizeResult> {
    return this.withRecord(id, async (record) => {
      const status = this.effectiveStatus(record);
      const live = status === 'running';
      if (!live && status !== 'stopped') throw new DriverError('invalid_state', `sandbox ${id} is ${status}; only a running or stopped VM is resized`);
      const target = { ...record.spec, ...(change.cpu !== undefined ? { cpu: change.cpu } : {}), ...(change.memoryMiB !== undefined ? { memoryMiB: change.memoryMiB } : {}) };
      this.validateSpec(target);
      const diskBytes = (await stat(this.diskPath(record))).size;
      if (change.diskGiB !== undefined) {
        if (live) throw new DriverError('invalid_state', `sandbox ${id} is running; its disk grows only while it is stopped`);
        if (change.diskGiB * 2 ** 30 < diskBytes) throw new DriverError('validation_failed', `diskGiB: disks only grow (sandbox ${id} has ${Math.ceil(diskBytes / 2 ** 30)} GiB)`);
      }
      const vcpus = Math.max(1, Math.ceil(target.cpu));
      const body: { desired_vcpus?: number; desired_ram?: number } = {};
      if (live) {
        const shape = record.vmShape;
        const cpuChanged = change.cpu !== undefined && vcpus !== Math.max(1, Math.ceil(record.spec.cpu));
        const memoryChanged = change.memoryMiB !== undefined && change.memoryMiB !== record.spec.memoryMiB;
        if ((cpuChanged || memoryChanged) && !shape) throw new DriverError('invalid_state', `sandbox ${id} was booted without room for live resize; stop it, resize, and start it`);
        if (cpuChanged && shape) {
          if (vcpus > shape.maxVcpus) throw new DriverError('validation_failed', `cpu: ${target.cpu} is beyond the ${shape.maxVcpus} vCPUs this VM can hotplug (its max_vcpus); stop it to resize beyond that`);
          body.desired_vcpus = vcpus;
        }
        if (memoryChanged && shape) {
          if (target.memoryMiB > shape.maxMemoryMiB) throw new DriverError('validation_failed', `memoryMiB: ${target.memoryMiB} is beyond the ${shape.maxMemoryMiB} MiB this VM can hotplug; stop it to resize beyond that`);
          if (target.memoryMiB < shape.bootMemoryMiB) throw new DriverError('invalid_state', `memoryMiB: a running VM cannot unplug memory below the ${shape.bootMemoryMiB} MiB it booted with; stop it, resize, and start it`);
          if ((target.memoryMiB - shape.bootMemoryMiB) % VIRTIO_MEM_BLOCK_MIB !== 0) throw new DriverError('validation_failed', `memoryMiB: a running VM's memory changes in ${VIRTIO_MEM_BLOCK_MIB} MiB blocks above its boot size of ${shape.bootMemoryMiB} MiB`);
          body.desired_ram = target.memoryMiB * 2 ** 20;
        }
      }
      const oldSpec = record.spec;
      record.spec = { ...target, ...(change.diskGiB !== undefined ? { diskGiB: change.diskGiB } : {}) };
      record.operation = { kind: 'resize', startedAt: new Date().toISOString() };
      await writeChRecord(this.sandboxDir(id), record);
      try {
        if (Object.keys(body).length) {
          const vm = this.requireLive(record);
          await vm.api.resizeVm(body);
          await this.onlineHotplugged(record, body.desired_vcpus);
        }
        if (change.diskGiB !== undefined && change.diskGiB * 2 ** 30 > diskBytes) {
          await resizeExt4(this.diskPath(record), change.diskGiB * 2 ** 30);
          // The memory image holds the old file system's size: the next start boots cold.
          if (record.memorySnapshot) {
            await removeTree(record.memorySnapshot.dir).catch(() => {});
            record.memorySnapshot = undefined;
          }
        }
      } catch (error) {
        record.spec = oldSpec;
        record.operation = undefined;
        await writeChRecord(this.sandboxDir(id), record);
        if (error instanceof ChApiError && !error.unreachable) throw new DriverError('conflict', `cloud-hypervisor refused the resize: ${lastChainElement(error)}`);
        throw error;
      }
      record.operation = undefined;
      await writeChRecord(this.sandboxDir(id), record);
      const diskGiB = (await stat(this.diskPath(record))).size / 2 ** 30;
      const result: ResizeResult = { cpu: record.spec.cpu, memoryMiB: record.spec.memoryMiB, diskGiB, live };
      this.log.info({ sandboxId: id, operation: 'resize', ...result }, `resize: ${result.cpu} vCPU, ${result.memoryMiB} MiB, ${diskGiB} GiB disk (${live ? 'live' : 'stopped'})`);
      return result;
    });
  }

  /**
   * Hotplugged vCPUs and memory blocks arrive offline in the guest. The VM image's udev onlines
   * them (vm-image.ts, 66-nestbox-hotplug.rules); an image VM has no udev, so its busybox does it
   * here, until the guest has the vCPUs asked for (the ACPI event is asynchronous; bounded).
   */
  private async onlineHotplugged(record: ChRecord, vcpus: number | undefined): Promise<void> {
    if (!isOciImage(record.diskImage ?? record.spec.image)) return;
    const script = [
      `B=${OCI_VM_BUSYBOX}; i=0`,
      'while [ $i -lt 50 ]; do',
      '  for f in /sys/devices/system/cpu/cpu[0-9]*/online; do [ -e "$f" ] && [ "$($B cat "$f")" = 0 ] && echo 1 > "$f"; done',
      '  for f in /sys/devices/system/memory/memory[0-9]*/state; do [ -e "$f" ] && [ "$($B cat "$f")" = offline ] && echo online > "$f"; done',
      `  [ ! -e /sys/devices/system/cpu/online ] || [ "$($B nproc --all 2>/dev/null || echo 0)" -ge ${vcpus ?? 0} ] && break`,
      '  $B sleep 0.1; i=$((i+1))',
      'done; true',
    ].join('\n');
    const client = this.agentClient(record.id);
    try {
      await client.exec({ argv: [OCI_VM_BUSYBOX, 'sh', '-c', script], timeoutMs: 15_000 });
    } catch (error) {
      this.log.warn({ sandboxId: record.id, operation: 'resize' }, `resize: onlining hotplugged vCPUs/memory failed: ${(error as Error).message}`);
    } finally {
      client.close();
    }
  }

  /** The disk image of a named snapshot (not found: `not_found`). */
  private async snapshotDisk(snapshotId: string): Promise<string> {
    await this.requireSnapshot(snapshotId);
    return join(this.requireSnapshots().layerDir(snapshotId), 'rootfs.img');
  }

  async destroy(id: string): Promise<void> {
    assertSandboxId(id);
    await this.withLock(id, () => this.destroyUnlocked(id));
  }

  /** The record (status, CH error chain of the last failure, …), for diagnostics and tests. */
  inspect(id: string): ChRecord | undefined {
    const record = this.records.get(id);
    return record ? structuredClone(record) : undefined;
  }

  // ---- pause ------------------------------------------------------------------------------------

  protected async setPaused(record: ChRecord, paused: boolean): Promise<void> {
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
    this.log.info({ sandboxId: record.id, operation: paused ? 'pause' : 'unpause', ms: Date.now() - started }, `${paused ? 'pause' : 'unpause'}: ${Date.now() - started} ms`);
  }

  // ---- fork -------------------------------------------------------------------------------------

  async fork(sourceId: string, children: SandboxSpec[]): Promise<ForkResult> {
    return this.forkUnder(sourceId, children, async (source) => {
      const started = Date.now();
      const sourceStatus = this.effectiveStatus(source);
      const image = await this.requireImage();
      // A snapshot of the source's memory + disk: taken now (running/paused), or the one its
      // stop left. Without one (a cold-stopped source), children boot cold from a disk copy.
      let snapshotDir: string | undefined;
      let temporary = false;
      // A source with volumes forks cold, for the reason it stops cold (see stop).
      if (source.spec.volumes?.length) {
        snapshotDir = undefined;
      } else if (sourceStatus === 'running' || sourceStatus === 'paused') {
        snapshotDir = (await this.takeMemorySnapshot(source, this.requireLive(source), 'fork', { resumeAfter: sourceStatus === 'running' })).dir;
        temporary = true;
      } else if (source.memorySnapshot && existsSync(join(source.memorySnapshot.dir, 'snapshot.json'))) {
        snapshotDir = source.memorySnapshot.dir;
      }
      const made: ChRecord[] = [];
      try {
        for (const spec of children) {
          await this.removeRemains(spec.id);
          const record = this.newRecord(spec);
          record.forkedFrom = sourceId;
          record.diskImage = source.diskImage ?? source.spec.image;
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
        for (const record of made) await this.destroyUnlocked(record.id).catch((cleanup) => this.log.warn({ sandboxId: sourceId, operation: 'fork', childId: record.id }, `fork: cleanup of ${record.id} failed: ${String(cleanup)}`));
        throw error;
      } finally {
        // Children hold hard links to state.json and memory-ranges, so the shared dir can go.
        if (temporary && snapshotDir) await removeTree(snapshotDir).catch(() => {});
      }
      this.log.info({ sandboxId: sourceId, operation: 'fork', childIds: made.map((record) => record.id), ms: Date.now() - started }, `fork → ${made.map((record) => record.id).join(', ')} in ${Date.now() - started} ms`);
      return { children: made.map((record) => this.runtimeOf(record)), memoryCopied: !!snapshotDir, diskCopy: this.requireDiskStore().mode };
    });
  }

  /** A per-child restore dir: patched config.json, hard links to the shared state and memory. */
  protected async childSnapshotDir(record: ChRecord, shared: string): Promise<string> {
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
    const checkArguments = () => assertSnapshotId(snapshotId);
    return this.withRecord(id, async (record) => {
      const store = this.requireSnapshots();
      const existing = await store.get(snapshotId);
      if (existing?.sourceId === id) return this.snapshotResult(existing);
      if (existing) throw new DriverError('conflict', `snapshot ${snapshotId} already exists`);
      const status = this.effectiveStatus(record);
      const meta = await store.create(
        { snapshotId, sourceId: id, image: record.diskImage ?? record.spec.image, parents: [], diskCopy: this.requireDiskStore().mode },
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
      return this.snapshotResult(meta);
    }, checkArguments);
  }

  /** The image leaves the OCI store, and its boot disk (vm-image-oci.ts) with it. */
  override async deleteImage(id: string): Promise<void> {
    await super.deleteImage(id);
    await removeOciVmDisk(this.options.imagesDir, id);
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    this.assertInitialized();
    assertSnapshotId(snapshotId);
    // Sandboxes got a copy of the disk at create, so nothing references a named snapshot.
    await this.requireSnapshots().remove(snapshotId);
  }

  async fileView(id: string): Promise<FileView> {
    assertSandboxId(id);
    this.requireRecord(id);
    throw new DriverError('invalid_state', 'file views of stopped VMs are not implemented by the cloud-hypervisor driver yet; start the sandbox to read its files');
  }

  touchFileView(): void {}

  // ---- Driver: usage ----------------------------------------------------------------------------

  /**
   * What the host can see of each live VM: the VMM process's CPU time (its vCPU threads
   * included), the memory it was given, the size of its disk image and its slot's veth. What
   * happens inside the guest (memory in use or cached, the disk's used blocks) is not visible from
   * here without an agent call, so those fields are left out rather than estimated.
   */
  async usage(): Promise<SandboxUsageCounters[]> {
    const live = [...this.records.values()].filter((record) => record.status === 'running' || record.status === 'paused');
    return Promise.all(
      live.map(async (record): Promise<SandboxUsageCounters> => {
        const [cpuNs, disk, traffic] = await Promise.all([
          record.pid && record.pidStartTime ? processCpuNs(record.pid, record.pidStartTime) : undefined,
          stat(this.diskPath(record)).catch(() => undefined),
          record.slot ? slotTrafficBytes(record.slot) : undefined,
        ]);
        return {
          id: record.id,
          status: record.status === 'paused' ? 'paused' : 'running',
          cpuNs,
          cpuLimit: record.spec.cpu,
          memoryLimitBytes: record.spec.memoryMiB * 2 ** 20,
          diskTotalBytes: disk?.size,
          netRxBytes: traffic?.rxBytes,
          netTxBytes: traffic?.txBytes,
        };
      }),
    );
  }
}

// ---- free functions -------------------------------------------------------------------------------

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

function runText(file: string, args: string[]): Promise<string> {
  return new Promise((resolveRun, reject) => {
    execFile(file, args, { timeout: 10_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(stderr.trim() || error.message));
      else resolveRun(stdout);
    });
  });
}
