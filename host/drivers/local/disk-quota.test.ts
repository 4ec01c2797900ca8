// Per-sandbox disk quotas of the local driver against the real kernel (root): the limit is a
// file system of the sandbox's own (disk-quota.ts) on the reflink store the config turns on by
// default. Measured numbers are printed; assertions are about limits, never about timing.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statfsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { unmountReflinkStore } from '../../storage/disk-store.js';
import { mountedFsType } from '../../util/mounts.js';
import { LocalDriver } from './driver.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const isRoot = process.getuid?.() === 0;
const GiB = 2 ** 30;
const MiB = 2 ** 20;

function spec(id: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 256, env: {}, egress: { mode: 'deny-all' }, ...overrides };
}

async function sh(socket: string, cmd: string, timeoutMs = 120_000): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
  const client = new AgentClient(socket);
  try {
    return await client.exec({ cmd, timeoutMs });
  } finally {
    client.close();
  }
}

/** Free bytes of the file system holding `path` (as an unprivileged user would see them). */
function freeBytes(path: string): number {
  const s = statfsSync(path);
  return s.bavail * s.bsize;
}

function usedBytes(path: string): number {
  const s = statfsSync(path);
  return (s.blocks - s.bfree) * s.bsize;
}

/** `df` inside the sandbox: size, used, available (bytes) and total/used inodes of `/`. */
async function dfInside(socket: string): Promise<{ size: number; used: number; avail: number; inodes: number; iused: number }> {
  const out = await sh(socket, 'df -B1 --output=size,used,avail / | tail -1; df --output=itotal,iused / | tail -1');
  expect(out.exitCode, out.stderr).toBe(0);
  const [size, used, avail, inodes, iused] = out.stdout.trim().split(/\s+/).map(Number);
  return { size, used, avail, inodes, iused };
}

const mib = (bytes: number) => `${(bytes / MiB).toFixed(1)} MiB`;

describe.skipIf(!isRoot)('LocalDriver: per-sandbox disk and inode quotas (real kernel)', () => {
  const ownerId = `dq${randomBytes(4).toString('hex')}`;
  const dataDir = mkdtempSync('/tmp/nbxq-');
  const storeImage = join(dataDir, 'store.xfs');
  let driver: LocalDriver;
  const created: string[] = [];
  const snapshots: string[] = [];

  const newId = (prefix: string) => {
    const id = `${prefix}${randomBytes(4).toString('hex')}`;
    created.push(id);
    return id;
  };

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('node', [join(REPO, 'scripts', 'bundle-guest-agent.mjs')], { cwd: REPO, stdio: 'inherit' });
    // The store as the host agent sets it up by default (NESTBOX_REFLINK_STORE=auto), smaller.
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0, watchIntervalMs: 500, reflinkStore: { imagePath: storeImage, sizeBytes: 6 * GiB } });
    await driver.init();
  }, 120_000);

  afterAll(async () => {
    for (const id of created) await driver.destroy(id).catch(() => {});
    for (const snapshot of snapshots) await driver.deleteSnapshot(snapshot).catch(() => {});
    await driver.close();
    const cgroups = await Cgroups.detect();
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    await unmountReflinkStore(dataDir).catch(() => {});
    if (!mountedFsType(join(dataDir, 'store'))) rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it('a sandbox fills its own disk (ENOSPC inside, df shows the limit) and the host loses at most that', async () => {
    const store = join(dataDir, 'store');
    expect(driver.capabilities().probes).toMatchObject({ diskCopy: 'reflink' });
    const id = newId('dq');
    const sandbox = await driver.create(spec(id, { diskGiB: 1, diskInodes: 4096 }));
    const socket = sandbox.agentSocket!;

    const before = await dfInside(socket);
    console.log(`[measure] df inside a 1 GiB sandbox: size ${mib(before.size)}, used ${mib(before.used)}, avail ${mib(before.avail)}, inodes ${before.inodes}`);
    // ext4's own metadata takes a few per cent of the size; the limit is the sandbox's, not the host's.
    expect(before.size).toBeGreaterThan(0.9 * GiB);
    expect(before.size).toBeLessThanOrEqual(GiB);
    expect(before.inodes).toBeGreaterThanOrEqual(4096);
    expect(before.inodes).toBeLessThan(4096 + 1024);

    // The limit cannot be got around from inside: no loop device is visible, none can be made,
    // and the disk's file system cannot be reached except through the overlay.
    const escape = await sh(socket, 'ls /dev | grep -c loop; mknod /tmp/loop0 b 7 0 2>&1 && echo MKNOD-OK; head -c 1 /tmp/loop0 >/dev/null 2>&1 && echo OPEN-OK; true');
    expect(escape.stdout).not.toMatch(/MKNOD-OK|OPEN-OK/);
    expect(escape.stdout.split('\n')[0]).toBe('0');

    const hostFreeBefore = freeBytes(dataDir);
    // Try to write three times the limit.
    const fill = await sh(socket, 'dd if=/dev/urandom of=/root/fill bs=1M count=3072 2>&1; echo "rc=$?"; sync; stat -c %s /root/fill');
    const hostFreeAfter = freeBytes(dataDir);
    console.log(`[measure] dd of 3 GiB into the 1 GiB sandbox: ${fill.stdout.trim().split('\n').slice(-3).join(' | ')}`);
    console.log(`[measure] host data-dir fs free before ${mib(hostFreeBefore)}, after ${mib(hostFreeAfter)}: ${mib(hostFreeBefore - hostFreeAfter)} used by the attempt`);
    expect(fill.stdout).toMatch(/No space left on device/);
    expect(fill.stdout).toMatch(/rc=1/);
    const written = Number(fill.stdout.trim().split('\n').pop());
    expect(written).toBeGreaterThan(0.9 * GiB);
    expect(written).toBeLessThanOrEqual(GiB);
    // The host gave the sandbox what fits in its disk, not the 3 GiB it asked for (slack: the
    // file-system metadata and whatever other tests on the machine write meanwhile).
    expect(hostFreeBefore - hostFreeAfter).toBeLessThan(1.25 * GiB);
    const full = await dfInside(socket);
    expect(full.avail).toBeLessThan(16 * MiB);

    // Deleting gives the blocks back to the host (discard punches them out of the image).
    const storeUsedFull = usedBytes(store);
    expect((await sh(socket, 'rm /root/fill && sync && sleep 1 && echo ok')).stdout).toBe('ok\n');
    execFileSync('fstrim', [join(store)], { stdio: 'ignore' });
    const storeUsedAfterRm = usedBytes(store);
    console.log(`[measure] reflink store used: ${mib(storeUsedFull)} with the disk full, ${mib(storeUsedAfterRm)} after rm inside`);
    expect(storeUsedFull - storeUsedAfterRm).toBeGreaterThan(0.8 * GiB);

    // The inode limit: creating files stops with ENOSPC near 4096, whatever space is left.
    const inodes = await sh(socket, 'mkdir /root/many && cd /root/many && i=0; while [ $i -lt 10000 ]; do err=$( { : > f$i; } 2>&1 ) || break; i=$((i+1)); done; echo $i; echo "$err"');
    const [made, error] = inodes.stdout.trim().split('\n');
    console.log(`[measure] files created before the inode limit: ${made} (${error})`);
    expect(Number(made)).toBeGreaterThan(3500);
    expect(Number(made)).toBeLessThan(4096 + 1024);
    expect(error).toMatch(/No space left on device/);
    const afterInodes = await dfInside(socket);
    expect(afterInodes.iused).toBe(afterInodes.inodes);
    expect(afterInodes.avail).toBeGreaterThan(0.5 * GiB);
  }, 300_000);

  it('a fork counts its source disk against its own limit while sharing the blocks on the host; a snapshot is a clone too', async () => {
    const store = join(dataDir, 'store');
    const sourceId = newId('dqs');
    const source = await driver.create(spec(sourceId, { diskGiB: 1 }));
    const wrote = await sh(source.agentSocket!, 'dd if=/dev/urandom of=/root/data bs=1M count=600 status=none && sync && sha256sum /root/data | cut -c1-16');
    expect(wrote.exitCode, wrote.stderr).toBe(0);
    const sourceDf = await dfInside(source.agentSocket!);

    const storeBefore = usedBytes(store);
    const hostFreeBefore = freeBytes(dataDir);
    const childId = newId('dqc');
    const forked = await driver.fork(sourceId, [spec(childId, { diskGiB: 1 })]);
    expect(forked.diskCopy).toBe('reflink');
    const storeGrew = usedBytes(store) - storeBefore;
    const hostUsed = hostFreeBefore - freeBytes(dataDir);
    const child = forked.children[0];
    const childDf = await dfInside(child.agentSocket!);
    console.log(`[measure] fork of a sandbox using ${mib(sourceDf.used)}: child df used ${mib(childDf.used)} of ${mib(childDf.size)}; store grew ${mib(storeGrew)}, host free space fell ${mib(hostUsed)}`);
    // XFS accounting: the clone's extents are shared, so the store (and the host) pay metadata only...
    expect(storeGrew).toBeLessThan(64 * MiB);
    // ...while the child's own limit counts the inherited 600 MiB in full.
    expect(childDf.used).toBeGreaterThan(600 * MiB);
    expect(Math.abs(childDf.used - sourceDf.used)).toBeLessThan(16 * MiB);
    expect((await sh(child.agentSocket!, 'sha256sum /root/data | cut -c1-16')).stdout).toBe(wrote.stdout);
    // So the child can write only what is left of its 1 GiB, not another 1 GiB.
    const childFill = await sh(child.agentSocket!, 'dd if=/dev/urandom of=/root/more bs=1M count=1024 2>&1; sync; stat -c %s /root/more');
    const childWrote = Number(childFill.stdout.trim().split('\n').pop());
    console.log(`[measure] the fork could add ${mib(childWrote)} before ENOSPC; store now ${mib(usedBytes(store) - storeBefore)} above before the fork`);
    expect(childFill.stdout).toMatch(/No space left on device/);
    expect(childWrote).toBeLessThan(450 * MiB);
    // The source is untouched by its child's writes.
    expect((await sh(source.agentSocket!, 'test -e /root/more || echo absent; sha256sum /root/data | cut -c1-16')).stdout).toBe(`absent\n${wrote.stdout}`);

    // A snapshot is a clone of the disk image as well: no data copied, at most the disk's size.
    const storeBeforeSnapshot = usedBytes(store);
    const snapshotId = `dq-${randomBytes(4).toString('hex')}`;
    snapshots.push(snapshotId);
    const snapshot = await driver.snapshot(sourceId, snapshotId);
    const snapshotGrew = usedBytes(store) - storeBeforeSnapshot;
    console.log(`[measure] snapshot of the source: layer ${mib(snapshot.sizeBytes)}, store grew ${mib(snapshotGrew)}`);
    expect(snapshot.diskCopy).toBe('reflink');
    expect(snapshot.sizeBytes).toBeGreaterThanOrEqual(600 * MiB);
    expect(snapshotGrew).toBeLessThan(64 * MiB);
    const fromSnapshotId = newId('dqf');
    const fromSnapshot = await driver.create(spec(fromSnapshotId, { diskGiB: 1, snapshot: snapshotId }));
    expect((await sh(fromSnapshot.agentSocket!, 'sha256sum /root/data | cut -c1-16')).stdout).toBe(wrote.stdout);
    // The snapshot is a read-only lower layer: the new sandbox's own 1 GiB starts empty.
    expect((await dfInside(fromSnapshot.agentSocket!)).used).toBeLessThan(64 * MiB);

    // A host agent that died while a disk was frozen (fork or snapshot copy): the next one
    // thaws it at init, so the sandbox can write again.
    const sourceFs = join(store, 'sandboxes', sourceId, 'fs');
    execFileSync('fsfreeze', ['--freeze', sourceFs]);
    await driver.close();
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0, watchIntervalMs: 500, reflinkStore: { imagePath: storeImage, sizeBytes: 6 * GiB } });
    await driver.init();
    expect((await sh(source.agentSocket!, 'echo thawed > /root/after-restart && cat /root/after-restart', 20_000)).stdout).toBe('thawed\n');

    // Destroy leaves no mount and no loop device of any of these disks.
    for (const id of [fromSnapshotId, childId, sourceId]) await driver.destroy(id);
    await driver.deleteSnapshot(snapshotId);
    const mountinfo = readFileSync('/proc/self/mountinfo', 'utf8');
    for (const id of [fromSnapshotId, childId, sourceId, snapshotId]) expect(mountinfo).not.toContain(id);
    const loops = execFileSync('losetup', ['-a'], { encoding: 'utf8' });
    for (const id of [fromSnapshotId, childId, sourceId, snapshotId]) expect(loops).not.toContain(id);
  }, 300_000);
});
