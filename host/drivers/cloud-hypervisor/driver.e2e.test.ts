// The Cloud Hypervisor driver end to end against the CH simulator (host/sim/ch), which is
// spawned exactly like the real binary (in the slot's netns, private mount ns), validates every
// request body against the pinned v53.0 API description, keeps CH's state machine and "boots"
// the real guest agent behind a real hybrid-vsock muxer. Needs root (network namespaces).
//
// scripts/kvm-smoke.sh runs this same file against a real cloud-hypervisor on a KVM host:
// NESTBOX_CH_BIN=<binary> NESTBOX_TEST_CH_IMAGES=<images dir with a built vm-default>; the
// simulator-only checks (fault injection, simulated boot ids) are skipped there.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newAgentKey } from '../../agent-protocol/auth.js';
import { AgentClient } from '../../agent-protocol/client.js';
import { processStartTime } from '../../util/process.js';
import { VM_IMAGE_NAME } from '../../images/vm-image.js';
import { vmCodeInterpreterImageDir } from '../../images/vm-code-interpreter-image.js';
import { installSimulator } from '../../sim/ch/launcher.js';
import { SLOTS_DIR } from '../../network/slots.js';
import { ChDriver } from './driver.js';

const REAL_BINARY = process.env.NESTBOX_CH_BIN;
const SIMULATED = !REAL_BINARY;
const isRoot = process.getuid?.() === 0;

let root: string;
let chBinary: string;
let faultsFile = '';
let imagesDir: string;
let driver: ChDriver;
const ownerId = `chtest-${process.pid}`;

function driverOptions() {
  return {
    dataDir: join(root, 'data'),
    imagesDir,
    ownerId,
    chBinary,
    requireKvm: !SIMULATED,
    readyTimeoutMs: SIMULATED ? 5_000 : 60_000,
    watchIntervalMs: 60_000,
    // Other suites' host agents share this machine's nftables table; leave it alone here.
    manageHostFirewall: false,
  };
}

function setFaults(faults: Record<string, unknown>): void {
  writeFileSync(faultsFile, JSON.stringify(faults));
}

/** A tiny stand-in for the built VM image: the simulator only checks that the files exist. */
function writeFakeVmImage(dir: string): void {
  const imageDir = join(dir, VM_IMAGE_NAME);
  mkdirSync(imageDir, { recursive: true });
  writeFileSync(join(imageDir, 'vmlinuz'), 'not a kernel');
  writeFileSync(join(imageDir, 'initrd.img'), 'not an initramfs');
  execFileSync('truncate', ['-s', '64M', join(imageDir, 'rootfs.img')]);
  writeFileSync(join(imageDir, 'manifest.json'), JSON.stringify({ name: VM_IMAGE_NAME, fake: true }));
}

/**
 * The VM's runtime carries this boot's proof key (also in agent.key, 0600): the agent proves its
 * answers with it through the host-side socket, an answer under any other key is refused, and
 * nobody without the current key can make the agent take another one. Returns the key.
 */
async function expectProvenAgent(id: string): Promise<string> {
  const runtime = await driver.get(id);
  const key = runtime?.agentProofKey;
  expect(key, `${id}: proof key`).toBeDefined();
  const keyFile = join(root, 'data', 'sandboxes', id, 'agent.key');
  expect(statSync(keyFile).mode & 0o777).toBe(0o600);
  expect(readFileSync(keyFile, 'utf8').trim()).toBe(key!.toString('hex'));
  const proven = new AgentClient(runtime!.agentSocket!, { proofKey: key });
  const other = new AgentClient(runtime!.agentSocket!, { proofKey: newAgentKey() });
  try {
    expect(await proven.health()).toMatchObject({ status: 'ok' });
    await expect(other.health()).rejects.toMatchObject({ code: 'agent_unavailable' });
    // What a process in the guest could try: install a key of its own choosing.
    const keyless = new AgentClient(runtime!.agentSocket!);
    const takeover = await keyless.request({ method: 'PUT', path: '/auth/key', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ key: newAgentKey().toString('hex') }) });
    takeover.resume();
    keyless.close();
    expect(takeover.statusCode).toBe(403);
    expect(await proven.health()).toMatchObject({ status: 'ok' });
  } finally {
    proven.close();
    other.close();
  }
  return key!.toString('hex');
}

async function exec(client: AgentClient, cmd: string): Promise<string> {
  const result = await client.exec({ cmd, timeoutMs: 10_000 });
  expect(result.exitCode, result.stderr).toBe(0);
  return result.stdout.trim();
}

async function withClient<T>(id: string, task: (client: AgentClient) => Promise<T>): Promise<T> {
  const client = driver.agentClient(id);
  try {
    return await task(client);
  } finally {
    client.close();
  }
}

function slotOwner(index: number): string | undefined {
  try {
    return JSON.parse(readFileSync(join(SLOTS_DIR, String(index)), 'utf8')).owner;
  } catch {
    return undefined;
  }
}

function ourSlotClaims(): string[] {
  if (!existsSync(SLOTS_DIR)) return [];
  return readdirSync(SLOTS_DIR).filter((name) => {
    try {
      return JSON.parse(readFileSync(join(SLOTS_DIR, name), 'utf8')).owner === ownerId;
    } catch {
      return false;
    }
  });
}

describe.skipIf(!isRoot)('cloud-hypervisor driver (against the simulator unless NESTBOX_CH_BIN is set)', () => {
  beforeAll(async () => {
    root = mkdtempSync('/tmp/nbch-');
    if (SIMULATED) {
      const sim = await installSimulator(join(root, 'sim'));
      chBinary = sim.binary;
      faultsFile = sim.faultsFile;
      imagesDir = join(root, 'images');
      writeFakeVmImage(imagesDir);
    } else {
      chBinary = REAL_BINARY!;
      imagesDir = process.env.NESTBOX_TEST_CH_IMAGES ?? '/var/lib/nestbox/images';
    }
    driver = new ChDriver(driverOptions());
    await driver.init();
  });

  afterAll(async () => {
    for (const sandbox of (await driver?.list()) ?? []) await driver.destroy(sandbox.id).catch(() => {});
    await driver?.close();
    rmSync(root, { recursive: true, force: true });
  });

  it.skipIf(!SIMULATED)('boots code-interpreter from its own disk, and refuses it (409) while that disk is not built', async () => {
    const spec = { id: 'chci', image: 'code-interpreter', cpu: 1, memoryMiB: 256, env: {} };
    await expect(driver.create(spec)).rejects.toMatchObject({ code: 'invalid_state', message: expect.stringContaining('not built on this host yet') });
    expect(await driver.get('chci')).toBeUndefined();
    // A stand-in for what ensureVmCodeInterpreterImage leaves: a disk of a size no other image has.
    writeFileSync(join(imagesDir, VM_IMAGE_NAME, 'tree.json'), JSON.stringify({ key: 'fake-vm-tree', seconds: 0 }));
    const where = (await vmCodeInterpreterImageDir(imagesDir))!;
    mkdirSync(where.dir, { recursive: true });
    execFileSync('truncate', ['-s', '48M', join(where.dir, 'rootfs.img')]);
    writeFileSync(join(where.dir, 'manifest.json'), JSON.stringify({ name: 'vm-code-interpreter', key: where.key }));
    try {
      const created = await driver.create(spec);
      expect(created.status).toBe('running');
      expect(statSync(join(driver.inspect('chci')!.diskDir, 'rootfs.img')).size).toBe(48 * 2 ** 20);
      await withClient('chci', async (client) => expect(await exec(client, 'echo up')).toBe('up'));
    } finally {
      await driver.destroy('chci').catch(() => {});
      rmSync(where.dir, { recursive: true, force: true });
      rmSync(join(imagesDir, VM_IMAGE_NAME, 'tree.json'), { force: true });
    }
  });

  it('probes its capabilities instead of assuming them', () => {
    const capabilities = driver.capabilities();
    expect(capabilities.memorySnapshot).toBe(true);
    expect(capabilities.fork).toBe(true);
    expect(typeof capabilities.probes.kvm).toBe('boolean');
    expect(capabilities.probes.chVersion).toMatch(/cloud-hypervisor/);
    if (SIMULATED) expect(capabilities.nestedVirt).toBe(false); // no /dev/kvm here
  });

  it('create → exec → pause/unpause → stop with memory → resume → fork → adopt → destroy', async () => {
    const spec = (id: string) => ({ id, image: 'default', cpu: 1, memoryMiB: 256, env: { NESTBOX_E2E: `env of ${id}` } });
    const timings: Record<string, number> = {};
    const timed = async <T>(label: string, task: () => Promise<T>): Promise<T> => {
      const started = Date.now();
      try {
        return await task();
      } finally {
        timings[label] = Date.now() - started;
      }
    };

    // create: the guest agent answers over hybrid vsock, and through the host-side socket.
    const created = await timed('create', () => driver.create(spec('cha')));
    expect(created.status).toBe('running');
    expect(created.network?.netns).toMatch(/^nbx-\d+$/);
    const bootId = await withClient('cha', async (client) => {
      expect(await exec(client, 'echo hello from the vm')).toBe('hello from the vm');
      // The sandbox's env reaches processes in the VM (handed to the image-started agent).
      expect(await exec(client, 'echo "$NESTBOX_E2E"')).toMatch(/^env of /);
      await client.writeFile('note.txt', Readable.from(['kept across stop and fork\n']));
      return SIMULATED ? exec(client, 'cat .nestbox-sim/boot_id') : exec(client, 'cat /proc/sys/kernel/random/boot_id');
    });
    const bootKeys = [await expectProvenAgent('cha')];
    const viaSocket = new AgentClient(created.agentSocket!);
    expect(await exec(viaSocket, 'cat note.txt')).toBe('kept across stop and fork');
    viaSocket.close();

    // usage: what the host can see of the VM (the VMM's CPU time, its memory and disk sizes,
    // the slot's veth); what only the guest knows is absent, never guessed.
    const [usage] = (await driver.usage()).filter((u) => u.id === 'cha');
    expect(usage).toMatchObject({ status: 'running', cpuLimit: 1, memoryLimitBytes: 256 * 2 ** 20 });
    expect(usage.cpuNs).toBeGreaterThan(0);
    expect(usage.diskTotalBytes).toBeGreaterThan(0);
    expect(usage.netTxBytes).toEqual(expect.any(Number));
    expect(usage).not.toHaveProperty('memoryUsedBytes');
    expect(usage.diskUsedBytes).toBeUndefined();

    // pause: the VM does not answer; unpause: it does again.
    expect((await timed('pause', () => driver.pause('cha'))).status).toBe('paused');
    expect((await driver.usage()).find((u) => u.id === 'cha')?.status).toBe('paused');
    await withClient('cha', async (client) => {
      await expect(client.health({ timeoutMs: 300 })).rejects.toThrow();
    });
    expect((await timed('unpause', () => driver.unpause('cha'))).status).toBe('running');
    await withClient('cha', async (client) => expect(await exec(client, 'echo again')).toBe('again'));

    // stop with memory: a complete snapshot generation, the slot released.
    const slotBefore = driver.inspect('cha')!.slot!.index;
    expect(await timed('stop', () => driver.stop('cha'))).toEqual({ memorySaved: true });
    const stopped = driver.inspect('cha')!;
    expect(stopped.status).toBe('stopped');
    for (const file of ['config.json', 'state.json', 'memory-ranges', 'rootfs.img', 'snapshot.json']) expect(existsSync(join(stopped.memorySnapshot!.dir, file)), file).toBe(true);
    expect(ourSlotClaims()).not.toContain(String(slotBefore));
    if (existsSync(`/run/netns/nbx-${slotBefore}`)) expect(slotOwner(slotBefore)).not.toBe(ownerId);

    // resume: memory restored (same boot), files there, clock/entropy/hostname resynced.
    const resumed = await timed('resume', () => driver.start(spec('cha')));
    expect(resumed.memoryRestored).toBe(true);
    expect(resumed.resumeReason).toBeUndefined();
    await withClient('cha', async (client) => {
      expect(await exec(client, 'cat note.txt')).toBe('kept across stop and fork');
      if (SIMULATED) {
        expect(await exec(client, 'cat .nestbox-sim/boot_id')).toBe(bootId);
        expect(await exec(client, 'tail -n 1 .nestbox-sim/resync.log')).toMatch(/--time-ms \d+ --entropy [0-9a-f]{128} --hostname cha/);
      }
    });
    // A restore is a new boot as far as keys go (the snapshot kept the old one to rekey with).
    expect(existsSync(join(stopped.memorySnapshot!.dir, 'agent.key'))).toBe(true);
    bootKeys.push(await expectProvenAgent('cha'));

    // fork of the running VM into two children restored from one snapshot.
    const fork = await timed('fork2', () => driver.fork('cha', [spec('chb'), spec('chc')]));
    expect(fork.memoryCopied).toBe(true);
    expect(fork.children.map((child) => child.status)).toEqual(['running', 'running']);
    for (const child of ['chb', 'chc']) {
      await withClient(child, async (client) => {
        expect(await exec(client, 'cat note.txt')).toBe('kept across stop and fork');
        if (SIMULATED) {
          expect(await exec(client, 'cat .nestbox-sim/boot_id')).toBe(bootId);
          expect(await exec(client, 'tail -n 1 .nestbox-sim/resync.log')).toContain(`--hostname ${child}`);
        }
        await client.writeFile('mine.txt', Readable.from([child]));
      });
    }
    // Each child has its own disk: what one wrote is not in the other, nor in the parent.
    await withClient('chb', async (client) => expect(await exec(client, 'cat mine.txt')).toBe('chb'));
    await withClient('cha', async (client) => expect(await exec(client, 'ls mine.txt 2>/dev/null || echo none')).toBe('none'));
    expect(driver.inspect('chb')!.diskDir).not.toBe(driver.inspect('chc')!.diskDir);
    expect((await driver.get('cha'))?.status).toBe('running');
    bootKeys.push(await expectProvenAgent('chb'), await expectProvenAgent('chc'));
    expect(new Set(bootKeys).size).toBe(bootKeys.length);

    // adoption: a new driver (host agent restarted) finds the running VMs and reaches them.
    const pids = ['cha', 'chb', 'chc'].map((id) => driver.inspect(id)!.pid!);
    await driver.close();
    driver = new ChDriver(driverOptions());
    await timed('adopt', () => driver.init());
    for (const [index, id] of ['cha', 'chb', 'chc'].entries()) {
      expect((await driver.get(id))?.status).toBe('running');
      expect(driver.inspect(id)!.pid).toBe(pids[index]);
    }
    await withClient('chc', async (client) => expect(await exec(client, 'cat mine.txt')).toBe('chc'));
    // The adopting driver read each VM's key back: the same keys, still proving the agents.
    expect([await expectProvenAgent('cha'), await expectProvenAgent('chb'), await expectProvenAgent('chc')]).toEqual(bootKeys.slice(1));

    // destroy leaves nothing: processes, slots, netns, files.
    const slots = ['cha', 'chb', 'chc'].map((id) => driver.inspect(id)!.slot!.index);
    await timed('destroy3', async () => {
      for (const id of ['cha', 'chb', 'chc']) await driver.destroy(id);
    });
    for (const pid of pids) expect(processStartTime(pid)).toBeUndefined();
    // Slots are machine-wide: another host agent on this machine may already have reused one.
    for (const index of slots) if (existsSync(`/run/netns/nbx-${index}`)) expect(slotOwner(index)).not.toBe(ownerId);
    expect(ourSlotClaims()).toEqual([]);
    expect(readdirSync(join(root, 'data', 'sandboxes'))).toEqual([]);
    await driver.destroy('cha'); // idempotent
    process.stderr.write(`[ch e2e] timings (ms): ${JSON.stringify(timings)}\n`);
  });

  it.skipIf(!SIMULATED)('a CH 500 on pause leaves an error state with the chain; a retry recovers; a failed restore boots cold with a reason', async () => {
    await driver.create({ id: 'chfp', image: 'default', cpu: 1, memoryMiB: 128, env: {} });
    setFaults({ chfp: { failOn: ['vm.pause'] } });
    const error = await driver.pause('chfp').catch((caught: unknown) => caught as Error);
    expect(error).toBeInstanceOf(Error);
    const record = driver.inspect('chfp')!;
    expect(record.status).toBe('error');
    expect(record.lastError?.chain).toEqual(['Error from API', 'The VM could not be handled (vm.pause)', 'Injected failure: simulated internal error']);
    expect(record.lastError?.observedState).toBe('Running');
    expect((await driver.get('chfp'))?.status).toBe('running');
    setFaults({});
    expect((await driver.pause('chfp')).status).toBe('paused');
    expect(driver.inspect('chfp')!.lastError).toBeUndefined();
    // A restore that fails falls back to a cold boot and says why.
    expect(await driver.stop('chfp')).toEqual({ memorySaved: true });
    setFaults({ chfp: { failOn: ['vm.restore'] } });
    const started = await driver.start({ id: 'chfp', image: 'default', cpu: 1, memoryMiB: 128, env: {} });
    setFaults({});
    expect(started.memoryRestored).toBe(false);
    expect(started.resumeReason).toBe('restore_failed: Injected failure: simulated internal error');
    expect(driver.inspect('chfp')!.memorySnapshot).toBeUndefined();
    await driver.destroy('chfp');
  });

  it.skipIf(!SIMULATED)('a guest agent that never answers fails the create and leaves nothing behind', async () => {
    setFaults({ chnr: { agentNeverReady: true } });
    await expect(driver.create({ id: 'chnr', image: 'default', cpu: 1, memoryMiB: 128, env: {} })).rejects.toThrow(/guest agent did not answer/);
    setFaults({});
    expect(await driver.get('chnr')).toBeUndefined();
    expect(existsSync(join(root, 'data', 'sandboxes', 'chnr'))).toBe(false);
    expect(ourSlotClaims()).toEqual([]);
  });

  it.skipIf(!SIMULATED)('a crashed VMM is detected: during a call, and by the watcher; the sandbox restarts cold', async () => {
    await driver.create({ id: chCrash, image: 'default', cpu: 1, memoryMiB: 128, env: {} });
    setFaults({ [chCrash]: { crashOn: 'vm.pause' } });
    await expect(driver.pause(chCrash)).rejects.toThrow();
    setFaults({});
    expect(driver.inspect(chCrash)!.status).toBe('stopped');
    expect(ourSlotClaims()).toEqual([]);
    const restarted = await driver.start({ id: chCrash, image: 'default', cpu: 1, memoryMiB: 128, env: {} });
    expect(restarted.memoryRestored).toBe(false);
    expect(restarted.resumeReason).toBe('stopped_without_memory_snapshot');
    // kill -9 from outside: the watcher's check finds it and releases the runtime.
    process.kill(driver.inspect(chCrash)!.pid!, 'SIGKILL');
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(await driver.checkAlive(chCrash)).toBe(false);
    expect(driver.inspect(chCrash)!.lastError?.chain[0]).toBe('cloud-hypervisor exited unexpectedly');
    expect((await driver.get(chCrash))?.status).toBe('stopped');
    await driver.destroy(chCrash);
    expect(ourSlotClaims()).toEqual([]);
  });
});

const chCrash = 'chcr';
