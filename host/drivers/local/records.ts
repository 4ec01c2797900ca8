// The local driver's per-sandbox record (`<dataDir>/sandboxes/<id>/record.json`, written
// atomically by base/records.ts): what a later host agent needs to adopt a running sandbox
// (launcher pid, slot, cgroups, id range) or to clean up after a crash.
import { readRecordFile, writeRecordFile } from '../base/records.js';
import type { Slot } from '../../network/slots.js';
import type { SandboxSpec } from '../types.js';

export { removeRecordTempFiles } from '../base/records.js';
const RECORD_VERSION = 1;

/**
 * `creating`/`starting` mark a launch in progress: finding one at init means the host agent died
 * mid-way, so the runtime is cleaned up (and a never-started create is removed entirely).
 * `paused` is a running sandbox whose cgroup is frozen.
 */
export type RecordStatus = 'creating' | 'starting' | 'running' | 'paused' | 'stopped';

/**
 * A freezer operation in flight, written before the cgroup is touched so that init() after a
 * crash knows whether to finish it (pause, unpause) or roll it back (a copy froze a running
 * sandbox for a consistent fork or snapshot: thaw it).
 */
export interface RecordOperation {
  /** `resize`: the record's spec and disk already hold the new sizes; init applies them again. */
  kind: 'pause' | 'unpause' | 'copy' | 'resize';
  startedAt: string;
}

export interface SandboxRecord {
  version: number;
  id: string;
  owner: string;
  spec: SandboxSpec;
  status: RecordStatus;
  /** The network slot while the sandbox runs. */
  slot?: Slot;
  cgroup?: { version: 1 | 2; paths: string[] };
  /** The host id range of its user namespace while it runs (id-ranges.ts). */
  idRange?: { index: number; base: number; count: number };
  /** Host pid of the outermost launcher process (unshare), plus its start time to detect pid reuse. */
  pid?: number;
  pidStartTime?: string;
  agentSocket: string;
  /** Snapshot ids of the read-only layers between the upper dir and the base image, topmost first. */
  layers?: string[];
  /** Directory holding upper/ and work/ (the reflink store); absent = the sandbox dir itself. */
  diskDir?: string;
  /**
   * The sandbox's own disk (disk-quota.ts): upper/ and work/ live in `<diskDir>/fs/`, an ext4 of
   * this size. Absent on sandboxes made before disk quotas (upper/ and work/ in diskDir itself).
   */
  disk?: { sizeBytes: number; inodes: number };
  /** The sandbox this one was forked from, for diagnostics. */
  forkedFrom?: string;
  operation?: RecordOperation;
  createdAt: string;
  updatedAt: string;
}

export function newRecord(spec: SandboxSpec, owner: string, agentSocket: string, status: RecordStatus): SandboxRecord {
  const now = new Date().toISOString();
  return { version: RECORD_VERSION, id: spec.id, owner, spec, status, agentSocket, createdAt: now, updatedAt: now };
}

export function writeRecord(sandboxDir: string, record: SandboxRecord): Promise<void> {
  return writeRecordFile(sandboxDir, record);
}

export function readRecord(sandboxDir: string): Promise<SandboxRecord | undefined> {
  return readRecordFile<SandboxRecord>(sandboxDir, (record) => record.version === RECORD_VERSION);
}
