// Sandboxes see their own limits (LXCFS, cpuset, disk quota) and are resized live, against the
// real kernel, lxcfs and cgroups. Runs as root; machine-wide (starts lxcfs, writes cpusets).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver } from './driver.js';
import { lxcfsAvailable } from './lxcfs.js';
import { readRecord, writeRecord } from './records.js';
import { sh, uniqueId } from './test-support.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const isRoot = process.getuid?.() === 0;

function spec(id: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 512, diskGiB: 1, env: {}, ...overrides };
}

/** `free -m`'s total memory, in MiB. */
async function freeTotal(socket: string): Promise<number> {
  const out = (await sh(socket, "free -m | awk '/^Mem:/ {print $2}'")).stdout.trim();
  return Number(out);
}

describe.skipIf(!isRoot || !lxcfsAvailable())('own limits and resize (local driver, real kernel)', () => {
  const dataDir = mkdtempSync('/tmp/nbxl-');
  const ownerId = uniqueId('lim');
  const created = new Set<string>();
  let driver: LocalDriver;
  let cgroups: Cgroups;

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('npm', ['run', 'build'], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, watchIntervalMs: 500, slotPoolSize: 0 });
    await driver.init();
  }, 300_000);

  afterAll(async () => {
    for (const id of created) await driver.destroy(id).catch(() => {});
    await driver.close();
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    // close() stopped lxcfs (no sandbox left): its mount is gone.
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(join(dataDir, 'lxcfs'));
    rmSync(dataDir, { recursive: true, force: true });
  }, 60_000);

  it('free, nproc, cpuinfo, uptime and df inside show the sandbox', async () => {
    const id = uniqueId('own');
    created.add(id);
    const { agentSocket } = await driver.create(spec(id));
    const socket = agentSocket!;
    expect(await freeTotal(socket)).toBe(512);
    expect((await sh(socket, 'nproc')).stdout.trim()).toBe('1');
    expect((await sh(socket, 'grep -c ^processor /proc/cpuinfo')).stdout.trim()).toBe('1');
    // Its own uptime (seconds since its start), not the machine's.
    const uptime = Number((await sh(socket, 'cut -d" " -f1 /proc/uptime')).stdout);
    expect(uptime).toBeGreaterThanOrEqual(0);
    expect(uptime).toBeLessThan(60);
    expect(Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0])).toBeGreaterThan(uptime);
    // `df /` shows the 1 GiB quota (ext4's own metadata taken off).
    const size = Number((await sh(socket, "df -B1 --output=size / | tail -1")).stdout.trim());
    expect(size).toBeGreaterThan(0.85 * 2 ** 30);
    expect(size).toBeLessThanOrEqual(2 ** 30);
    // Read-only: the sandbox cannot unmount or write them.
    expect((await sh(socket, 'echo x > /proc/meminfo 2>&1; umount /proc/meminfo 2>&1; free -m | grep -c Mem')).stdout).toMatch(/1\n$/);
  });

  it('a 2-vCPU sandbox gets 2 CPUs of its own (as many as the machine has)', async () => {
    const id = uniqueId('two');
    created.add(id);
    const { agentSocket } = await driver.create(spec(id, { cpu: 2 }));
    const expected = Math.min(2, (await cgroups.machineCpus()).length);
    expect((await sh(agentSocket!, 'nproc')).stdout.trim()).toBe(String(expected));
    await driver.destroy(id);
    created.delete(id);
  });

  it('resizes memory and CPU live: free and nproc follow, the new limit is enforced', async () => {
    const id = uniqueId('rsz');
    created.add(id);
    const { agentSocket } = await driver.create(spec(id, { memoryMiB: 256 }));
    const socket = agentSocket!;
    expect(await freeTotal(socket)).toBe(256);
    // Up: 300 MiB fit after the resize, not before.
    const alloc = (mib: number) => sh(socket, `python3 -c "x = bytearray(${mib} * 1024 * 1024); print('allocated')"`, 30_000);
    expect((await alloc(300)).stdout).not.toContain('allocated');
    const up = await driver.resize(id, { memoryMiB: 640 });
    expect(up).toMatchObject({ memoryMiB: 640, live: true });
    expect(await freeTotal(socket)).toBe(640);
    expect((await alloc(300)).stdout).toContain('allocated');
    // Down again: 300 MiB no longer fit.
    await driver.resize(id, { memoryMiB: 200 });
    expect(await freeTotal(socket)).toBe(200);
    const hog = await alloc(300);
    expect(hog.stdout).not.toContain('allocated');
    expect((await sh(socket, 'echo alive')).stdout).toBe('alive\n');
    // Below what it uses now: refused, nothing changed.
    const holder = sh(socket, `python3 -c "import time; x = bytearray(150 * 1024 * 1024); x[::4096] = b'y' * len(x[::4096]); print('held', flush=True); time.sleep(8)"`, 30_000);
    await new Promise((r) => setTimeout(r, 2500));
    await expect(driver.resize(id, { memoryMiB: 64 })).rejects.toMatchObject({ code: 'conflict' });
    expect(await freeTotal(socket)).toBe(200);
    expect((await holder).stdout).toContain('held');
    expect((await readRecord(join(dataDir, 'sandboxes', id)))?.spec.memoryMiB).toBe(200);
    // CPU: nproc and the CFS quota follow.
    const machine = (await cgroups.machineCpus()).length;
    if (machine >= 2) {
      await driver.resize(id, { cpu: 2 });
      expect((await sh(socket, 'nproc')).stdout.trim()).toBe('2');
      expect((await sh(socket, 'grep -c ^processor /proc/cpuinfo')).stdout.trim()).toBe('2');
    }
    await driver.resize(id, { cpu: 1 });
    expect((await sh(socket, 'nproc')).stdout.trim()).toBe('1');
    if (cgroups.version === 1) {
      const cpuDir = cgroups.groupFor(`nestbox/${ownerId}/${id}`).paths[1];
      expect(readFileSync(join(cpuDir, 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('100000');
    }
    // The disk grows only while stopped.
    await expect(driver.resize(id, { diskGiB: 2 })).rejects.toMatchObject({ code: 'invalid_state' });
  }, 120_000);

  it('grows the disk of a stopped sandbox; df shows it after the start, the files are kept', async () => {
    const id = uniqueId('dsk');
    created.add(id);
    const { agentSocket } = await driver.create(spec(id));
    await sh(agentSocket!, 'echo kept > /root/file');
    await driver.stop(id);
    await expect(driver.resize(id, { diskGiB: 0 })).rejects.toMatchObject({ code: 'validation_failed' });
    const result = await driver.resize(id, { diskGiB: 3 });
    expect(result).toMatchObject({ diskGiB: 3, live: false });
    const started = await driver.start({ ...spec(id), diskGiB: 3 });
    const size = Number((await sh(started.agentSocket!, 'df -B1 --output=size / | tail -1')).stdout.trim());
    expect(size).toBeGreaterThan(2.8 * 2 ** 30);
    expect((await sh(started.agentSocket!, 'cat /root/file')).stdout).toBe('kept\n');
    await driver.stop(id);
    await expect(driver.resize(id, { diskGiB: 2 })).rejects.toMatchObject({ code: 'validation_failed' });
  }, 120_000);

  it('a host agent killed mid-resize: the next one puts the record\'s sizes in force', async () => {
    const id = uniqueId('crs');
    created.add(id);
    await driver.create(spec(id, { memoryMiB: 256 }));
    // As if the host agent died right after writing the record of a resize to 384 MiB.
    const dir = join(dataDir, 'sandboxes', id);
    const record = (await readRecord(dir))!;
    record.spec = { ...record.spec, memoryMiB: 384 };
    record.operation = { kind: 'resize', startedAt: new Date().toISOString() };
    await writeRecord(dir, record);
    await driver.close();
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, watchIntervalMs: 500, slotPoolSize: 0 });
    await driver.init();
    const adopted = await driver.get(id);
    expect(adopted?.status).toBe('running');
    expect(await freeTotal(adopted!.agentSocket!)).toBe(384);
    expect((await readRecord(dir))?.operation).toBeUndefined();
  }, 120_000);
});
