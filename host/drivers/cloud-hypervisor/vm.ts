// A Cloud Hypervisor sandbox's VM: boot (slot + TAP, VMM, vm.create, vm.boot, the agent's
// first answer, its key, clock/entropy/env fixups), restore from a memory snapshot, taking one,
// and teardown back to a disk only (VMM, forwarder, slot) or all the way (destroy).
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { newAgentKey } from '../../agent-protocol/auth.js';
import { readAgentKeyFile, removeAgentKeyFile, writeAgentKeyFile } from '../../agent-protocol/key-file.js';
import type { VmImage } from '../../images/vm-image.js';
import { buildSlot, teardownSlot } from '../../network/slots.js';
import { removeTree } from '../../util/fs.js';
import { isProcessAlive } from '../../util/process.js';
import { ChApi, type RestoreConfig, type VmConfig } from './api.js';
import { AGENT_VSOCK_PORT, buildVmConfig, patchSnapshotConfig, volumeTag } from './config.js';
import { transition } from './lifecycle.js';
import { addVmNetworking } from './network.js';
import { EventFileReader, killProcess, launchVmm, readPidFile, readTail, stopVmm } from './process.js';
import { readChRecord, writeChRecord, type ChRecord } from './records.js';
import { ChSandboxes, isOciImage, SNAPSHOT_TIMEOUT_MS, type LiveVm } from './sandboxes.js';
import { VsockForwarder } from './vsock.js';
import { findVirtiofsd, guestMountScript, launchVirtiofsd, stopVirtiofsds, VIRTIOFSD_CANDIDATES } from './virtiofs.js';
import { DriverError } from '../errors.js';
import { OCI_VM_BUSYBOX } from '../../images/vm-image-oci.js';

export abstract class ChVms extends ChSandboxes {
  /**
   * A fresh proof key for this boot, stored host-side first (adoption after a restart needs
   * it), then handed to the agent over vsock before anything else is asked of it. After a cold
   * boot the agent has no key and takes the first one; a restored (or forked) VM's agent still
   * holds the key of the boot its snapshot was taken of, `previousKey`, without which it refuses.
   * What this cannot do inside a VM: root in the guest can read the agent's memory, so the
   * scheme stops impersonation by anyone who cannot (see auth.ts); the VM boundary, not this
   * key, is what protects the host.
   */
  protected async handOverAgentKey(record: ChRecord, previousKey: Buffer | undefined): Promise<void> {
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

  // ---- the VM itself ------------------------------------------------------------------------------

  /** Slot + TAP, VMM, vm.create → Created, vm.boot → Running, guest agent answers. */
  protected async bootVm(record: ChRecord, image: VmImage, onProgress?: (line: string) => void): Promise<void> {
    // Volumes mounted on the host before the VMM's private mount namespace is made (it copies them).
    for (const mount of record.spec.volumes ?? []) await this.volumes.ensure(mount.volumeId);
    const vm = await this.launchRuntime(record, onProgress);
    const fs = await this.startVolumeShares(record);
    if (fs.length) onProgress?.(`virtio-fs: ${fs.length} volume share(s)`);
    const ceiling = this.resizeCeiling();
    const config = buildVmConfig(
      { cpu: record.spec.cpu, memoryMiB: record.spec.memoryMiB, nested: this.nestedVirt, cmdline: this.cmdlineFor(record), maxVcpus: ceiling.maxVcpus, maxMemoryMiB: ceiling.maxMemoryMiB, fs },
      { kernel: image.kernel, initramfs: image.initramfs, rootfsDisk: this.diskPath(record), vsockSocket: this.vsockPath(record.id), serialLog: this.serialPath(record.id) },
    );
    record.vmShape = {
      bootVcpus: config.cpus!.boot_vcpus,
      bootMemoryMiB: record.spec.memoryMiB,
      maxVcpus: config.cpus!.max_vcpus,
      maxMemoryMiB: record.spec.memoryMiB + (config.memory!.hotplug_size ?? 0) / 2 ** 20,
    };
    await writeChRecord(this.sandboxDir(record.id), record);
    await transition(vm.api, 'vm.create', () => vm.api.createVm(config), 'Created');
    await transition(vm.api, 'vm.boot', () => vm.api.bootVm(), 'Running');
    onProgress?.('vm booted; waiting for the guest agent');
    await this.waitForAgent(record);
    await this.handOverAgentKey(record, undefined);
    await this.mountVolumesInGuest(record);
    await this.postBootFixups(record);
    record.status = 'running';
    record.lastError = undefined;
    await writeChRecord(this.sandboxDir(record.id), record);
  }

  /**
   * The ceilings every VM is created with (vm.create's max_vcpus and hotplug_size): the host's
   * CPUs and total memory unless configured lower. Room to hotplug costs address space only.
   */
  protected resizeCeiling(): { maxVcpus: number; maxMemoryMiB: number } {
    return { maxVcpus: this.options.maxVcpus ?? cpus().length, maxMemoryMiB: this.options.maxMemoryMiB ?? Math.floor(totalmem() / 2 ** 20) };
  }

  /** One virtiofsd per volume mount (virtiofs.ts), before vm.create names their sockets. */
  protected async startVolumeShares(record: ChRecord): Promise<Array<{ tag: string; socket: string }>> {
    const mounts = record.spec.volumes ?? [];
    if (!mounts.length) return [];
    const binary = await findVirtiofsd(this.options.virtiofsdBinary);
    if (!binary) throw new DriverError('not_supported', `this host has no virtiofsd (looked for ${this.options.virtiofsdBinary ?? VIRTIOFSD_CANDIDATES.join(', ')}): install Debian's qemu-system-common (or virtiofsd) to mount volumes into VMs`);
    const run = this.runDir(record.id);
    const shares: Array<{ tag: string; socket: string }> = [];
    for (const [index, mount] of mounts.entries()) {
      await this.volumes.ensure(mount.volumeId);
      const share = { tag: volumeTag(index), socket: join(run, `fs${index}.sock`), source: this.volumes.dataDir(mount.volumeId), readOnly: mount.readOnly };
      await launchVirtiofsd(binary, share, { pidFile: join(run, `virtiofsd-${index}.pid`), logFile: join(this.sandboxDir(record.id), `virtiofsd-${index}.log`) });
      shares.push({ tag: share.tag, socket: share.socket });
    }
    return shares;
  }

  /** The guest mounts its volumes' tags (after every cold boot; volume VMs are never restored). */
  protected async mountVolumesInGuest(record: ChRecord): Promise<void> {
    const mounts = (record.spec.volumes ?? []).map((mount, index) => ({ ...mount, tag: volumeTag(index) }));
    if (!mounts.length) return;
    const oci = isOciImage(record.diskImage ?? record.spec.image);
    const shell = oci ? [OCI_VM_BUSYBOX, 'sh'] : ['/bin/sh'];
    const client = this.agentClient(record.id);
    try {
      const result = await client.exec({ argv: [...shell, '-c', guestMountScript(mounts, oci ? { busybox: OCI_VM_BUSYBOX } : {})], timeoutMs: 30_000 });
      if (result.exitCode !== 0) throw new Error(`exit ${result.exitCode}: ${result.stderr.trim()}`);
    } catch (error) {
      throw new Error(`sandbox ${record.id}: the guest could not mount its volumes: ${(error as Error).message}`);
    } finally {
      client.close();
    }
  }

  /** New VMM, vm.restore → Paused, vm.resume → Running, guest agent answers, clock + entropy resync. */
  protected async restoreVm(record: ChRecord, snapshotDir: string): Promise<void> {
    // The snapshot names the paths of the VM it was taken of; this VM's are what count.
    const configPath = join(snapshotDir, 'config.json');
    const original = JSON.parse(await readFile(configPath, 'utf8')) as VmConfig;
    await writeFile(configPath, JSON.stringify(patchSnapshotConfig(original, this.patchFor(record))), { mode: 0o600 });
    await rm(this.vsockPath(record.id), { force: true });
    const vm = await this.launchRuntime(record);
    const restore: RestoreConfig = { source_url: `file://${snapshotDir}`, memory_restore_mode: this.restoreMode, resume: false };
    const restored = patchSnapshotConfig(original, this.patchFor(record));
    record.vmShape = shapeOf(restored);
    await transition(vm.api, 'vm.restore', () => vm.api.restoreVm(restore, SNAPSHOT_TIMEOUT_MS), 'Paused');
    await transition(vm.api, 'vm.resume', () => vm.api.resumeVm(), 'Running');
    await this.waitForAgent(record);
    await this.handOverAgentKey(record, await readAgentKeyFile(snapshotDir));
    await this.postBootFixups(record);
  }

  /** Slot, TAP, VMM process, forwarder: everything before the first VM call. */
  protected async launchRuntime(record: ChRecord, onProgress?: (line: string) => void): Promise<LiveVm> {
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
  protected async attach(record: ChRecord): Promise<LiveVm> {
    const old = this.live.get(record.id);
    if (old) await old.forwarder.close();
    const forwarder = new VsockForwarder(join(this.runDir(record.id), 'agent.sock'), this.vsockPath(record.id), AGENT_VSOCK_PORT);
    await forwarder.start();
    const vm: LiveVm = { api: new ChApi(join(this.runDir(record.id), 'api.sock')), forwarder, events: new EventFileReader(join(this.runDir(record.id), 'events.json')) };
    this.live.set(record.id, vm);
    return vm;
  }

  /** Liveness only (the agent may not have this boot's key yet): the key handoff comes next. */
  protected async waitForAgent(record: ChRecord): Promise<void> {
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
  protected async postBootFixups(record: ChRecord): Promise<void> {
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
        argv: [...this.guestHelper(record, 'resync'), '--time-ms', String(Date.now()), '--entropy', randomBytes(64).toString('hex'), '--hostname', record.id],
        timeoutMs: 10_000,
      });
      if (result.exitCode !== 0) this.log.warn({ sandboxId: record.id }, `nestbox-resync exited ${result.exitCode}: ${result.stderr.trim()}`);
    } catch (error) {
      this.log.warn({ sandboxId: record.id }, `resync failed: ${(error as Error).message}`);
    } finally {
      client.close();
    }
  }

  /**
   * Pause (if running) → snapshot → reflink the disk while still paused. For `stop` the VMM is
   * shut down by the caller; for `fork` the source resumes when it was running.
   */
  protected async takeMemorySnapshot(record: ChRecord, vm: LiveVm, purpose: 'stop' | 'fork', options: { resumeAfter?: boolean } = {}) {
    const wasRunning = this.effectiveStatus(record) === 'running';
    const started = Date.now();
    // Flush the guest's page cache first so the disk copy is as complete as the memory image.
    if (wasRunning) {
      const client = this.agentClient(record.id);
      await client.exec({ argv: this.guestHelper(record, 'sync'), timeoutMs: 10_000 }).catch(() => {});
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
      const meta = { chVersion: record.chVersion ?? this.chVersion, cpuModel: await cpuModel(), image: record.diskImage ?? record.spec.image, memoryMiB: record.spec.memoryMiB, takenAt: new Date().toISOString(), sourceId: record.id };
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
    this.log.info({ sandboxId: record.id, operation: purpose, ms: Date.now() - started }, `${purpose}: snapshot in ${Date.now() - started} ms`);
    return { dir, takenAt: new Date().toISOString(), chVersion: record.chVersion ?? this.chVersion };
  }

  // ---- teardown, destroy ----------------------------------------------------------------------------

  /** VMM, forwarder, slot; the disk and generations stay. */
  protected async teardownRuntime(record: ChRecord): Promise<void> {
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
    // After the VMM: with its connection gone each virtiofsd exits by itself; this makes sure.
    await stopVirtiofsds(this.runDir(record.id));
    for (const { slot } of await this.slots.heldBy(this.options.ownerId, record.id, record.slot)) {
      await teardownSlot(slot);
      await this.slots.release(slot.index);
    }
    record.slot = undefined;
    record.pid = undefined;
    record.pidStartTime = undefined;
    record.vmShape = undefined;
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

  protected async destroyUnlocked(id: string): Promise<void> {
    const dir = this.sandboxDir(id);
    const record = this.records.get(id) ?? (await readChRecord(dir));
    const stub: ChRecord = record ?? this.newRecord({ id, image: 'default', cpu: 1, memoryMiB: 64, env: {} });
    await this.teardownRuntime(stub);
    await this.removeDiskDirs(id, record);
    await removeTree(dir);
    if (existsSync(dir)) throw new Error(`could not remove ${dir}`);
    this.records.delete(id);
  }

  /** Keeps only the newest complete memory snapshot (the one the record points at). */
  protected async pruneGenerations(record: ChRecord): Promise<void> {
    const generations = join(record.diskDir, 'generations');
    for (const entry of await readdir(generations).catch(() => [] as string[])) {
      const path = join(generations, entry);
      if (path !== record.memorySnapshot?.dir && path !== record.restoredFrom) await removeTree(path);
    }
  }
}

/** Boot sizes and resize ceilings of a VM from its config (a snapshot's config.json). */
export function shapeOf(config: VmConfig): ChRecord['vmShape'] {
  if (!config.cpus || !config.memory) return undefined;
  const bootMemoryMiB = config.memory.size / 2 ** 20;
  return { bootVcpus: config.cpus.boot_vcpus, bootMemoryMiB, maxVcpus: config.cpus.max_vcpus, maxMemoryMiB: bootMemoryMiB + (config.memory.hotplug_size ?? 0) / 2 ** 20 };
}

async function cpuModel(): Promise<string> {
  return cpus()[0]?.model ?? 'unknown';
}
