// Cloud Hypervisor sandboxes from OCI images (host/images/vm-image-oci.ts) against the CH
// simulator: a busybox image built here with umoci, served by Debian's registry on loopback and
// pulled into an OCI store, becomes a bootable ext4 disk once per digest; sandboxes boot it.
//
// What the simulator proves here (host/sim/ch/guest.ts): the VmConfig the driver sends (checked
// against CH's API description) names the sandbox's copy of the image's disk and our init; the
// disk is a real ext4 holding the image plus /.nestbox; the disk's own agent-start runs the
// agent chrooted into the image's files with the disk's node, loader and libraries (not the
// image's libc: the image has none) and the image's Env; files written by the guest persist on
// the ext4 across stop/start and into snapshots and forks. What it cannot: the kernel,
// initramfs and PID 1's init script (mounts, modules, network, socat on vsock) — a real boot
// does (scripts/vm-smoke.mjs --oci, QEMU).
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { projectPath } from '../../../src/paths.js';
import type { AgentClient } from '../../agent-protocol/client.js';
import { hexOf, OciImageStore } from '../../images/oci/store.js';
import { buildTestImage, busyboxImageSpec, distrolessImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../../images/oci/test-registry.js';
import { ensureOciVmDisk, ociVmDiskDir, OCI_VM_INIT, readOciVmDisk, removeOciVmDisk, type GuestRuntimeFiles } from '../../images/vm-image-oci.js';
import { VM_IMAGE_NAME } from '../../images/vm-image.js';
import { installSimulator } from '../../sim/ch/launcher.js';
import { ChApi } from './api.js';
import { ChDriver } from './driver.js';

const isRoot = process.getuid?.() === 0;
const ownerId = `choci-${process.pid}`;

/** The host's node and static busybox stand in for the VM image's tree (the same Debian). */
function hostRuntime(): GuestRuntimeFiles {
  return {
    nodeBinary: process.execPath,
    guestAgentBundle: projectPath('dist/guest-agent.mjs'),
    ptyHelperBinary: projectPath('dist/nestbox-pty'),
    busyboxBinary: '/bin/busybox',
    socatBinary: '/usr/bin/socat',
    librariesRoot: '/',
  };
}

function debugfs(disk: string, request: string): string {
  return execFileSync('debugfs', ['-R', request, disk], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
}

async function exec(client: AgentClient, request: { argv?: string[]; cmd?: string; env?: Record<string, string> }) {
  return client.exec({ ...request, timeoutMs: 20_000 });
}

describe.skipIf(!isRoot)('cloud-hypervisor driver: sandboxes from OCI images (simulator)', () => {
  let root: string;
  let imagesDir: string;
  let ociStoreDir: string;
  let registry: TestRegistry;
  let driver: ChDriver;
  let imageId: string;
  let otherImageId: string;

  const spec = (id: string, image = imageId, extra: Record<string, unknown> = {}) => ({ id, image, cpu: 1, memoryMiB: 256, env: { SANDBOX_VAR: `of ${id}`, OVERRIDDEN: 'sandbox' }, ...extra });
  const withClient = async <T>(id: string, task: (client: AgentClient) => Promise<T>): Promise<T> => {
    const client = driver.agentClient(id);
    try {
      return await task(client);
    } finally {
      client.close();
    }
  };

  beforeAll(async () => {
    root = mkdtempSync('/tmp/nbco-');
    if (!existsSync(projectPath('dist/guest-agent.mjs'))) execFileSync('npm', ['run', 'build'], { cwd: projectPath('.'), stdio: 'inherit' });
    const sim = await installSimulator(join(root, 'sim'));
    imagesDir = join(root, 'images');
    ociStoreDir = join(imagesDir, 'oci');
    // The simulator boots no kernel: a stand-in VM image (kernel + initramfs) is enough.
    const vmImage = join(imagesDir, VM_IMAGE_NAME);
    mkdirSync(vmImage, { recursive: true });
    writeFileSync(join(vmImage, 'vmlinuz'), 'not a kernel');
    writeFileSync(join(vmImage, 'initrd.img'), 'not an initramfs');
    execFileSync('truncate', ['-s', '64M', join(vmImage, 'rootfs.img')]);
    writeFileSync(join(vmImage, 'manifest.json'), JSON.stringify({ name: VM_IMAGE_NAME, kernelVersion: 'none', fake: true }));
    registry = await startTestRegistry();
    const work = join(root, 'build');
    await pushTestImage(await buildTestImage(join(work, 'busybox'), busyboxImageSpec({ env: ['GREETING=hello from the image', 'PATH=/bin', 'OVERRIDDEN=image'], workingDir: '/srv/app' })), `${registry.host}/test/busybox:1`);
    await pushTestImage(await buildTestImage(join(work, 'other'), busyboxImageSpec({ env: ['PATH=/bin'], files: { 'etc/os-release': { content: 'ID=other\n' } } })), `${registry.host}/test/other:1`);
    const store = new OciImageStore({ storeDir: ociStoreDir });
    imageId = (await store.pull(`${registry.host}/test/busybox:1`)).meta.id;
    otherImageId = (await store.pull(`${registry.host}/test/other:1`)).meta.id;
    driver = new ChDriver({
      dataDir: join(root, 'data'),
      imagesDir,
      ownerId,
      chBinary: sim.binary,
      requireKvm: false,
      readyTimeoutMs: 15_000,
      watchIntervalMs: 60_000,
      manageHostFirewall: false,
      guestRuntime: hostRuntime(),
      defaultDiskGiB: 2,
    });
    await driver.init();
  }, 300_000);

  afterAll(async () => {
    for (const sandbox of (await driver?.list()) ?? []) await driver.destroy(sandbox.id).catch(() => {});
    await driver?.close();
    await registry?.stop();
    rmSync(root, { recursive: true, force: true });
  }, 120_000);

  it('boots a busybox image: argv, the shell, files, the image Env and WorkingDir under the sandbox env; the VmConfig names its disk and our init', async () => {
    const progress: string[] = [];
    const created = await driver.create(spec('cocia'), (line) => progress.push(line));
    expect(created.status).toBe('running');
    expect(progress.join('\n')).toMatch(/mkfs\.ext4 -d/);

    await withClient('cocia', async (client) => {
      // argv: the image's busybox (the host has its own in /usr/bin; /bin/cat here is the image's).
      const release = await exec(client, { argv: ['/bin/cat', '/etc/os-release'] });
      expect(release.exitCode, release.stderr).toBe(0);
      expect(release.stdout).toContain('Nestbox test busybox');
      // Nothing of the host's root is visible: no bash, no /usr/bin/node, no apt.
      const ls = await exec(client, { argv: ['/bin/ls', '/'] });
      expect(ls.stdout.split('\n')).not.toContain('usr');
      // The image's Env and WorkingDir (home and default cwd), the sandbox's env on top.
      const env = await exec(client, { cmd: 'echo "$GREETING|$OVERRIDDEN|$SANDBOX_VAR|$HOME|$(pwd)|$PATH"' });
      expect(env.exitCode, env.stderr).toBe(0);
      expect(env.stdout.trim()).toBe('hello from the image|sandbox|of cocia|/srv/app|/srv/app|/bin');
      // Files: written through the agent, read back by the image's cat.
      await client.writeFile('/srv/app/note.txt', Readable.from(['written in the vm\n']));
      expect((await exec(client, { argv: ['cat', 'note.txt'] })).stdout).toBe('written in the vm\n');
    });

    // The VmConfig the simulator accepted (validated against CH's API description).
    const api = new ChApi(join(root, 'data', 'sandboxes', 'cocia', 'run', 'api.sock'));
    const info = await api.info();
    const disk = join(driver.inspect('cocia')!.diskDir, 'rootfs.img');
    expect(info.config.disks?.map((entry) => entry.path)).toEqual([disk]);
    expect(info.config.payload?.cmdline).toContain(`init=${OCI_VM_INIT}`);
    expect(info.config.payload?.kernel).toBe(join(imagesDir, VM_IMAGE_NAME, 'vmlinuz'));
    // The sandbox's disk: a copy of the image's, grown to the default size, a real ext4 with
    // the image and the runtime in it.
    expect(execFileSync('stat', ['-c', '%s', disk], { encoding: 'utf8' }).trim()).toBe(String(2 * 2 ** 30));
    expect(debugfs(disk, 'cat /etc/os-release')).toContain('Nestbox test busybox');
    expect(debugfs(disk, 'ls -l /.nestbox/bin')).toMatch(/busybox[\s\S]*node/);
    expect(execFileSync('dumpe2fs', ['-h', disk], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] })).toMatch(/Filesystem magic number:\s+0xEF53/);

    // Stop (memory kept) and start: the file is still there; then a cold stop + boot.
    expect(await driver.stop('cocia')).toEqual({ memorySaved: true });
    expect((await driver.start(spec('cocia'))).memoryRestored).toBe(true);
    await withClient('cocia', async (client) => expect((await exec(client, { argv: ['cat', 'note.txt'] })).stdout).toBe('written in the vm\n'));
  });

  it('builds the disk once per digest (a second create reuses it), another image gets its own', async () => {
    const dir = ociVmDiskDir(imagesDir, imageId);
    const first = await readOciVmDisk(dir);
    expect(first).toBeDefined();
    const progress: string[] = [];
    await driver.create(spec('cocib'), (line) => progress.push(line));
    expect(progress.join('\n')).not.toMatch(/mkfs/);
    expect((await readOciVmDisk(dir))?.manifest.builtAt).toBe(first!.manifest.builtAt);
    expect(first!.manifest.env).toMatchObject({ GREETING: 'hello from the image', HOME: '/srv/app', PATH: '/bin' });
    // The second sandbox is a copy: what the first wrote is not there.
    await withClient('cocib', async (client) => expect((await exec(client, { cmd: 'ls note.txt 2>/dev/null || echo none' })).stdout.trim()).toBe('none'));

    await driver.create(spec('cocic', otherImageId));
    await withClient('cocic', async (client) => expect((await exec(client, { argv: ['cat', '/etc/os-release'] })).stdout).toBe('ID=other\n'));
    expect(readdirSync(join(imagesDir, 'vm-oci')).filter((entry) => !entry.endsWith('.lock')).sort()).toEqual([hexOf(imageId), hexOf(otherImageId)].sort());
    await driver.destroy('cocib');
    await driver.destroy('cocic');
  });

  it('snapshots and forks of an image sandbox boot the image (copies of its disk)', async () => {
    await withClient('cocia', async (client) => client.writeFile('/srv/app/forked.txt', Readable.from(['from the parent\n'])));
    const fork = await driver.fork('cocia', [spec('cocif', 'default')]);
    expect(fork.memoryCopied).toBe(true);
    await withClient('cocif', async (client) => {
      expect((await exec(client, { argv: ['cat', 'forked.txt'] })).stdout).toBe('from the parent\n');
      expect((await exec(client, { argv: ['cat', '/etc/os-release'] })).stdout).toContain('Nestbox test busybox');
    });
    // A cold boot of the child still boots the image (its disk's image, not its spec's `default`).
    expect(driver.inspect('cocif')!.diskImage).toBe(imageId);
    await driver.destroy('cocif');

    const snapshot = await driver.snapshot('cocia', 'cocisnap');
    expect(snapshot.snapshotId).toBe('cocisnap');
    await driver.create({ ...spec('cocis', 'default'), snapshot: 'cocisnap' });
    const api = new ChApi(join(root, 'data', 'sandboxes', 'cocis', 'run', 'api.sock'));
    expect((await api.info()).config.payload?.cmdline).toContain(`init=${OCI_VM_INIT}`);
    await withClient('cocis', async (client) => {
      expect((await exec(client, { argv: ['cat', 'forked.txt'] })).stdout).toBe('from the parent\n');
      expect((await exec(client, { cmd: 'echo $GREETING' })).stdout.trim()).toBe('hello from the image');
    });
    await driver.destroy('cocis');
    await driver.deleteSnapshot('cocisnap');
  });

  it('honours diskGiB; a missing image is not_found naming it; a name is not an image id; an unbootable image is refused', async () => {
    await driver.create(spec('cocid', imageId, { diskGiB: 3 }));
    expect(execFileSync('stat', ['-c', '%s', join(driver.inspect('cocid')!.diskDir, 'rootfs.img')], { encoding: 'utf8' }).trim()).toBe(String(3 * 2 ** 30));
    await driver.destroy('cocid');

    const missing = `sha256:${'0'.repeat(64)}`;
    await expect(driver.create(spec('cocim', missing))).rejects.toMatchObject({ code: 'not_found', message: expect.stringContaining(missing) });
    expect(existsSync(join(root, 'data', 'sandboxes', 'cocim'))).toBe(false);
    await expect(driver.create(spec('cociv', 'busybox:latest'))).rejects.toMatchObject({ code: 'validation_failed' });
    // An image whose /proc is a symbolic link cannot boot: a clear 4xx, before any disk is made.
    const broken = `sha256:${'b'.repeat(64)}`;
    const brokenRoot = join(ociStoreDir, 'images', 'b'.repeat(64), 'rootfs');
    mkdirSync(join(brokenRoot, 'bin'), { recursive: true });
    symlinkSync('/tmp', join(brokenRoot, 'proc'));
    writeFileSync(join(ociStoreDir, 'images', 'b'.repeat(64), 'image.json'), JSON.stringify({ id: broken, config: { env: [], workingDir: '' } }));
    await expect(driver.create(spec('cocib2', broken))).rejects.toMatchObject({ code: 'validation_failed', message: expect.stringContaining(`image ${broken} cannot boot as a VM: /proc is a symbolic link`) });
    expect(existsSync(join(root, 'data', 'sandboxes', 'cocib2'))).toBe(false);
    expect(existsSync(ociVmDiskDir(imagesDir, broken))).toBe(false);
  });

  it('boots a distroless image (one static binary, no shell, no /etc): argv works, a cmd is a 400 naming the way out', async () => {
    const store = new OciImageStore({ storeDir: ociStoreDir });
    await pushTestImage(await buildTestImage(join(root, 'build', 'distroless'), distrolessImageSpec()), `${registry.host}/test/distroless:1`);
    const distrolessId = (await store.pull(`${registry.host}/test/distroless:1`)).meta.id;
    await driver.create(spec('cocin', distrolessId));
    await withClient('cocin', async (client) => {
      const version = await exec(client, { argv: ['/tini', '--version'] });
      expect(version.exitCode, version.stderr).toBe(0);
      expect(version.stdout).toMatch(/tini version/);
      await expect(exec(client, { cmd: 'echo hi' })).rejects.toMatchObject({ status: 400, message: expect.stringMatching(/no shell/) });
    });
    await driver.destroy('cocin');
    await removeOciVmDisk(imagesDir, distrolessId);
    expect(existsSync(ociVmDiskDir(imagesDir, distrolessId))).toBe(false);
  });

  it("a killed VMM takes its image guest along (the simulator's agent-start and agent, chrooted)", async () => {
    await driver.create(spec('cocik'));
    const guestRoot = join(root, 'data', 'sandboxes', 'cocik', 'run', 'sim', 'root');
    const chrootedInto = (dir: string) =>
      readdirSync('/proc')
        .filter((entry) => /^\d+$/.test(entry))
        .filter((pid) => {
          try {
            return readlinkSync(`/proc/${pid}/root`) === dir;
          } catch {
            return false;
          }
        });
    expect(chrootedInto(guestRoot).length).toBeGreaterThanOrEqual(2); // busybox sh + node
    process.kill(driver.inspect('cocik')!.pid!, 'SIGKILL');
    let left = chrootedInto(guestRoot);
    for (let i = 0; i < 100 && left.length > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      left = chrootedInto(guestRoot);
    }
    expect(left).toEqual([]);
    expect(await driver.checkAlive('cocik')).toBe(false);
    await driver.destroy('cocik');
  });

  it('a build killed midway leaves nothing visible; the next build sweeps it and succeeds', async () => {
    // A fresh images dir of its own, so the cached disk above does not answer.
    const isolated = join(root, 'images-kill');
    mkdirSync(isolated, { recursive: true });
    const script = join(root, 'build-disk.mjs');
    await build({
      stdin: {
        contents: `import { ensureOciVmDisk } from ${JSON.stringify(projectPath('host/images/vm-image-oci.ts'))};
await ensureOciVmDisk({ imagesDir: ${JSON.stringify(isolated)}, ociStoreDir: ${JSON.stringify(ociStoreDir)}, imageId: ${JSON.stringify(imageId)}, runtime: ${JSON.stringify(hostRuntime())} });`,
        resolveDir: projectPath('.'),
        loader: 'ts',
      },
      outfile: script,
      bundle: true,
      format: 'esm',
      platform: 'node',
      logLevel: 'warning',
    });
    const child = spawn(process.execPath, [script], { detached: true, stdio: 'ignore' });
    const parent = join(isolated, 'vm-oci');
    const hex = hexOf(imageId);
    let sawTemp = false;
    for (let i = 0; i < 600 && !sawTemp; i++) {
      sawTemp = existsSync(parent) && readdirSync(parent).some((entry) => entry.startsWith(`${hex}.tmp-`));
      if (!sawTemp) await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(sawTemp).toBe(true);
    process.kill(-child.pid!, 'SIGKILL');
    await new Promise((resolve) => child.once('exit', resolve));
    expect(await readOciVmDisk(ociVmDiskDir(isolated, imageId))).toBeUndefined();
    expect(existsSync(ociVmDiskDir(isolated, imageId))).toBe(false);

    const disk = await ensureOciVmDisk({ imagesDir: isolated, ociStoreDir, imageId, runtime: hostRuntime(), lockWaitMs: 30_000 });
    expect(debugfs(disk.rootfs, 'cat /etc/os-release')).toContain('Nestbox test busybox');
    expect(readdirSync(parent).sort()).toEqual([hex]);
  }, 120_000);
});
