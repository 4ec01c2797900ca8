// Resize on the local driver (issue 19): CPU and memory of a running sandbox are cgroup values
// written live (memory limits, CFS quota, cpuset: cgroups.ts resizeSandbox), the disk of a
// stopped one is its ext4 image grown (disk-quota.ts growDiskImage). Crash safety: the record
// is written with the new sizes and a `resize` operation before anything is touched, so a host
// agent killed half-way finds the target at init and applies it again (every step is
// idempotent); on a failure the old sizes are put back, in the kernel and in the record.
import { DriverError } from '../errors.js';
import type { ResizeResult, ResizeSpec } from '../types.js';
import { growDiskImage, diskUsage } from '../../storage/disk-quota.js';
import { formatCpuList, MemoryInUseError, type CgroupLimits, type Cgroups } from './cgroups.js';
import { writeRecord, type SandboxRecord } from './records.js';

export interface ResizeContext {
  cgroups: Cgroups;
  cgroupPath: string;
  sandboxDir: string;
  diskDir: string;
  pidsMax: number;
}

/** What the cgroups of a sandbox of this record should hold (cpuset: keeping `current` where it can). */
async function limitsOf(ctx: ResizeContext, record: SandboxRecord, current: number[]): Promise<CgroupLimits> {
  const cpusetCpus = ctx.cgroups.hasCpuset ? await ctx.cgroups.pickCpus(Math.ceil(record.spec.cpu), current, ctx.cgroupPath) : undefined;
  return { memoryBytes: record.spec.memoryMiB * 2 ** 20, cpus: record.spec.cpu, pidsMax: ctx.pidsMax, cpusetCpus };
}

export async function resizeRecord(ctx: ResizeContext, record: SandboxRecord, change: ResizeSpec): Promise<ResizeResult> {
  const live = record.status === 'running';
  if (!live && record.status !== 'stopped') throw new DriverError('invalid_state', `sandbox ${record.id} is ${record.status}; only a running or stopped sandbox is resized`);
  const oldSpec = { ...record.spec };
  const oldDisk = record.disk ? { ...record.disk } : undefined;
  if (change.diskGiB !== undefined) {
    if (live) throw new DriverError('invalid_state', `sandbox ${record.id} is running; its disk grows only while it is stopped`);
    if (!record.disk) throw new DriverError('not_supported', `sandbox ${record.id} predates disk quotas; its disk cannot be resized`);
    if (change.diskGiB * 2 ** 30 < record.disk.sizeBytes) throw new DriverError('validation_failed', `diskGiB: disks only grow (sandbox ${record.id} has ${record.disk.sizeBytes / 2 ** 30} GiB)`);
  }
  const current = live ? await ctx.cgroups.cpusetOf(ctx.cgroupPath) : [];
  const from = live ? await limitsOf(ctx, record, current) : undefined;
  if (from && current.length) from.cpusetCpus = formatCpuList(current);
  record.spec = { ...record.spec, ...(change.cpu !== undefined ? { cpu: change.cpu } : {}), ...(change.memoryMiB !== undefined ? { memoryMiB: change.memoryMiB } : {}), ...(change.diskGiB !== undefined ? { diskGiB: change.diskGiB } : {}) };
  if (record.disk && change.diskGiB !== undefined) record.disk = { ...record.disk, sizeBytes: change.diskGiB * 2 ** 30 };
  record.operation = { kind: 'resize', startedAt: new Date().toISOString() };
  await writeRecord(ctx.sandboxDir, record);
  try {
    await applyRecordSizes(ctx, record, from, change.diskGiB !== undefined);
  } catch (error) {
    record.spec = oldSpec;
    record.disk = oldDisk;
    record.operation = undefined;
    if (from) await ctx.cgroups.resizeSandbox(ctx.cgroupPath, await limitsOf(ctx, record, current), from).catch(() => {});
    await writeRecord(ctx.sandboxDir, record);
    if (error instanceof MemoryInUseError) throw new DriverError('conflict', `memoryMiB: ${error.message}`);
    throw error;
  }
  record.operation = undefined;
  await writeRecord(ctx.sandboxDir, record);
  return { cpu: record.spec.cpu, memoryMiB: record.spec.memoryMiB, diskGiB: record.disk ? record.disk.sizeBytes / 2 ** 30 : (record.spec.diskGiB ?? null), live };
}

/**
 * Puts the record's sizes in force: the cgroups of a running sandbox (from `from`, or from what
 * they hold now when adopting after a crash) and the disk image's size.
 */
export async function applyRecordSizes(ctx: ResizeContext, record: SandboxRecord, from: CgroupLimits | undefined, growDisk: boolean): Promise<void> {
  if (record.status === 'running' || record.status === 'paused') {
    const current = await ctx.cgroups.cpusetOf(ctx.cgroupPath);
    // After a crash nothing is known of what was written: every value is written again.
    const before = from ?? { memoryBytes: -1, cpus: -1, pidsMax: ctx.pidsMax, cpusetCpus: current.length ? formatCpuList(current) : undefined };
    await ctx.cgroups.resizeSandbox(ctx.cgroupPath, before, await limitsOf(ctx, record, current));
  }
  if (record.disk && growDisk) {
    await growDiskImage(ctx.diskDir, record.disk.sizeBytes);
    record.disk = { ...record.disk, inodes: diskUsage(ctx.diskDir).inodes };
  }
}
