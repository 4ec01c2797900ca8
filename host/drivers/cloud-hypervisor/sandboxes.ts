// The Cloud Hypervisor driver's state and where everything of a VM lives: the options, the
// records and live VMM handles, the run, disk and snapshot paths, the checks every call makes,
// and how a failed CH call is recorded (`error` with CH's chain and the state vm.info reports).
// The lifecycle builds on it: vm.ts (the VM itself, teardown), recovery.ts (adoption,
// watching), driver.ts (the Driver methods).
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, rm, stat, truncate } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../../../core/logger.js';
import { AgentClient } from '../../agent-protocol/client.js';
import { readCompleteVmImage, VM_IMAGE_NAME, type VmImage } from '../../images/vm-image.js';
import { CODE_INTERPRETER_IMAGE } from '../../images/code-interpreter-image.js';
import { readCompleteVmCodeInterpreterImage, type VmCodeInterpreterImage } from '../../images/vm-code-interpreter-image.js';
import { IMAGE_ID } from '../../images/oci/store.js';
import { ensureOciVmDisk, guestRuntimeFromVmImage, OCI_VM_BUSYBOX, OCI_VM_INIT, OCI_VM_RESYNC, OciImageMissingError, OciImageUnbootableError, type GuestRuntimeFiles, type OciVmDisk } from '../../images/vm-image-oci.js';
import { SlotAllocator } from '../../network/slots.js';
import type { ReflinkStoreOptions } from '../../storage/disk-store.js';
import { assertSnapshotId, type SnapshotMeta } from '../../storage/snapshots.js';
import { isProcessAlive } from '../../util/process.js';
import { assertSandboxId, DriverBase, SUN_PATH_MAX } from '../base/driver-base.js';
import { validateVolumeMounts } from '../base/volume-mounts.js';
import { DriverError } from '../errors.js';
import type { SandboxRuntime, SandboxSpec, SnapshotResult } from '../types.js';
import { ChApi, ChApiError } from './api.js';
import { AGENT_VSOCK_PORT, DEFAULT_CMDLINE } from './config.js';
import { observeState, runtimeStatusFor, VmOperationError } from './lifecycle.js';
import type { EventFileReader, VmmPaths } from './process.js';
import { CH_RECORD_VERSION, readChRecord, writeChRecord, type ChLastError, type ChRecord } from './records.js';
import { HybridVsockAgent, type VsockForwarder } from './vsock.js';

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
  /** Where the driver's lines go (none when unset). */
  logger?: Logger;
  /** The OCI image store whose images (`sha256:<hex>`) sandboxes may boot (default <imagesDir>/oci). */
  ociStoreDir?: string;
  /** What image VMs run the agent on (default: taken from the VM image's tree; tests give host files). */
  guestRuntime?: GuestRuntimeFiles;
  /** Disk of an image VM whose spec names no diskGiB (default 10 GiB, as the local driver's). */
  defaultDiskGiB?: number;
  /** The virtiofsd serving volumes (default: the first of VIRTIOFSD_CANDIDATES that exists). */
  virtiofsdBinary?: string;
  /**
   * Ceilings of a live resize: every VM is created with room to hotplug up to this many vCPUs
   * and MiB (default: the host's CPUs and its total memory, which no sandbox could exceed anyway).
   */
  maxVcpus?: number;
  maxMemoryMiB?: number;
}

export const DEFAULT_DISK_GIB = 10;
export const MAX_DISK_GIB = 16_384;
const GIB = 2 ** 30;

export const SNAPSHOT_TIMEOUT_MS = 120_000;

export interface LiveVm {
  api: ChApi;
  forwarder: VsockForwarder;
  events: EventFileReader;
}

export abstract class ChSandboxes extends DriverBase<ChRecord> {
  protected readonly subnet: string;
  protected readonly slots: SlotAllocator;
  protected readonly live = new Map<string, LiveVm>();
  protected probes: Record<string, string | number | boolean> = {};
  protected restoreMode: 'Copy' | 'OnDemand' = 'Copy';
  protected nestedVirt = false;
  protected chVersion = 'unknown';
  protected watchTimer?: NodeJS.Timeout;

  constructor(protected readonly options: ChDriverOptions) {
    super('ChDriver', options.dataDir, options.logger);
    // The OCI store the host agent pulls into (driver-base.ts) is the one image disks are made from.
    this.ociStoreDir = options.ociStoreDir ?? join(options.imagesDir, 'oci');
    this.subnet = options.subnet ?? '10.200.0.0/16';
    this.slots = new SlotAllocator(this.subnet, options.slotsDir);
  }

  /** A client that speaks to the guest agent directly over hybrid vsock, checking its proofs. */
  agentClient(id: string): AgentClient {
    const record = this.requireRecord(id);
    return this.vsockClient(record.id, this.agentKeys.get(record.id));
  }

  /** `proofKey` undefined: answers are not checked (only before the key handoff of a boot). */
  protected vsockClient(id: string, proofKey: Buffer | undefined): AgentClient {
    const runDir = this.runDir(id);
    return new AgentClient(`${join(runDir, 'vsock.sock')}:${AGENT_VSOCK_PORT}`, { agent: new HybridVsockAgent(join(runDir, 'vsock.sock'), AGENT_VSOCK_PORT), proofKey });
  }

  // ---- errors and state ---------------------------------------------------------------------------

  protected noteError(record: ChRecord, operation: string, error: unknown): ChLastError {
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
  protected async failOperation(record: ChRecord, operation: string, error: unknown): Promise<void> {
    const lastError = this.noteError(record, operation, error);
    if (lastError.observedState === 'unreachable' || !isProcessAlive(record.pid, record.pidStartTime)) {
      this.log.warn({ sandboxId: record.id, operation }, `cloud-hypervisor is gone during ${operation}; tearing down`);
      await this.teardownRuntime(record).catch(() => {});
      record.status = 'stopped';
    } else {
      record.status = 'error';
    }
    await writeChRecord(this.sandboxDir(record.id), record);
  }

  /** Running/paused/stopped as far as we know (an `error` record reports what vm.info last said). */
  protected effectiveStatus(record: ChRecord): 'running' | 'paused' | 'stopped' | 'busy' {
    if (record.status === 'running' || record.status === 'paused' || record.status === 'stopped') return record.status;
    if (record.status === 'error') return runtimeStatusFor(record.lastError?.observedState);
    return 'busy';
  }

  /** Re-reads vm.info for an `error` record and adopts that state when it is a normal one. */
  protected async settleStatus(record: ChRecord): Promise<void> {
    const vm = this.live.get(record.id);
    if (!vm) return;
    const state = await observeState(vm.api);
    if (state === 'Running' || state === 'Paused') {
      record.status = runtimeStatusFor(state);
      await writeChRecord(this.sandboxDir(record.id), record);
    }
  }

  // ---- helpers ----------------------------------------------------------------------------------------

  protected runtimeOf(record: ChRecord): SandboxRuntime {
    const status = this.effectiveStatus(record);
    if (status !== 'running' && status !== 'paused') return { id: record.id, status: 'stopped' };
    return this.liveRuntime(record, status, join(this.runDir(record.id), 'agent.sock'));
  }

  protected readRecord(sandboxDir: string): Promise<ChRecord | undefined> {
    return readChRecord(sandboxDir);
  }

  protected snapshotResult(meta: SnapshotMeta): SnapshotResult {
    return { snapshotId: meta.snapshotId, sizeBytes: meta.sizeBytes, diskCopy: meta.diskCopy, layers: [meta.snapshotId] };
  }

  protected newRecord(spec: SandboxSpec): ChRecord {
    const now = new Date().toISOString();
    return { version: CH_RECORD_VERSION, driver: 'cloud-hypervisor', id: spec.id, owner: this.options.ownerId, spec, status: 'creating', diskDir: this.newDiskDir(spec.id), diskImage: spec.image, createdAt: now, updatedAt: now };
  }

  protected async makeDirs(record: ChRecord): Promise<void> {
    await mkdir(this.runDir(record.id), { recursive: true, mode: 0o700 });
    await mkdir(join(record.diskDir, 'generations'), { recursive: true, mode: 0o700 });
  }

  protected async copyDisk(source: string, target: string, options: { replace?: boolean } = {}): Promise<void> {
    if (!existsSync(source)) throw new Error(`disk image ${source} is missing`);
    if (options.replace) await rm(target, { force: true });
    await this.requireDiskStore().copyTree(source, target);
  }

  protected patchFor(record: ChRecord) {
    return { rootfsDisk: this.diskPath(record), vsockSocket: this.vsockPath(record.id), serialLog: this.serialPath(record.id) };
  }

  protected async requireImage(): Promise<VmImage> {
    const name = this.options.vmImage ?? VM_IMAGE_NAME;
    const image = await readCompleteVmImage(join(this.options.imagesDir, name));
    if (!image) throw new Error(`VM image "${name}" is not built under ${this.options.imagesDir}; run \`nestbox image build --vm\``);
    return image;
  }

  /**
   * The `code-interpreter` disk for today's VM image (vm-code-interpreter-image.ts), booted with
   * the VM image's kernel. The host agent builds it in the background after the VM image; a
   * create that comes before it is ready is refused (409) rather than waiting minutes.
   */
  protected async requireCodeInterpreterImage(vmImage: VmImage): Promise<VmCodeInterpreterImage> {
    const image = await readCompleteVmCodeInterpreterImage(this.options.imagesDir, vmImage, this.options.vmImage ?? VM_IMAGE_NAME);
    if (!image) throw new DriverError('invalid_state', `the ${CODE_INTERPRETER_IMAGE} VM image is not built on this host yet (the host agent builds it in the background after it starts); try again in a few minutes`);
    return image;
  }

  /**
   * The bootable disk of an OCI image (host/images/vm-image-oci.ts), built once per digest and
   * runtime and cached under the images dir. A missing image is `not_found`; a root filesystem
   * a VM cannot boot is `validation_failed`, both naming the image.
   */
  protected async ociImageDisk(imageId: string, vmImage: VmImage, onProgress?: (line: string) => void): Promise<OciVmDisk> {
    try {
      const vmImageDir = join(this.options.imagesDir, this.options.vmImage ?? VM_IMAGE_NAME);
      const runtime = this.options.guestRuntime ?? (await guestRuntimeFromVmImage(vmImageDir, vmImage.manifest.kernelVersion));
      return await ensureOciVmDisk({ imagesDir: this.options.imagesDir, ociStoreDir: this.options.ociStoreDir, imageId, runtime, onProgress, warn: (message) => this.log.warn({ image: imageId }, message) });
    } catch (error) {
      if (error instanceof OciImageMissingError) throw new DriverError('not_found', error.message);
      if (error instanceof OciImageUnbootableError) throw new DriverError('validation_failed', error.message);
      throw error;
    }
  }

  /** Grows a new sandbox's disk copy to its diskGiB (image VMs: the default size too). */
  protected async growDisk(record: ChRecord, minimumBytes: number): Promise<void> {
    const image = record.diskImage ?? record.spec.image;
    const wanted = record.spec.diskGiB ?? (isOciImage(image) ? (this.options.defaultDiskGiB ?? DEFAULT_DISK_GIB) : undefined);
    if (wanted === undefined) return;
    const path = this.diskPath(record);
    const size = (await stat(path)).size;
    if (wanted * GIB < Math.max(size, minimumBytes)) {
      if (record.spec.diskGiB === undefined) return;
      throw new DriverError('validation_failed', `diskGiB ${wanted} is smaller than the disk of image ${image} (${Math.ceil(size / 2 ** 20)} MiB)`);
    }
    if (wanted * GIB === size) return;
    await resizeExt4(path, wanted * GIB);
  }

  /** The kernel command line of a cold boot: image VMs start our init instead of the image's. */
  protected cmdlineFor(record: ChRecord): string | undefined {
    return isOciImage(record.diskImage ?? record.spec.image) ? `${DEFAULT_CMDLINE} init=${OCI_VM_INIT}` : undefined;
  }

  /** argv of the guest helpers: the VM image has them on the PATH, an image VM under /.nestbox. */
  protected guestHelper(record: ChRecord, helper: 'resync' | 'sync'): string[] {
    const oci = isOciImage(record.diskImage ?? record.spec.image);
    if (helper === 'resync') return [oci ? OCI_VM_RESYNC : 'nestbox-resync'];
    return oci ? [OCI_VM_BUSYBOX, 'sync'] : ['sync'];
  }

  protected validateSpec(spec: SandboxSpec): void {
    assertSandboxId(spec.id);
    const invalid = (message: string) => new DriverError('validation_failed', message);
    // Volumes (issue 19) reach the guest over virtio-fs (virtiofs.ts), one virtiofsd each.
    validateVolumeMounts(spec, this.volumes);
    if (spec.image !== 'default' && spec.image !== CODE_INTERPRETER_IMAGE && !IMAGE_ID.test(spec.image)) throw invalid(`unknown image "${spec.image}" (the cloud-hypervisor driver knows "default", "${CODE_INTERPRETER_IMAGE}" and pulled OCI images by id, sha256:<64 hex>)`);
    if (spec.diskGiB !== undefined && (!Number.isInteger(spec.diskGiB) || spec.diskGiB < 1 || spec.diskGiB > MAX_DISK_GIB)) throw invalid(`diskGiB must be an integer from 1 to ${MAX_DISK_GIB}, got ${spec.diskGiB}`);
    if (!(spec.cpu > 0) || spec.cpu > 256) throw invalid(`cpu must be between 0 and 256 vCPUs, got ${spec.cpu}`);
    if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < 128) throw invalid(`memoryMiB must be an integer of at least 128, got ${spec.memoryMiB}`);
    if (spec.snapshot !== undefined) assertSnapshotId(spec.snapshot);
    // The slot egress rules of host/network are not applied to VMs yet: refuse rather than ignore.
    if (spec.egress && spec.egress.mode !== 'allow-all') throw invalid(`egress mode "${spec.egress.mode}" is not supported by the cloud-hypervisor driver yet`);
    if (spec.egress?.deny?.length) throw invalid('egress deny lists are not supported by the cloud-hypervisor driver yet');
    // The guest → host vsock socket is `<vsock.socket>_<port>`: the longest path we create.
    const longest = `${this.vsockPath(spec.id)}_4294967295`;
    if (Buffer.byteLength(longest) > SUN_PATH_MAX) throw new Error(`socket path ${longest} exceeds the Unix socket limit; use a shorter data dir than ${this.dataDir}`);
  }

  protected requireLive(record: ChRecord): LiveVm {
    const vm = this.live.get(record.id);
    if (!vm) throw new DriverError('invalid_state', `sandbox ${record.id} has no running VMM`);
    return vm;
  }

  protected runDir(id: string): string {
    return join(this.sandboxDir(id), 'run');
  }
  protected newDiskDir(id: string): string {
    const store = this.requireDiskStore();
    return store.root === this.dataDir ? join(this.sandboxDir(id), 'disk') : join(store.root, 'vm-disks', id);
  }
  protected diskPath(record: ChRecord): string {
    return join(record.diskDir, 'rootfs.img');
  }
  protected vsockPath(id: string): string {
    return join(this.runDir(id), 'vsock.sock');
  }
  protected serialPath(id: string): string {
    return join(this.sandboxDir(id), 'serial.log');
  }
  protected vmmPaths(id: string): VmmPaths {
    const run = this.runDir(id);
    return {
      apiSocket: join(run, 'api.sock'),
      eventMonitor: join(run, 'events.json'),
      logFile: join(this.sandboxDir(id), 'ch.log'),
      stdioLog: join(this.sandboxDir(id), 'vmm.out'),
      pidFile: join(run, 'vmm.pid'),
    };
  }

  /** VMM, forwarder, slot; the disk and generations stay (vm.ts). */
  protected abstract teardownRuntime(record: ChRecord): Promise<void>;
}

// ---- free functions -------------------------------------------------------------------------------

export function isOciImage(image: string): boolean {
  return IMAGE_ID.test(image);
}

/** truncate + resize2fs of an ext4 image file (offline: before the VM opens it). */
export async function resizeExt4(path: string, sizeBytes: number): Promise<void> {
  await truncate(path, sizeBytes);
  try {
    await runTool('resize2fs', [path]);
  } catch (error) {
    // resize2fs insists on a checked file system after any use (a snapshot's disk).
    if (!/e2fsck/.test((error as Error).message)) throw error;
    await runTool('e2fsck', ['-fy', path]).catch((check: Error) => {
      if (!/\(exit code 1\)/.test(check.message)) throw check;
    });
    await runTool('resize2fs', [path]);
  }
}

function runTool(file: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: 300_000, encoding: 'utf8' }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${file} ${args.join(' ')} failed (exit code ${(error as { code?: unknown }).code}): ${stderr.trim() || error.message}`));
      else resolve(stdout);
    });
  });
}

export function lastChainElement(error: unknown): string {
  if (error instanceof VmOperationError || error instanceof ChApiError) return error.chain[error.chain.length - 1] ?? error.message;
  return (error as Error)?.message?.split('\n')[0] ?? String(error);
}
