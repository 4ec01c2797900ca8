// Per-sandbox disk quotas: every sandbox's writable layer (overlay upper/ and work/) lives on a
// file system of its own, an ext4 in a sparse file `<diskDir>/disk.img` of the sandbox's
// diskGiB, loop-mounted at `<diskDir>/fs`. Why this and not XFS project quotas on the reflink
// store: kernels built without CONFIG_XFS_QUOTA (this one, for instance) refuse `prjquota`, and
// a file system per sandbox holds on every kernel with loop devices. It gives, for free:
//   - a hard byte limit and a hard inode limit (`mkfs.ext4 -N`), both ENOSPC inside the sandbox;
//   - `df` and `df -i` inside the sandbox show them, since overlayfs answers statfs from its
//     upper dir's file system;
//   - the host only ever gives a sandbox what it wrote, up to its size: the file is sparse, and
//     `discard` punches the blocks of deleted files back out of it;
//   - a fork clones the image file (FICLONE on the reflink store): the child starts with its
//     source's usage counted against its own limit, while the blocks stay shared on the host
//     until one side rewrites them.
// A sparse image whose file system is mounted stays mounted while its sandbox exists (running
// or stopped: file views and forks read it), and is mounted again after a reboot.
import { randomBytes } from 'node:crypto';
import { existsSync, statfsSync } from 'node:fs';
import { mkdir, open, rename, rm, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { isMountPoint } from '../util/mounts.js';
import { runCommand } from '../util/run.js';

const run = (file: string, args: string[], timeoutMs = 60_000) => runCommand(file, args, { timeoutMs });

export const DISK_IMAGE_FILE = 'disk.img';
export const DISK_MOUNT_DIR = 'fs';
/** ext4 below this has too little room for its journal and metadata to be worth anything. */
export const MIN_DISK_BYTES = 64 * 2 ** 20;
const MIN_INODES = 1024;

export interface DiskQuota {
  /** Size of the sandbox's file system (its disk limit). */
  sizeBytes: number;
  /** Inodes of that file system (its inode limit; ext4 rounds up to a multiple of its group size). */
  inodes: number;
}

export function diskImagePath(diskDir: string): string {
  return join(diskDir, DISK_IMAGE_FILE);
}

export function diskMountPoint(diskDir: string): string {
  return join(diskDir, DISK_MOUNT_DIR);
}

/**
 * Creates the sparse image and its ext4 (under a temporary name, renamed when complete) and
 * mounts it. Inode tables and the journal are not zeroed: a sparse file reads as zeros already,
 * and zeroing would allocate host blocks for nothing.
 */
export async function createDiskImage(diskDir: string, quota: DiskQuota, mountOptions: { nodevNosuid?: boolean } = {}): Promise<void> {
  if (!Number.isSafeInteger(quota.sizeBytes) || quota.sizeBytes < MIN_DISK_BYTES) throw new Error(`disk size must be at least ${MIN_DISK_BYTES} bytes, got ${quota.sizeBytes}`);
  if (!Number.isSafeInteger(quota.inodes) || quota.inodes < MIN_INODES) throw new Error(`disk inodes must be at least ${MIN_INODES}, got ${quota.inodes}`);
  const image = diskImagePath(diskDir);
  const temp = `${image}.partial-${randomBytes(4).toString('hex')}`;
  try {
    const handle = await open(temp, 'w', 0o600);
    try {
      await handle.truncate(quota.sizeBytes);
    } finally {
      await handle.close();
    }
    // -m 0: no blocks reserved for root (the sandbox's root is the only user and gets them all).
    await run('mkfs.ext4', ['-q', '-F', '-m', '0', '-N', String(quota.inodes), '-L', 'nestbox-disk', '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', '--', temp], 60_000);
    await rename(temp, image);
  } catch (error) {
    await rm(temp, { force: true }).catch(() => {});
    throw error;
  }
  await mountDiskImage(diskDir, mountOptions);
}

/**
 * Mounts the image at `<diskDir>/fs` unless it already is (idempotent: init after a reboot or
 * a host-agent restart). A file system left frozen by a host agent that died during a fork or
 * snapshot is thawed.
 */
export async function mountDiskImage(diskDir: string, options: { readOnly?: boolean; nodevNosuid?: boolean } = {}): Promise<void> {
  const mountPoint = diskMountPoint(diskDir);
  if (isMountPoint(mountPoint)) {
    if (!options.readOnly) await run('fsfreeze', ['--unfreeze', mountPoint]).catch(() => {});
    return;
  }
  await mkdir(mountPoint, { recursive: true, mode: 0o700 });
  // `-o loop` sets autoclear (the loop device goes with the last unmount); `discard` gives the
  // blocks of deleted files back to the host; `noinit_itable` keeps ext4 from zeroing inode
  // tables in the background (see createDiskImage).
  const flags = (options.readOnly ? 'loop,ro,noload' : 'loop,discard,noinit_itable') + (options.nodevNosuid ? ',nodev,nosuid' : '');
  await run('mount', ['-t', 'ext4', '-o', flags, '--', diskImagePath(diskDir), mountPoint]);
}

/** Unmounts `<diskDir>/fs` if mounted; lazily, so a leftover reference never blocks a destroy. */
export async function unmountDiskImage(diskDir: string): Promise<void> {
  const mountPoint = diskMountPoint(diskDir);
  if (!isMountPoint(mountPoint)) return;
  await run('fsfreeze', ['--unfreeze', mountPoint]).catch(() => {});
  await run('umount', ['-l', '--', mountPoint]);
}

/**
 * Runs `task` with the disk's file system frozen (FIFREEZE): dirty data is written to the
 * image and the journal is checkpointed first, so a clone taken meanwhile is a clean file
 * system. Always thawed afterwards.
 */
export async function withDiskFrozen<T>(diskDir: string, task: () => Promise<T>): Promise<T> {
  const mountPoint = diskMountPoint(diskDir);
  await run('fsfreeze', ['--freeze', mountPoint]);
  try {
    return await task();
  } finally {
    await run('fsfreeze', ['--unfreeze', mountPoint]).catch(() => {});
  }
}

/** Whether this disk dir holds a sandbox disk image (sandboxes made before quotas do not). */
export function hasDiskImage(diskDir: string): boolean {
  return existsSync(diskImagePath(diskDir));
}

/** Size and usage of a mounted disk, as `df` inside the sandbox reports them. */
export function diskUsage(diskDir: string): { sizeBytes: number; usedBytes: number; inodes: number; usedInodes: number } {
  const stats = statfsSync(diskMountPoint(diskDir));
  return {
    sizeBytes: stats.blocks * stats.bsize,
    usedBytes: (stats.blocks - stats.bfree) * stats.bsize,
    inodes: stats.files,
    usedInodes: stats.files - stats.ffree,
  };
}

/** `diskUsage` without blocking the event loop (the usage sampler reads it for every sandbox). */
export async function readDiskUsage(diskDir: string): Promise<{ sizeBytes: number; usedBytes: number }> {
  const stats = await statfs(diskMountPoint(diskDir));
  return { sizeBytes: stats.blocks * stats.bsize, usedBytes: (stats.blocks - stats.bfree) * stats.bsize };
}

/** Inodes for a disk of `sizeBytes` at `perGiB` (never below ext4's useful minimum). */
export function inodesFor(sizeBytes: number, perGiB: number): number {
  return Math.max(MIN_INODES, Math.round((sizeBytes / 2 ** 30) * perGiB));
}


/**
 * Grows a stopped sandbox's disk to `sizeBytes` (never shrinks: a smaller size is an error),
 * offline: unmounted, the sparse image extended, checked (e2fsck -f, which resize2fs wants
 * first) and grown (resize2fs adds block groups, inodes with them), then mounted again. Online
 * growth would need CAP_SYS_RESOURCE, which a host agent in a container may lack. Every step is
 * idempotent, so a grow interrupted by a crash is finished by running it again.
 */
export async function growDiskImage(diskDir: string, sizeBytes: number): Promise<void> {
  const image = diskImagePath(diskDir);
  await unmountDiskImage(diskDir);
  try {
    const handle = await open(image, 'r+');
    try {
      const { size } = await handle.stat();
      if (size > sizeBytes) throw new Error(`disk image ${image} is ${size} bytes, more than ${sizeBytes}: disks only grow`);
      if (size < sizeBytes) await handle.truncate(sizeBytes);
    } finally {
      await handle.close();
    }
    // -p: fix what is safe without asking; exit 1 means "errors corrected", still fine.
    await run('e2fsck', ['-f', '-p', image], 300_000).catch((error: Error & { code?: number }) => {
      if (!/exit code 1\b/.test(String(error.message)) && (error as { code?: number }).code !== 1) throw error;
    });
    await run('resize2fs', [image], 300_000);
  } finally {
    await mountDiskImage(diskDir);
  }
}
