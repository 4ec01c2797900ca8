// Bootable ext4 disks of OCI images for the Cloud Hypervisor driver: the image's root
// filesystem (host/images/oci, as pulled) plus a self-contained guest runtime under /.nestbox,
// booted with the VM image's kernel and initramfs (vm-image.ts) and `init=/.nestbox/init`.
//
// Why one disk per image with the runtime inside, not a shared read-only "agent disk": the
// initramfs mounts /dev/vda as root and execs init from it, so with a second disk the init would
// have to mount it and pivot first; snapshots, restores and forks would have to carry and patch
// two disks (and keep every old agent disk alive for the memory images that name it). One disk
// keeps the VmConfig, the snapshot patcher and the disk copies exactly as for `default`. The
// cost: a new guest agent rebuilds each image's disk once, on its next use (the cache key holds
// the runtime's hash), which is one `mkfs.ext4 -d` of the image — seconds.
//
// The runtime never uses the image's libc or shell, so an Alpine (musl), distroless or busybox
// image boots the same way (busybox and distroless are what the tests and the QEMU smoke test
// boot; no musl image is reachable offline): node runs on its own glibc loader and libraries (`ld.so --inhibit-cache
// --library-path`, the local driver's layout), PID 1 and the scripts run on a static busybox,
// socat (same loader) bridges vsock port 1024 to the agent's socket, and the kernel modules the
// VM needs come from the VM image's own tree. All of it comes from the VM image's debootstrap
// tree by default (the guest's Debian), or from paths given by the caller.
//
// Output: <imagesDir>/vm-oci/<hex>/{rootfs.img,disk.json}, assembled in a temp dir beside it and
// renamed into place under a per-digest lock (base-image.ts's pid + start-time lock file): a
// build killed midway leaves only a temp dir, swept by the next build of that digest.
import { createHash } from 'node:crypto';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, copyFile, lstat, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { acquireBuildLock } from './base-image.js';
import { imageEnvironment, ENV_NAME } from './oci/image-environment.js';
import { hexOf, IMAGE_ID, OciImageStore } from './oci/store.js';
import { removeTree, writeFileAtomic } from '../util/fs.js';
import { copyGuestAgentBundle, guestAgentBundleSha256 } from '../util/guest-agent-bundle.js';
import { GUEST_AGENT_SOCKET, VIRTIO_SERIAL_PORT_NAME, writeTreeFile } from './vm-image.js';

export const OCI_VM_DISKS_DIR = 'vm-oci';
/** PID 1 of an image VM (kernel command line `init=`). */
export const OCI_VM_INIT = '/.nestbox/init';
/** What the init ends with and the simulator runs: the agent, with the image's environment. */
export const OCI_VM_AGENT_START = '/.nestbox/agent-start';
export const OCI_VM_RESYNC = '/.nestbox/bin/nestbox-resync';
export const OCI_VM_BUSYBOX = '/.nestbox/bin/busybox';
/** Bump when the layout or scripts below change: every image's disk is rebuilt at next use. */
export const OCI_VM_LAYOUT_VERSION = 3;
/**
 * Kernel modules an image VM loads itself (the default image's udev does it there): vsock,
 * network, console, and virtio-fs (volumes) and virtio-mem (live memory resize).
 */
export const OCI_VM_KERNEL_MODULES = ['vmw_vsock_virtio_transport', 'virtio_net', 'virtio_console', 'virtiofs', 'virtio_mem'];
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const MIB = 1024 * 1024;
const HOST_LIBS = '/.nestbox/lib/host';

export interface GuestRuntimeFiles {
  /** The node binary the agent runs on (glibc-linked; its libraries are copied alongside). */
  nodeBinary: string;
  guestAgentBundle: string;
  /** Static PTY helper (terminals, xattrs); skipped when absent. */
  ptyHelperBinary?: string;
  /** A statically linked busybox: PID 1's shell and its mount/ip/insmod/hostname. */
  busyboxBinary: string;
  /** socat (vsock and virtio-serial to the agent's Unix socket; Node cannot open AF_VSOCK). */
  socatBinary: string;
  /** The root whose `ldd` resolves the libraries of node and socat (`/` = this host). */
  librariesRoot: string;
  /** `lib/modules/<version>` of the VM image's kernel; absent = nothing to load (built in). */
  kernelModulesDir?: string;
}

export interface OciVmDiskManifest {
  imageId: string;
  runtimeKey: string;
  /** Size of rootfs.img as built (the driver grows each sandbox's copy to its diskGiB). */
  sizeMiB: number;
  contentBytes: number;
  /** The agent's environment baked into agent-start (the image's Env, HOME from WorkingDir). */
  env: Record<string, string>;
  kernelModules: string[];
  builtAt: string;
  buildMs: number;
}

export interface OciVmDisk {
  rootfs: string;
  manifest: OciVmDiskManifest;
}

export interface EnsureOciVmDiskOptions {
  imagesDir: string;
  /** The OCI image store (default <imagesDir>/oci). */
  ociStoreDir?: string;
  imageId: string;
  runtime: GuestRuntimeFiles;
  lockWaitMs?: number;
  onProgress?: (line: string) => void;
  warn?: (message: string) => void;
}

/** An image id the store does not hold (the driver maps it to not_found). */
export class OciImageMissingError extends Error {}
/** An image's root filesystem a VM cannot boot (the driver maps it to validation_failed). */
export class OciImageUnbootableError extends Error {}

/**
 * The guest runtime taken from a built VM image's debootstrap tree (the guest's own Debian):
 * the node, agent bundle and PTY helper its installGuestFiles put there, its busybox-static and
 * socat, and the modules of its kernel.
 */
export async function guestRuntimeFromVmImage(vmImageDir: string, kernelVersion: string): Promise<GuestRuntimeFiles> {
  const tree = join(vmImageDir, 'tree');
  const need = async (path: string, what: string): Promise<string> => {
    if (!existsSync(path)) throw new Error(`VM image at ${vmImageDir} has no ${what} (${path}); rebuild it with \`nestbox image build --vm\``);
    return path;
  };
  return {
    nodeBinary: await need(join(tree, '.nestbox/bin/node'), 'node'),
    guestAgentBundle: await need(join(tree, '.nestbox/lib/guest-agent.mjs'), 'guest agent bundle'),
    ptyHelperBinary: join(tree, '.nestbox/bin/nestbox-pty'),
    busyboxBinary: await need(join(tree, 'bin/busybox'), 'static busybox (busybox-static)'),
    socatBinary: await need(join(tree, 'usr/bin/socat'), 'socat'),
    librariesRoot: tree,
    kernelModulesDir: await need(join(tree, 'lib/modules', kernelVersion), `kernel modules for ${kernelVersion}`),
  };
}

export function ociVmDiskDir(imagesDir: string, imageId: string): string {
  return join(imagesDir, OCI_VM_DISKS_DIR, hexOf(imageId));
}

/** The disk when complete (disk.json is written before the rename that publishes the dir). */
export async function readOciVmDisk(dir: string): Promise<OciVmDisk | undefined> {
  try {
    const manifest = JSON.parse(await readFile(join(dir, 'disk.json'), 'utf8')) as OciVmDiskManifest;
    await stat(join(dir, 'rootfs.img'));
    return { rootfs: join(dir, 'rootfs.img'), manifest };
  } catch {
    return undefined;
  }
}

/** The image's disk for this runtime: the cached one, or built once (per digest, under a lock). */
export async function ensureOciVmDisk(options: EnsureOciVmDiskOptions): Promise<OciVmDisk> {
  if (!IMAGE_ID.test(options.imageId)) throw new OciImageMissingError(`image ${options.imageId} is not an image id (sha256:<64 hex>)`);
  const store = new OciImageStore({ storeDir: options.ociStoreDir ?? join(options.imagesDir, 'oci') });
  const image = await store.get(options.imageId);
  if (!image) throw new OciImageMissingError(`image ${options.imageId} is not in this host's image store (pull it first)`);
  const runtimeKey = await runtimeKeyOf(options.runtime);
  const dir = ociVmDiskDir(options.imagesDir, options.imageId);
  const cached = await readOciVmDisk(dir);
  if (cached?.manifest.runtimeKey === runtimeKey) return cached;
  const parent = dirname(dir);
  await mkdir(parent, { recursive: true, mode: 0o700 });
  const hex = hexOf(options.imageId);
  const release = await acquireBuildLock(join(parent, `${hex}.lock`), options.lockWaitMs ?? 10 * 60_000);
  try {
    const meanwhile = await readOciVmDisk(dir);
    if (meanwhile?.manifest.runtimeKey === runtimeKey) return meanwhile;
    // We hold this digest's lock: any temp dir of it is a dead build's.
    for (const entry of await readdir(parent)) if (entry.startsWith(`${hex}.tmp-`)) await removeTree(join(parent, entry));
    const temp = join(parent, `${hex}.tmp-${process.pid}`);
    try {
      await buildDisk(temp, image.rootfs, image.meta.config, options, runtimeKey);
      // Replace an outdated disk: sandboxes hold copies, never the cached file itself.
      if (existsSync(dir)) await removeTree(dir);
      await rename(temp, dir);
    } catch (error) {
      await removeTree(temp).catch(() => {});
      throw error;
    }
    const disk = await readOciVmDisk(dir);
    if (!disk) throw new Error(`image disk of ${options.imageId}: output incomplete in ${dir}`);
    return disk;
  } finally {
    await release();
  }
}

/**
 * Deletes an image's cached disk (when the image leaves the store), under the same per-digest
 * lock as a build. Sandboxes and snapshots hold copies, so none of them depends on it.
 */
export async function removeOciVmDisk(imagesDir: string, imageId: string, lockWaitMs = 10 * 60_000): Promise<void> {
  const dir = ociVmDiskDir(imagesDir, imageId);
  const parent = dirname(dir);
  if (!existsSync(parent)) return;
  const hex = hexOf(imageId);
  const release = await acquireBuildLock(join(parent, `${hex}.lock`), lockWaitMs);
  try {
    for (const entry of await readdir(parent)) if (entry === hex || entry.startsWith(`${hex}.tmp-`)) await removeTree(join(parent, entry));
  } finally {
    await release();
  }
}

async function buildDisk(temp: string, rootfs: string, config: Parameters<typeof imageEnvironment>[0], options: EnsureOciVmDiskOptions, runtimeKey: string): Promise<void> {
  const started = Date.now();
  const progress = options.onProgress ?? (() => {});
  await mkdir(temp, { recursive: true, mode: 0o700 });
  const tree = join(temp, 'tree');
  await checkBootable(rootfs, options.imageId);
  progress(`image disk ${options.imageId}: copying the root filesystem`);
  // --reflink=auto: free on XFS/btrfs, a plain copy elsewhere. -a keeps owners, modes, links.
  await run('cp', ['-a', '--reflink=auto', '--', rootfs, tree], 600_000);
  const hasRootHome = (await lstat(join(tree, 'root')).catch(() => undefined))?.isDirectory() ?? false;
  const env = imageEnvironment(config, hasRootHome, options.warn ?? (() => {}));
  env.PATH ??= DEFAULT_PATH;
  const kernelModules = await installRuntime(tree, options.runtime, env);
  const contentBytes = Number((await run('du', ['-s', '-B1', '-x', tree])).split(/\s/)[0]);
  const files = Number((await run('find', [tree, '-xdev', '-printf', '.'], 600_000)).length);
  // Room for ext4's own structures and the journal; each sandbox's copy is grown to its diskGiB.
  const sizeMiB = Math.ceil((contentBytes * 1.25) / MIB) + 256;
  // Enough for the image's files and as many again; growing the disk adds more per block group.
  const inodes = Math.max(files * 2 + 4096, 16_384);
  progress(`image disk ${options.imageId}: mkfs.ext4 -d (${sizeMiB} MiB, ${files} files)`);
  const image = join(temp, 'rootfs.img');
  await run('mkfs.ext4', ['-q', '-F', '-L', 'rootfs', '-b', '4096', '-N', String(inodes), '-E', 'root_owner=0:0', '-d', tree, image, `${sizeMiB}M`], 600_000);
  await run('e2fsck', ['-fy', image], 600_000).catch((error: Error) => {
    if (!/\(exit code 1\)/.test(error.message)) throw error;
  });
  await removeTree(tree);
  const manifest: OciVmDiskManifest = { imageId: options.imageId, runtimeKey, sizeMiB, contentBytes, env, kernelModules, builtAt: new Date().toISOString(), buildMs: Date.now() - started };
  await writeFileAtomic(join(temp, 'disk.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  progress(`image disk ${options.imageId}: ready in ${manifest.buildMs} ms`);
}

/**
 * What a VM needs of the image's tree: directories (or nothing) where it mounts /proc, /sys,
 * /dev, /run, /tmp and puts /.nestbox — never a file or a symlink, which the init would follow
 * or fail on at boot, where the only trace would be the serial console.
 */
async function checkBootable(rootfs: string, imageId: string): Promise<void> {
  const root = await lstat(rootfs).catch(() => undefined);
  if (!root?.isDirectory()) throw new OciImageUnbootableError(`image ${imageId} has no root filesystem directory (${rootfs})`);
  for (const name of ['proc', 'sys', 'dev', 'run', 'tmp', 'etc', '.nestbox']) {
    const entry = await lstat(join(rootfs, name)).catch(() => undefined);
    if (entry && !entry.isDirectory()) {
      throw new OciImageUnbootableError(`image ${imageId} cannot boot as a VM: /${name} is ${entry.isSymbolicLink() ? 'a symbolic link' : 'not a directory'} (the VM mounts or writes there)`);
    }
  }
}

/** /.nestbox (runtime, scripts, modules) and the /etc files every VM has; returns the modules. */
async function installRuntime(tree: string, runtime: GuestRuntimeFiles, env: Record<string, string>): Promise<string[]> {
  const put = (path: string, content: string, mode = 0o644) => writeTreeFile(tree, path, content, mode);
  const copy = async (source: string, path: string, mode: number): Promise<void> => {
    const target = join(tree, path);
    await mkdir(dirname(target), { recursive: true });
    await copyFile(source, target);
    await chmod(target, mode);
  };
  for (const dir of ['proc', 'sys', 'dev', 'run', 'tmp', 'etc']) await mkdir(join(tree, dir), { recursive: true });
  await chmod(join(tree, 'tmp'), 0o1777);
  await copy(runtime.nodeBinary, '.nestbox/bin/node', 0o755);
  // With its lazily imported chunks, in .nestbox/lib/guest-agent-chunks (util/guest-agent-bundle.ts).
  await mkdir(join(tree, '.nestbox/lib'), { recursive: true });
  await copyGuestAgentBundle(runtime.guestAgentBundle, join(tree, '.nestbox/lib/guest-agent.mjs'));
  await copy(runtime.busyboxBinary, OCI_VM_BUSYBOX, 0o755);
  await copy(runtime.socatBinary, '.nestbox/bin/socat', 0o755);
  if (runtime.ptyHelperBinary && existsSync(runtime.ptyHelperBinary)) await copy(runtime.ptyHelperBinary, '.nestbox/bin/nestbox-pty', 0o755);
  const libraries = new Map<string, string>();
  let loader: string | undefined;
  for (const program of [runtime.nodeBinary, runtime.socatBinary]) {
    const linked = await linkedLibraries(program, runtime.librariesRoot);
    loader ??= linked.loader;
    for (const [soname, path] of linked.libs) libraries.set(soname, path);
  }
  if (!loader) throw new Error(`no dynamic loader found for ${runtime.nodeBinary}`);
  await copy(loader, `${HOST_LIBS}/ld.so`, 0o755);
  for (const [soname, path] of libraries) await copy(path, `${HOST_LIBS}/${soname}`, 0o644);
  const modules = runtime.kernelModulesDir ? await installKernelModules(tree, runtime.kernelModulesDir) : [];
  await put(OCI_VM_INIT.slice(1), INIT_SCRIPT, 0o755);
  await put(OCI_VM_AGENT_START.slice(1), agentStartScript(env), 0o755);
  await put(OCI_VM_RESYNC.slice(1), RESYNC_SCRIPT, 0o755);
  // The image's own files win where it has them (its resolver, its hosts); a VM needs some.
  const etc = async (name: string, content: string) => {
    if (!(await lstat(join(tree, 'etc', name)).catch(() => undefined))) await put(`etc/${name}`, content);
  };
  await etc('hostname', 'nestbox\n');
  await etc('hosts', '127.0.0.1\tlocalhost\n127.0.1.1\tnestbox\n::1\tlocalhost ip6-localhost ip6-loopback\n');
  await etc('resolv.conf', 'nameserver 1.1.1.1\nnameserver 8.8.8.8\n');
  return modules;
}

/** The loader and libraries `ldd` resolves for a program, as paths on this host. */
async function linkedLibraries(program: string, root: string): Promise<{ loader?: string; libs: Map<string, string> }> {
  const inRoot = root === '/' ? program : program.slice(root.replace(/\/$/, '').length);
  const output = root === '/' ? await run('ldd', [program]) : await run('chroot', [root, 'ldd', inRoot]);
  const libs = new Map<string, string>();
  let loader: string | undefined;
  const onHost = (path: string) => (root === '/' ? path : join(root, path));
  for (const line of output.split('\n')) {
    const linked = /^\s*(\S+) => (\/\S+) \(0x[0-9a-f]+\)$/.exec(line);
    if (linked) libs.set(linked[1], onHost(linked[2]));
    const interpreter = /^\s*(\/\S*ld-linux\S*) \(0x[0-9a-f]+\)$/.exec(line);
    if (interpreter) loader = onHost(interpreter[1]);
  }
  if (!libs.size) throw new Error(`ldd found no libraries for ${program}: ${output.trim().slice(0, 200)}`);
  return { loader, libs };
}

/** The wanted modules and their dependencies, in load order, as /.nestbox/modules/NN-name.ko. */
async function installKernelModules(tree: string, modulesDir: string): Promise<string[]> {
  const deps = new Map<string, string[]>();
  for (const line of (await readFile(join(modulesDir, 'modules.dep'), 'utf8')).split('\n')) {
    const [module, rest] = line.split(':');
    if (module && rest !== undefined) deps.set(module, rest.trim() ? rest.trim().split(/\s+/) : []);
  }
  const byName = new Map([...deps.keys()].map((path) => [basename(path).replace(/\.ko(\.(xz|zst|gz))?$/, ''), path]));
  const order: string[] = [];
  const visit = (path: string) => {
    if (order.includes(path)) return;
    for (const dep of deps.get(path) ?? []) visit(dep);
    order.push(path);
  };
  for (const name of OCI_VM_KERNEL_MODULES) {
    const path = byName.get(name);
    if (path) visit(path); // absent from modules.dep: built into the kernel
  }
  await mkdir(join(tree, '.nestbox/modules'), { recursive: true });
  for (const [index, path] of order.entries()) {
    const name = basename(path).replace(/\.ko(\.(xz|zst|gz))?$/, '');
    const target = join(tree, '.nestbox/modules', `${String(index).padStart(2, '0')}-${name}.ko`);
    const source = join(modulesDir, path);
    // busybox insmod hands the file to the kernel as is; decompress here.
    if (path.endsWith('.xz')) await writeFile(target, await runBuffer('xz', ['-dc', source]));
    else if (path.endsWith('.zst')) await writeFile(target, await runBuffer('zstd', ['-dc', source]));
    else if (path.endsWith('.gz')) await writeFile(target, await runBuffer('gzip', ['-dc', source]));
    else await copyFile(source, target);
  }
  return order.map((path) => basename(path));
}

/** Runtime keys by the files' identity (path, size, mtime): node alone is ~100 MB to hash per create. */
const runtimeKeys = new Map<string, string>();

/** Changes to any of these rebuild every image's disk at its next use. */
async function runtimeKeyOf(runtime: GuestRuntimeFiles): Promise<string> {
  const files = [runtime.nodeBinary, runtime.guestAgentBundle, runtime.busyboxBinary, runtime.socatBinary, runtime.ptyHelperBinary];
  const identity = JSON.stringify(await Promise.all(files.map(async (file) => (file ? stat(file).then((info) => [file, info.size, info.mtimeMs, info.ino], () => [file]) : null))));
  const memo = runtimeKeys.get(identity);
  if (memo) return memo;
  const key = await hashRuntime(runtime);
  runtimeKeys.set(identity, key);
  return key;
}

async function hashRuntime(runtime: GuestRuntimeFiles): Promise<string> {
  const hash = createHash('sha256').update(`layout ${OCI_VM_LAYOUT_VERSION}\0${INIT_SCRIPT}\0${RESYNC_SCRIPT}\0${agentStartScript({})}\0${OCI_VM_KERNEL_MODULES.join(',')}\0`);
  for (const file of [runtime.nodeBinary, runtime.guestAgentBundle, runtime.busyboxBinary, runtime.socatBinary, runtime.ptyHelperBinary]) {
    if (file && existsSync(file)) hash.update(file === runtime.guestAgentBundle ? await guestAgentBundleSha256(file) : await readFile(file));
    hash.update('\0');
  }
  hash.update(runtime.kernelModulesDir ?? '');
  return hash.digest('hex');
}

/** A shell word that stays one word whatever the value holds (newlines included). */
export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** The agent with exactly the image's environment, in its home, restarted if it ever exits. */
export function agentStartScript(env: Record<string, string>): string {
  const assignments = Object.entries(env)
    .filter(([name, value]) => ENV_NAME.test(name) && !value.includes('\0'))
    .map(([name, value]) => `  ${shellQuote(`${name}=${value}`)} \\\n`)
    .join('');
  return `#!${OCI_VM_BUSYBOX} sh
# The guest agent of a VM booted from an OCI image (written by host/images/vm-image-oci.ts).
# Run by ${OCI_VM_INIT} as the last step of a boot; the Cloud Hypervisor simulator runs it too.
# node runs on its own loader and libraries: nothing of the image's libc is used; and with an
# empty OpenSSL configuration (the image's openssl.cnf is written for the image's OpenSSL).
B=${OCI_VM_BUSYBOX}
cd ${shellQuote(env.HOME ?? '/')} 2>/dev/null || cd /
while :; do
  $B env -i \\
${assignments}  ${HOST_LIBS}/ld.so --inhibit-cache --library-path ${HOST_LIBS} /.nestbox/bin/node --openssl-config=/dev/null /.nestbox/lib/guest-agent.mjs --socket ${GUEST_AGENT_SOCKET}
  $B sleep 0.2
done
`;
}

// PID 1 of an image VM: what systemd and udev do in the default image, with busybox. Failures
// of optional steps are tolerated (a module may be built in, a serial port absent); the agent
// start is what the host waits for, and its lines reach the serial console.
const INIT_SCRIPT = `#!${OCI_VM_BUSYBOX} sh
# PID 1 of a VM booted from an OCI image (written by host/images/vm-image-oci.ts).
B=${OCI_VM_BUSYBOX}
export PATH=${DEFAULT_PATH}
$B mount -o remount,rw / 2>/dev/null
# Debian's initramfs moves its /dev, /proc, /sys and /run here before it runs us.
$B mountpoint -q /proc || $B mount -t proc proc /proc
$B mountpoint -q /sys || $B mount -t sysfs sysfs /sys
$B mountpoint -q /dev || $B mount -t devtmpfs devtmpfs /dev
$B mkdir -p /dev/pts /dev/shm
$B mountpoint -q /dev/pts || $B mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
$B mountpoint -q /dev/shm || $B mount -t tmpfs -o mode=1777 shm /dev/shm
$B mountpoint -q /run || $B mount -t tmpfs -o mode=755 run /run
$B mkdir -p /run/nestbox
# Even our own loader reads /etc/ld.so.preload: an image's (a library built for its libc) would
# be loaded into node and socat. Masked for every process, as the local driver does.
[ -f /etc/ld.so.preload ] && $B mount --bind /dev/null /etc/ld.so.preload
for module in /.nestbox/modules/*.ko; do
  [ -e "$module" ] && $B insmod "$module" 2>/dev/null
done
$B hostname -F /etc/hostname 2>/dev/null || $B hostname nestbox
$B ip link set lo up
$B ip link set eth0 up 2>/dev/null && $B ip addr add 169.254.0.21/30 dev eth0 && $B ip route add default via 169.254.0.22
SOCAT="${HOST_LIBS}/ld.so --inhibit-cache --library-path ${HOST_LIBS} /.nestbox/bin/socat"
# Hybrid vsock from the host agent (Cloud Hypervisor).
( while :; do $SOCAT VSOCK-LISTEN:1024,reuseaddr,fork UNIX-CONNECT:${GUEST_AGENT_SOCKET}; $B sleep 0.2; done ) &
# virtio-serial (QEMU smoke test): one byte stream, restarted whenever the agent closes it.
for port in /sys/class/virtio-ports/*; do
  if [ "$($B cat "$port/name" 2>/dev/null)" = ${VIRTIO_SERIAL_PORT_NAME} ]; then
    device=/dev/$($B basename "$port")
    ( until [ -S ${GUEST_AGENT_SOCKET} ]; do $B sleep 0.2; done
      while :; do $SOCAT -d "$device" UNIX-CONNECT:${GUEST_AGENT_SOCKET}; $B sleep 0.2; done ) &
  fi
done
${OCI_VM_AGENT_START} &
# As PID 1, reap whatever is orphaned; never exit (that would panic the kernel).
while :; do wait; $B sleep 1; done
`;

const RESYNC_SCRIPT = `#!${OCI_VM_BUSYBOX} sh
# Called by the host agent after every boot and restore of an image VM: clock, entropy, hostname.
B=${OCI_VM_BUSYBOX}
while [ $# -gt 0 ]; do
  case "$1" in
    --time-ms) $B date -u -s "@$(( $2 / 1000 ))" >/dev/null; shift 2 ;;
    --entropy) printf '%s' "$2" > /dev/urandom; shift 2 ;;
    --hostname) $B hostname "$2"; printf '%s\\n' "$2" > /etc/hostname 2>/dev/null; shift 2 ;;
    *) echo "nestbox-resync: unknown option $1" >&2; exit 2 ;;
  esac
done
`;

function run(file: string, args: string[], timeoutMs = 60_000): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024, encoding: 'utf8' }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${file} ${args.join(' ')} failed (exit code ${(error as { code?: unknown }).code}): ${stderr.trim() || error.message}`));
      else resolve(stdout);
    });
  });
}

function runBuffer(file: string, args: string[]): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: 60_000, maxBuffer: 64 * 1024 * 1024, encoding: 'buffer' }, (error, stdout) => (error ? reject(new Error(`${file} ${args.join(' ')}: ${error.message}`)) : resolve(stdout)));
  });
}
