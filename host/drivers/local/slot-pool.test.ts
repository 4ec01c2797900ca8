// The slot pool against the real kernel: creates take pre-built slots, stopped sandboxes' slots
// come back scrubbed (no processes, no egress rules, no conntrack state), a restarted host agent
// reclaims its pool and its crash leftovers, and another owner's slots are never touched.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver, type LocalDriverOptions } from './driver.js';
import { SlotAllocator, buildSlot, slotFor } from '../../network/slots.js';
import { applyNftRuleset, listSlotChain, listSlotNftObjects, renderSlotEgress, renderSlotSourceCheck } from '../../network/nft.js';
import { readRecord } from './records.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const isRoot = process.getuid?.() === 0;
const SLOTS_DIR = '/run/nestbox/slots';

const uniqueId = (prefix: string) => `${prefix}${randomBytes(4).toString('hex')}`;
const spec = (id: string) => ({ id, image: 'default', cpu: 1, memoryMiB: 256, env: {} });

function claimsOf(owner: string): { index: number; sandboxId: string; pooled?: boolean }[] {
  const out: { index: number; sandboxId: string; pooled?: boolean }[] = [];
  for (const name of existsSync(SLOTS_DIR) ? execFileSync('ls', [SLOTS_DIR], { encoding: 'utf8' }).split('\n') : []) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const claim = JSON.parse(readFileSync(join(SLOTS_DIR, name), 'utf8'));
      if (claim.owner === owner) out.push({ index: Number(name), sandboxId: claim.sandboxId, pooled: claim.pooled });
    } catch {
      // being rewritten
    }
  }
  return out.sort((a, b) => a.index - b.index);
}

const netnsExists = (index: number) => existsSync(`/run/netns/nbx-${index}`);

/** Indices anyone on the machine claims right now. */
function claimedIndices(): Set<number> {
  return new Set(readdirSync(SLOTS_DIR).filter((name) => /^\d+$/.test(name)).map(Number));
}

/**
 * Of `indices`, those that still have per-slot nft objects although nobody claims them (the
 * table is listed first: an index claimed after that is someone's and skipped).
 */
async function leakedIndices(indices: Iterable<number>): Promise<number[]> {
  const objects = await listSlotNftObjects('nbxv');
  const claimed = claimedIndices();
  return [...indices].filter((index) => objects.has(index) && !claimed.has(index));
}

function conntrackFor(address: string): string {
  try {
    return execFileSync('conntrack', ['-L', '-d', address], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  } catch {
    return '';
  }
}

async function sh(socket: string, cmd: string): Promise<string> {
  const client = new AgentClient(socket);
  try {
    return (await client.exec({ cmd, timeoutMs: 20_000 })).stdout;
  } finally {
    client.close();
  }
}

describe.skipIf(!isRoot)('slot pool (real kernel)', () => {
  const dataDir = mkdtempSync('/tmp/nbxp-');
  const otherDataDir = mkdtempSync('/tmp/nbxq-');
  const ownerId = uniqueId('pool');
  const otherOwner = uniqueId('other');
  const drivers: LocalDriver[] = [];

  function newDriver(extra: Partial<LocalDriverOptions> = {}): LocalDriver {
    const driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, watchIntervalMs: 500, slotPoolSize: 2, ...extra });
    drivers.push(driver);
    return driver;
  }

  afterAll(async () => {
    for (const driver of drivers) await driver.close().catch(() => {});
    // Whatever a test left (a "crashed" driver's pool), the owners' last drivers clean up.
    for (const [dir, owner] of [[dataDir, ownerId], [otherDataDir, otherOwner]] as const) {
      const cleaner = new LocalDriver({ dataDir: dir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId: owner, slotPoolSize: 0 });
      await cleaner.init().catch(() => {});
      for (const runtime of await cleaner.list()) await cleaner.destroy(runtime.id).catch(() => {});
      await cleaner.close();
      expect(claimsOf(owner)).toEqual([]);
    }
    const cgroups = await Cgroups.detect();
    for (const owner of [ownerId, otherOwner]) await cgroups.remove(cgroups.groupFor(`nestbox/${owner}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
    rmSync(otherDataDir, { recursive: true, force: true });
  }, 120_000);

  it('hands a pre-built slot to a create, scrubs it on stop and takes the idle ones apart on close', async () => {
    const driver = newDriver();
    await driver.init();
    const warm = await driver.waitForSlotPool();
    expect(warm.idle).toBe(2);
    const pooled = claimsOf(ownerId);
    expect(pooled).toHaveLength(2);
    expect(pooled.every((claim) => claim.pooled && claim.sandboxId === '' && netnsExists(claim.index))).toBe(true);

    const id = uniqueId('pl');
    const runtime = await driver.create(spec(id));
    const record = await readRecord(join(dataDir, 'sandboxes', id));
    const index = record!.slot!.index;
    expect(pooled.map((claim) => claim.index)).toContain(index);
    expect(driver.slotPoolStats()).toMatchObject({ hits: 1, misses: 0 });
    expect(claimsOf(ownerId).find((claim) => claim.index === index)).toMatchObject({ sandboxId: id });

    // Leave state behind: a deny-all policy in the slot's chain and a tracked connection from the host.
    await driver.setEgress(id, { mode: 'deny-all' });
    expect(await listSlotChain(index)).toContain('drop');
    await sh(runtime.agentSocket!, 'setsid python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null & sleep 0.5');
    const address = runtime.network!.sandboxAddress;
    await new Promise<void>((resolveConnect, reject) => {
      const socket = connect({ host: address, port: 8080, timeout: 3_000 }, () => {
        socket.end('GET / HTTP/1.0\r\n\r\n');
      });
      socket.on('close', () => resolveConnect());
      socket.on('error', reject);
      socket.resume();
    });
    expect(conntrackFor(address)).toContain(`dst=${address}`);

    // Room in the pool (without building more), so the stopped sandbox's slot is kept, not taken apart.
    await driver.waitForSlotPool();
    await driver.resizeSlotPool(3, false);
    await driver.stop(id);
    // Back in the pool, same namespace, emptied.
    const after = claimsOf(ownerId).find((claim) => claim.index === index);
    expect(after).toMatchObject({ sandboxId: '', pooled: true });
    expect(netnsExists(index)).toBe(true);
    expect(execFileSync('ip', ['netns', 'pids', `nbx-${index}`], { encoding: 'utf8' }).trim()).toBe('');
    expect(await listSlotChain(index)).not.toContain('drop');
    expect(conntrackFor(address)).not.toContain(`dst=${address}`);
    expect(driver.slotPoolStats().recycled).toBeGreaterThanOrEqual(1);

    // The next create gets a recycled slot and no rule of the previous sandbox.
    const second = uniqueId('pl');
    const secondRuntime = await driver.create(spec(second));
    expect(driver.slotPoolStats().misses).toBe(0);
    expect(await sh(secondRuntime.agentSocket!, 'ip -o -4 addr show eth0 | wc -l')).toBe('1\n');
    await driver.destroy(second);
    await driver.destroy(id);

    const idle = driver.slotPoolStats().idle;
    expect(idle).toBe(3);
    const indices = claimsOf(ownerId).map((claim) => claim.index);
    await driver.close();
    expect(claimsOf(ownerId)).toEqual([]);
    for (const i of indices) expect(netnsExists(i)).toBe(false);
    // Taken apart for good: their chains, sets and map elements went with them.
    expect(await leakedIndices(indices)).toEqual([]);
  }, 120_000);

  it('keeps the nft table bounded by live and pooled slots while sandboxes come and go', async () => {
    const driver = newDriver({ slotPoolSize: 1 });
    await driver.init();
    await driver.waitForSlotPool();
    const used = new Set<number>();
    // Three at once, beyond the pool of one, twice: slots are built on demand and taken apart.
    for (let round = 0; round < 2; round++) {
      const ids = [uniqueId('nl'), uniqueId('nl'), uniqueId('nl')];
      for (const id of ids) {
        await driver.create(spec(id));
        used.add((await readRecord(join(dataDir, 'sandboxes', id)))!.slot!.index);
      }
      const objects = await listSlotNftObjects('nbxv');
      for (const claim of claimsOf(ownerId)) expect(objects.get(claim.index), `slot ${claim.index}`).toMatchObject({ chain: true, allowSet: true, egressElement: true, ifaceElement: true });
      for (const id of ids) await driver.destroy(id);
      await driver.waitForSlotPool();
      expect(await leakedIndices(used)).toEqual([]);
      // What is left of ours is the pool, and each of its slots has its objects.
      const pooled = claimsOf(ownerId);
      expect(pooled.length).toBeLessThanOrEqual(1);
      const after = await listSlotNftObjects('nbxv');
      for (const claim of pooled) expect(after.has(claim.index)).toBe(true);
    }
    expect(used.size).toBeGreaterThan(1);
    await driver.close();
    expect(await leakedIndices(used)).toEqual([]);
  }, 180_000);

  it('removes the nft objects of indices nobody claims when a host agent starts', async () => {
    // A leftover far above the indices in use (allocation takes the lowest free one), as a
    // crashed or older host agent leaves it: chain with a policy, allow set, all elements.
    const capacity = 32768;
    const claimed = claimedIndices();
    let index = capacity - 1 - Math.floor(Math.random() * 500);
    while (claimed.has(index)) index--;
    const slot = slotFor('10.200.0.0/16', index);
    await applyNftRuleset(renderSlotEgress(index, 'nbxv', { mode: 'allow-list', addresses: ['198.51.100.9'] }) + renderSlotSourceCheck(slot));
    expect((await listSlotNftObjects('nbxv')).get(index)).toMatchObject({ chain: true, allowSet: true, egressElement: true, ifaceElement: true, sourceAddresses: [slot.sandboxAddress] });

    const driver = newDriver({ slotPoolSize: 1 });
    await driver.init();
    expect((await listSlotNftObjects('nbxv')).has(index)).toBe(false);
    expect(existsSync(join(SLOTS_DIR, String(index)))).toBe(false); // the cleaner's own claim is gone too
    await driver.waitForSlotPool();
    const pooled = claimsOf(ownerId);
    const objects = await listSlotNftObjects('nbxv');
    for (const claim of pooled) expect(objects.has(claim.index)).toBe(true);
    await driver.close();
  }, 120_000);

  it('reclaims its pool and crash leftovers at start, and never touches another owner', async () => {
    const other = new LocalDriver({ dataDir: otherDataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId: otherOwner, slotPoolSize: 1 });
    drivers.push(other);
    await other.init();
    await other.waitForSlotPool();
    const othersBefore = claimsOf(otherOwner);
    expect(othersBefore).toHaveLength(1);

    // Not in `drivers`: it "crashes", so nothing may close it later (its slots become the next run's).
    // Without LXCFS: a dropped driver's supervisor would keep running in this process and start
    // the daemon again on the data dir after the others stopped it (a real crash ends it).
    const crashed = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 2, lxcfs: false });
    await crashed.init();
    await crashed.waitForSlotPool();
    const poolIndices = claimsOf(ownerId).map((claim) => claim.index);
    // A crash leftover: a slot claimed for a sandbox that no longer exists.
    const leftover = await new SlotAllocator('10.200.0.0/16').claim(ownerId, 'ghostsandbox');
    await buildSlot(leftover);
    // "Crash": the driver is dropped without close(), its pool stays claimed on the machine.

    const restarted = newDriver({ slotPoolSize: 3 });
    await restarted.init();
    const reclaimed = claimsOf(ownerId);
    // The pooled slots come back as they were and the leftover is scrubbed into the pool:
    // nothing is built, nothing is lost.
    expect(reclaimed.map((claim) => claim.index)).toEqual([...poolIndices, leftover.index].sort((a, b) => a - b));
    expect(reclaimed.every((claim) => claim.pooled && claim.sandboxId === '' && netnsExists(claim.index))).toBe(true);
    expect(restarted.slotPoolStats()).toMatchObject({ idle: 3, misses: 0, tornDown: 0 });

    expect(claimsOf(otherOwner)).toEqual(othersBefore);
    expect(netnsExists(othersBefore[0].index)).toBe(true);
    await restarted.close();
    await other.close();
    expect(claimsOf(otherOwner)).toEqual([]);
  }, 120_000);

  it('builds on demand when the pool is empty (size 0) and takes the slot apart afterwards', async () => {
    const driver = newDriver({ slotPoolSize: 0 });
    await driver.init();
    const id = uniqueId('pz');
    await driver.create(spec(id));
    const index = (await readRecord(join(dataDir, 'sandboxes', id)))!.slot!.index;
    expect(driver.slotPoolStats()).toMatchObject({ size: 0, hits: 0, misses: 1 });
    await driver.destroy(id);
    expect(netnsExists(index)).toBe(false);
    expect(claimsOf(ownerId)).toEqual([]);
    await driver.close();
  }, 60_000);
});
