// Persistent named volumes on the local driver against the real kernel (root, issue 19): one
// ext4 image per volume (host/storage/volumes.ts), an idmapped bind of it into each sandbox
// that mounts it (nestbox-rootfs --volume). Two sandboxes with different id ranges share it,
// a read-only mount refuses writes, the size limit is ENOSPC inside, a symlink planted by a
// sandbox never lets a host-side mount or file call reach a host path.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver } from './driver.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const isRoot = process.getuid?.() === 0;
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

describe.skipIf(!isRoot)('LocalDriver: volumes (real kernel)', () => {
  const ownerId = `vo${randomBytes(4).toString('hex')}`;
  const dataDir = mkdtempSync('/tmp/nbxv-');
  const hostSecret = join(dataDir, 'host-secret.txt');
  let driver: LocalDriver;
  const created: string[] = [];
  const volumeId = `v${randomBytes(4).toString('hex')}`;
  const smallVolume = `s${randomBytes(4).toString('hex')}`;
  const newId = (prefix: string) => {
    const id = `${prefix}${randomBytes(4).toString('hex')}`;
    created.push(id);
    return id;
  };

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('node', [join(REPO, 'scripts', 'bundle-guest-agent.mjs')], { cwd: REPO, stdio: 'inherit' });
    writeFileSync(hostSecret, 'host-only\n');
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0, watchIntervalMs: 500 });
    await driver.init();
    await driver.volumes.ensure(volumeId, 256 * MiB);
    await driver.volumes.ensure(smallVolume, 64 * MiB);
  }, 120_000);

  afterAll(async () => {
    for (const id of created) await driver.destroy(id).catch(() => {});
    await driver.volumes.destroy(volumeId).catch(() => {});
    await driver.volumes.destroy(smallVolume).catch(() => {});
    await driver.close();
    const cgroups = await Cgroups.detect();
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it('two sandboxes share a volume and see each other\'s writes; it outlives both; read-only refuses writes', async () => {
    const a = await driver.create(spec(newId('va'), { volumes: [{ volumeId, mountPath: '/mnt/shared', readOnly: false }] }));
    const b = await driver.create(spec(newId('vb'), { volumes: [{ volumeId, mountPath: '/data/v', readOnly: false }, { volumeId, mountPath: '/ro', readOnly: true }] }));
    const write = await sh(a.agentSocket!, 'echo from-a > /mnt/shared/a.txt && mkdir -p /mnt/shared/dir && id -u && stat -c %u:%g /mnt/shared/a.txt');
    expect(write.exitCode, write.stderr).toBe(0);
    expect(write.stdout).toBe('0\n0:0\n');
    const read = await sh(b.agentSocket!, 'cat /data/v/a.txt && echo from-b > /data/v/b.txt && stat -c %u:%g /data/v/a.txt && cat /ro/b.txt');
    expect(read.exitCode, read.stderr).toBe(0);
    expect(read.stdout).toBe('from-a\n0:0\nfrom-b\n');
    expect((await sh(a.agentSocket!, 'cat /mnt/shared/b.txt')).stdout).toBe('from-b\n');
    // On disk, ids are unshifted (uid 0), whatever each sandbox's host range is.
    expect(readFileSync(join(driver.volumes.dataDir(volumeId), 'b.txt'), 'utf8')).toBe('from-b\n');
    const ro = await sh(b.agentSocket!, 'sh -c "echo x > /ro/c.txt" 2>&1; echo rc=$?; grep " /ro " /proc/mounts');
    expect(ro.stdout).toMatch(/Read-only file system/);
    expect(ro.stdout).toMatch(/rc=[12]/);
    expect(ro.stdout).toMatch(/ \/ro \S+ ro,/);
    // Stop and start: mounted again.
    await driver.stop(b.id);
    const restarted = await driver.start(spec(b.id, { volumes: [{ volumeId, mountPath: '/data/v', readOnly: false }] }));
    expect((await sh(restarted.agentSocket!, 'cat /data/v/a.txt')).stdout).toBe('from-a\n');
    await driver.destroy(a.id);
    await driver.destroy(b.id);
    expect(readFileSync(join(driver.volumes.dataDir(volumeId), 'a.txt'), 'utf8')).toBe('from-a\n');
    const c = await driver.create(spec(newId('vc'), { volumes: [{ volumeId, mountPath: '/mnt/again', readOnly: false, subpath: 'dir' }] }));
    const sub = await sh(c.agentSocket!, 'echo in-sub > /mnt/again/s.txt && ls /mnt/again');
    expect(sub.stdout).toBe('s.txt\n');
    expect(readFileSync(join(driver.volumes.dataDir(volumeId), 'dir', 's.txt'), 'utf8')).toBe('in-sub\n');
  }, 240_000);

  it('a full volume is ENOSPC inside; df shows its limit', async () => {
    const s = await driver.create(spec(newId('vs'), { volumes: [{ volumeId: smallVolume, mountPath: '/small', readOnly: false }] }));
    const out = await sh(s.agentSocket!, 'dd if=/dev/zero of=/small/big bs=1M count=200 2>&1; echo rc=$?; df -B1 --output=size /small | tail -1');
    expect(out.stdout).toMatch(/No space left on device/);
    expect(out.stdout).toMatch(/rc=1/);
    const size = Number(out.stdout.trim().split('\n').pop());
    expect(size).toBeLessThanOrEqual(64 * MiB);
    expect(size).toBeGreaterThan(40 * MiB);
    const usage = await driver.volumes.usage(smallVolume);
    expect(usage.usedBytes).toBeGreaterThan(40 * MiB);
  }, 240_000);

  it('volumes keep working across a host-agent restart (adoption) and are mounted again after a reboot', async () => {
    const s = await driver.create(spec(newId('vr'), { volumes: [{ volumeId, mountPath: '/keep', readOnly: false }] }));
    expect((await sh(s.agentSocket!, 'echo before > /keep/restart.txt && echo ok')).stdout).toBe('ok\n');
    // A second driver on the same data dir adopts the running sandbox (what a restarted host agent does).
    const adopted = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0, watchIntervalMs: 500 });
    await adopted.init();
    const runtime = await adopted.get(s.id);
    expect(runtime?.status).toBe('running');
    expect((await sh(runtime!.agentSocket!, 'cat /keep/restart.txt')).stdout).toBe('before\n');
    await adopted.close();
    // A reboot unmounts everything: stop, unmount the volume's file system, start again.
    await driver.stop(s.id);
    execFileSync('umount', [join(driver.volumes.dataDir(volumeId), '..')]);
    expect(driver.volumes.isMounted(volumeId)).toBe(false);
    const started = await driver.start(spec(s.id, { volumes: [{ volumeId, mountPath: '/keep', readOnly: false }] }));
    expect(driver.volumes.isMounted(volumeId)).toBe(true);
    expect((await sh(started.agentSocket!, 'cat /keep/restart.txt')).stdout).toBe('before\n');
  }, 240_000);

  it('a symlink planted by a sandbox never leads a later mount (mount path or subpath) to a host path', async () => {
    const s = await driver.create(spec(newId('vy'), { volumes: [{ volumeId, mountPath: '/mnt/v', readOnly: false }] }));
    const plant = await sh(s.agentSocket!, `ln -s ${dataDir} /mnt/v/escape && ln -s ${dataDir} /opt/target && echo ok`);
    expect(plant.stdout).toBe('ok\n');
    await driver.stop(s.id);
    // A subpath through the planted symlink, and a mount path at the sandbox's own symlink: refused.
    await expect(driver.start(spec(s.id, { volumes: [{ volumeId, mountPath: '/mnt/v', readOnly: false, subpath: 'escape' }] }))).rejects.toThrow(/symlink|not a directory|did not become ready/);
    await expect(driver.start(spec(s.id, { volumes: [{ volumeId, mountPath: '/opt/target/x', readOnly: false }] }))).rejects.toThrow(/symlink|not a directory|did not become ready/);
    expect(readFileSync(hostSecret, 'utf8')).toBe('host-only\n');
    // Bad mount paths are refused before anything runs.
    await expect(driver.start(spec(s.id, { volumes: [{ volumeId, mountPath: '/proc/x', readOnly: false }] }))).rejects.toThrow(/mountPath/);
    await expect(driver.start(spec(s.id, { volumes: [{ volumeId, mountPath: '/a/../b', readOnly: false }] }))).rejects.toThrow(/mountPath/);
    await expect(driver.start(spec(s.id, { volumes: [{ volumeId: 'nosuchvolume', mountPath: '/a', readOnly: false }] }))).rejects.toThrow(/not on this host/);
  }, 240_000);
});
