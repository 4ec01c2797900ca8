// The `code-interpreter` image: the default image plus real Jupyter kernels (IPython, R's
// IRkernel, bash_kernel, Deno's kernel for JavaScript and TypeScript) and the Python data stack.
// Built on every host from the host's own default image, so it needs no per-deployment build
// step and every organisation can start from it anywhere, like `default`.
//
// How: copy the default tree (reflinked where the filesystem can), then in a chroot of the copy
// `apt-get install --no-install-recommends` Debian bookworm's packages from deb.debian.org (what
// Debian packages is used wherever it exists: it is built, signed and updated by Debian). Two
// kernels Debian does not package come pinned from their language registries: bash_kernel's
// wheel from PyPI (sha256, pip --require-hashes) and Deno's Linux build from npm (sha512
// integrity, as node-runtime.ts pins Node). Putting python3-ipykernel into debootstrap's own
// --include list fails (debootstrap cannot configure python3-zmq in its second stage), which is
// why this is a derived image rather than more packages in the default one.
//
// Layout under <imagesDir>/code-interpreter-<key>/ (key: a hash of everything that determines
// the tree, the default image's build included), as base-image.ts does it: rootfs/, manifest.json
// (written last: the image is complete when it exists), .lock, .build-<pid>-<n>. Being keyed by
// content, two versions (two branches, an upgrade) sit side by side and never rebuild each other;
// a version built from a default tree that has since been replaced is removed once no mount uses it.
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { removeTree, writeFileAtomic } from '../util/fs.js';
import { acquireBuildLock, diskUsageBytes, ensureBaseImage, readCompleteImage, removeStaleBuildDirs, type ImageManifest } from './base-image.js';
import { aptInstall, captureInTree, runInTree, withHostResolver } from './chroot.js';
import { downloadPinnedPackage, type PinnedPackage } from './node-runtime.js';
import { runWithProgress } from './run-with-progress.js';

export const CODE_INTERPRETER_IMAGE = 'code-interpreter';

/**
 * Debian bookworm packages added to the default image (their Depends come along; no Recommends).
 * jupyter-core and jupyter-client are the `jupyter` and `jupyter-kernelspec` commands (the
 * python3-* packages are only the modules).
 */
export const CODE_INTERPRETER_PACKAGES = [
  'python3-ipykernel',
  'python3-jupyter-client',
  'jupyter-core',
  'jupyter-client',
  'python3-numpy',
  'python3-pandas',
  'python3-matplotlib',
  'python3-matplotlib-inline',
  'python3-scipy',
  'python3-sklearn',
  'python3-seaborn',
  'python3-plotly',
  'python3-openpyxl',
  'python3-pil',
  'python3-requests',
  // matplotlib's default font (DejaVu Sans); without it every figure warns and falls back.
  'fonts-dejavu-core',
  'r-base-core',
  // IRkernel with its kernelspec in /usr/share/jupyter/kernels/ir (name `ir`).
  'r-cran-irkernel',
  // bash_kernel's dependencies (it comes from PyPI, without its dependencies: see BASH_KERNEL).
  'python3-pexpect',
  'python3-filetype',
] as const;

/** bash_kernel from PyPI (Debian has none): the wheel's sha256 as PyPI publishes it. */
export const BASH_KERNEL = {
  requirement: 'bash_kernel==0.10.0',
  wheel: 'bash_kernel-0.10.0-py2.py3-none-any.whl',
  sha256: 'da28513230f5307c7a49e87352366304dc52b66faa207d6caed1b2bdec03c1fa',
} as const;

/** Deno's official Linux build as published on npm (the `deno` package's binary), with the registry's integrity. */
export const DENO_PACKAGE: PinnedPackage = {
  name: '@deno/linux-x64-glibc',
  version: '2.9.6',
  integrity: 'sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3iLP9vBQJtEgc116OAoQ==',
};

/** Where kernelspecs this image adds live: on every user's Jupyter path, before Debian's /usr/share/jupyter. */
export const KERNELSPEC_DIR = '/usr/local/share/jupyter/kernels';

/**
 * The kernelspecs written here (Debian's packages ship python3 and ir). Deno's kernel checks for
 * updates online and may prompt unless told otherwise; NO_COLOR keeps ANSI colours out of its
 * text/plain results (the other kernels send plain text too).
 */
export const KERNELSPECS = {
  bash: { argv: ['/usr/bin/python3', '-m', 'bash_kernel', '-f', '{connection_file}'], display_name: 'Bash', language: 'bash', codemirror_mode: 'shell', env: { PS1: '$' } },
  deno: {
    argv: ['/usr/local/bin/deno', 'jupyter', '--kernel', '--conn', '{connection_file}'],
    display_name: 'Deno',
    language: 'typescript',
    env: { DENO_NO_UPDATE_CHECK: '1', DENO_NO_PROMPT: '1', NO_COLOR: '1' },
  },
} as const;

/** Every kernel name the image has (`jupyter kernelspec list`). */
export const CODE_INTERPRETER_KERNELS = ['python3', 'ir', 'bash', 'deno'] as const;

/** Bump whenever a step below changes what it writes (the key changes, so a new version is built). */
export const CODE_INTERPRETER_SETUP_VERSION = 1;

export interface CodeInterpreterManifest {
  name: typeof CODE_INTERPRETER_IMAGE;
  key: string;
  /** The default image this one was built from (its manifest's identity). */
  base: BaseIdentity;
  packages: string[];
  bashKernel: string;
  deno: string;
  setupVersion: number;
  builtAt: string;
  buildSeconds: number;
  sizeBytes: number;
}

export interface CodeInterpreterImage {
  rootfs: string;
  manifest: CodeInterpreterManifest;
}

export interface EnsureCodeInterpreterImageOptions {
  imagesDir: string;
  /** The build's steps, one line each (and the default image's progress, when it is built first). */
  onProgress?: (line: string) => void;
  /** Every line apt, pip, npm and cp print (hundreds); a failure quotes the last of them anyway. */
  onOutput?: (line: string) => void;
  /** How long a second process waits for another one's build before giving up. */
  lockWaitMs?: number;
  /** The npm program that downloads Deno. */
  npmBinary?: string;
}

type BaseIdentity = Pick<ImageManifest, 'suite' | 'mirror' | 'variant' | 'packages' | 'setupVersion' | 'languageServers' | 'nodeRuntime' | 'builtAt'>;

const DEFAULT_LOCK_WAIT_MS = 30 * 60_000;
const STEP_TIMEOUT_MS = 10 * 60_000;
const WHAT = 'code-interpreter image';

/** The part of the default image's manifest that determines its tree (its build time included: each build is another tree). */
function baseIdentity(manifest: ImageManifest): BaseIdentity {
  const { suite, mirror, variant, packages, setupVersion, languageServers, nodeRuntime, builtAt } = manifest;
  return { suite, mirror, variant, packages, setupVersion, languageServers, nodeRuntime, builtAt };
}

/** The content key of the image built from `base`: changes with anything that changes the tree. */
export function codeInterpreterKey(base: ImageManifest): string {
  return createHash('sha256').update(JSON.stringify({ base: baseIdentity(base), ...CODE_INTERPRETER_INPUTS })).digest('hex').slice(0, 16);
}

/** `<imagesDir>/code-interpreter-<key>` */
export function codeInterpreterImageDir(imagesDir: string, key: string): string {
  return join(imagesDir, `${CODE_INTERPRETER_IMAGE}-${key}`);
}

/** Returns this version of the image, building the default image and then it first when missing. */
export async function ensureCodeInterpreterImage(options: EnsureCodeInterpreterImageOptions): Promise<CodeInterpreterImage> {
  const progress = options.onProgress ?? (() => {});
  const output = options.onOutput ?? (() => {});
  const base = await ensureBaseImage({ imagesDir: options.imagesDir, onProgress: progress });
  const key = codeInterpreterKey(base.manifest);
  const imageDir = codeInterpreterImageDir(options.imagesDir, key);
  const existing = await readComplete(imageDir, key);
  if (existing) return existing;

  await mkdir(imageDir, { recursive: true });
  const releaseLock = await acquireBuildLock(join(imageDir, '.lock'), options.lockWaitMs ?? DEFAULT_LOCK_WAIT_MS);
  try {
    const builtMeanwhile = await readComplete(imageDir, key);
    if (builtMeanwhile) return builtMeanwhile;
    await removeStaleBuildDirs(imageDir);
    const image = await build(imageDir, key, base.rootfs, base.manifest, options, progress, output);
    await removeSupersededVersions(options.imagesDir, imageDir, base.manifest, progress);
    return image;
  } finally {
    await releaseLock();
  }
}

async function readComplete(imageDir: string, key: string): Promise<CodeInterpreterImage | undefined> {
  const image = await readCompleteImage(imageDir);
  const manifest = image?.manifest as unknown as CodeInterpreterManifest | undefined;
  return image && manifest?.key === key ? { rootfs: image.rootfs, manifest } : undefined;
}

async function build(imageDir: string, key: string, baseRootfs: string, baseManifest: ImageManifest, options: EnsureCodeInterpreterImageOptions, progress: (line: string) => void, output: (line: string) => void): Promise<CodeInterpreterImage> {
  const buildDir = join(imageDir, `.build-${process.pid}-${randomBytes(4).toString('hex')}`);
  const target = join(buildDir, 'rootfs');
  const started = Date.now();
  await mkdir(buildDir, { recursive: true });
  try {
    progress(`building image ${CODE_INTERPRETER_IMAGE} (${key}) from the default image`);
    await runWithProgress('cp', ['-a', '--reflink=auto', baseRootfs, target], output, { what: 'copying the default image', timeoutMs: STEP_TIMEOUT_MS });
    await installCodeInterpreter(target, progress, output, options.npmBinary);
    const rootfs = join(imageDir, 'rootfs');
    // A rootfs without a manifest is a build that died after its rename: nothing uses it.
    await removeTree(rootfs);
    await rename(target, rootfs);
    const manifest: CodeInterpreterManifest = {
      name: CODE_INTERPRETER_IMAGE,
      key,
      base: baseIdentity(baseManifest),
      packages: [...CODE_INTERPRETER_PACKAGES],
      bashKernel: `${BASH_KERNEL.requirement} sha256:${BASH_KERNEL.sha256}`,
      deno: `${DENO_PACKAGE.name}@${DENO_PACKAGE.version} ${DENO_PACKAGE.integrity}`,
      setupVersion: CODE_INTERPRETER_SETUP_VERSION,
      builtAt: new Date().toISOString(),
      buildSeconds: Math.round((Date.now() - started) / 1000),
      sizeBytes: diskUsageBytes(rootfs),
    };
    await writeFileAtomic(join(imageDir, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
    progress(`image ${CODE_INTERPRETER_IMAGE} ready in ${manifest.buildSeconds} s (${Math.round(manifest.sizeBytes / 1e6)} MB)`);
    return { rootfs, manifest };
  } finally {
    await removeTree(buildDir);
  }
}

// ---- steps -----------------------------------------------------------------------------------

/**
 * Everything this image adds to a default tree, checked: the Debian packages, bash_kernel, Deno,
 * the kernelspecs. The Cloud Hypervisor driver's VM image runs it on its own tree too (vm-image.ts).
 */
export async function installCodeInterpreter(rootfs: string, progress: (line: string) => void, output: (line: string) => void = () => {}, npm?: string): Promise<void> {
  await installPackages(rootfs, progress, output);
  await installBashKernel(rootfs, progress, output);
  await installDeno(rootfs, progress, output, npm);
  await writeKernelspecs(rootfs);
  await checkTree(rootfs, progress);
  await cleanTree(rootfs);
}

/** What installCodeInterpreter puts into a tree, for keys of images built with it. */
export const CODE_INTERPRETER_INPUTS = {
  packages: CODE_INTERPRETER_PACKAGES,
  bashKernel: BASH_KERNEL,
  deno: DENO_PACKAGE,
  kernelspecs: KERNELSPECS,
  setupVersion: CODE_INTERPRETER_SETUP_VERSION,
} as const;

async function installPackages(rootfs: string, progress: (line: string) => void, output: (line: string) => void): Promise<void> {
  progress(`apt-get install ${CODE_INTERPRETER_PACKAGES.join(' ')}`);
  await aptInstall(rootfs, CODE_INTERPRETER_PACKAGES, output);
}

/**
 * The wheel is downloaded by the tree's own pip (pip checks the pin: --require-hashes), checked
 * again here, then installed offline without dependencies (they are Debian's, above). pip is
 * given the host's CA bundle: the host's trust store is the one its network is set up for.
 */
async function installBashKernel(rootfs: string, progress: (line: string) => void, output: (line: string) => void): Promise<void> {
  const stagingInTree = `/var/tmp/nestbox-bash-kernel-${process.pid}`;
  const staging = join(rootfs, stagingInTree);
  await mkdir(staging, { recursive: true, mode: 0o700 });
  try {
    await writeFile(join(staging, 'requirements.txt'), `${BASH_KERNEL.requirement} --hash=sha256:${BASH_KERNEL.sha256}\n`);
    const hostCa = await hostCaBundle();
    if (hostCa) await copyFile(hostCa, join(staging, 'ca.crt'));
    const pip = ['python3', '-m', 'pip', '--no-cache-dir', '--disable-pip-version-check', '--no-input'];
    progress(`downloading ${BASH_KERNEL.requirement} from PyPI`);
    const download = [...pip, 'download', '--no-deps', '--require-hashes', ...(hostCa ? ['--cert', `${stagingInTree}/ca.crt`] : []), '-d', stagingInTree, '-r', `${stagingInTree}/requirements.txt`];
    await withHostResolver(rootfs, () => runInTree(rootfs, download, output));
    const wheel = join(staging, BASH_KERNEL.wheel);
    const actual = await sha256Hex(wheel);
    if (actual !== BASH_KERNEL.sha256) throw new Error(`${BASH_KERNEL.wheel}: sha256 ${actual} is not the pinned ${BASH_KERNEL.sha256}`);
    await runInTree(rootfs, [...pip, 'install', '--no-index', '--no-deps', '--root-user-action=ignore', `${stagingInTree}/${BASH_KERNEL.wheel}`], output);
  } finally {
    await removeTree(staging);
  }
}

/** The CA bundle the host's own TLS clients use, if it has one where pip, curl and Debian look. */
async function hostCaBundle(): Promise<string | undefined> {
  for (const path of [process.env.PIP_CERT, process.env.SSL_CERT_FILE, '/etc/ssl/certs/ca-certificates.crt']) {
    if (path && (await stat(path).catch(() => undefined))?.isFile()) return path;
  }
  return undefined;
}

/** Deno's binary at /usr/local/bin/deno (on everyone's PATH), from its pinned npm tarball. */
async function installDeno(rootfs: string, progress: (line: string) => void, output: (line: string) => void, npm = 'npm'): Promise<void> {
  const staging = join(rootfs, 'usr', 'local', `.nestbox-deno-staging-${process.pid}`);
  await mkdir(staging, { recursive: true, mode: 0o755 });
  try {
    progress(`downloading ${DENO_PACKAGE.name}@${DENO_PACKAGE.version} from the npm registry`);
    const tarball = await downloadPinnedPackage(DENO_PACKAGE, staging, output, npm);
    await runWithProgress('tar', ['-xzf', tarball, '-C', staging, '--no-same-owner', 'package/deno'], output, { what: `tar -x ${tarball}`, timeoutMs: STEP_TIMEOUT_MS });
    await mkdir(join(rootfs, 'usr', 'local', 'bin'), { recursive: true, mode: 0o755 });
    await rename(join(staging, 'package', 'deno'), join(rootfs, 'usr', 'local', 'bin', 'deno'));
    await chmod(join(rootfs, 'usr', 'local', 'bin', 'deno'), 0o755);
  } finally {
    await removeTree(staging);
  }
}

async function writeKernelspecs(rootfs: string): Promise<void> {
  for (const [name, spec] of Object.entries(KERNELSPECS)) {
    const dir = join(rootfs, KERNELSPEC_DIR, name);
    await mkdir(dir, { recursive: true, mode: 0o755 });
    await writeFile(join(dir, 'kernel.json'), `${JSON.stringify(spec, null, 1)}\n`, { mode: 0o644 });
  }
}

/** The image never ships a kernel that cannot start its interpreter, or a missing library. */
async function checkTree(rootfs: string, progress: (line: string) => void): Promise<void> {
  progress('checking the kernels and libraries in the image');
  const listed = JSON.parse(await captureInTree(rootfs, ['jupyter', 'kernelspec', 'list', '--json'], WHAT)) as { kernelspecs: Record<string, unknown> };
  const missing = CODE_INTERPRETER_KERNELS.filter((k) => !(k in listed.kernelspecs));
  if (missing.length) throw new Error(`code-interpreter image: kernelspecs ${missing.join(', ')} are missing (jupyter kernelspec list has ${Object.keys(listed.kernelspecs).join(', ')})`);
  await captureInTree(rootfs, ['python3', '-c', 'import ipykernel, jupyter_client, numpy, pandas, matplotlib, scipy, sklearn, seaborn, plotly, openpyxl, PIL, requests, bash_kernel'], WHAT);
  const deno = await captureInTree(rootfs, ['/usr/local/bin/deno', '--version'], WHAT, { DENO_NO_UPDATE_CHECK: '1', DENO_DIR: '/nonexistent' });
  if (!deno.startsWith(`deno ${DENO_PACKAGE.version} `)) throw new Error(`code-interpreter image: deno --version printed ${JSON.stringify(deno)}`);
  await captureInTree(rootfs, ['R', '--quiet', '--no-save', '-e', 'library(IRkernel)'], WHAT);
}

/** What only the build needed: temporary files, and what the checks left in root's home (the default image's has none of it). */
async function cleanTree(rootfs: string): Promise<void> {
  for (const dir of ['tmp', 'var/tmp']) {
    for (const entry of await readdir(join(rootfs, dir)).catch(() => [] as string[])) await rm(join(rootfs, dir, entry), { recursive: true, force: true });
  }
  for (const dir of ['.cache', '.config', '.ipython', '.local']) await rm(join(rootfs, 'root', dir), { recursive: true, force: true });
}

/**
 * Versions built from a default tree that has since been replaced (superseded: a new default
 * means a new version of this image on top of it). A version is removed only when no mount on
 * the machine names it (a running sandbox's overlay has it as its lower layer; sandboxes live
 * in their own mount namespaces, so every process's mount table is read). Versions on the
 * current default tree are other builds' (another branch, another package list) and stay.
 */
async function removeSupersededVersions(imagesDir: string, current: string, base: ImageManifest, progress: (line: string) => void): Promise<void> {
  const currentBase = JSON.stringify(baseIdentity(base));
  for (const entry of await readdir(imagesDir).catch(() => [] as string[])) {
    const dir = join(imagesDir, entry);
    if (!entry.startsWith(`${CODE_INTERPRETER_IMAGE}-`) || dir === current) continue;
    const manifest = await readFile(join(dir, 'manifest.json'), 'utf8').then((t) => JSON.parse(t) as CodeInterpreterManifest).catch(() => undefined);
    if (!manifest || JSON.stringify(manifest.base) === currentBase) continue;
    if (await stat(join(dir, '.lock')).catch(() => undefined)) continue;
    if (await mountedAnywhere(dir)) {
      progress(`the superseded image ${dir} is still in use by a sandbox; it is kept`);
      continue;
    }
    progress(`removing the superseded image ${dir}`);
    await rm(join(dir, 'manifest.json'), { force: true });
    await removeTree(dir);
  }
}

async function mountedAnywhere(path: string): Promise<boolean> {
  const pids = (await readdir('/proc').catch(() => [] as string[])).filter((p) => /^\d+$/.test(p));
  const seen = new Set<string>();
  for (const pid of pids) {
    const table = await readFile(`/proc/${pid}/mountinfo`, 'utf8').catch(() => '');
    if (!table || seen.has(table)) continue;
    seen.add(table);
    if (table.includes(path)) return true;
  }
  return false;
}

function sha256Hex(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha256');
    createReadStream(path)
      .on('data', (chunk) => hash.update(chunk))
      .once('error', reject)
      .once('end', () => resolve(hash.digest('hex')));
  });
}
