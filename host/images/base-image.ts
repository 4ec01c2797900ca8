// The default sandbox image: a Debian minbase tree built with debootstrap, cached on disk and
// shared read-only by every sandbox (it is the overlayfs lower layer of the local driver).
//
// Layout under <imagesDir>/<name>/:
//   rootfs/          the finished tree (never modified once the manifest exists)
//   manifest.json    written last: its presence is what makes the image "complete"
//   .lock            O_EXCL lock file (pid + start time of the builder) so only one process builds
//   .build-<pid>-<n> temporary build directory, renamed onto rootfs/ when debootstrap succeeds
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { appendFile, chmod, chown, cp, mkdir, open, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { removeTree, writeFileAtomic } from '../util/fs.js';
import { processStartTime } from '../util/process.js';
import { aptInstall } from './chroot.js';
import { runWithProgress } from './run-with-progress.js';
import { installLanguageServers, LANGUAGE_SERVER_PACKAGES, LANGUAGE_SERVERS_IMAGE_KEY } from './language-servers.js';
import { installNodeRuntime, NODE_RUNTIME_IMAGE_KEY, NODE_RUNTIME_PACKAGES } from './node-runtime.js';

// What coding agents expect of E2B's and Daytona's images: python3 with pip and venv, git, curl,
// a C toolchain, sudo, and Node.js LTS with npm (not from Debian: see node-runtime.ts).
export const DEFAULT_IMAGE_PACKAGES = [
  'bash',
  'coreutils',
  'python3',
  'python3-pip',
  // `python3 -m venv` (with pip inside the venv, from Debian's bundled wheels).
  'python3-venv',
  // gcc, g++, make, libc headers: native npm modules and Python packages built from source.
  'build-essential',
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
  ...NODE_RUNTIME_PACKAGES,
  // The vendors' default users (SANDBOX_ACCOUNTS) work as root through passwordless sudo.
  'sudo',
  // `python` beside `python3`, as E2B's and Daytona's images have it.
  'python-is-python3',
  // getfattr/setfattr: file metadata is kept in user.* extended attributes (E2B's envd does so too).
  'attr',
] as const;

/**
 * Installed with apt in a chroot after debootstrap, not through its --include: debootstrap's
 * second stage cannot configure python3-zmq (a dependency of IPython's kernel), apt can. They
 * are the code interpreter's Python kernel (core/code-interpreter): IPython's kernel and
 * jupyter_client, which starts and speaks to kernels.
 */
export const DEFAULT_IMAGE_APT_PACKAGES = ['python3-ipykernel', 'python3-jupyter-client'] as const;

/**
 * The accounts every default image has besides root: E2B's `user` and Daytona's `daytona`, each
 * with its own group, a home made from /etc/skel, bash, no password and passwordless sudo (as
 * the vendors' images). Both vendors give their user uid 1000; a system has one uid 1000, so
 * E2B's keeps it (its SDK's tests look at ids more) and Daytona's gets 1001.
 */
export const SANDBOX_ACCOUNTS = [
  { name: 'user', uid: 1000, home: '/home/user' },
  { name: 'daytona', uid: 1001, home: '/home/daytona' },
] as const;

/**
 * Bump whenever a setup step below changes what it writes: a cached image whose manifest has
 * another setup version (or another package list) is rebuilt.
 */
export const IMAGE_SETUP_VERSION = 4;

export interface ImageManifest {
  name: string;
  suite: string;
  mirror: string;
  variant: string;
  packages: string[];
  /** DEFAULT_IMAGE_APT_PACKAGES of the build (installed after debootstrap). */
  aptPackages?: string[];
  /** IMAGE_SETUP_VERSION of the build (absent in images built before it existed). */
  setupVersion?: number;
  /** LANGUAGE_SERVERS_IMAGE_KEY of the build: the npm-installed language servers. */
  languageServers?: string;
  /** NODE_RUNTIME_IMAGE_KEY of the build: Node.js and npm in /usr/local. */
  nodeRuntime?: string;
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
  /** Installs Node.js and npm into the tree (tests substitute a fake: the real one needs root and the registry). */
  installNodeRuntime?: (rootfs: string, progress: (line: string) => void) => Promise<void>;
  /** Installs DEFAULT_IMAGE_APT_PACKAGES into the tree (tests substitute a fake: the real one needs root and the mirror). */
  installAptPackages?: (rootfs: string, packages: readonly string[], progress: (line: string) => void) => Promise<void>;
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
  if (existing && isCurrent(existing.manifest)) return existing;

  await mkdir(imageDir, { recursive: true });
  const releaseLock = await acquireBuildLock(join(imageDir, '.lock'), options.lockWaitMs ?? DEFAULT_LOCK_WAIT_MS);
  try {
    // Another process may have finished the build while we waited for the lock.
    const builtMeanwhile = await readCompleteImage(imageDir);
    if (builtMeanwhile && isCurrent(builtMeanwhile.manifest)) return builtMeanwhile;
    await removeStaleBuildDirs(imageDir);
    return await buildImage(imageDir, name, options);
  } finally {
    await releaseLock();
  }
}

/** Built from today's package list and setup steps (else ensureBaseImage rebuilds it). */
export function isCurrent(manifest: ImageManifest): boolean {
  return (
    manifest.setupVersion === IMAGE_SETUP_VERSION &&
    manifest.languageServers === LANGUAGE_SERVERS_IMAGE_KEY &&
    manifest.nodeRuntime === NODE_RUNTIME_IMAGE_KEY &&
    JSON.stringify(manifest.packages) === JSON.stringify(DEFAULT_IMAGE_PACKAGES) &&
    JSON.stringify(manifest.aptPackages) === JSON.stringify(DEFAULT_IMAGE_APT_PACKAGES)
  );
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
    progress(`building image ${name}: apt-get install ${DEFAULT_IMAGE_APT_PACKAGES.join(' ')}`);
    await (options.installAptPackages ?? aptInstall)(target, DEFAULT_IMAGE_APT_PACKAGES, progress);
    await installLanguageServers(target, progress, options.npmBinary);
    await (options.installNodeRuntime ?? ((rootfs, onLine) => installNodeRuntime(rootfs, onLine, options.npmBinary)))(target, progress);
    await setUpTree(target);
    const rootfs = join(imageDir, 'rootfs');
    await retirePreviousTree(imageDir, rootfs, progress);
    await rename(target, rootfs);
    const manifest: ImageManifest = {
      name,
      suite,
      mirror,
      variant: 'minbase',
      packages,
      aptPackages: [...DEFAULT_IMAGE_APT_PACKAGES],
      setupVersion: IMAGE_SETUP_VERSION,
      languageServers: LANGUAGE_SERVERS_IMAGE_KEY,
      nodeRuntime: NODE_RUNTIME_IMAGE_KEY,
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

// ---- setup steps after debootstrap (one function each; the VM image runs them too) ----------

/** Every step that turns a debootstrap tree into a sandbox image, in order. */
export async function setUpTree(rootfs: string): Promise<void> {
  await prepareTreeForSandboxes(rootfs);
  await createSandboxAccounts(rootfs);
  await letPipInstall(rootfs);
}

/** Mount points the local driver needs, created in the image so sandbox upper layers stay clean. */
async function prepareTreeForSandboxes(rootfs: string): Promise<void> {
  await mkdir(join(rootfs, '.nestbox'), { recursive: true, mode: 0o755 });
  // debootstrap copies the build host's resolv.conf; each sandbox gets its own in its upper layer.
  await writeFile(join(rootfs, 'etc', 'resolv.conf'), '');
  // The downloaded .debs (apt-get clean): a cache nothing reads again. The package lists stay,
  // so `apt-get install` works in a sandbox before any `apt-get update`.
  const archives = join(rootfs, 'var', 'cache', 'apt', 'archives');
  for (const entry of await readdir(archives).catch(() => [] as string[])) if (entry.endsWith('.deb')) await rm(join(archives, entry), { force: true });
}

/**
 * `pip install x` works, as in E2B's and Daytona's images (their Python is not Debian's, so no
 * PEP 668 marker stops it). Debian 12 marks its Python externally managed; this image lifts that
 * for pip only, in pip's own system-wide configuration, rather than deleting Debian's marker or
 * putting a venv first on PATH (which would hide the Debian packages, pylsp among them, from
 * `python3`). It stays safe for the tree: Debian's pip installs root's packages into
 * /usr/local/lib/python3.11/dist-packages, never over files dpkg owns, and refuses to
 * uninstall a Debian-installed package; `user` and `daytona` get pip's automatic --user install
 * into ~/.local. `python3 -m venv` works as before for whoever wants isolation.
 */
export async function letPipInstall(rootfs: string): Promise<void> {
  await mkdir(join(rootfs, 'etc'), { recursive: true });
  await writeFile(
    join(rootfs, 'etc', 'pip.conf'),
    "# Nestbox default image: `pip install` works outside a venv, as in E2B's and Daytona's images.\n[global]\nbreak-system-packages = true\n",
    { mode: 0o644 },
  );
}

/**
 * SANDBOX_ACCOUNTS, written straight into the account files (no chroot: the build needs nothing
 * of the tree but its files, and a fake debootstrap's tree works too). Idempotent: an account
 * that exists is left as it is.
 */
export async function createSandboxAccounts(rootfs: string): Promise<void> {
  const etc = join(rootfs, 'etc');
  await mkdir(etc, { recursive: true });
  const passwd = await readFile(join(etc, 'passwd'), 'utf8').catch(() => '');
  for (const account of SANDBOX_ACCOUNTS) {
    if (passwd.split('\n').some((line) => line.startsWith(`${account.name}:`))) continue;
    const { name, uid, home } = account;
    await appendLine(join(etc, 'passwd'), `${name}:x:${uid}:${uid}:${name}:${home}:/bin/bash`, 0o644);
    await appendLine(join(etc, 'group'), `${name}:x:${uid}:`, 0o644);
    // An empty password field: no password at all (as E2B's `passwd -d user`); sudo needs none.
    await appendLine(join(etc, 'shadow'), `${name}::19000:0:99999:7:::`, 0o640);
    await appendLine(join(etc, 'gshadow'), `${name}:!::`, 0o640);
    await addToGroup(join(etc, 'group'), 'sudo', name);
    const homeDir = join(rootfs, home);
    await mkdir(homeDir, { recursive: true, mode: 0o755 });
    await cp(join(etc, 'skel'), homeDir, { recursive: true, force: false, errorOnExist: false }).catch(() => undefined);
    await chownTree(homeDir, uid, uid);
  }
  const sudoers = join(etc, 'sudoers.d', 'nestbox-sandbox-users');
  await mkdir(join(etc, 'sudoers.d'), { recursive: true, mode: 0o755 });
  await writeFile(sudoers, `# Nestbox: the vendors' default users run anything as root without a password.\n${SANDBOX_ACCOUNTS.map((a) => `${a.name} ALL=(ALL:ALL) NOPASSWD: ALL`).join('\n')}\n`);
  // sudo refuses a sudoers file writable by anyone but root.
  await chmod(sudoers, 0o440);
}

async function appendLine(path: string, line: string, mode: number): Promise<void> {
  const text = await readFile(path, 'utf8').catch(() => undefined);
  if (text === undefined) await writeFile(path, '', { mode });
  await appendFile(path, `${text && !text.endsWith('\n') ? '\n' : ''}${line}\n`);
}

/** Adds `member` to an existing group's member list (Debian's minbase has `sudo` as gid 27). */
async function addToGroup(groupPath: string, group: string, member: string): Promise<void> {
  const lines = (await readFile(groupPath, 'utf8').catch(() => '')).split('\n');
  const at = lines.findIndex((line) => line.startsWith(`${group}:`));
  if (at < 0) return;
  const fields = lines[at].split(':');
  const members = fields[3] ? fields[3].split(',') : [];
  if (members.includes(member)) return;
  fields[3] = [...members, member].join(',');
  lines[at] = fields.join(':');
  await writeFile(groupPath, lines.join('\n'));
}

async function chownTree(path: string, uid: number, gid: number): Promise<void> {
  await chown(path, uid, gid);
  const info = await stat(path);
  if (!info.isDirectory()) return;
  for (const entry of await readdir(path)) await chownTree(join(path, entry), uid, gid);
}

/**
 * Moves an older complete tree aside rather than deleting it: sandboxes still running have it as
 * their overlay's lower layer (in mount namespaces this process may not see), and a rename keeps
 * their mounts whole. It is never removed automatically; the progress line says where it is. A
 * rootfs without a manifest (a build that crashed after its rename) is removed.
 */
async function retirePreviousTree(imageDir: string, rootfs: string, progress: (line: string) => void): Promise<void> {
  if (!(await stat(rootfs).catch(() => undefined))) return;
  if (!(await stat(join(imageDir, 'manifest.json')).catch(() => undefined))) {
    await removeTree(rootfs);
    return;
  }
  await rm(join(imageDir, 'manifest.json'), { force: true });
  const retired = join(imageDir, `.retired-${Date.now()}-${randomBytes(2).toString('hex')}`);
  await rename(rootfs, retired);
  progress(`the previous image tree is kept at ${retired} for sandboxes that still use it; remove it once they have restarted`);
}

export function runDebootstrap(program: string, args: string[], progress: (line: string) => void): Promise<void> {
  return runWithProgress(program, args, progress, { what: 'debootstrap' });
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

export async function removeStaleBuildDirs(imageDir: string): Promise<void> {
  for (const entry of await readdir(imageDir)) {
    if (entry.startsWith('.build-')) await removeTree(join(imageDir, entry));
  }
}

export function diskUsageBytes(path: string): number {
  try {
    const out = execFileSync('du', ['-sb', '--one-file-system', path], { encoding: 'utf8' });
    return Number(out.split('\t')[0]) || 0;
  } catch {
    return 0;
  }
}
