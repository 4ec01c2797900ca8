// The VM image builder's steps with a fake debootstrap (the real one downloads the kernel
// package and takes minutes): the tree is cached, the guest agent and boot configuration go in,
// kernel + initramfs come out of /boot, mkfs.ext4 -d makes the rootfs, and a new agent bundle
// only redoes the cheap stage.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ensureVmImage, VM_IMAGE_NAME, VM_IMAGE_PACKAGES } from './vm-image.js';

// Arguments: --variant=… --include=… <suite> <target> <mirror>. Counts its runs.
const FAKE_DEBOOTSTRAP = `#!/bin/sh
set -e
include=$2
target=$4
echo "$include" > "$(dirname "$target")/include-seen"
echo run >> "$(dirname "$target")/runs"
echo "I: fake debootstrap into $target"
mkdir -p "$target/usr/bin" "$target/etc/systemd/system" "$target/boot" "$target/lib/systemd/system" "$target/var/lib/apt/lists"
echo kernel-6.1.0-98 > "$target/boot/vmlinuz-6.1.0-98-cloud-amd64"
echo initrd-6.1.0-98 > "$target/boot/initrd.img-6.1.0-98-cloud-amd64"
echo kernel-6.1.0-99 > "$target/boot/vmlinuz-6.1.0-99-cloud-amd64"
echo initrd-6.1.0-99 > "$target/boot/initrd.img-6.1.0-99-cloud-amd64"
echo stale > "$target/var/lib/apt/lists/some_Packages"
echo "I: Base system installed successfully."
`;

// Arguments: install --prefix <dir> … : leaves what installLanguageServers checks for.
const FAKE_NPM = `#!/bin/sh
set -e
mkdir -p "$3/node_modules/typescript-language-server/lib"
touch "$3/node_modules/typescript-language-server/lib/cli.mjs"
`;

// Stands in for installNodeRuntime (which needs root for its chroot check, and the registry).
async function fakeNodeRuntime(rootfs: string): Promise<void> {
  mkdirSync(join(rootfs, 'usr', 'local', 'bin'), { recursive: true });
  writeFileSync(join(rootfs, 'usr', 'local', 'bin', 'node'), 'installed\n', { mode: 0o755 });
}

function debugfsCat(image: string, path: string): string {
  return execFileSync('debugfs', ['-R', `cat ${path}`, image], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
}

describe('ensureVmImage', () => {
  let dir: string;
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('builds kernel, initramfs and an ext4 rootfs with the agent started at boot; caches both stages', async () => {
    dir = mkdtempSync('/tmp/nbx-vmimg-');
    const imagesDir = join(dir, 'images');
    const fake = join(dir, 'fake-debootstrap');
    writeFileSync(fake, FAKE_DEBOOTSTRAP, { mode: 0o755 });
    const npm = join(dir, 'fake-npm');
    writeFileSync(npm, FAKE_NPM, { mode: 0o755 });
    const agent = join(dir, 'guest-agent.mjs');
    writeFileSync(agent, '// agent v1\n');
    const lines: string[] = [];
    // A small stand-in for the node binary keeps the 64 MiB test image roomy.
    const node = join(dir, 'node');
    writeFileSync(node, '#!/bin/sh\n', { mode: 0o755 });
    const options = { imagesDir, guestAgentBundle: agent, nodeBinary: node, debootstrapBinary: fake, npmBinary: npm, installNodeRuntime: fakeNodeRuntime, installAptPackages: async () => {}, diskSizeMiB: 64, onProgress: (line: string) => lines.push(line) };

    const image = await ensureVmImage(options);
    const imageDir = join(imagesDir, VM_IMAGE_NAME);
    expect(readFileSync(image.kernel, 'utf8')).toBe('kernel-6.1.0-99\n'); // the newest kernel
    expect(readFileSync(image.initramfs, 'utf8')).toBe('initrd-6.1.0-99\n');
    expect(image.manifest.kernelVersion).toBe('6.1.0-99-cloud-amd64');
    expect(statSync(image.rootfs).size).toBe(64 * 1024 * 1024);
    expect(readFileSync(join(imageDir, 'include-seen'), 'utf8')).toContain('linux-image-cloud-amd64');
    expect([...VM_IMAGE_PACKAGES]).toEqual(expect.arrayContaining(['socat', 'systemd-sysv', 'initramfs-tools', 'python3', 'git', 'curl']));
    expect(lines.some((line) => line.includes('fake debootstrap'))).toBe(true);
    expect(lines.some((line) => line.includes('mkfs.ext4'))).toBe(true);

    // Inside the ext4 image: agent, units (enabled), network, resync helper, kvm rule.
    expect(debugfsCat(image.rootfs, '/.nestbox/lib/guest-agent.mjs')).toBe('// agent v1\n');
    expect(debugfsCat(image.rootfs, '/etc/systemd/system/nestbox-agent.service')).toContain('--socket /run/nestbox/agent.sock');
    // The compat layers' default users, as in the local base image.
    expect(debugfsCat(image.rootfs, '/etc/passwd')).toContain('user:x:1000:1000:user:/home/user:/bin/bash');
    expect(debugfsCat(image.rootfs, '/etc/sudoers.d/nestbox-sandbox-users')).toContain('daytona ALL=(ALL:ALL) NOPASSWD: ALL');
    expect(debugfsCat(image.rootfs, '/etc/systemd/system/nestbox-agent-vsock.service')).toContain('VSOCK-LISTEN:1024');
    expect(debugfsCat(image.rootfs, '/etc/systemd/system/nestbox-agent-serial.service')).toContain('/dev/virtio-ports/nestbox.agent');
    const wants = execFileSync('debugfs', ['-R', 'ls -l /etc/systemd/system/multi-user.target.wants', image.rootfs], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
    for (const unit of ['nestbox-agent.service', 'nestbox-agent-vsock.service', 'nestbox-agent-serial.service', 'nestbox-kvm.service', 'systemd-networkd.service']) expect(wants).toContain(unit);
    expect(debugfsCat(image.rootfs, '/etc/systemd/network/10-eth0.network')).toContain('Address=169.254.0.21/30');
    expect(debugfsCat(image.rootfs, '/usr/local/bin/nestbox-resync')).toContain('--time-ms');
    expect(debugfsCat(image.rootfs, '/etc/udev/rules.d/65-nestbox-kvm.rules')).toContain('KERNEL=="kvm"');
    expect(debugfsCat(image.rootfs, '/var/lib/apt/lists/some_Packages')).toBe('');
    // The default image's Node.js and pip configuration.
    expect(debugfsCat(image.rootfs, '/usr/local/bin/node')).toBe('installed\n');
    expect(debugfsCat(image.rootfs, '/etc/pip.conf')).toContain('break-system-packages = true');
    expect(existsSync(join(imageDir, '.lock'))).toBe(false);

    // Cached: same agent → nothing rebuilt.
    await ensureVmImage(options);
    expect(readFileSync(join(imageDir, 'runs'), 'utf8').trim().split('\n')).toHaveLength(1);
    // New agent bundle → image files rebuilt from the cached tree (no second debootstrap).
    writeFileSync(agent, '// agent v2\n');
    const updated = await ensureVmImage(options);
    expect(readFileSync(join(imageDir, 'runs'), 'utf8').trim().split('\n')).toHaveLength(1);
    expect(debugfsCat(updated.rootfs, '/.nestbox/lib/guest-agent.mjs')).toBe('// agent v2\n');
  });

  it('reports a failing debootstrap and leaves no complete image', async () => {
    dir = mkdtempSync('/tmp/nbx-vmimg-');
    const failing = join(dir, 'failing');
    writeFileSync(failing, '#!/bin/sh\necho "E: Couldn\'t download linux-image-cloud-amd64" >&2\nexit 1\n', { mode: 0o755 });
    const agent = join(dir, 'agent.mjs');
    writeFileSync(agent, '//\n');
    await expect(ensureVmImage({ imagesDir: join(dir, 'images'), guestAgentBundle: agent, debootstrapBinary: failing })).rejects.toThrow(/linux-image-cloud-amd64/);
    expect(existsSync(join(dir, 'images', VM_IMAGE_NAME, 'manifest.json'))).toBe(false);
    expect(existsSync(join(dir, 'images', VM_IMAGE_NAME, '.lock'))).toBe(false);
  });
});
