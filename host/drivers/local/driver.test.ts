// The local driver against the real kernel: namespaces, overlayfs, cgroups, netns, nftables.
// Runs as root. The base image is shared through NESTBOX_TEST_IMAGES_DIR (built once by the
// global setup or by the first create); each test file gets its own short dataDir and owner id.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, lstatSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { networkInterfaces } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import { processStartTime } from '../../util/process.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver, type LocalDriverOptions } from './driver.js';
import { readRecord } from './records.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const isRoot = process.getuid?.() === 0;

function spec(id: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 256, env: { NESTBOX_TEST: 'yes' }, ...overrides };
}

function uniqueId(prefix: string): string {
  return `${prefix}${randomBytes(4).toString('hex')}`;
}

async function sh(socket: string, cmd: string, timeoutMs = 20_000): Promise<{ exitCode: number | null; stdout: string; stderr: string; signal: string | null }> {
  const client = new AgentClient(socket);
  try {
    return await client.exec({ cmd, timeoutMs });
  } finally {
    client.close();
  }
}

async function waitUntil<T>(probe: () => Promise<T | undefined>, timeoutMs = 10_000): Promise<T | undefined> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined || Date.now() > deadline) return value;
    await new Promise((r) => setTimeout(r, 100));
  }
}

function readFromTcp(host: string, port: number, send?: string): Promise<string> {
  return new Promise((resolveRead, reject) => {
    let text = '';
    const conn = connect({ host, port, timeout: 3_000 });
    if (send) conn.write(send);
    conn.on('data', (chunk) => (text += chunk));
    conn.on('end', () => resolveRead(text));
    conn.on('timeout', () => conn.destroy(new Error('timeout')));
    conn.on('error', reject);
  });
}

interface Footprint {
  id: string;
  pid?: number;
  pidStartTime?: string;
  slotIndex?: number;
  cgroupPaths: string[];
  dir: string;
}

/** Everything a destroyed sandbox must no longer have anywhere on the host. */
function assertNothingLeft(footprint: Footprint): void {
  if (footprint.pid) expect(processStartTime(footprint.pid), 'launcher process').not.toBe(footprint.pidStartTime);
  for (const path of footprint.cgroupPaths) expect(existsSync(path), `cgroup ${path}`).toBe(false);
  expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(footprint.id);
  if (footprint.slotIndex !== undefined) {
    expect(existsSync(`/run/netns/nbx-${footprint.slotIndex}`), 'netns').toBe(false);
    expect(existsSync(`/sys/class/net/nbxv${footprint.slotIndex}`), 'veth').toBe(false);
    expect(existsSync(`/run/nestbox/slots/${footprint.slotIndex}`), 'slot claim').toBe(false);
  }
  expect(existsSync(footprint.dir), 'sandbox dir').toBe(false);
}

describe.skipIf(!isRoot)('LocalDriver (real kernel)', () => {
  const dataDir = mkdtempSync('/tmp/nbxt-');
  const ownerId = uniqueId('test');
  const drivers: LocalDriver[] = [];
  const created = new Set<string>();
  let cgroups: Cgroups;

  // No slot pool here: these tests check that a slot is taken apart with its sandbox (the pool
  // is covered by slot-pool.test.ts).
  function newDriver(extra: Partial<LocalDriverOptions> = {}): LocalDriver {
    const driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, watchIntervalMs: 500, slotPoolSize: 0, ...extra });
    drivers.push(driver);
    return driver;
  }

  async function footprintOf(driver: LocalDriver, id: string): Promise<Footprint> {
    const record = await readRecord(join(dataDir, 'sandboxes', id));
    const runtime = await driver.get(id);
    return {
      id,
      pid: runtime?.pid,
      pidStartTime: record?.pidStartTime,
      slotIndex: record?.slot?.index,
      cgroupPaths: cgroups.groupFor(`nestbox/${ownerId}/${id}`).paths,
      dir: join(dataDir, 'sandboxes', id),
    };
  }

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE) || !existsSync(join(REPO, 'dist', 'nestbox-pty'))) execFileSync('node', [join(REPO, 'scripts', 'bundle-guest-agent.mjs')], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
  }, 300_000);

  afterAll(async () => {
    const cleaner = newDriver();
    await cleaner.init().catch(() => {});
    for (const id of created) await cleaner.destroy(id).catch(() => {});
    for (const driver of drivers) await driver.close();
    // The per-owner parent group is ours alone; leave no empty directories behind.
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }, 60_000);

  it('creates, runs commands, keeps the disk across stop/start and leaves nothing after destroy', async () => {
    const driver = newDriver();
    await driver.init();
    expect(driver.capabilities().memorySnapshot).toBe(false);
    const id = uniqueId('life');
    created.add(id);
    const runtime = await driver.create(spec(id));
    expect(runtime.status).toBe('running');
    expect(runtime.agentSocket).toBe(join(dataDir, 'sandboxes', id, 'run', 'agent.sock'));

    const hi = await sh(runtime.agentSocket!, 'echo hi; echo $NESTBOX_TEST $HOME $HOSTNAME; env | grep -c ^NESTBOX_STAGE');
    expect(hi).toMatchObject({ stdout: `hi\nyes /root ${id}\n0\n` });
    const client = new AgentClient(runtime.agentSocket!);
    await client.writeFile('/root/kept.txt', Readable.from([Buffer.from('survives stop')]));
    client.close();
    expect((await sh(runtime.agentSocket!, 'cat /root/kept.txt')).stdout).toBe('survives stop');

    const running = await footprintOf(driver, id);
    expect(await driver.stop(id)).toEqual({ memorySaved: false });
    expect(await driver.get(id)).toEqual({ id, status: 'stopped' });
    expect(processStartTime(running.pid!)).not.toBe(running.pidStartTime);
    for (const path of running.cgroupPaths) expect(existsSync(path)).toBe(false);
    expect(existsSync(`/sys/class/net/nbxv${running.slotIndex}`)).toBe(false);
    expect(existsSync(join(dataDir, 'sandboxes', id, 'fs', 'upper', 'root', 'kept.txt'))).toBe(true);

    const restarted = await driver.start(spec(id));
    expect(restarted).toMatchObject({ status: 'running', memoryRestored: false, resumeReason: 'driver_has_no_memory_snapshot' });
    expect((await sh(restarted.agentSocket!, 'cat /root/kept.txt')).stdout).toBe('survives stop');

    const beforeDestroy = await footprintOf(driver, id);
    await driver.destroy(id);
    await driver.destroy(id); // idempotent
    assertNothingLeft(beforeDestroy);
    expect(await driver.get(id)).toBeUndefined();
  });

  it('isolates the sandbox from the host: filesystem, pid 1, capabilities, network, memory', async () => {
    const driver = newDriver();
    await driver.init();
    const id = uniqueId('iso');
    created.add(id);
    const runtime = await driver.create(spec(id, { memoryMiB: 128 }));
    const socket = runtime.agentSocket!;

    const fs = await sh(socket, `ls /work; test -e ${dataDir} && echo DATADIR_VISIBLE; hostname; cat /proc/1/comm; ps -o ppid= -p $PPID`);
    expect(fs.stderr).toContain('/work');
    expect(fs.stdout).not.toContain('DATADIR_VISIBLE');
    const [hostname, initName, agentParent] = fs.stdout.trim().split('\n').map((line) => line.trim());
    expect(hostname).toBe(id);
    expect(initName).toBe('tini');
    expect(agentParent).toBe('1');

    // The agent's socket is bound on the host side and only inherited: the sandbox cannot see
    // the directory it lives in, so it cannot swap it for a symlink to a host socket.
    const socketView = await sh(socket, 'ls -A /.nestbox; find / -xdev -type s -name agent.sock 2>/dev/null; touch /.nestbox/run 2>/dev/null || echo READONLY');
    expect(socketView.stdout.trim().split('\n')).toEqual(['bin', 'lib', 'READONLY']);
    expect(lstatSync(socket).isSocket()).toBe(true);

    const mount = await sh(socket, 'mount -t tmpfs none /mnt');
    expect(mount.exitCode).not.toBe(0);
    const bounding = await sh(socket, "grep CapBnd /proc/self/status | cut -f2");
    const capBnd = BigInt(`0x${bounding.stdout.trim()}`);
    for (const cap of [16n, 17n, 21n, 22n, 25n, 27n, 12n, 2n]) expect((capBnd >> cap) & 1n, `capability ${cap}`).toBe(0n);

    // Host services must be unreachable: on the slot's gateway, on every host address, and on
    // the sandbox's own loopback (which is not the host's).
    const server: Server = createServer((socketConn) => socketConn.end('HOST-SECRET'));
    await new Promise<void>((ready) => server.listen(0, '0.0.0.0', ready));
    const port = (server.address() as { port: number }).port;
    try {
      const targets = [runtime.network!.hostAddress, '127.0.0.1'];
      for (const addresses of Object.values(networkInterfaces())) {
        for (const address of addresses ?? []) if (address.family === 'IPv4' && !address.internal) targets.push(address.address);
      }
      // Positive control: the host itself reaches the server on the gateway address.
      expect(await readFromTcp(runtime.network!.hostAddress, port)).toBe('HOST-SECRET');
      for (const target of targets) {
        const probe = await sh(socket, `timeout 1 bash -c 'exec 3<>/dev/tcp/${target}/${port}; cat <&3' && echo CONNECTED`);
        expect(probe.stdout, `connect to ${target}:${port}`).not.toContain('HOST-SECRET');
        expect(probe.stdout).not.toContain('CONNECTED');
      }
    } finally {
      server.close();
    }

    // Sandbox → other sandbox is dropped, host → sandbox is allowed (the port proxy needs it).
    const otherId = uniqueId('peer');
    created.add(otherId);
    const other = await driver.create(spec(otherId));
    await sh(other.agentSocket!, 'nohup python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 &');
    const peer = other.network!.sandboxAddress;
    const hostToSandbox = await waitUntil(() => readFromTcp(peer, 8080, 'GET / HTTP/1.0\r\n\r\n').catch(() => undefined));
    expect(hostToSandbox).toContain('HTTP/1.0 200');
    const lateral = await sh(socket, `timeout 1 bash -c 'exec 3<>/dev/tcp/${peer}/8080' && echo CONNECTED`);
    expect(lateral.stdout).not.toContain('CONNECTED');
    await driver.destroy(otherId);

    const limits = cgroups.groupFor(`nestbox/${ownerId}/${id}`);
    if (cgroups.version === 1) {
      // The agent's reserve (32 MiB of 128) comes on top of the workloads' 128 MiB.
      expect(readFileSync(join(limits.paths[0], 'memory.limit_in_bytes'), 'utf8').trim()).toBe(String(160 * 1024 * 1024));
      expect(readFileSync(join(limits.paths[1], 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('100000');
      expect(readFileSync(join(limits.paths[2], 'pids.max'), 'utf8').trim()).toBe('1024');
      // Workloads get the sandbox's memory and its pids minus the agent's reserve (64 pids).
      expect(readFileSync(join(limits.paths[0], 'work', 'memory.limit_in_bytes'), 'utf8').trim()).toBe(String(128 * 1024 * 1024));
      expect(readFileSync(join(limits.paths[2], 'work', 'pids.max'), 'utf8').trim()).toBe('960');
    }
    const hog = await sh(socket, "python3 -c \"x = b'x' * (400 * 1024 * 1024); print('allocated')\"", 30_000);
    expect(hog.stdout).not.toContain('allocated');
    expect(hog.signal === 'SIGKILL' || hog.exitCode === 137).toBe(true);
    expect((await sh(socket, 'echo agent-alive')).stdout).toBe('agent-alive\n');

    const footprint = await footprintOf(driver, id);
    await driver.destroy(id);
    assertNothingLeft(footprint);
  });

  it('adopts a running sandbox after a restart, and marks one killed meanwhile as stopped', async () => {
    const first = newDriver();
    await first.init();
    const id = uniqueId('adopt');
    created.add(id);
    const runtime = await first.create(spec(id));
    await first.close(); // as if the host agent died: no destroy, no stop

    const second = newDriver();
    await second.init();
    expect(await second.get(id)).toMatchObject({ status: 'running', pid: runtime.pid });
    expect((await sh(runtime.agentSocket!, 'echo adopted')).stdout).toBe('adopted\n');
    await second.close();

    // Someone kills the sandbox while no host agent runs.
    const record = await readRecord(join(dataDir, 'sandboxes', id));
    process.kill(runtime.pid!, 'SIGKILL');
    const deadline = Date.now() + 5_000;
    while (processStartTime(runtime.pid!) === record?.pidStartTime && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));

    const third = newDriver();
    await third.init();
    expect(await third.get(id)).toEqual({ id, status: 'stopped' });
    expect(existsSync(`/sys/class/net/nbxv${record?.slot?.index}`)).toBe(false);
    const restarted = await third.start(spec(id));
    expect((await sh(restarted.agentSocket!, 'echo back')).stdout).toBe('back\n');
    const footprint = await footprintOf(third, id);
    await third.destroy(id);
    assertNothingLeft(footprint);
  });

  it('notices a sandbox that dies on its own', async () => {
    const driver = newDriver();
    await driver.init();
    const id = uniqueId('die');
    created.add(id);
    const runtime = await driver.create(spec(id));
    process.kill(runtime.pid!, 'SIGKILL');
    const deadline = Date.now() + 5_000;
    while ((await driver.get(id))?.status !== 'stopped' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(await driver.get(id)).toEqual({ id, status: 'stopped' });
    await driver.destroy(id);
  });

  it('leaves nothing behind when the guest agent never becomes ready', async () => {
    const brokenAgent = join(dataDir, 'broken-agent.mjs');
    writeFileSync(brokenAgent, "console.error('stand-in agent: giving up'); process.exit(3);\n");
    // The helpers normally sit next to the bundle; this stand-in bundle has none beside it.
    const helpers = { ptyHelperBinary: join(dirname(AGENT_BUNDLE), 'nestbox-pty'), enterHelperBinary: join(dirname(AGENT_BUNDLE), 'nestbox-enter'), rootfsHelperBinary: join(dirname(AGENT_BUNDLE), 'nestbox-rootfs'), seccompHelperBinary: join(dirname(AGENT_BUNDLE), 'nestbox-seccomp') };
    const driver = newDriver({ guestAgentBundle: brokenAgent, readyTimeoutMs: 5_000, ...helpers });
    await driver.init();
    const id = uniqueId('bad');
    const error = await driver.create(spec(id)).catch((caught: Error) => caught);
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).message).toContain('stand-in agent: giving up');
    assertNothingLeft({ id, cgroupPaths: cgroups.groupFor(`nestbox/${ownerId}/${id}`).paths, dir: join(dataDir, 'sandboxes', id) });
    const claims = execFileSync('ls', ['/run/nestbox/slots'], { encoding: 'utf8' }).split('\n').filter(Boolean);
    for (const claim of claims) expect(readFileSync(`/run/nestbox/slots/${claim}`, 'utf8')).not.toContain(id);
  });

  it('reclaims its own leftovers at init but never another owner’s', async () => {
    const driver = newDriver();
    await driver.init();
    const mine = `nestbox/${ownerId}/ghost1`;
    const theirsOwner = uniqueId('other');
    const theirs = `nestbox/${theirsOwner}/ghost2`;
    const limits = { memoryBytes: 64 << 20, cpus: 1, pidsMax: 16 };
    await cgroups.create(mine, limits);
    await cgroups.create(theirs, limits);
    // A half-created sandbox: directory without a record.
    execFileSync('mkdir', ['-p', join(dataDir, 'sandboxes', 'half1', 'upper')]);
    try {
      const restarted = newDriver();
      await restarted.init();
      expect(cgroups.exists(cgroups.groupFor(mine))).toBe(false);
      expect(cgroups.exists(cgroups.groupFor(theirs))).toBe(true);
      expect(existsSync(join(dataDir, 'sandboxes', 'half1'))).toBe(false);
    } finally {
      await cgroups.remove(cgroups.groupFor(theirs));
      await cgroups.remove(cgroups.groupFor(`nestbox/${theirsOwner}`));
    }
  });

  it('refuses a data dir whose agent socket path would not fit in sun_path', async () => {
    const longDir = join('/tmp', 'x'.repeat(90));
    const driver = newDriver({ dataDir: longDir });
    await driver.init();
    await expect(driver.create(spec(uniqueId('long')))).rejects.toThrow(longDir);
    // Its lxcfs mount lives in the data dir: close() takes it down (no sandbox uses it).
    await driver.close();
    rmSync(longDir, { recursive: true, force: true });
  });
});
