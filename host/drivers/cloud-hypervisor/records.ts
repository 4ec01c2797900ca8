// Per-sandbox record of the Cloud Hypervisor driver (`<dataDir>/sandboxes/<id>/record.json`),
// written atomically by base/records.ts like the local driver's, holding what a restarted host
// agent needs to adopt the VMM (pid + start time, slot) or to finish/roll back an operation it
// died in.
import { readRecordFile, writeRecordFile } from '../base/records.js';
import type { Slot } from '../../network/slots.js';
import type { SandboxSpec } from '../types.js';
import type { VmState } from './api.js';
export const CH_RECORD_VERSION = 1;

/**
 * `error`: a CH call failed or left the VM in an unexpected state; `lastError` has CH's chain and
 * `observedState` what vm.info said afterwards (the runtime is reported from that).
 */
export type ChRecordStatus = 'creating' | 'starting' | 'running' | 'paused' | 'stopping' | 'stopped' | 'error';

export interface MemorySnapshotRef {
  /** Directory with config.json, state.json, memory-ranges, rootfs.img, snapshot.json. */
  dir: string;
  takenAt: string;
  chVersion: string;
}

export interface ChLastError {
  operation: string;
  message: string;
  /** CH's error chain (outermost first); empty for non-API failures. */
  chain: string[];
  status?: number;
  observedState?: VmState | 'unreachable';
  at: string;
}

export interface ChRecord {
  version: number;
  driver: 'cloud-hypervisor';
  id: string;
  owner: string;
  spec: SandboxSpec;
  status: ChRecordStatus;
  slot?: Slot;
  pid?: number;
  pidStartTime?: string;
  chVersion?: string;
  /** Where rootfs.img and snapshot generations live (the reflink store or the sandbox dir). */
  diskDir: string;
  /** The memory snapshot a stop left behind; a start restores from it. */
  memorySnapshot?: MemorySnapshotRef;
  /** The snapshot a running VM was restored from (OnDemand keeps reading its memory-ranges). */
  restoredFrom?: string;
  lastError?: ChLastError;
  /**
   * What the running VM was created with (vm.create): its boot memory (virtio-mem can plug
   * above it, never unplug below) and the ceilings of a live resize. Absent = no resize room
   * (a VM booted before live resize existed).
   */
  vmShape?: { bootVcpus: number; bootMemoryMiB: number; maxVcpus: number; maxMemoryMiB: number };
  /** The operation in flight, so init() can finish or roll it back after a crash. */
  operation?: { kind: 'pause' | 'unpause' | 'stop' | 'fork-source' | 'snapshot' | 'resize'; startedAt: string };
  forkedFrom?: string;
  /**
   * The image the disk was made from (`default` or an OCI image id): a create from a snapshot or a
   * fork keeps its source's, whatever its own spec names, and the boot (init, helpers) follows it.
   */
  diskImage?: string;
  createdAt: string;
  updatedAt: string;
}

export function writeChRecord(sandboxDir: string, record: ChRecord): Promise<void> {
  return writeRecordFile(sandboxDir, record);
}

export function readChRecord(sandboxDir: string): Promise<ChRecord | undefined> {
  return readRecordFile<ChRecord>(sandboxDir, (record) => record.version === CH_RECORD_VERSION && record.driver === 'cloud-hypervisor');
}
