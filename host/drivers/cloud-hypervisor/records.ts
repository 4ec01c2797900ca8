// Per-sandbox record of the Cloud Hypervisor driver (`<dataDir>/sandboxes/<id>/record.json`),
// written atomically like the local driver's, holding what a restarted host agent needs to adopt
// the VMM (pid + start time, slot) or to finish/roll back an operation it died in.
import { randomBytes } from 'node:crypto';
import { readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { SandboxSpec } from '../types.js';
import type { VmState } from './api.js';

const RECORD_FILE = 'record.json';
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
  slot?: { index: number; netns: string; hostInterface: string; hostAddress: string; sandboxAddress: string };
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
  /** The operation in flight, so init() can finish or roll it back after a crash. */
  operation?: { kind: 'pause' | 'unpause' | 'stop' | 'fork-source' | 'snapshot'; startedAt: string };
  forkedFrom?: string;
  createdAt: string;
  updatedAt: string;
}

export async function writeChRecord(sandboxDir: string, record: ChRecord): Promise<void> {
  const path = join(sandboxDir, RECORD_FILE);
  const temp = `${path}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  record.updatedAt = new Date().toISOString();
  await writeFile(temp, `${JSON.stringify(record, null, 2)}\n`, { mode: 0o600 });
  await rename(temp, path);
}

export async function readChRecord(sandboxDir: string): Promise<ChRecord | undefined> {
  try {
    const record = JSON.parse(await readFile(join(sandboxDir, RECORD_FILE), 'utf8')) as ChRecord;
    return record.version === CH_RECORD_VERSION && record.driver === 'cloud-hypervisor' ? record : undefined;
  } catch {
    return undefined;
  }
}
