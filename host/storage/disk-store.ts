// Where sandbox disks (overlay upper dirs) and snapshot layers live, and how they are copied.
// Fork and snapshot copy an upper dir; on a reflink filesystem (XFS with reflink=1, btrfs) that
// copy shares every data block and costs only metadata, so a 1 GiB sandbox forks as fast as an
// empty one (host-runtime.md §7). The data dir is probed once; if it cannot reflink and the
// operator configured `reflinkStore`, a sparse file is formatted as XFS and loop-mounted at
// `<dataDir>/store`, and disks and snapshots live there instead.
//
// Copies are made with `cp -a` (plus `--reflink=always` when available): it keeps modes, owners,
// timestamps, hard links, xattrs (`trusted.overlay.*` opaque/redirect markers, file
// capabilities) and device nodes — overlayfs whiteouts are 0/0 character devices, and losing
// one would resurrect a file the sandbox deleted.
import { randomBytes } from 'node:crypto';
import { constants as fsConstants, existsSync, readFileSync } from 'node:fs';
import { copyFile, lstat, mkdir, open, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import type { DiskCopyMode } from '../drivers/types.js';
import { assertSafeHostPath } from '../util/fs.js';
import { mountedFsType, mountPointsUnder, readMountinfo } from '../util/mounts.js';
import { runCommand } from '../util/run.js';

const run = (file: string, args: string[], timeoutMs = 60_000) => runCommand(file, args, { timeoutMs });

export type { DiskCopyMode };

export interface ReflinkStoreOptions {
  /** The sparse file holding the XFS filesystem (created on first use). */
  imagePath: string;
  /** Apparent size of that file; blocks are only allocated as sandboxes write. */
  sizeBytes: number;
}

export interface DiskStoreOptions {
  dataDir: string;
  reflinkStore?: ReflinkStoreOptions | 'off';
  log?: (message: string) => void;
}

/** mkfs.xfs refuses filesystems below 300 MB. */
const MIN_STORE_BYTES = 512 * 1024 * 1024;
const STORE_DIR = 'store';

export class DiskStore {
  private constructor(
    /** Root under which `sandboxes/<id>/{upper,work}` and `snapshots/` live. */
    readonly root: string,
    readonly mode: DiskCopyMode,
    readonly probes: Record<string, string | number | boolean>,
  ) {}

  /**
   * Probes the data dir and sets up (or re-mounts, after a reboot) the loop-mounted XFS store
   * when configured. Idempotent: an existing mount is reused.
   */
  static async open(options: DiskStoreOptions): Promise<DiskStore> {
    const dataDir = resolve(options.dataDir);
    const log = options.log ?? (() => {});
    await mkdir(dataDir, { recursive: true, mode: 0o700 });
    const nativeReflink = await probeReflink(dataDir);
    const configured = options.reflinkStore && options.reflinkStore !== 'off' ? options.reflinkStore : undefined;
    // `reflink`: whether disk copies reflink (here or in the store); `reflinkDataDir`: the data dir itself.
    const probes: Record<string, string | number | boolean> = { reflink: nativeReflink, reflinkDataDir: nativeReflink, reflinkStore: 'off' };
    if (nativeReflink) {
      probes.diskCopy = 'reflink';
      if (configured) probes.reflinkStore = 'not needed: the data dir itself supports reflink';
      return new DiskStore(dataDir, 'reflink', probes);
    }
    if (!configured) {
      probes.diskCopy = 'copy';
      return new DiskStore(dataDir, 'copy', probes);
    }
    const mountPoint = join(dataDir, STORE_DIR);
    await mountReflinkStore(configured, mountPoint, log);
    if (!(await probeReflink(mountPoint))) throw new Error(`the reflink store at ${mountPoint} cannot reflink (is ${configured.imagePath} an XFS with reflink=1?)`);
    probes.reflink = true;
    probes.reflinkStore = mountPoint;
    probes.reflinkStoreImage = configured.imagePath;
    probes.diskCopy = 'reflink';
    return new DiskStore(mountPoint, 'reflink', probes);
  }

  /**
   * Clones a disk image file (a sandbox's or a snapshot's `disk.img`): on a reflink store the
   * clone shares every block with its source (FICLONE), otherwise the allocated blocks are
   * copied and holes stay holes. `target` appears complete or not at all.
   */
  async cloneImage(source: string, target: string): Promise<void> {
    const temp = `${target}.partial-${randomBytes(4).toString('hex')}`;
    try {
      if (this.mode === 'reflink') await copyFile(source, temp, fsConstants.COPYFILE_FICLONE_FORCE);
      else await run('cp', ['--sparse=always', '--', source, temp], 0);
      await rename(temp, target);
    } catch (error) {
      await rm(temp, { force: true }).catch(() => {});
      throw error;
    }
  }

  /** Copies a directory tree to `target` (which must not exist); on failure nothing is left at `target`. */
  async copyTree(source: string, target: string): Promise<void> {
    const args = ['-a', '--no-target-directory'];
    if (this.mode === 'reflink') args.push('--reflink=always');
    try {
      await run('cp', [...args, '--', source, target], 0);
    } catch (error) {
      await rm(target, { recursive: true, force: true }).catch(() => {});
      throw error;
    }
  }
}

/** Whether `dir` can clone a file (FICLONE): the only reliable test is to try it. */
export async function probeReflink(dir: string): Promise<boolean> {
  const source = join(dir, `.reflink-probe-${randomBytes(4).toString('hex')}`);
  const target = `${source}.clone`;
  try {
    await writeFile(source, 'nestbox reflink probe\n');
    await copyFile(source, target, fsConstants.COPYFILE_FICLONE_FORCE);
    return true;
  } catch {
    return false;
  } finally {
    await rm(source, { force: true });
    await rm(target, { force: true });
  }
}

/** Total apparent size of the regular files under `dir` (what a full copy would write). */
export async function treeSizeBytes(dir: string): Promise<number> {
  let total = 0;
  const pending = [dir];
  while (pending.length) {
    const current = pending.pop()!;
    const entries = await readdir(current, { withFileTypes: true }).catch(() => []);
    for (const entry of entries) {
      const path = join(current, entry.name);
      if (entry.isDirectory()) pending.push(path);
      else if (entry.isFile()) total += (await lstat(path).catch(() => undefined))?.size ?? 0;
    }
  }
  return total;
}

async function mountReflinkStore(options: ReflinkStoreOptions, mountPoint: string, log: (message: string) => void): Promise<void> {
  const imagePath = resolve(options.imagePath);
  assertSafeHostPath('reflink store image', imagePath);
  const mounted = mountedFsType(mountPoint);
  if (mounted === 'xfs') return;
  if (mounted) throw new Error(`${mountPoint} already has a ${mounted} filesystem mounted; expected the XFS reflink store`);
  if (!existsSync(imagePath)) await createStoreImage(imagePath, options.sizeBytes, log);
  await mkdir(mountPoint, { recursive: true, mode: 0o700 });
  const started = Date.now();
  // `-o loop` sets autoclear: unmounting detaches the loop device, so nothing leaks.
  await run('mount', ['-t', 'xfs', '-o', 'loop,discard', '--', imagePath, mountPoint]);
  // Read the backing file with O_DIRECT so data is not cached twice (loop + XFS); optional.
  const device = loopDeviceOf(mountPoint);
  if (device) await run('losetup', ['--direct-io=on', device]).catch((error) => log(`reflink store: direct I/O not enabled on ${device}: ${(error as Error).message}`));
  log(`reflink store: mounted ${imagePath} at ${mountPoint}${device ? ` (${device})` : ''} in ${Date.now() - started} ms`);
}

/** Sparse file + mkfs under a temporary name, renamed when complete: a crash never leaves a half-formatted image under the real name. */
async function createStoreImage(imagePath: string, sizeBytes: number, log: (message: string) => void): Promise<void> {
  if (!Number.isSafeInteger(sizeBytes) || sizeBytes < MIN_STORE_BYTES) {
    throw new Error(`reflinkStore.sizeBytes must be at least ${MIN_STORE_BYTES} (512 MiB), got ${sizeBytes}`);
  }
  await mkdir(dirname(imagePath), { recursive: true, mode: 0o700 });
  const temp = `${imagePath}.partial`;
  const handle = await open(temp, 'w', 0o600);
  try {
    await handle.truncate(sizeBytes);
  } finally {
    await handle.close();
  }
  const started = Date.now();
  await run('mkfs.xfs', ['-q', '-f', '-m', 'reflink=1', '-L', 'nestbox', '--', temp], 120_000);
  await rename(temp, imagePath);
  log(`reflink store: created ${imagePath} (${Math.round(sizeBytes / 2 ** 30)} GiB sparse XFS) in ${Date.now() - started} ms`);
}

function loopDeviceOf(mountPoint: string): string | undefined {
  return readMountinfo().find((entry) => entry.mountPoint === mountPoint && entry.source?.startsWith('/dev/loop'))?.source;
}

/**
 * Unmounts the reflink store of a data dir (the loop device detaches itself). For tests and
 * operators; the driver never unmounts it, since sandboxes keep running across host agents.
 */
export async function unmountReflinkStore(dataDir: string): Promise<void> {
  const mountPoint = join(resolve(dataDir), STORE_DIR);
  if (!mountedFsType(mountPoint)) return;
  const device = loopDeviceOf(mountPoint);
  const backingFile = device ? readFileSync(`/sys/block/${device.slice('/dev/'.length)}/loop/backing_file`, 'utf8').trim() : undefined;
  // Sandbox disks and snapshot images are mounted inside the store (disk-quota.ts): they go first.
  for (const nested of mountPointsUnder(mountPoint).filter((path) => path !== mountPoint).reverse()) {
    await run('umount', ['-l', '--', nested]).catch(() => {});
  }
  await run('umount', ['--', mountPoint]);
  // Autoclear detaches on the last close. Should the device still be attached (something held
  // it open), detach it — but only a device still backed by our image, never a reused number.
  if (!backingFile) return;
  // The kernel detaches an autoclear device a moment after the last close, so wait (bounded)
  // until nothing is attached to our image any more, detaching what is still there.
  for (let attempt = 0; attempt < 50; attempt++) {
    const attached = await run('losetup', ['-j', backingFile]).catch(() => '');
    const loops = attached.split('\n').map((line) => /^(\/dev\/loop\d+):/.exec(line)?.[1]).filter((l): l is string => !!l);
    if (loops.length === 0) return;
    for (const loop of loops) await run('losetup', ['-d', loop]).catch(() => {});
    await new Promise((r) => setTimeout(r, 100));
  }
}

