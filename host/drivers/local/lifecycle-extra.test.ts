// Pause, fork, named snapshots, file views and the reflink store of the local driver, against
// the real kernel (root). The base image is shared through NESTBOX_TEST_IMAGES_DIR; every data
// dir is a short temp dir of this file's own. Timings are printed, never asserted.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statfsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import { processStartTime } from '../../util/process.js';
import { HostAgentServer } from '../../agent/server.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { unmountReflinkStore } from '../../storage/disk-store.js';
import { mountedFsType } from '../../util/mounts.js';
import { LocalDriver, type LocalDriverOptions } from './driver.js';
import { readRecord, writeRecord } from './records.js';
import { sh, uniqueId } from './test-support.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const isRoot = process.getuid?.() === 0;
const SECRET = 'lifecycle-extra-test-secret-0123456789';

function spec(id: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 256, env: { NESTBOX_TEST: 'yes' }, ...overrides };
}


async function timed<T>(label: string, task: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await task();
  console.log(`[timing] ${label}: ${(performance.now() - started).toFixed(1)} ms`);
  return result;
}

/** CPU time (utime + stime, in clock ticks) of every process in the sandbox's cgroups. */
function cpuTicks(cgroups: Cgroups, cgroupPath: string): number {
  let total = 0;
  // Workloads live in child groups (agent, work), so read the whole subtree.
  const pids = new Set<number>();
  const walk = (dir: string) => {
    for (const line of readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n')) if (line.trim()) pids.add(Number(line));
    for (const entry of readdirSync(dir, { withFileTypes: true })) if (entry.isDirectory()) walk(join(dir, entry.name));
  };
  for (const path of cgroups.groupFor(cgroupPath).paths) walk(path);
  for (const pid of pids) {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const afterName = fields.slice(fields.lastIndexOf(')') + 2).split(' ');
      total += Number(afterName[11]) + Number(afterName[12]);
    } catch {
      // Exited meanwhile.
    }
  }
  return total;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.skipIf(!isRoot)('LocalDriver: pause, fork, snapshots, file views (real kernel)', () => {
  const ownerId = uniqueId('lx');
  const dataDirs: string[] = [];
  const drivers: LocalDriver[] = [];
  const created = new Map<string, string>(); // sandbox id → data dir
  let cgroups: Cgroups;

  function newDataDir(): string {
    const dir = mkdtempSync('/tmp/nbxl-');
    dataDirs.push(dir);
    return dir;
  }

  // No slot pool here: these tests check that a slot is taken apart with its sandbox (the pool
  // is covered by slot-pool.test.ts).
  function newDriver(dataDir: string, extra: Partial<LocalDriverOptions> = {}): LocalDriver {
    // NESTBOX_TEST_LOG=1 prints the driver's own log lines (with their timings).
    const log = process.env.NESTBOX_TEST_LOG ? (message: string) => console.log(`[driver] ${message}`) : undefined;
    const driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, watchIntervalMs: 500, slotPoolSize: 0, log, ...extra });
    drivers.push(driver);
    return driver;
  }

  function track(dataDir: string, ...ids: string[]): void {
    for (const id of ids) created.set(id, dataDir);
  }

  const cgroupPath = (id: string) => `nestbox/${ownerId}/${id}`;

  /** Nothing of a destroyed sandbox is left: processes, cgroups (its own and its view's), slot, mounts, dirs. */
  function assertGone(dataDir: string, id: string, slotIndex?: number, extraDirs: string[] = []): void {
    for (const group of [cgroupPath(id), cgroupPath(`${id}-view`)]) for (const path of cgroups.groupFor(group).paths) expect(existsSync(path), path).toBe(false);
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(id);
    if (slotIndex !== undefined) {
      expect(existsSync(`/run/netns/nbx-${slotIndex}`)).toBe(false);
      expect(existsSync(`/sys/class/net/nbxv${slotIndex}`)).toBe(false);
    }
    for (const dir of [join(dataDir, 'sandboxes', id), ...extraDirs]) expect(existsSync(dir), dir).toBe(false);
  }

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('node', [join(REPO, 'scripts', 'bundle-guest-agent.mjs')], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
  }, 300_000);

  afterAll(async () => {
    for (const dataDir of dataDirs) {
      const cleaner = newDriver(dataDir, { reflinkStore: existsSync(join(dataDir, 'store.xfs')) ? { imagePath: join(dataDir, 'store.xfs'), sizeBytes: 4 * 2 ** 30 } : 'off' });
      await cleaner.init().catch(() => {});
      for (const [id, dir] of created) if (dir === dataDir) await cleaner.destroy(id).catch(() => {});
      for (const snapshot of await cleaner.listSnapshots().catch(() => [])) await cleaner.deleteSnapshot(snapshot.snapshotId).catch(() => {});
    }
    for (const driver of drivers) await driver.close();
    for (const dataDir of dataDirs) {
      await unmountReflinkStore(dataDir).catch(() => {});
      if (!mountedFsType(join(dataDir, 'store'))) rmSync(dataDir, { recursive: true, force: true });
    }
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
  }, 120_000);

  it('pauses (no CPU, agent pass-through answers 409 at once), survives a restart paused, unpauses', async () => {
    const dataDir = newDataDir();
    const driver = newDriver(dataDir);
    await driver.init();
    expect(driver.capabilities()).toMatchObject({ pause: true, fork: true });
    const id = uniqueId('pz');
    track(dataDir, id);
    const runtime = await driver.create(spec(id));
    await sh(runtime.agentSocket!, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &");
    const before = cpuTicks(cgroups, cgroupPath(id));
    await sleep(600);
    expect(cpuTicks(cgroups, cgroupPath(id)) - before, 'busy loop burns CPU while running').toBeGreaterThan(20);

    const paused = await timed('pause', () => driver.pause(id));
    expect(paused.status).toBe('paused');
    expect((await driver.pause(id)).status).toBe('paused'); // idempotent
    const frozenAt = cpuTicks(cgroups, cgroupPath(id));
    await sleep(1_000);
    expect(cpuTicks(cgroups, cgroupPath(id))).toBe(frozenAt);
    expect((await readRecord(join(dataDir, 'sandboxes', id)))?.status).toBe('paused');

    // The host agent's pass-through must not hang on a frozen agent.
    const host = new HostAgentServer({ hostId: 'hx', secret: SECRET, driver, log: () => {} });
    const base = `http://127.0.0.1:${await host.listen(0, '127.0.0.1')}`;
    try {
      const started = Date.now();
      const answer = await fetch(`${base}/v1/sandboxes/${id}/agent/health`, { headers: { authorization: `Bearer ${SECRET}` }, signal: AbortSignal.timeout(5_000) });
      expect(answer.status).toBe(409);
      expect((await answer.json()).error).toMatchObject({ code: 'invalid_state', message: expect.stringContaining('paused') });
      expect(Date.now() - started).toBeLessThan(1_000);
      const listed = await (await fetch(`${base}/v1/sandboxes`, { headers: { authorization: `Bearer ${SECRET}` } })).json();
      expect(listed.sandboxes).toContainEqual({ id, status: 'paused' });
    } finally {
      await host.close();
    }

    // A restarted host agent keeps it paused.
    await driver.close();
    const second = newDriver(dataDir);
    await second.init();
    expect(await second.get(id)).toMatchObject({ status: 'paused', pid: runtime.pid });
    await sleep(300);
    expect(cpuTicks(cgroups, cgroupPath(id))).toBe(frozenAt);

    const resumed = await timed('unpause', () => second.unpause(id));
    expect(resumed.status).toBe('running');
    expect((await second.unpause(id)).status).toBe('running'); // idempotent
    expect((await sh(runtime.agentSocket!, 'echo thawed')).stdout).toBe('thawed\n');
    const thawedAt = cpuTicks(cgroups, cgroupPath(id));
    await sleep(400);
    expect(cpuTicks(cgroups, cgroupPath(id))).toBeGreaterThan(thawedAt);

    // A crash in the middle of a copy (fork/snapshot froze a running sandbox) is rolled back at init.
    await second.close();
    const group = cgroups.groupFor(cgroupPath(id));
    await cgroups.setFrozenAndWait(group, true);
    const record = (await readRecord(join(dataDir, 'sandboxes', id)))!;
    record.operation = { kind: 'copy', startedAt: new Date().toISOString() };
    await writeRecord(join(dataDir, 'sandboxes', id), record);
    const third = newDriver(dataDir);
    await third.init();
    expect(await third.get(id)).toMatchObject({ status: 'running' });
    expect(await cgroups.isFrozen(group)).toBe(false);
    expect((await readRecord(join(dataDir, 'sandboxes', id)))?.operation).toBeUndefined();

    // Stop and destroy work on a paused sandbox too.
    await third.pause(id);
    const slotIndex = (await readRecord(join(dataDir, 'sandboxes', id)))?.slot?.index;
    await third.destroy(id);
    expect(processStartTime(runtime.pid!)).not.toBe(record.pidStartTime);
    assertGone(dataDir, id, slotIndex);
  });

  it('forks a running sandbox into two independent children, keeping whiteouts and opaque dirs', async () => {
    const dataDir = newDataDir();
    const driver = newDriver(dataDir);
    await driver.init();
    const source = uniqueId('src');
    track(dataDir, source);
    const parent = await driver.create(spec(source));
    const prep = await sh(
      parent.agentSocket!,
      [
        'test -e /etc/motd && rm /etc/motd',
        'rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo mine > /etc/apt/apt.conf.d/only',
        'echo from-parent > /root/shared.txt',
      ].join(' && '),
    );
    expect(prep.exitCode).toBe(0);
    // A process that must survive the fork's freeze and thaw.
    const loopPid = (await sh(parent.agentSocket!, "nohup sh -c 'while :; do sleep 0.05; done' >/dev/null 2>&1 & echo $!")).stdout.trim();

    const [a, b] = [uniqueId('ka'), uniqueId('kb')];
    track(dataDir, a, b);
    const result = await timed('fork running sandbox into 2 (copy)', () => driver.fork(source, [spec(a), spec(b)]));
    expect(result).toMatchObject({ memoryCopied: false, diskCopy: 'copy' });
    expect(result.children.map((child) => [child.id, child.status])).toEqual([
      [a, 'running'],
      [b, 'running'],
    ]);
    // The source was thawed and still runs its processes.
    expect(await driver.get(source)).toMatchObject({ status: 'running' });
    expect(await cgroups.isFrozen(cgroups.groupFor(cgroupPath(source)))).toBe(false);
    expect((await sh(parent.agentSocket!, `kill -0 ${loopPid} && echo alive`)).stdout).toBe('alive\n');

    const [childA, childB] = result.children;
    for (const [child, name] of [
      [childA, a],
      [childB, b],
    ] as const) {
      const seen = await sh(child.agentSocket!, 'cat /root/shared.txt; test -e /etc/motd && echo MOTD; ls /etc/apt/apt.conf.d; hostname');
      expect(seen.stdout).toBe(`from-parent\nonly\n${name}\n`);
      await sh(child.agentSocket!, `echo ${name} > /root/own.txt; echo changed-by-${name} > /root/shared.txt`);
    }
    expect((await sh(childA.agentSocket!, 'cat /root/own.txt /root/shared.txt')).stdout).toBe(`${a}\nchanged-by-${a}\n`);
    expect((await sh(childB.agentSocket!, 'cat /root/own.txt /root/shared.txt')).stdout).toBe(`${b}\nchanged-by-${b}\n`);
    expect((await sh(parent.agentSocket!, 'cat /root/shared.txt; test -e /root/own.txt || echo none')).stdout).toBe('from-parent\nnone\n');
    // Each child has its own slot.
    expect(new Set([parent, childA, childB].map((r) => r.network?.netns)).size).toBe(3);

    // Forking onto an existing id is refused as a conflict and leaves nothing half made.
    await expect(driver.fork(source, [spec(uniqueId('kc')), spec(a)])).rejects.toMatchObject({ code: 'conflict' });
    expect((await driver.list()).length).toBe(3);

    // A child that fails to start takes its siblings with it; the source is left as it was.
    const [x, y] = [uniqueId('kx'), uniqueId('ky')];
    track(dataDir, x, y);
    const launch = (driver as unknown as { launch: (record: { id: string }, lower: string) => Promise<void> }).launch.bind(driver);
    (driver as unknown as { launch: typeof launch }).launch = async (record, lower) => {
      if (record.id === y) throw new Error('injected launch failure');
      return launch(record, lower);
    };
    await expect(driver.fork(source, [spec(x), spec(y)])).rejects.toThrow('injected launch failure');
    (driver as unknown as { launch: typeof launch }).launch = launch;
    expect((await driver.list()).map((runtime) => runtime.id).sort()).toEqual([a, b, source].sort());
    for (const id of [x, y]) assertGone(dataDir, id);
    expect(await driver.get(source)).toMatchObject({ status: 'running' });
    expect(await cgroups.isFrozen(cgroups.groupFor(cgroupPath(source)))).toBe(false);

    // A stopped source forks too; its child starts running.
    await driver.stop(source);
    const c = uniqueId('kd');
    track(dataDir, c);
    const fromStopped = await timed('fork stopped sandbox into 1 (copy)', () => driver.fork(source, [spec(c)]));
    expect(fromStopped.children[0].status).toBe('running');
    expect((await sh(fromStopped.children[0].agentSocket!, 'cat /root/shared.txt; test -e /etc/motd || echo no-motd')).stdout).toBe('from-parent\nno-motd\n');
    expect(await driver.get(source)).toEqual({ id: source, status: 'stopped' });

    for (const id of [a, b, c, source]) {
      const slot = (await readRecord(join(dataDir, 'sandboxes', id)))?.slot?.index;
      await driver.destroy(id);
      assertGone(dataDir, id, slot);
    }
  });

  it('named snapshots: create from one, outlive the source, chain, refuse deletion while in use', async () => {
    const dataDir = newDataDir();
    const driver = newDriver(dataDir);
    await driver.init();
    const source = uniqueId('ss');
    track(dataDir, source);
    const src = await driver.create(spec(source));
    await sh(src.agentSocket!, 'rm /etc/motd; echo layer-one > /root/one.txt; mkdir -p /opt/tool && echo v1 > /opt/tool/version');
    const snapOne = `tpl-${uniqueId('a')}`;
    const saved = await timed('snapshot of a running sandbox', () => driver.snapshot(source, snapOne));
    expect(saved).toMatchObject({ snapshotId: snapOne, diskCopy: 'copy', layers: [snapOne] });
    expect(saved.sizeBytes).toBeGreaterThan(0);
    expect(await driver.get(source)).toMatchObject({ status: 'running' });
    // Same call again: the same snapshot. Another sandbox cannot take the name.
    expect(await driver.snapshot(source, snapOne)).toEqual(saved);
    await driver.destroy(source);

    // The snapshot outlives its source.
    const fromOne = uniqueId('f1');
    track(dataDir, fromOne);
    const first = await timed('create from snapshot', () => driver.create(spec(fromOne, { snapshot: snapOne })));
    expect((await sh(first.agentSocket!, 'cat /root/one.txt /opt/tool/version; test -e /etc/motd || echo no-motd; hostname')).stdout).toBe(`layer-one\nv1\nno-motd\n${fromOne}\n`);
    // Its upper starts empty (apart from the per-sandbox /etc files): nothing was copied.
    expect(readdirSync(join(dataDir, 'sandboxes', fromOne, 'fs', 'upper')).sort()).toEqual(['etc']);
    await expect(driver.snapshot(fromOne, snapOne)).rejects.toMatchObject({ code: 'conflict' });

    // A snapshot of a sandbox created from a snapshot records the chain.
    await sh(first.agentSocket!, 'echo layer-two > /root/two.txt; echo v2 > /opt/tool/version; rm /root/one.txt');
    await driver.stop(fromOne);
    const snapTwo = `tpl-${uniqueId('b')}`;
    const chained = await timed('snapshot of a stopped sandbox', () => driver.snapshot(fromOne, snapTwo));
    expect(chained.layers).toEqual([snapTwo, snapOne]);

    const fromTwo = uniqueId('f2');
    track(dataDir, fromTwo);
    const second = await driver.create(spec(fromTwo, { snapshot: snapTwo }));
    expect((await sh(second.agentSocket!, 'cat /root/two.txt /opt/tool/version; test -e /root/one.txt || echo one-deleted; test -e /etc/motd || echo no-motd')).stdout).toBe(
      'layer-two\nv2\none-deleted\nno-motd\n',
    );
    // Stop/start keeps the layers.
    await driver.stop(fromTwo);
    const restarted = await driver.start(spec(fromTwo));
    expect((await sh(restarted.agentSocket!, 'cat /root/two.txt')).stdout).toBe('layer-two\n');

    const listed = await driver.listSnapshots();
    expect(listed.map((s) => s.snapshotId).sort()).toEqual([snapOne, snapTwo].sort());
    expect(listed.find((s) => s.snapshotId === snapTwo)).toMatchObject({ sourceId: fromOne, layers: [snapTwo, snapOne], image: 'default' });

    // In use: by sandboxes, and by a child snapshot.
    await expect(driver.deleteSnapshot(snapOne)).rejects.toMatchObject({ code: 'conflict', message: expect.stringContaining(fromOne) });
    await expect(driver.deleteSnapshot(snapTwo)).rejects.toMatchObject({ code: 'conflict', message: expect.stringContaining(fromTwo) });
    await driver.destroy(fromTwo);
    await driver.deleteSnapshot(snapTwo);
    await driver.deleteSnapshot(snapTwo); // idempotent
    await expect(driver.deleteSnapshot(snapOne)).rejects.toMatchObject({ code: 'conflict' });
    await driver.destroy(fromOne);
    await driver.deleteSnapshot(snapOne);
    expect(await driver.listSnapshots()).toEqual([]);
    await expect(driver.create(spec(uniqueId('f3'), { snapshot: snapOne }))).rejects.toMatchObject({ code: 'not_found' });
    expect(readdirSync(join(dataDir, 'snapshots'))).toEqual([]);
    for (const id of [source, fromOne, fromTwo]) assertGone(dataDir, id);
  });

  it('file view of a stopped sandbox: lists and reads, cannot write, no network, torn down by start and destroy', async () => {
    const dataDir = newDataDir();
    const driver = newDriver(dataDir, { fileViewIdleMs: 1_500 });
    await driver.init();
    const id = uniqueId('fv');
    track(dataDir, id);
    const runtime = await driver.create(spec(id));
    await sh(runtime.agentSocket!, 'mkdir -p /root/data && echo hello-view > /root/data/a.txt && ln -s /root/data/a.txt /root/link && rm /etc/motd');
    await expect(driver.fileView(id)).rejects.toMatchObject({ code: 'invalid_state' });
    await driver.stop(id);

    const view = await timed('file view start', () => driver.fileView(id));
    expect(view.agentSocket).toBe(join(dataDir, 'sandboxes', id, 'view', 'agent.sock'));
    expect((await driver.fileView(id)).viewId).toBe(view.viewId); // reused
    const client = new AgentClient(view.agentSocket);
    try {
      expect((await client.list('/root/data')).entries.map((entry) => entry.name)).toEqual(['a.txt']);
      const body = await client.readFile('/root/link');
      let text = '';
      for await (const chunk of body) text += chunk;
      expect(text).toBe('hello-view\n');
      await expect(client.writeFile('/root/new.txt', Readable.from([Buffer.from('x')]))).rejects.toThrow();
      const probe = await client.exec({ cmd: 'touch /root/x 2>&1; ls /sys/class/net; test -e /etc/motd || echo no-motd; cat /etc/hostname', timeoutMs: 10_000 });
      expect(probe.stdout).toContain('Read-only file system');
      expect(probe.stdout).toContain(`lo\nno-motd\n${id}\n`);
      expect(probe.stdout).not.toContain('eth0');
    } finally {
      client.close();
    }
    expect(existsSync(join(dataDir, 'sandboxes', id, 'fs', 'upper', 'root', 'x'))).toBe(false);
    expect(cgroups.exists(cgroups.groupFor(cgroupPath(`${id}-view`)))).toBe(true);

    // Through the host agent: the files-view pass-through, and 409 for /files-view of a running one.
    const host = new HostAgentServer({ hostId: 'hx', secret: SECRET, driver, log: () => {} });
    const base = `http://127.0.0.1:${await host.listen(0, '127.0.0.1')}`;
    const auth = { authorization: `Bearer ${SECRET}` };
    try {
      const listed = await fetch(`${base}/v1/sandboxes/${id}/files-view/files/list?path=%2Froot%2Fdata`, { headers: auth });
      expect(listed.status).toBe(200);
      expect((await listed.json()).entries.map((entry: { name: string }) => entry.name)).toEqual(['a.txt']);
      const agentWhileStopped = await fetch(`${base}/v1/sandboxes/${id}/agent/health`, { headers: auth });
      expect(agentWhileStopped.status).toBe(409);

      // Unused for longer than fileViewIdleMs: it goes away by itself; the next request restarts it.
      const deadline = Date.now() + 10_000;
      while (cgroups.exists(cgroups.groupFor(cgroupPath(`${id}-view`))) && Date.now() < deadline) await sleep(200);
      expect(cgroups.exists(cgroups.groupFor(cgroupPath(`${id}-view`)))).toBe(false);
      const again = await fetch(`${base}/v1/sandboxes/${id}/files-view/files/stat?path=%2Froot%2Fdata%2Fa.txt`, { headers: auth });
      expect(again.status).toBe(200);

      // Starting the sandbox stops the view first.
      const restarted = await driver.start(spec(id));
      expect(cgroups.exists(cgroups.groupFor(cgroupPath(`${id}-view`)))).toBe(false);
      expect(existsSync(join(dataDir, 'sandboxes', id, 'view'))).toBe(false);
      const running = await fetch(`${base}/v1/sandboxes/${id}/files-view/files/list?path=%2Froot`, { headers: auth });
      expect(running.status).toBe(409);
      expect((await sh(restarted.agentSocket!, 'cat /root/data/a.txt')).stdout).toBe('hello-view\n');
    } finally {
      await host.close();
    }

    // Destroy tears a live view down.
    await driver.stop(id);
    await driver.fileView(id);
    await driver.destroy(id);
    assertGone(dataDir, id);
  });

  it('init removes what a crash left half made: a child being forked, a snapshot being written or deleted', async () => {
    const dataDir = newDataDir();
    const driver = newDriver(dataDir);
    await driver.init();
    await driver.close();
    const half = uniqueId('hf');
    const halfDir = join(dataDir, 'sandboxes', half);
    execFileSync('mkdir', ['-p', join(halfDir, 'upper', 'root'), join(halfDir, 'work'), join(halfDir, 'run')]);
    const record = { version: 1, id: half, owner: ownerId, spec: spec(half), status: 'creating', agentSocket: join(halfDir, 'run', 'agent.sock'), forkedFrom: 'someone', createdAt: '', updatedAt: '' };
    await writeRecord(halfDir, record as Parameters<typeof writeRecord>[1]);
    const partialSnapshot = join(dataDir, 'snapshots', '.tmp-tpl-1-abcd', 'layer', 'root');
    const trashedSnapshot = join(dataDir, 'snapshots', '.trash-tpl-2-abcd', 'layer');
    execFileSync('mkdir', ['-p', partialSnapshot, trashedSnapshot]);
    const restarted = newDriver(dataDir);
    await restarted.init();
    expect(existsSync(halfDir)).toBe(false);
    expect(readdirSync(join(dataDir, 'snapshots'))).toEqual([]);
    expect(await restarted.listSnapshots()).toEqual([]);
  });

  it('reflink store: a loop-mounted XFS makes forking 1 GiB as cheap as forking nothing', async () => {
    const dataDir = newDataDir();
    const imagePath = join(dataDir, 'store.xfs');
    const storeOptions = { imagePath, sizeBytes: 4 * 2 ** 30 };
    const driver = newDriver(dataDir, { reflinkStore: storeOptions });
    await timed('reflink store setup (sparse file + mkfs.xfs + mount) and init', () => driver.init());
    const store = join(dataDir, 'store');
    expect(mountedFsType(store)).toBe('xfs');
    expect(driver.capabilities().probes).toMatchObject({ reflink: true, diskCopy: 'reflink', reflinkStore: store });

    const source = uniqueId('rf');
    track(dataDir, source);
    const src = await driver.create(spec(source, { memoryMiB: 512 }));
    expect((await readRecord(join(dataDir, 'sandboxes', source)))?.diskDir).toBe(join(store, 'sandboxes', source));
    await sh(src.agentSocket!, 'rm /etc/motd; echo small > /root/small.txt');

    const empty = uniqueId('re');
    track(dataDir, empty);
    const forkEmpty = await timed('fork (reflink) of a nearly empty sandbox', () => driver.fork(source, [spec(empty)]));
    expect(forkEmpty.diskCopy).toBe('reflink');

    const wrote = await timed('write 1 GiB in the sandbox', () =>
      sh(src.agentSocket!, 'dd if=/dev/zero of=/root/big bs=1M count=1024 conv=fsync status=none && head -c 65536 /dev/urandom | dd of=/root/big conv=notrunc,fsync status=none && echo done', 120_000),
    );
    expect(wrote.stdout).toBe('done\n');
    const usedBefore = usedBytes(store);
    const big = uniqueId('rb');
    track(dataDir, big);
    const forkBig = await timed('fork (reflink) of a sandbox holding 1 GiB', () => driver.fork(source, [spec(big)]));
    expect(forkBig.diskCopy).toBe('reflink');
    const grew = usedBytes(store) - usedBefore;
    console.log(`[info] store usage grew by ${(grew / 2 ** 20).toFixed(1)} MiB for a fork of 1 GiB`);
    expect(grew).toBeLessThan(256 * 2 ** 20);
    const sourceBig = join(store, 'sandboxes', source, 'fs', 'upper', 'root', 'big');
    const childBig = join(store, 'sandboxes', big, 'fs', 'upper', 'root', 'big');
    execFileSync('cmp', [sourceBig, childBig]); // throws if they differ
    expect((await sh(forkBig.children[0].agentSocket!, 'stat -c %s /root/big; cat /root/small.txt; test -e /etc/motd || echo no-motd')).stdout).toBe(`${2 ** 30}\nsmall\nno-motd\n`);

    const snap = `big-${uniqueId('s')}`;
    const saved = await timed('snapshot (reflink) of a sandbox holding 1 GiB', () => driver.snapshot(source, snap));
    expect(saved).toMatchObject({ diskCopy: 'reflink' });
    expect(saved.sizeBytes).toBeGreaterThanOrEqual(2 ** 30);
    const fromSnap = uniqueId('rs');
    track(dataDir, fromSnap);
    const created = await timed('create from a 1 GiB snapshot', () => driver.create(spec(fromSnap, { snapshot: snap })));
    expect((await sh(created.agentSocket!, 'stat -c %s /root/big')).stdout).toBe(`${2 ** 30}\n`);

    // A restarted host agent reuses the mounted store and sees everything.
    await driver.close();
    const second = newDriver(dataDir, { reflinkStore: storeOptions });
    await second.init();
    expect((await second.list()).length).toBe(4);
    expect(readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((line) => line.split(' ')[4] === store)).toHaveLength(1);

    for (const id of [empty, big, fromSnap, source]) {
      await second.destroy(id);
      assertGone(dataDir, id, undefined, [join(store, 'sandboxes', id)]);
    }
    await second.deleteSnapshot(snap);
    await second.close();
    await unmountReflinkStore(dataDir);
    expect(mountedFsType(store)).toBeUndefined();
    expect(execFileSync('losetup', ['-j', imagePath], { encoding: 'utf8' }).trim()).toBe('');
    rmSync(dataDir, { recursive: true, force: true });
  }, 180_000);

  it('fork of a sandbox holding 1 GiB without reflink (full copy), for comparison', async () => {
    const dataDir = newDataDir();
    const driver = newDriver(dataDir);
    await driver.init();
    expect(driver.capabilities().probes).toMatchObject({ diskCopy: 'copy' });
    const source = uniqueId('cp');
    track(dataDir, source);
    const src = await driver.create(spec(source, { memoryMiB: 512 }));
    const empty = uniqueId('ce');
    track(dataDir, empty);
    await timed('fork (copy) of a nearly empty sandbox', () => driver.fork(source, [spec(empty)]));
    await sh(src.agentSocket!, 'dd if=/dev/zero of=/root/big bs=1M count=1024 conv=fsync status=none', 120_000);
    const big = uniqueId('cb');
    track(dataDir, big);
    const forkBig = await timed('fork (copy) of a sandbox holding 1 GiB', () => driver.fork(source, [spec(big)]));
    expect(forkBig.diskCopy).toBe('copy');
    expect((await sh(forkBig.children[0].agentSocket!, 'stat -c %s /root/big')).stdout).toBe(`${2 ** 30}\n`);
    for (const id of [empty, big, source]) {
      await driver.destroy(id);
      assertGone(dataDir, id);
    }
  }, 120_000);
});

function usedBytes(path: string): number {
  const stats = statfsSync(path);
  return (stats.blocks - stats.bfree) * stats.bsize;
}
