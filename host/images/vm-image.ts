// The Cloud Hypervisor guest image (host-runtime.md §5), from Debian packages only: a
// debootstrap tree with Debian's cloud kernel and initramfs, the guest agent started at boot by
// systemd and reachable over vsock (port 1024) and a virtio-serial port (`nestbox.agent`), a
// static network identical in every VM, /dev/kvm for nested use, and the local base image's
// tools. Output under <imagesDir>/<name>/: vmlinuz, initrd.img, rootfs.img (ext4, sparse raw),
// manifest.json (written last = complete).
//
// Two cache levels: the debootstrap tree (`tree/` + `tree.json`, minutes to build: the kernel
// package download dominates) and the image files (seconds: agent install + mkfs.ext4 -d). A new
// guest-agent bundle only redoes the second.
import { createHash } from 'node:crypto';
import { execFile } from 'node:child_process';
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { acquireBuildLock, createSandboxAccounts, DEFAULT_IMAGE_APT_PACKAGES, DEFAULT_IMAGE_PACKAGES, IMAGE_SETUP_VERSION, letPipInstall, runDebootstrap } from './base-image.js';
import { aptInstall } from './chroot.js';
import { removeTree, writeFileAtomic } from '../util/fs.js';
import { installLanguageServers, LANGUAGE_SERVERS_IMAGE_KEY } from './language-servers.js';
import { installNodeRuntime, NODE_RUNTIME_IMAGE_KEY } from './node-runtime.js';
import { copyGuestAgentBundle, guestAgentBundleSha256 } from '../util/guest-agent-bundle.js';

export const VM_IMAGE_NAME = 'vm-default';

/** The local base image's tools plus what a VM needs to boot and serve the agent. */
export const VM_IMAGE_PACKAGES = [
  ...DEFAULT_IMAGE_PACKAGES,
  'systemd-sysv',
  'udev',
  'kmod',
  'initramfs-tools',
  'linux-image-cloud-amd64',
  // Node cannot open AF_VSOCK sockets; socat bridges vsock and virtio-serial to the agent's Unix socket.
  'socat',
  'iputils-ping',
  // PID 1 and shell of VMs booted from OCI images (vm-image-oci.ts), whatever the image holds.
  'busybox-static',
] as const;

export const GUEST_AGENT_SOCKET = '/run/nestbox/agent.sock';
export const VIRTIO_SERIAL_PORT_NAME = 'nestbox.agent';

export interface VmImage {
  kernel: string;
  initramfs: string;
  rootfs: string;
  manifest: VmImageManifest;
}

export interface VmImageManifest {
  name: string;
  suite: string;
  mirror: string;
  packages: string[];
  kernelVersion: string;
  guestFilesSha256: string;
  diskSizeMiB: number;
  builtAt: string;
  treeSeconds: number;
  imageSeconds: number;
}

export interface EnsureVmImageOptions {
  imagesDir: string;
  name?: string;
  guestAgentBundle: string;
  /** The node binary copied into the guest (the host's; same Debian release as the guest). */
  nodeBinary?: string;
  /** Static PTY helper for terminals (dist/nestbox-pty); skipped when absent. */
  ptyHelperBinary?: string;
  suite?: string;
  mirror?: string;
  diskSizeMiB?: number;
  debootstrapBinary?: string;
  /** The npm program that installs the language servers (tests substitute a fake one too). */
  npmBinary?: string;
  /** Installs Node.js and npm into the tree (tests substitute a fake: the real one needs root and the registry). */
  installNodeRuntime?: (rootfs: string, progress: (line: string) => void) => Promise<void>;
  /** Installs DEFAULT_IMAGE_APT_PACKAGES after debootstrap, as in the local base image (tests substitute a fake). */
  installAptPackages?: (rootfs: string, packages: readonly string[], progress: (line: string) => void) => Promise<void>;
  onProgress?: (line: string) => void;
  lockWaitMs?: number;
}

/** Complete = manifest present and the three files there. */
export async function readCompleteVmImage(imageDir: string): Promise<VmImage | undefined> {
  try {
    const manifest = JSON.parse(await readFile(join(imageDir, 'manifest.json'), 'utf8')) as VmImageManifest;
    const image = { kernel: join(imageDir, 'vmlinuz'), initramfs: join(imageDir, 'initrd.img'), rootfs: join(imageDir, 'rootfs.img'), manifest };
    for (const path of [image.kernel, image.initramfs, image.rootfs]) await stat(path);
    return image;
  } catch {
    return undefined;
  }
}

export async function ensureVmImage(options: EnsureVmImageOptions): Promise<VmImage> {
  const name = options.name ?? VM_IMAGE_NAME;
  const imageDir = join(options.imagesDir, name);
  const progress = options.onProgress ?? (() => {});
  // The agent bundle and everything else we add: a change to either rebuilds the image files.
  const guestFilesSha256 = createHash('sha256')
    .update(await guestAgentBundleSha256(options.guestAgentBundle))
    .update([GUEST_AGENT_UNIT, VSOCK_BRIDGE_UNIT, SERIAL_BRIDGE_UNIT, KVM_UNIT, RESYNC_SCRIPT].join('\0'))
    .digest('hex');
  const cached = await readCompleteVmImage(imageDir);
  if (cached?.manifest.guestFilesSha256 === guestFilesSha256) return cached;
  await mkdir(imageDir, { recursive: true });
  const release = await acquireBuildLock(join(imageDir, '.lock'), options.lockWaitMs ?? 30 * 60_000);
  try {
    const meanwhile = await readCompleteVmImage(imageDir);
    if (meanwhile?.manifest.guestFilesSha256 === guestFilesSha256) return meanwhile;
    const suite = options.suite ?? 'bookworm';
    const mirror = options.mirror ?? 'http://deb.debian.org/debian';
    const tree = await ensureTree(imageDir, suite, mirror, options, progress);
    return await buildImageFiles(imageDir, name, tree.dir, { suite, mirror, guestFilesSha256, treeSeconds: tree.seconds }, options, progress);
  } finally {
    await release();
  }
}

// ---- stage 1: the debootstrap tree --------------------------------------------------------------

async function ensureTree(imageDir: string, suite: string, mirror: string, options: EnsureVmImageOptions, progress: (line: string) => void): Promise<{ dir: string; seconds: number }> {
  const dir = join(imageDir, 'tree');
  const packages = [...VM_IMAGE_PACKAGES];
  const key = JSON.stringify({ suite, mirror, packages, aptPackages: DEFAULT_IMAGE_APT_PACKAGES, setupVersion: IMAGE_SETUP_VERSION, languageServers: LANGUAGE_SERVERS_IMAGE_KEY, nodeRuntime: NODE_RUNTIME_IMAGE_KEY });
  const marker = join(imageDir, 'tree.json');
  const existing = await readFile(marker, 'utf8').then((text) => JSON.parse(text) as { key: string; seconds: number }).catch(() => undefined);
  if (existing?.key === key && existsSync(join(dir, 'usr'))) {
    progress(`vm image: reusing the debootstrap tree (${dir})`);
    return { dir, seconds: existing.seconds };
  }
  for (const entry of await readdir(imageDir)) if (entry.startsWith('.tree-')) await removeTree(join(imageDir, entry));
  const temp = join(imageDir, `.tree-${process.pid}`);
  const started = Date.now();
  // The kernel comes in through --include: debootstrap configures it inside the target with
  // /proc mounted, so initramfs-tools builds the initrd (MODULES=most has virtio_blk/net/pci).
  progress(`vm image: debootstrap ${suite} (minbase + ${packages.length} packages incl. linux-image-cloud-amd64) from ${mirror}`);
  await runDebootstrap(options.debootstrapBinary ?? 'debootstrap', ['--variant=minbase', `--include=${packages.join(',')}`, suite, temp, mirror], progress);
  // IPython's kernel and jupyter_client, as in the local base image (apt: debootstrap cannot configure them).
  await (options.installAptPackages ?? aptInstall)(temp, DEFAULT_IMAGE_APT_PACKAGES, progress);
  await addNpmTrees(temp, options, progress);
  // The same accounts and pip configuration as the local base image.
  await createSandboxAccounts(temp);
  await letPipInstall(temp);
  await rm(marker, { force: true });
  await removeTree(dir);
  await rename(temp, dir);
  const seconds = Math.round((Date.now() - started) / 1000);
  await writeFileAtomic(marker, `${JSON.stringify({ key, seconds })}\n`);
  progress(`vm image: tree ready in ${seconds} s`);
  return { dir, seconds };
}

/**
 * The language servers (/opt/nestbox/lsp) and the workloads' Node.js and npm (/usr/local), as in
 * the local base image, installed the same way. (Copying them out of a built base image instead
 * was measured: about as slow as npm with its cache warm, which it is after the base build.)
 */
async function addNpmTrees(tree: string, options: EnsureVmImageOptions, progress: (line: string) => void): Promise<void> {
  await installLanguageServers(tree, progress, options.npmBinary);
  await (options.installNodeRuntime ?? ((rootfs, onLine) => installNodeRuntime(rootfs, onLine, options.npmBinary)))(tree, progress);
}

// ---- stage 2: agent, boot configuration, kernel files, ext4 image ------------------------------------

async function buildImageFiles(
  imageDir: string,
  name: string,
  tree: string,
  facts: { suite: string; mirror: string; guestFilesSha256: string; treeSeconds: number },
  options: EnsureVmImageOptions,
  progress: (line: string) => void,
): Promise<VmImage> {
  const started = Date.now();
  await rm(join(imageDir, 'manifest.json'), { force: true });
  progress('vm image: installing the guest agent and boot configuration');
  await installGuestFiles(tree, options);
  const { kernel, initrd, version } = await findKernel(tree);
  await copyFile(kernel, join(imageDir, 'vmlinuz'));
  await copyFile(initrd, join(imageDir, 'initrd.img'));
  const diskSizeMiB = options.diskSizeMiB ?? 4096;
  const temp = join(imageDir, 'rootfs.img.partial');
  await rm(temp, { force: true });
  progress(`vm image: mkfs.ext4 -d (${diskSizeMiB} MiB, sparse)`);
  // -d copies the tree into the new filesystem: no loop mount, works without extra privileges.
  await run('mkfs.ext4', ['-q', '-F', '-L', 'rootfs', '-E', 'root_owner=0:0', '-d', tree, temp, `${diskSizeMiB}M`], 600_000);
  await run('e2fsck', ['-fy', temp], 600_000).catch((error: Error) => {
    // e2fsck exits 1 when it fixed something; only worse is a failure.
    if (!/\(exit code 1\)/.test(error.message)) throw error;
  });
  await rename(temp, join(imageDir, 'rootfs.img'));
  const manifest: VmImageManifest = {
    name,
    suite: facts.suite,
    mirror: facts.mirror,
    packages: [...VM_IMAGE_PACKAGES],
    kernelVersion: version,
    guestFilesSha256: facts.guestFilesSha256,
    diskSizeMiB,
    builtAt: new Date().toISOString(),
    treeSeconds: facts.treeSeconds,
    imageSeconds: Math.round((Date.now() - started) / 1000),
  };
  await writeFileAtomic(join(imageDir, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  progress(`vm image ${name} ready (kernel ${version}) in ${manifest.imageSeconds} s`);
  const image = await readCompleteVmImage(imageDir);
  if (!image) throw new Error(`vm image ${name}: output incomplete in ${imageDir}`);
  return image;
}

/** The newest `vmlinuz-*` and its initrd in the tree's /boot. */
export async function findKernel(tree: string): Promise<{ kernel: string; initrd: string; version: string }> {
  const boot = join(tree, 'boot');
  const versions = (await readdir(boot).catch(() => [] as string[]))
    .filter((entry) => entry.startsWith('vmlinuz-'))
    .map((entry) => entry.slice('vmlinuz-'.length))
    .sort(compareVersions);
  const version = versions[versions.length - 1];
  if (!version) throw new Error(`vm image: no kernel in ${boot} (did linux-image-cloud-amd64 install?)`);
  const initrd = join(boot, `initrd.img-${version}`);
  if (!existsSync(initrd)) throw new Error(`vm image: kernel ${version} has no initramfs (${initrd}); is initramfs-tools installed?`);
  return { kernel: join(boot, `vmlinuz-${version}`), initrd, version };
}

function compareVersions(a: string, b: string): number {
  return a.localeCompare(b, 'en', { numeric: true });
}

/** Writes `content` at `path` inside `tree` (made, replaced, with exactly `mode`). */
export async function writeTreeFile(tree: string, path: string, content: string, mode = 0o644): Promise<void> {
  const target = join(tree, path);
  await mkdir(dirname(target), { recursive: true });
  await rm(target, { force: true });
  await writeFile(target, content, { mode });
  await chmod(target, mode);
}

/** Everything we add to the Debian tree. Idempotent (the tree is reused across agent updates). */
export async function installGuestFiles(tree: string, options: Pick<EnsureVmImageOptions, 'guestAgentBundle' | 'nodeBinary' | 'ptyHelperBinary'>): Promise<void> {
  const put = (path: string, content: string, mode = 0o644) => writeTreeFile(tree, path, content, mode);
  const enable = async (unit: string, target = 'multi-user.target', from = `/etc/systemd/system/${unit}`): Promise<void> => {
    const link = join(tree, 'etc/systemd/system', `${target}.wants`, unit);
    await mkdir(dirname(link), { recursive: true });
    await rm(link, { force: true });
    await symlink(from, link);
  };
  // Same layout as the local driver's bind mounts, so the agent finds its helpers where it expects.
  await mkdir(join(tree, '.nestbox/bin'), { recursive: true });
  await mkdir(join(tree, '.nestbox/lib'), { recursive: true });
  await copyFile(options.nodeBinary ?? process.execPath, join(tree, '.nestbox/bin/node'));
  await chmod(join(tree, '.nestbox/bin/node'), 0o755);
  // With its lazily imported chunks, in .nestbox/lib/guest-agent-chunks (util/guest-agent-bundle.ts).
  await copyGuestAgentBundle(options.guestAgentBundle, join(tree, '.nestbox/lib/guest-agent.mjs'));
  if (options.ptyHelperBinary && existsSync(options.ptyHelperBinary)) {
    await copyFile(options.ptyHelperBinary, join(tree, '.nestbox/bin/nestbox-pty'));
    await chmod(join(tree, '.nestbox/bin/nestbox-pty'), 0o755);
  }
  await put('etc/systemd/system/nestbox-agent.service', GUEST_AGENT_UNIT);
  await put('etc/systemd/system/nestbox-agent-vsock.service', VSOCK_BRIDGE_UNIT);
  await put('etc/systemd/system/nestbox-agent-serial.service', SERIAL_BRIDGE_UNIT);
  await put('etc/systemd/system/nestbox-kvm.service', KVM_UNIT);
  await enable('nestbox-agent.service');
  await enable('nestbox-agent-vsock.service');
  await enable('nestbox-agent-serial.service');
  await enable('nestbox-kvm.service');
  await enable('systemd-networkd.service', 'multi-user.target', '/lib/systemd/system/systemd-networkd.service');
  await put('etc/systemd/network/10-eth0.network', '[Match]\nName=eth0\n\n[Network]\nAddress=169.254.0.21/30\nGateway=169.254.0.22\n');
  await put('etc/modules-load.d/nestbox.conf', '# hybrid vsock to the host agent\nvmw_vsock_virtio_transport\n');
  await put('etc/udev/rules.d/65-nestbox-kvm.rules', '# Nested virtualization: the sandbox user may use /dev/kvm.\nKERNEL=="kvm", GROUP="kvm", MODE="0666"\n');
  // Live resize (vm.resize): vCPUs and memory blocks CH hotplugs arrive offline; online them.
  await put('etc/udev/rules.d/66-nestbox-hotplug.rules', '# Live resize: hotplugged vCPUs and memory come online at once.\nSUBSYSTEM=="cpu", ACTION=="add", TEST=="online", ATTR{online}=="0", ATTR{online}="1"\nSUBSYSTEM=="memory", ACTION=="add", TEST=="state", ATTR{state}=="offline", ATTR{state}="online"\n');
  await put('usr/local/bin/nestbox-resync', RESYNC_SCRIPT, 0o755);
  await put('etc/fstab', '/dev/vda / ext4 rw,discard,errors=remount-ro 0 1\n');
  await put('etc/hostname', 'nestbox\n');
  await put('etc/hosts', '127.0.0.1\tlocalhost\n127.0.1.1\tnestbox\n::1\tlocalhost ip6-localhost ip6-loopback\n');
  await put('etc/resolv.conf', 'nameserver 1.1.1.1\nnameserver 8.8.8.8\n');
  // Empty: systemd generates one per boot instead of every clone sharing the builder's.
  await put('etc/machine-id', '');
  // The image is booted, never apt-updated in place; lists only cost disk.
  await removeTree(join(tree, 'var/lib/apt/lists')).catch(() => {});
  await mkdir(join(tree, 'var/lib/apt/lists/partial'), { recursive: true });
  await removeTree(join(tree, 'var/cache/apt/archives')).catch(() => {});
  await mkdir(join(tree, 'var/cache/apt/archives/partial'), { recursive: true });
}

const GUEST_AGENT_UNIT = `[Unit]
Description=Nestbox guest agent
After=local-fs.target

[Service]
Environment=HOME=/root
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WorkingDirectory=/root
ExecStart=/.nestbox/bin/node /.nestbox/lib/guest-agent.mjs --socket ${GUEST_AGENT_SOCKET}
# Its log lines (and a failure to start) show on the serial console, which the host keeps.
StandardOutput=journal+console
StandardError=journal+console
Restart=always
RestartSec=200ms

[Install]
WantedBy=multi-user.target
`;

const VSOCK_BRIDGE_UNIT = `[Unit]
Description=Nestbox guest agent on vsock port 1024 (hybrid vsock from the host)
After=nestbox-agent.service
Wants=nestbox-agent.service
StartLimitIntervalSec=0

[Service]
ExecStartPre=-/sbin/modprobe vmw_vsock_virtio_transport
ExecStart=/usr/bin/socat VSOCK-LISTEN:1024,reuseaddr,fork UNIX-CONNECT:${GUEST_AGENT_SOCKET}
Restart=always
RestartSec=200ms

[Install]
WantedBy=multi-user.target
`;

// One byte stream (no connections on a serial port): good for sequential HTTP/1.1 requests,
// which is what the QEMU smoke test needs. Bound to the port's device so it starts when it appears.
const SERIAL_BRIDGE_UNIT = `[Unit]
Description=Nestbox guest agent on virtio-serial port ${VIRTIO_SERIAL_PORT_NAME}
BindsTo=dev-virtio\\x2dports-${VIRTIO_SERIAL_PORT_NAME}.device
After=dev-virtio\\x2dports-${VIRTIO_SERIAL_PORT_NAME}.device nestbox-agent.service
# socat exits whenever the agent closes the connection; it must always come back.
StartLimitIntervalSec=0

[Service]
# The agent (node) can take seconds to listen on a slow boot; connecting earlier would fail.
ExecStart=/bin/sh -c 'until [ -S ${GUEST_AGENT_SOCKET} ]; do sleep 0.2; done; exec /usr/bin/socat -d /dev/virtio-ports/${VIRTIO_SERIAL_PORT_NAME} UNIX-CONNECT:${GUEST_AGENT_SOCKET}'
StandardError=journal+console
Restart=always
RestartSec=200ms

[Install]
WantedBy=multi-user.target
`;

const KVM_UNIT = `[Unit]
Description=Load the KVM module for nested virtualization (when the host passes VMX/SVM through)
ConditionVirtualization=vm

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'if grep -qw vmx /proc/cpuinfo; then modprobe kvm_intel; elif grep -qw svm /proc/cpuinfo; then modprobe kvm_amd; fi; true'

[Install]
WantedBy=multi-user.target
`;

const RESYNC_SCRIPT = `#!/bin/sh
# Called by the host agent after every boot and restore (the guest's clock stood still while it
# was stopped; clones must not share RNG state; a fork child gets its own hostname).
set -e
while [ $# -gt 0 ]; do
  case "$1" in
    --time-ms) date -u -s "@$(( $2 / 1000 ))" >/dev/null; shift 2 ;;
    # Mixed into the pool (not credited: that needs the RNDADDENTROPY ioctl).
    --entropy) printf '%s' "$2" > /dev/urandom; shift 2 ;;
    --hostname) hostname "$2"; printf '%s\\n' "$2" > /etc/hostname; shift 2 ;;
    *) echo "nestbox-resync: unknown option $1" >&2; exit 2 ;;
  esac
done
`;

function run(file: string, args: string[], timeoutMs = 60_000): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${file} ${args.join(' ')} failed (exit code ${(error as { code?: unknown }).code}): ${stderr.trim() || error.message}`));
      else resolve(stdout);
    });
  });
}
