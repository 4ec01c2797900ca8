// The `code-interpreter` image for the Cloud Hypervisor driver: the VM image's tree (vm-image.ts)
// with what code-interpreter-image.ts adds to the local default image (the same function, so
// both drivers' images have the same kernels and packages), as its own ext4 disk. VMs boot it
// with the VM image's kernel and initramfs.
//
// Two cache levels, as vm-image.ts: the tree (`tree/` + `tree.json`: apt, minutes) keyed by the
// VM tree it was copied from and the code-interpreter inputs, and the disk (`rootfs.img` +
// `manifest.json`, written last) redone when only the guest files (the agent bundle) changed.
// Under <imagesDir>/vm-code-interpreter-<key>/, so versions coexist like the local image's.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { removeTree, writeFileAtomic } from '../util/fs.js';
import { acquireBuildLock } from './base-image.js';
import { CODE_INTERPRETER_INPUTS, installCodeInterpreter } from './code-interpreter-image.js';
import { runWithProgress } from './run-with-progress.js';
import { ensureVmImage, installGuestFiles, VM_IMAGE_NAME, type EnsureVmImageOptions, type VmImage } from './vm-image.js';

export const VM_CODE_INTERPRETER_IMAGE = 'vm-code-interpreter';

export interface VmCodeInterpreterManifest {
  name: typeof VM_CODE_INTERPRETER_IMAGE;
  key: string;
  /** The VM image's guest files this disk has (a new agent bundle redoes the disk only). */
  guestFilesSha256: string;
  kernelVersion: string;
  diskSizeMiB: number;
  builtAt: string;
  treeSeconds: number;
  imageSeconds: number;
}

export interface VmCodeInterpreterImage {
  rootfs: string;
  manifest: VmCodeInterpreterManifest;
}

export interface EnsureVmCodeInterpreterImageOptions extends EnsureVmImageOptions {
  /** Disk size of the image (sparse; default 8 GiB: the tree is about 2.5 GB). */
  codeInterpreterDiskSizeMiB?: number;
  /** Adds the code interpreter to the tree (tests substitute a fake: the real one needs root, apt and the registries). */
  installCodeInterpreter?: (tree: string, progress: (line: string) => void) => Promise<void>;
}

const DEFAULT_DISK_SIZE_MIB = 8192;

/** The key of the image on the VM tree in `vmImageDir` (undefined while that tree is not built). */
async function keyFor(vmImageDir: string): Promise<string | undefined> {
  const tree = await readFile(join(vmImageDir, 'tree.json'), 'utf8').then((t) => JSON.parse(t) as { key: string }).catch(() => undefined);
  if (!tree) return undefined;
  return createHash('sha256').update(JSON.stringify({ vmTree: tree.key, ...CODE_INTERPRETER_INPUTS })).digest('hex').slice(0, 16);
}

/** Where the image on today's tree of the VM image `vmImageName` lives (undefined while that tree is not built). */
export async function vmCodeInterpreterImageDir(imagesDir: string, vmImageName = VM_IMAGE_NAME): Promise<{ dir: string; key: string } | undefined> {
  const key = await keyFor(join(imagesDir, vmImageName));
  return key ? { dir: join(imagesDir, `${VM_CODE_INTERPRETER_IMAGE}-${key}`), key } : undefined;
}

/** The complete image for the VM image `vmImage` (its tree and guest files), if it is built. */
export async function readCompleteVmCodeInterpreterImage(imagesDir: string, vmImage: VmImage, vmImageName = VM_IMAGE_NAME): Promise<VmCodeInterpreterImage | undefined> {
  const where = await vmCodeInterpreterImageDir(imagesDir, vmImageName);
  if (!where) return undefined;
  const { dir, key } = where;
  try {
    const manifest = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8')) as VmCodeInterpreterManifest;
    if (manifest.key !== key || manifest.guestFilesSha256 !== vmImage.manifest.guestFilesSha256) return undefined;
    await stat(join(dir, 'rootfs.img'));
    return { rootfs: join(dir, 'rootfs.img'), manifest };
  } catch {
    return undefined;
  }
}

/** Builds (or reuses) the VM image first, then this image on its tree. */
export async function ensureVmCodeInterpreterImage(options: EnsureVmCodeInterpreterImageOptions): Promise<VmCodeInterpreterImage> {
  const progress = options.onProgress ?? (() => {});
  const vmImage = await ensureVmImage(options);
  const vmImageName = options.name ?? VM_IMAGE_NAME;
  const cached = await readCompleteVmCodeInterpreterImage(options.imagesDir, vmImage, vmImageName);
  if (cached) return cached;
  const vmImageDir = join(options.imagesDir, vmImageName);
  const where = await vmCodeInterpreterImageDir(options.imagesDir, vmImageName);
  if (!where) throw new Error(`vm image ${vmImageName}: no tree.json after its build`);
  const { dir, key } = where;
  await mkdir(dir, { recursive: true });
  const release = await acquireBuildLock(join(dir, '.lock'), options.lockWaitMs ?? 30 * 60_000);
  try {
    const meanwhile = await readCompleteVmCodeInterpreterImage(options.imagesDir, vmImage, vmImageName);
    if (meanwhile) return meanwhile;
    const tree = await ensureTree(dir, key, join(vmImageDir, 'tree'), options, progress);
    return await buildDisk(dir, key, tree, vmImage, options, progress);
  } finally {
    await release();
  }
}

async function ensureTree(dir: string, key: string, vmTree: string, options: EnsureVmCodeInterpreterImageOptions, progress: (line: string) => void): Promise<{ dir: string; seconds: number }> {
  const tree = join(dir, 'tree');
  const marker = join(dir, 'tree.json');
  const existing = await readFile(marker, 'utf8').then((t) => JSON.parse(t) as { key: string; seconds: number }).catch(() => undefined);
  if (existing?.key === key && (await stat(join(tree, 'usr')).catch(() => undefined))) return { dir: tree, seconds: existing.seconds };
  for (const entry of await readdir(dir)) if (entry.startsWith('.tree-')) await removeTree(join(dir, entry));
  const temp = join(dir, `.tree-${process.pid}`);
  const started = Date.now();
  progress(`vm image ${VM_CODE_INTERPRETER_IMAGE}: copying the VM image's tree`);
  await runWithProgress('cp', ['-a', '--reflink=auto', vmTree, temp], () => {}, { what: 'copying the VM tree', timeoutMs: 10 * 60_000 });
  await (options.installCodeInterpreter ?? ((t, onLine) => installCodeInterpreter(t, onLine, () => {}, options.npmBinary)))(temp, progress);
  await rm(marker, { force: true });
  await removeTree(tree);
  await rename(temp, tree);
  const seconds = Math.round((Date.now() - started) / 1000);
  await writeFileAtomic(marker, `${JSON.stringify({ key, seconds })}\n`);
  return { dir: tree, seconds };
}

async function buildDisk(dir: string, key: string, tree: { dir: string; seconds: number }, vmImage: VmImage, options: EnsureVmCodeInterpreterImageOptions, progress: (line: string) => void): Promise<VmCodeInterpreterImage> {
  const started = Date.now();
  await rm(join(dir, 'manifest.json'), { force: true });
  // The agent and boot configuration of today's VM image (the copied tree may have older ones).
  await installGuestFiles(tree.dir, options);
  const diskSizeMiB = options.codeInterpreterDiskSizeMiB ?? DEFAULT_DISK_SIZE_MIB;
  const temp = join(dir, 'rootfs.img.partial');
  await rm(temp, { force: true });
  progress(`vm image ${VM_CODE_INTERPRETER_IMAGE}: mkfs.ext4 -d (${diskSizeMiB} MiB, sparse)`);
  await run('mkfs.ext4', ['-q', '-F', '-L', 'rootfs', '-E', 'root_owner=0:0', '-d', tree.dir, temp, `${diskSizeMiB}M`], 20 * 60_000);
  await run('e2fsck', ['-fy', temp], 20 * 60_000).catch((error: Error) => {
    // e2fsck exits 1 when it fixed something; only worse is a failure.
    if (!/\(exit code 1\)/.test(error.message)) throw error;
  });
  await rename(temp, join(dir, 'rootfs.img'));
  const manifest: VmCodeInterpreterManifest = {
    name: VM_CODE_INTERPRETER_IMAGE,
    key,
    guestFilesSha256: vmImage.manifest.guestFilesSha256,
    kernelVersion: vmImage.manifest.kernelVersion,
    diskSizeMiB,
    builtAt: new Date().toISOString(),
    treeSeconds: tree.seconds,
    imageSeconds: Math.round((Date.now() - started) / 1000),
  };
  await writeFileAtomic(join(dir, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  progress(`vm image ${VM_CODE_INTERPRETER_IMAGE} ready (tree ${tree.seconds} s, disk ${manifest.imageSeconds} s)`);
  return { rootfs: join(dir, 'rootfs.img'), manifest };
}

function run(file: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${file} ${args.join(' ')} failed (exit code ${(error as { code?: unknown }).code}): ${stderr.trim() || error.message}`));
      else resolve(stdout);
    });
  });
}
