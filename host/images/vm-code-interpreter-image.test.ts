// The Cloud Hypervisor driver's code-interpreter disk, with fakes for debootstrap, npm and the
// code-interpreter install (the real ones take minutes and the network; the local image's
// integration test runs the real install): it is built on the VM image's tree, has today's
// guest agent, and a new agent bundle redoes the disk from the cached tree.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ensureVmImage } from './vm-image.js';
import { ensureVmCodeInterpreterImage, readCompleteVmCodeInterpreterImage } from './vm-code-interpreter-image.js';

const FAKE_DEBOOTSTRAP = `#!/bin/sh
set -e
target=$4
mkdir -p "$target/usr/bin" "$target/etc/systemd/system" "$target/boot" "$target/lib/systemd/system"
echo kernel > "$target/boot/vmlinuz-6.1.0-99-cloud-amd64"
echo initrd > "$target/boot/initrd.img-6.1.0-99-cloud-amd64"
`;
const FAKE_NPM = `#!/bin/sh
set -e
mkdir -p "$3/node_modules/typescript-language-server/lib"
touch "$3/node_modules/typescript-language-server/lib/cli.mjs"
`;

function debugfsCat(image: string, path: string): string {
  return execFileSync('debugfs', ['-R', `cat ${path}`, image], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
}

describe('ensureVmCodeInterpreterImage', () => {
  let dir: string;
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('adds the code interpreter to the VM tree as its own disk, and redoes only the disk for a new agent', async () => {
    dir = mkdtempSync('/tmp/nbx-vmci-');
    const imagesDir = join(dir, 'images');
    writeFileSync(join(dir, 'debootstrap'), FAKE_DEBOOTSTRAP, { mode: 0o755 });
    writeFileSync(join(dir, 'npm'), FAKE_NPM, { mode: 0o755 });
    const agent = join(dir, 'guest-agent.mjs');
    writeFileSync(agent, '// agent v1\n');
    const node = join(dir, 'node');
    writeFileSync(node, '#!/bin/sh\n', { mode: 0o755 });
    let installs = 0;
    const options = {
      imagesDir,
      guestAgentBundle: agent,
      nodeBinary: node,
      debootstrapBinary: join(dir, 'debootstrap'),
      npmBinary: join(dir, 'npm'),
      installNodeRuntime: async () => {},
      installAptPackages: async () => {},
      diskSizeMiB: 64,
      codeInterpreterDiskSizeMiB: 64,
      installCodeInterpreter: async (tree: string) => {
        installs++;
        mkdirSync(join(tree, 'usr', 'local', 'share', 'jupyter', 'kernels', 'deno'), { recursive: true });
        writeFileSync(join(tree, 'usr', 'local', 'share', 'jupyter', 'kernels', 'deno', 'kernel.json'), '{"language":"typescript"}\n');
      },
    };

    const vm = await ensureVmImage(options);
    // Not built yet: the driver's read finds nothing (it refuses the create).
    expect(await readCompleteVmCodeInterpreterImage(imagesDir, vm)).toBeUndefined();
    const image = await ensureVmCodeInterpreterImage(options);
    expect(installs).toBe(1);
    expect(statSync(image.rootfs).size).toBe(64 * 1024 * 1024);
    expect(image.manifest.kernelVersion).toBe(vm.manifest.kernelVersion);
    expect(debugfsCat(image.rootfs, '/usr/local/share/jupyter/kernels/deno/kernel.json')).toContain('typescript');
    expect(debugfsCat(image.rootfs, '/.nestbox/lib/guest-agent.mjs')).toBe('// agent v1\n');
    expect(debugfsCat(image.rootfs, '/etc/systemd/system/nestbox-agent.service')).toContain('/run/nestbox/agent.sock');
    expect((await readCompleteVmCodeInterpreterImage(imagesDir, vm))?.rootfs).toBe(image.rootfs);
    // The VM image's own disk is untouched.
    expect(() => debugfsCat(vm.rootfs, '/usr/local/share/jupyter/kernels/deno/kernel.json')).not.toThrow();
    expect(debugfsCat(vm.rootfs, '/usr/local/share/jupyter/kernels/deno/kernel.json')).toBe('');

    // Cached; a new agent bundle makes the old disk stale for the driver, and redoes only the disk.
    await ensureVmCodeInterpreterImage(options);
    expect(installs).toBe(1);
    writeFileSync(agent, '// agent v2\n');
    const vm2 = await ensureVmImage(options);
    expect(await readCompleteVmCodeInterpreterImage(imagesDir, vm2)).toBeUndefined();
    const updated = await ensureVmCodeInterpreterImage(options);
    expect(installs).toBe(1);
    expect(debugfsCat(updated.rootfs, '/.nestbox/lib/guest-agent.mjs')).toBe('// agent v2\n');
  });
});
