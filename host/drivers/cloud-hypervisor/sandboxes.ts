// The Cloud Hypervisor driver's state and where everything of a VM lives: the options, the
// records and live VMM handles, the run, disk and snapshot paths, the checks every call makes,
// and how a failed CH call is recorded (`error` with CH's chain and the state vm.info reports).
// The lifecycle builds on it: vm.ts (the VM itself, teardown), recovery.ts (adoption,
// watching), driver.ts (the Driver methods).
import { existsSync } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../../../core/logger.js';
import { AgentClient } from '../../agent-protocol/client.js';
import { readCompleteVmImage, VM_IMAGE_NAME, type VmImage } from '../../images/vm-image.js';
import { SlotAllocator } from '../../network/slots.js';
import type { ReflinkStoreOptions } from '../../storage/disk-store.js';
import { assertSnapshotId, type SnapshotMeta } from '../../storage/snapshots.js';
import { isProcessAlive } from '../../util/process.js';
import { assertSandboxId, DriverBase, SUN_PATH_MAX } from '../base/driver-base.js';
import { DriverError } from '../errors.js';
import type { SandboxRuntime, SandboxSpec, SnapshotResult } from '../types.js';
import { ChApi, ChApiError } from './api.js';
import { AGENT_VSOCK_PORT } from './config.js';
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
}

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
    return { version: CH_RECORD_VERSION, driver: 'cloud-hypervisor', id: spec.id, owner: this.options.ownerId, spec, status: 'creating', diskDir: this.newDiskDir(spec.id), createdAt: now, updatedAt: now };
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

  protected validateSpec(spec: SandboxSpec): void {
    assertSandboxId(spec.id);
    const invalid = (message: string) => new DriverError('validation_failed', message);
    if (spec.image !== 'default') throw invalid(`unknown image "${spec.image}" (the cloud-hypervisor driver has only "default")`);
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

export function lastChainElement(error: unknown): string {
  if (error instanceof VmOperationError || error instanceof ChApiError) return error.chain[error.chain.length - 1] ?? error.message;
  return (error as Error)?.message?.split('\n')[0] ?? String(error);
}
