// Network slots: one network namespace per running sandbox, wired to the host by a veth pair
// with a /31 carved from the sandbox subnet (host-runtime.md §6). Slot indices are allocated
// machine-wide with O_EXCL files under /run/nestbox/slots/, so host agents running side by side
// never hand out the same namespace or addresses; each file names its owner and sandbox.
//
// A host agent may run in a network namespace of its own (one per "machine" on a shared box, or
// systemd's NetworkNamespacePath=): the slot veths, routes, sysctls, nft table and conntrack
// entries are then all in that namespace, since every `ip`/`nft`/`conntrack` call and every
// /proc/sys/net write acts on the caller's namespace. Only two things are machine-wide and must
// stay so: the claim files (one index space per machine, so slot namespace names never collide)
// and /run/netns (the namespaces must outlive the agent and be visible to its restart).
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, open, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runCommand } from '../util/run.js';

export const SLOTS_DIR = '/run/nestbox/slots';
export const NETNS_PREFIX = 'nbx-';
/** Where `ip netns` keeps named namespaces (bind mounts of their nsfs files). */
const NETNS_DIR = '/run/netns';
export const VETH_PREFIX = 'nbxv';

export interface Slot {
  index: number;
  /** Network namespace name (`/run/netns/<netns>`). */
  netns: string;
  /** Host end of the veth pair. */
  hostInterface: string;
  hostAddress: string;
  sandboxAddress: string;
}

export interface SlotClaim {
  index: number;
  owner: string;
  /** The sandbox holding the slot; empty while it waits in its owner's pool. */
  sandboxId: string;
  /** Built and scrubbed, waiting in the owner's pool for the next sandbox. */
  pooled?: boolean;
  createdAt: string;
}

// ---- addresses ------------------------------------------------------------------------------

export function parseIpv4Cidr(cidr: string): { base: number; prefix: number } {
  const match = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/.exec(cidr);
  if (!match) throw new Error(`invalid IPv4 CIDR: ${cidr}`);
  const octets = match.slice(1, 5).map(Number);
  const prefix = Number(match[5]);
  if (octets.some((octet) => octet > 255) || prefix > 32) throw new Error(`invalid IPv4 CIDR: ${cidr}`);
  const address = octets.reduce((acc, octet) => acc * 256 + octet, 0);
  const size = 2 ** (32 - prefix);
  return { base: address - (address % size), prefix };
}

function formatIpv4(value: number): string {
  return [24, 16, 8, 0].map((shift) => Math.floor(value / 2 ** shift) % 256).join('.');
}

/** `1.2.3.4` → `1.2.3.4`, `1.2.3.4/24` → `1.2.3.0/24` (nft wants the network address); throws on garbage. */
export function canonicalIpv4(entry: string): string {
  const withPrefix = entry.includes('/') ? entry : `${entry}/32`;
  const { base, prefix } = parseIpv4Cidr(withPrefix);
  return prefix === 32 ? formatIpv4(base) : `${formatIpv4(base)}/${prefix}`;
}

/** How many /31 slots fit in the subnet. */
export function slotCapacity(subnet: string): number {
  return 2 ** (32 - parseIpv4Cidr(subnet).prefix) / 2;
}

/** Slot i owns the i-th /31: `.0`-side for the sandbox, `.1`-side for the host. */
export function slotFor(subnet: string, index: number): Slot {
  if (!Number.isInteger(index) || index < 0 || index >= slotCapacity(subnet)) throw new Error(`slot ${index} is outside ${subnet}`);
  const { base } = parseIpv4Cidr(subnet);
  return {
    index,
    netns: `${NETNS_PREFIX}${index}`,
    hostInterface: `${VETH_PREFIX}${index}`,
    sandboxAddress: formatIpv4(base + 2 * index),
    hostAddress: formatIpv4(base + 2 * index + 1),
  };
}

// ---- allocation -----------------------------------------------------------------------------

export class SlotAllocator {
  constructor(
    private readonly subnet: string,
    private readonly slotsDir = SLOTS_DIR,
  ) {}

  /**
   * Claims the lowest free index with an O_EXCL file; a racing agent simply gets EEXIST.
   * `sandboxId` empty = a slot built ahead for the owner's pool.
   */
  async claim(owner: string, sandboxId: string): Promise<Slot> {
    await mkdir(this.slotsDir, { recursive: true, mode: 0o755 });
    const taken = new Set((await this.claims()).map((claim) => claim.index));
    const capacity = slotCapacity(this.subnet);
    for (let index = 0; index < capacity; index++) {
      if (taken.has(index)) continue;
      const claim: SlotClaim = { index, owner, sandboxId, ...(sandboxId ? {} : { pooled: true }), createdAt: new Date().toISOString() };
      try {
        const handle = await open(this.claimPath(index), 'wx', 0o644);
        await handle.writeFile(`${JSON.stringify(claim)}\n`);
        await handle.close();
        return slotFor(this.subnet, index);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      }
    }
    throw new Error(`no free network slot in ${this.subnet} (${capacity} slots, see ${this.slotsDir})`);
  }

  /**
   * Claims one given index if nobody holds it (O_EXCL, like `claim`): a host agent cleaning up
   * an index's leftovers holds it meanwhile, so nobody builds on it while they are removed.
   */
  async claimIndex(index: number, owner: string): Promise<boolean> {
    if (!Number.isInteger(index) || index < 0 || index >= slotCapacity(this.subnet)) return false;
    await mkdir(this.slotsDir, { recursive: true, mode: 0o755 });
    const claim: SlotClaim = { index, owner, sandboxId: '', pooled: true, createdAt: new Date().toISOString() };
    try {
      const handle = await open(this.claimPath(index), 'wx', 0o644);
      await handle.writeFile(`${JSON.stringify(claim)}\n`);
      await handle.close();
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false;
      throw error;
    }
  }

  async claims(): Promise<SlotClaim[]> {
    const names = await readdir(this.slotsDir).catch(() => [] as string[]);
    const claims: SlotClaim[] = [];
    for (const name of names) {
      if (!/^\d+$/.test(name)) continue;
      try {
        claims.push({ ...(JSON.parse(await readFile(join(this.slotsDir, name), 'utf8')) as SlotClaim), index: Number(name) });
      } catch {
        // A claim being written right now (or torn by a crash): count it as taken, owner unknown.
        claims.push({ index: Number(name), owner: '', sandboxId: '', createdAt: '' });
      }
    }
    return claims;
  }

  /**
   * Hands a claimed slot to a sandbox (or back to the pool with `sandboxId` empty). Temp file +
   * rename, so a crash leaves the old or the new claim, never a torn one that nobody owns.
   */
  async reassign(index: number, owner: string, sandboxId: string): Promise<void> {
    const claim: SlotClaim = { index, owner, sandboxId, ...(sandboxId ? {} : { pooled: true }), createdAt: new Date().toISOString() };
    const temp = join(this.slotsDir, `.${index}.tmp-${process.pid}`);
    await writeFile(temp, `${JSON.stringify(claim)}\n`, { mode: 0o644 });
    await rename(temp, this.claimPath(index));
  }

  async release(index: number): Promise<void> {
    await rm(this.claimPath(index), { force: true });
  }

  /**
   * The slots a sandbox holds: those our claim files give it, and the one its record names when
   * nobody claims that index (a crash between teardown and record write can leave either).
   * `claimed: false` ones are only to be taken apart, never claimed again by us: an index
   * someone else claimed (or that went back to our pool) after the sandbox let it go is theirs.
   */
  async heldBy(owner: string, sandboxId: string, recorded: { index: number } | undefined): Promise<{ slot: Slot; claimed: boolean }[]> {
    const found = new Map<number, boolean>();
    const claims = await this.claims();
    for (const claim of claims) if (claim.owner === owner && claim.sandboxId === sandboxId) found.set(claim.index, true);
    if (recorded && !found.has(recorded.index) && !claims.some((claim) => claim.index === recorded.index)) found.set(recorded.index, false);
    return [...found].map(([index, claimed]) => ({ slot: slotFor(this.subnet, index), claimed }));
  }

  slot(index: number): Slot {
    return slotFor(this.subnet, index);
  }

  private claimPath(index: number): string {
    return join(this.slotsDir, String(index));
  }
}

// ---- wiring ---------------------------------------------------------------------------------

const run = (file: string, args: string[], input?: string) => runCommand(file, args, { timeoutMs: 15_000, input });


/**
 * Traffic counters of every network device in this process's namespace, by name. Read from
 * /proc/self/net/dev, not /sys/class/net: sysfs shows the devices of the namespace it was
 * mounted from (the machine's root one, unless something remounted it), so a host agent that
 * joined a namespace of its own (`nsenter --net=`) would see none of its slot veths there.
 */
export async function namespaceDevices(): Promise<Map<string, { rxBytes: number; txBytes: number }>> {
  return parseNetDev(await readFile('/proc/self/net/dev', 'utf8'));
}

/** `/proc/net/dev` → device → bytes received and sent (two header lines, then `name: 16 counters`). */
export function parseNetDev(text: string): Map<string, { rxBytes: number; txBytes: number }> {
  const devices = new Map<string, { rxBytes: number; txBytes: number }>();
  for (const line of text.split('\n')) {
    const match = /^\s*([^\s:]+):\s*(.*)$/.exec(line);
    if (!match) continue;
    const fields = match[2].trim().split(/\s+/).map(Number);
    // Receive: bytes packets errs drop fifo frame compressed multicast; transmit starts at 8.
    if (fields.length < 9 || !fields.every(Number.isFinite)) continue;
    devices.set(match[1], { rxBytes: fields[0], txBytes: fields[8] });
  }
  return devices;
}

export async function slotExists(slot: Slot): Promise<{ netns: boolean; veth: boolean }> {
  return {
    netns: existsSync(`${NETNS_DIR}/${slot.netns}`),
    veth: (await namespaceDevices()).has(slot.hostInterface),
  };
}

/**
 * Refuses to build slots where their namespaces would not be the machine's: `ip netns exec`
 * gives the process a mount namespace of its own in which /run/netns is a slave (and /sys a
 * fresh sysfs without /sys/fs/cgroup), so a namespace this host agent creates is mounted for it
 * alone: invisible to `ip netns` elsewhere, and gone for its next run, which could then neither
 * adopt nor clean up its sandboxes. `nsenter --net=` and NetworkNamespacePath= join only the
 * network namespace and keep the machine's mounts. `mountinfo` defaults to this process's.
 */
export function assertMachineNetnsMounts(mountinfo = readFileSyncSafe('/proc/self/mountinfo')): void {
  // Fields: id parent major:minor root mount-point options [optional tags…] - type source …
  const netnsMounts = mountinfo.split('\n').map((line) => line.split(' ')).filter((fields) => fields[4] === NETNS_DIR);
  const top = netnsMounts.at(-1);
  if (!top) return; // not a mount point yet: the first `ip netns add` makes it a shared one
  const tags = top.slice(6, top.indexOf('-'));
  if (tags.some((tag) => tag.startsWith('shared:'))) return;
  throw new Error(
    `${NETNS_DIR} is not shared with the machine's mount namespace (propagation: ${tags.join(' ') || 'private'}): network namespaces this host agent ` +
      'creates for sandboxes would exist for it alone and be lost to its next start. Was it started with `ip netns exec`? ' +
      'To run a host agent in a network namespace of its own, join only that namespace: `nsenter --net=/run/netns/<name> nestbox host-agent`, or NetworkNamespacePath= in its systemd unit.',
  );
}

function readFileSyncSafe(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/**
 * Creates the namespace and veth pair with two `ip -batch` calls (the `-n` form is refused
 * inside a batch file, hence one batch per namespace).
 */
export async function buildSlot(slot: Slot): Promise<void> {
  const leftovers = await slotExists(slot);
  // Our claim file is fresh, so anything still wired to this index is a crash leftover.
  if (leftovers.netns || leftovers.veth) await teardownSlot(slot);
  await run('ip', ['-batch', '-'], [
    `netns add ${slot.netns}`,
    `link add ${slot.hostInterface} type veth peer name eth0 netns ${slot.netns}`,
    `addr add ${slot.hostAddress}/31 dev ${slot.hostInterface}`,
    `link set ${slot.hostInterface} up`,
    '',
  ].join('\n'));
  await run('ip', ['-n', slot.netns, '-batch', '-'], [
    'link set lo up',
    `addr add ${slot.sandboxAddress}/31 dev eth0`,
    'link set eth0 up',
    `route add default via ${slot.hostAddress}`,
    '',
  ].join('\n'));
  await hardenHostInterface(slot.hostInterface);
}

/**
 * Kernel-side checks on the host end of a slot's veth, under the nft source check: strict
 * reverse-path filtering (a packet whose source is not routed back through this veth is
 * dropped; the kernel uses the larger of `all` and the interface's value, so 1 here is strict
 * unless the host asked for loose everywhere) and no IPv6 at all (no link-local address, no
 * neighbour discovery, every IPv6 packet from the slot is discarded on arrival).
 */
async function hardenHostInterface(hostInterface: string): Promise<void> {
  await writeFile(`/proc/sys/net/ipv4/conf/${hostInterface}/rp_filter`, '1');
  await writeFile(`/proc/sys/net/ipv6/conf/${hostInterface}/disable_ipv6`, '1').catch((error: NodeJS.ErrnoException) => {
    // A host booted with ipv6.disable=1 has no IPv6 sysctls: there is no IPv6 to refuse.
    if (error.code !== 'ENOENT') throw error;
  });
}

/**
 * Removes the veth pair and the namespace. The host end is deleted explicitly because a
 * namespace still pinned by a process would otherwise keep the pair alive.
 */
export async function teardownSlot(slot: Slot): Promise<void> {
  const present = await slotExists(slot);
  const commands: string[] = [];
  if (present.veth) commands.push(`link del ${slot.hostInterface}`);
  if (present.netns) commands.push(`netns del ${slot.netns}`);
  if (commands.length) await run('ip', ['-force', '-batch', '-'], `${commands.join('\n')}\n`).catch(() => {});
  const after = await slotExists(slot);
  if (after.netns || after.veth) throw new Error(`could not remove network slot ${slot.index} (netns ${after.netns}, veth ${after.veth})`);
  // A later sandbox on this slot must not inherit NAT/established state of this one.
  await flushSlotConntrack(slot);
}

/**
 * Bytes through the slot's veth as the sandbox sees them: what the host end sent is what the
 * sandbox received, and the other way round. Undefined when the interface is gone.
 */
export async function slotTrafficBytes(slot: Pick<Slot, 'hostInterface'>): Promise<{ rxBytes: number; txBytes: number } | undefined> {
  const host = (await namespaceDevices().catch(() => undefined))?.get(slot.hostInterface);
  if (!host) return undefined;
  return { rxBytes: host.txBytes, txBytes: host.rxBytes };
}

/** Processes still inside the slot's namespace (a recycled slot must have none). */
export async function netnsPids(slot: Slot): Promise<number[]> {
  const stdout = await run('ip', ['netns', 'pids', slot.netns]);
  return stdout.split('\n').filter((line) => /^\d+$/.test(line.trim())).map(Number);
}

/**
 * Forgets the kernel's connection state of the slot's address, both directions (NAT entries of
 * its outbound connections, the proxy's connections to it), so the next sandbox on the slot
 * inherits none of it. `conntrack -D` exits 1 when nothing matched: not an error here.
 */
export async function flushSlotConntrack(slot: Slot): Promise<void> {
  for (const direction of ['-s', '-d']) await run('conntrack', ['-D', direction, slot.sandboxAddress]).catch(() => {});
}

export async function enableIpForwarding(): Promise<void> {
  const path = '/proc/sys/net/ipv4/ip_forward';
  if ((await readFile(path, 'utf8')).trim() !== '1') await writeFile(path, '1');
}
