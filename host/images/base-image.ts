// The default sandbox image: a Debian minbase tree built with debootstrap, cached on disk and
// shared read-only by every sandbox (it is the overlayfs lower layer of the local driver).
//
// Layout under <imagesDir>/<name>/:
//   rootfs/          the finished tree (never modified once the manifest exists)
//   manifest.json    written last: its presence is what makes the image "complete"
//   .lock            O_EXCL lock file (pid + start time of the builder) so only one process builds
//   .build-<pid>-<n> temporary build directory, renamed onto rootfs/ when debootstrap succeeds
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { mkdir, open, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createInterface } from 'node:readline';
import { removeTree, writeFileAtomic } from '../util/fs.js';
import { processStartTime } from '../util/process.js';
import { installLanguageServers, LANGUAGE_SERVER_PACKAGES } from './language-servers.js';

export const DEFAULT_IMAGE_PACKAGES = [
  'bash',
  'coreutils',
  'python3',
  'git',
  'curl',
  'ca-certificates',
  'procps',
  'iproute2',
  'less',
  // The host's node binary (bind-mounted into every sandbox for the guest agent) is linked
  // against libstdc++; it is usually pulled in anyway, but the agent must never depend on luck.
  'libstdc++6',
  ...LANGUAGE_SERVER_PACKAGES,
] as const;

export interface ImageManifest {
  name: string;
  suite: string;
  mirror: string;
  variant: string;
  packages: string[];
  builtAt: string;
  buildSeconds: number;
  sizeBytes: number;
}

export interface EnsureBaseImageOptions {
  imagesDir: string;
  name?: 'default';
  onProgress?: (line: string) => void;
  suite?: string;
  mirror?: string;
  /** How long a second process waits for another one's build before giving up. */
  lockWaitMs?: number;
  /** The debootstrap program (tests substitute a fake one to exercise locking quickly). */
  debootstrapBinary?: string;
  /** The npm program that installs the language servers (tests substitute a fake one too). */
  npmBinary?: string;
}

export interface BaseImage {
  rootfs: string;
  manifest: ImageManifest;
}

const DEFAULT_SUITE = 'bookworm';
const DEFAULT_MIRROR = 'http://deb.debian.org/debian';
const DEFAULT_LOCK_WAIT_MS = 15 * 60_000;
const LOCK_POLL_MS = 500;

/** Returns the cached image, building it first when it is missing or incomplete. */
export async function ensureBaseImage(options: EnsureBaseImageOptions): Promise<BaseImage> {
  const name = options.name ?? 'default';
  const imageDir = join(options.imagesDir, name);
  const existing = await readCompleteImage(imageDir);
  if (existing) return existing;

  await mkdir(imageDir, { recursive: true });
  const releaseLock = await acquireBuildLock(join(imageDir, '.lock'), options.lockWaitMs ?? DEFAULT_LOCK_WAIT_MS);
  try {
    // Another process may have finished the build while we waited for the lock.
    const builtMeanwhile = await readCompleteImage(imageDir);
    if (builtMeanwhile) return builtMeanwhile;
    await removeStaleBuildDirs(imageDir);
    return await buildImage(imageDir, name, options);
  } finally {
    await releaseLock();
  }
}

/** The image is complete only when both the tree and the manifest (written last) exist. */
export async function readCompleteImage(imageDir: string): Promise<BaseImage | undefined> {
  const rootfs = join(imageDir, 'rootfs');
  try {
    const manifest = JSON.parse(await readFile(join(imageDir, 'manifest.json'), 'utf8')) as ImageManifest;
    const rootStat = await stat(join(rootfs, 'usr', 'bin'));
    if (!rootStat.isDirectory()) return undefined;
    return { rootfs, manifest };
  } catch {
    return undefined;
  }
}

async function buildImage(imageDir: string, name: string, options: EnsureBaseImageOptions): Promise<BaseImage> {
  const suite = options.suite ?? DEFAULT_SUITE;
  const mirror = options.mirror ?? DEFAULT_MIRROR;
  const packages = [...DEFAULT_IMAGE_PACKAGES];
  const buildDir = join(imageDir, `.build-${process.pid}-${randomBytes(4).toString('hex')}`);
  const target = join(buildDir, 'rootfs');
  const started = Date.now();
  const progress = options.onProgress ?? (() => {});
  await mkdir(buildDir, { recursive: true });
  try {
    progress(`building image ${name}: debootstrap ${suite} (minbase) from ${mirror}`);
    await runDebootstrap(options.debootstrapBinary ?? 'debootstrap', ['--variant=minbase', `--include=${packages.join(',')}`, suite, target, mirror], progress);
    await installLanguageServers(target, progress, options.npmBinary);
    await prepareTreeForSandboxes(target);
    const rootfs = join(imageDir, 'rootfs');
    // A rootfs without a manifest is the remains of a build that crashed after its rename.
    await removeTree(rootfs);
    await rename(target, rootfs);
    const manifest: ImageManifest = {
      name,
      suite,
      mirror,
      variant: 'minbase',
      packages,
      builtAt: new Date().toISOString(),
      buildSeconds: Math.round((Date.now() - started) / 1000),
      sizeBytes: diskUsageBytes(rootfs),
    };
    await writeFileAtomic(join(imageDir, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
    progress(`image ${name} ready in ${manifest.buildSeconds} s (${Math.round(manifest.sizeBytes / 1e6)} MB)`);
    return { rootfs, manifest };
  } finally {
    await removeTree(buildDir);
  }
}

/** Mount points the local driver needs, created in the image so sandbox upper layers stay clean. */
async function prepareTreeForSandboxes(rootfs: string): Promise<void> {
  await mkdir(join(rootfs, '.nestbox'), { recursive: true, mode: 0o755 });
  // debootstrap copies the build host's resolv.conf; each sandbox gets its own in its upper layer.
  await writeFile(join(rootfs, 'etc', 'resolv.conf'), '');
}

export function runDebootstrap(program: string, args: string[], progress: (line: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const tail: string[] = [];
    const onLine = (line: string): void => {
      tail.push(line);
      if (tail.length > 20) tail.shift();
      progress(line);
    };
    createInterface({ input: child.stdout }).on('line', onLine);
    createInterface({ input: child.stderr }).on('line', onLine);
    child.once('error', reject);
    child.once('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`debootstrap failed (${signal ?? `exit ${code}`}):\n${tail.join('\n')}`));
    });
  });
}

// ---- lock -----------------------------------------------------------------------------------

interface LockOwner {
  pid: number;
  startTime: string;
}

/** Takes the O_EXCL lock file, waiting (bounded) while a live process holds it. */
export async function acquireBuildLock(lockPath: string, waitMs: number): Promise<() => Promise<void>> {
  const deadline = Date.now() + waitMs;
  const me: LockOwner = { pid: process.pid, startTime: processStartTime(process.pid) ?? '' };
  for (;;) {
    try {
      const handle = await open(lockPath, fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_WRONLY, 0o644);
      await handle.writeFile(JSON.stringify(me));
      await handle.close();
      return async () => {
        await rm(lockPath, { force: true });
      };
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    if (await lockIsStale(lockPath)) {
      // The builder died (kill -9, reboot); its temp dir is cleaned once we hold the lock.
      await rm(lockPath, { force: true });
      continue;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${waitMs} ms waiting for the image build lock ${lockPath}`);
    await sleep(LOCK_POLL_MS);
  }
}

async function lockIsStale(lockPath: string): Promise<boolean> {
  let owner: LockOwner;
  try {
    owner = JSON.parse(await readFile(lockPath, 'utf8')) as LockOwner;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return false;
    // Empty or torn file: the holder writes it right after creating it, so give it a moment.
    const age = Date.now() - (await stat(lockPath).then((s) => s.mtimeMs).catch(() => Date.now()));
    return age > 5_000;
  }
  const startTime = processStartTime(owner.pid);
  // A recycled pid has a different start time, so it does not keep a dead builder's lock alive.
  return startTime === undefined || startTime !== owner.startTime;
}

// ---- filesystem helpers ---------------------------------------------------------------------

async function removeStaleBuildDirs(imageDir: string): Promise<void> {
  for (const entry of await readdir(imageDir)) {
    if (entry.startsWith('.build-')) await removeTree(join(imageDir, entry));
  }
}

function diskUsageBytes(path: string): number {
  try {
    const out = execFileSync('du', ['-sb', '--one-file-system', path], { encoding: 'utf8' });
    return Number(out.split('\t')[0]) || 0;
  } catch {
    return 0;
  }
}
