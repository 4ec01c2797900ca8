// Volumes and resize of the Cloud Hypervisor driver (issue 19), end to end against the CH
// simulator: real virtiofsd processes (Debian's) serve each volume mount over vhost-user, the
// simulator proves they answer (VHOST_USER_GET_FEATURES on the socket vm.create names) and its
// guest mounts what they share, through the driver's own guest mount script; vm.resize bodies
// are checked against the pinned API description and its limits (max_vcpus, hotplug_size), and
// the simulated guest reports its vCPUs, memory and root file system size as its kernel would.
// Needs root (network namespaces, mounts) and a virtiofsd (scripts/install-system-deps.sh).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentClient } from '../../agent-protocol/client.js';
import { VM_IMAGE_NAME } from '../../images/vm-image.js';
import { installSimulator } from '../../sim/ch/launcher.js';
import { MIN_VOLUME_BYTES } from '../../storage/volumes.js';
import { ChApi, ChApiError } from './api.js';
import { ChDriver } from './driver.js';
import { findVirtiofsd } from './virtiofs.js';

const isRoot = process.getuid?.() === 0;
const MIB = 2 ** 20;

let root: string;
let mountBase: string;
let driver: ChDriver;
let virtiofsd: string | undefined;
const ownerId = `chvol-${process.pid}`;

/** The fake VM image, its disk a small ext4 (so a grown disk is a grown file system). */
function writeFakeVmImage(dir: string): void {
  const imageDir = join(dir, VM_IMAGE_NAME);
  mkdirSync(imageDir, { recursive: true });
  writeFileSync(join(imageDir, 'vmlinuz'), 'not a kernel');
  writeFileSync(join(imageDir, 'initrd.img'), 'not an initramfs');
  execFileSync('truncate', ['-s', '64M', join(imageDir, 'rootfs.img')]);
  execFileSync('mkfs.ext4', ['-q', '-F', '-b', '4096', join(imageDir, 'rootfs.img')]);
  writeFileSync(join(imageDir, 'manifest.json'), JSON.stringify({ name: VM_IMAGE_NAME, fake: true }));
}

async function run(id: string, cmd: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const client: AgentClient = driver.agentClient(id);
  try {
    const result = await client.exec({ cmd, timeoutMs: 10_000 });
    return { exitCode: result.exitCode ?? -1, stdout: result.stdout.trim(), stderr: result.stderr.trim() };
  } finally {
    client.close();
  }
}

async function ok(id: string, cmd: string): Promise<string> {
  const result = await run(id, cmd);
  expect(result.exitCode, `${id}: ${cmd}: ${result.stderr}`).toBe(0);
  return result.stdout;
}

/** virtiofsd processes serving a directory (by their command line). */
function virtiofsdsSharing(dir: string): number[] {
  const pids: number[] = [];
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    } catch {
      continue;
    }
    if (argv[0]?.endsWith('virtiofsd') && argv.some((arg) => arg === `source=${dir}` || arg === `--shared-dir=${dir}`)) pids.push(Number(pid));
  }
  return pids;
}

const base = (id: string, extra: object = {}) => ({ id, image: 'default', cpu: 1, memoryMiB: 256, env: {}, ...extra });

describe.skipIf(!isRoot)('cloud-hypervisor driver: volumes over virtio-fs and resize (simulator)', () => {
  beforeAll(async () => {
    virtiofsd = await findVirtiofsd();
    root = mkdtempSync('/tmp/nbchv-');
    // The simulated guest shares the machine's file system; its mount points are fresh dirs here.
    mountBase = mkdtempSync('/tmp/nbchv-mnt-');
    const sim = await installSimulator(join(root, 'sim'));
    const imagesDir = join(root, 'images');
    writeFakeVmImage(imagesDir);
    driver = new ChDriver({
      dataDir: join(root, 'data'),
      imagesDir,
      ownerId,
      chBinary: sim.binary,
      requireKvm: false,
      readyTimeoutMs: 5_000,
      watchIntervalMs: 60_000,
      manageHostFirewall: false,
      // Fixed ceilings, whatever this machine has.
      maxVcpus: 4,
      maxMemoryMiB: 1024,
    });
    await driver.init();
  });

  afterAll(async () => {
    for (const sandbox of (await driver?.list()) ?? []) await driver.destroy(sandbox.id).catch(() => {});
    for (const id of (await driver?.volumes.list().catch(() => [] as string[])) ?? []) await driver.volumes.destroy(id).catch(() => {});
    await driver?.close();
    rmSync(root, { recursive: true, force: true });
    rmSync(mountBase, { recursive: true, force: true });
  });

  it('two VMs share a volume and see each other\'s writes; a read-only mount (subpath) refuses writes; virtiofsd goes with the VM', async () => {
    expect(virtiofsd, 'a virtiofsd (qemu-system-common) is installed').toBeDefined();
    await driver.volumes.ensure('chshared', MIN_VOLUME_BYTES);
    const hostDir = driver.volumes.dataDir('chshared');
    mkdirSync(join(hostDir, 'sub'), { recursive: true });
    const at = (name: string) => join(mountBase, name, 'data');
    await driver.create(base('chva', { volumes: [{ volumeId: 'chshared', mountPath: at('a'), readOnly: false }] }));
    await driver.create(base('chvb', { volumes: [{ volumeId: 'chshared', mountPath: at('b'), readOnly: false }] }));
    await driver.create(base('chvc', { volumes: [{ volumeId: 'chshared', mountPath: at('c'), readOnly: true, subpath: 'sub' }] }));
    // One virtiofsd per mount, each sharing the volume's directory on the volume store.
    expect(virtiofsdsSharing(hostDir).length).toBeGreaterThanOrEqual(3);
    for (const id of ['chva', 'chvb', 'chvc']) expect(existsSync(join(root, 'data', 'sandboxes', id, 'run', 'fs0.sock'))).toBe(true);

    await ok('chva', `echo written by a > ${at('a')}/from-a`);
    expect(await ok('chvb', `cat ${at('b')}/from-a`)).toBe('written by a');
    await ok('chvb', `echo written by b > ${at('b')}/from-b`);
    expect(await ok('chva', `cat ${at('a')}/from-b`)).toBe('written by b');
    // What the guests wrote is in the volume's directory on the host.
    expect(readFileSync(join(hostDir, 'from-a'), 'utf8')).toBe('written by a\n');
    expect(readFileSync(join(hostDir, 'from-b'), 'utf8')).toBe('written by b\n');

    // The read-only mount sees only its subpath, and cannot write to it.
    await ok('chva', `echo in sub > ${at('a')}/sub/note`);
    expect(await ok('chvc', `cat ${at('c')}/note`)).toBe('in sub');
    expect(await ok('chvc', `ls ${at('c')}`)).toBe('note');
    const refused = await run('chvc', `echo nope > ${at('c')}/nope`);
    expect(refused.exitCode).not.toBe(0);
    expect(refused.stderr).toMatch(/Read-only file system/);
    expect(existsSync(join(hostDir, 'sub', 'nope'))).toBe(false);
    // ...and its virtiofsd shares it read-only on the host side too: in its own mount namespace
    // its root (it pivots into the share) is a read-only mount.
    const readOnlyRoot = (pid: number) => readFileSync(`/proc/${pid}/mountinfo`, 'utf8').split('\n').some((line) => line.split(' ')[4] === '/' && /(^|,)ro(,|$)/.test(line.split(' ')[5] ?? ''));
    const readOnlyPid = virtiofsdsSharing(hostDir).find(readOnlyRoot);
    expect(readOnlyPid, 'a virtiofsd whose share is a read-only bind').toBeDefined();
    expect(virtiofsdsSharing(hostDir).filter(readOnlyRoot).length).toBeLessThan(virtiofsdsSharing(hostDir).length);

    // A stop is cold (virtiofsd state is not in a snapshot) and a start mounts the volume again.
    expect(await driver.stop('chvb')).toEqual({ memorySaved: false });
    const started = await driver.start(base('chvb', { volumes: [{ volumeId: 'chshared', mountPath: at('b'), readOnly: false }] }));
    expect(started.memoryRestored).toBe(false);
    expect(await ok('chvb', `cat ${at('b')}/from-a`)).toBe('written by a');

    for (const id of ['chva', 'chvb', 'chvc']) await driver.destroy(id);
    expect(virtiofsdsSharing(hostDir)).toEqual([]);
    // The volume outlives its sandboxes.
    expect(readFileSync(join(hostDir, 'from-b'), 'utf8')).toBe('written by b\n');
  });

  it('a VMM killed with -9 takes its virtiofsd along: the watcher\'s check tears the rest down, a start shares again', async () => {
    await driver.volumes.ensure('chcrash', MIN_VOLUME_BYTES);
    const hostDir = driver.volumes.dataDir('chcrash');
    const spec = base('chvk', { volumes: [{ volumeId: 'chcrash', mountPath: join(mountBase, 'k', 'data'), readOnly: false }] });
    await driver.create(spec);
    // QEMU's daemon forks into its sandbox once the VMM connects: a parent and a child.
    expect(virtiofsdsSharing(hostDir).length).toBeGreaterThanOrEqual(1);
    const run = join(root, 'data', 'sandboxes', 'chvk', 'run');
    expect(existsSync(join(run, 'virtiofsd-0.pid'))).toBe(true);
    process.kill(driver.inspect('chvk')!.pid!, 'SIGKILL');
    // Bounded: the check below is what matters, not how fast the kernel reaps.
    for (let i = 0; i < 200 && (await driver.checkAlive('chvk')); i++) await new Promise((resolve) => setTimeout(resolve, 25));
    expect(driver.inspect('chvk')?.status).toBe('stopped');
    expect(virtiofsdsSharing(hostDir)).toEqual([]);
    expect(existsSync(join(run, 'virtiofsd-0.pid'))).toBe(false);
    expect(existsSync(join(run, 'fs0.sock'))).toBe(false);
    await driver.start(spec);
    await ok('chvk', `echo again > ${join(mountBase, 'k', 'data')}/after-crash`);
    expect(readFileSync(join(hostDir, 'after-crash'), 'utf8')).toBe('again\n');
    await driver.destroy('chvk');
    expect(virtiofsdsSharing(hostDir)).toEqual([]);
  });

  it('resizes CPU and memory of a running VM live (vm.resize), refuses beyond its max, grows a stopped disk seen after start', async () => {
    await driver.create(base('chrs'));
    const limits = async () => ({
      vcpus: Number(await ok('chrs', 'cat "$HOME/.nestbox-sim/vcpus"')),
      memoryMiB: Number(await ok('chrs', 'cat "$HOME/.nestbox-sim/memory-bytes"')) / MIB,
      rootfsBytes: Number(await ok('chrs', 'cat "$HOME/.nestbox-sim/rootfs-bytes"')),
    });
    expect(await limits()).toMatchObject({ vcpus: 1, memoryMiB: 256, rootfsBytes: 64 * MIB });
    expect(driver.inspect('chrs')?.vmShape).toEqual({ bootVcpus: 1, bootMemoryMiB: 256, maxVcpus: 4, maxMemoryMiB: 1024 });

    expect(await driver.resize('chrs', { cpu: 3, memoryMiB: 768 })).toMatchObject({ cpu: 3, memoryMiB: 768, live: true });
    expect(await limits()).toMatchObject({ vcpus: 3, memoryMiB: 768 });
    expect(await driver.resize('chrs', { cpu: 2, memoryMiB: 512 })).toMatchObject({ cpu: 2, memoryMiB: 512, live: true });
    expect(await limits()).toMatchObject({ vcpus: 2, memoryMiB: 512 });

    // Beyond the room it was created with: refused with the reason, nothing changed.
    await expect(driver.resize('chrs', { cpu: 5 })).rejects.toMatchObject({ code: 'validation_failed', message: expect.stringContaining('beyond the 4 vCPUs') });
    await expect(driver.resize('chrs', { memoryMiB: 2048 })).rejects.toMatchObject({ code: 'validation_failed', message: expect.stringContaining('beyond the 1024 MiB') });
    await expect(driver.resize('chrs', { memoryMiB: 128 })).rejects.toMatchObject({ code: 'invalid_state', message: expect.stringContaining('below the 256 MiB it booted with') });
    await expect(driver.resize('chrs', { diskGiB: 1 })).rejects.toMatchObject({ code: 'invalid_state' });
    expect(await limits()).toMatchObject({ vcpus: 2, memoryMiB: 512 });
    // The VMM itself refuses too (as CH does), whatever a caller sends.
    const api = new ChApi(join(root, 'data', 'sandboxes', 'chrs', 'run', 'api.sock'));
    const beyond = await api.resizeVm({ desired_vcpus: 5 }).then(() => undefined, (error: unknown) => error);
    expect(beyond).toBeInstanceOf(ChApiError);
    expect((beyond as ChApiError).status).toBe(500);
    expect((beyond as ChApiError).chain.join(' / ')).toMatch(/exceeds max vCPUs count \(4\)/);
    const misspelt = await api.resizeVm({ desired_cpus: 2 } as never).then(() => undefined, (error: unknown) => error);
    expect((misspelt as ChApiError).status).toBe(400);

    // Stopped (memory kept), the sizes survive a restore.
    expect(await driver.stop('chrs')).toEqual({ memorySaved: true });
    const restored = await driver.start(base('chrs', { cpu: 2, memoryMiB: 512 }));
    expect(restored.memoryRestored).toBe(true);
    expect(await limits()).toMatchObject({ vcpus: 2, memoryMiB: 512 });

    // Disk grown while stopped: the image and its ext4 grow; the next start boots cold and sees it.
    await ok('chrs', 'echo kept > "$HOME/kept.txt"');
    await driver.stop('chrs');
    await expect(driver.resize('chrs', { diskGiB: 1 })).resolves.toMatchObject({ diskGiB: 1, live: false });
    expect(driver.inspect('chrs')?.memorySnapshot).toBeUndefined();
    const grown = await driver.start(base('chrs', { cpu: 2, memoryMiB: 512, diskGiB: 1 }));
    expect(grown.memoryRestored).toBe(false);
    expect(await limits()).toMatchObject({ vcpus: 2, memoryMiB: 512, rootfsBytes: 2 ** 30 });
    expect(await ok('chrs', 'cat "$HOME/kept.txt"')).toBe('kept');
    await driver.destroy('chrs');
  });
});
