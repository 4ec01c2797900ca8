// The host nftables table that isolates sandboxes. One table (`inet nestbox`) shared by every
// host agent on the machine. Applies are never destructive: the base chains and sets are
// created if missing and flushed-and-refilled inside one `nft -f` transaction, so two host
// agents starting side by side (tests do) never wipe each other's per-slot egress chains, and
// rules never half-exist.
//
// Per-slot egress: the forward chain jumps through a verdict map keyed by the slot's host veth
// (`iifname vmap @egress`) into `slot_<i>`, a chain that either does nothing (allow all), drops
// (deny all) or returns for the slot's allowed addresses and drops the rest (allow list). A deny
// list (`deny4_<i>`) drops before any allow is looked at, so deny wins over allow. The isolation
// rules come after the jump, so a `return` never lets a sandbox reach what isolation forbids
// (host, other slots, private and link-local ranges).
//
// Source check (anti-spoofing): a `prerouting` chain at raw priority, so before connection
// tracking and NAT ever see the packet, drops from every slot veth
//   - all IPv6 (slots have none; nothing IPv6 may leave a slot),
//   - every IPv4 packet whose source is not routed back through the veth it came in on (strict
//     reverse-path check with `fib`: covers every slot, also ones an older host agent built),
//   - every IPv4 packet whose source is not exactly the slot's address (`slot_src4`, one
//     `veth . address` element per slot, checked for the veths listed in `slot_ifaces`).
// So a sandbox can neither pose as another sandbox (replies to that flow would land in it) nor
// send packets with an outside address. Root inside a sandbox has no CAP_NET_ADMIN on its
// namespace, so it cannot add addresses, but a raw socket can forge any source: hence the host
// side check.
//
// Per-slot objects (chain `slot_<i>`, sets `allow4_<i>` and `deny4_<i>`, the `egress`, `slot_ifaces` and
// `slot_src4` elements) live as long as the slot: built with it, emptied when it is scrubbed back
// into a pool, deleted when it is taken apart (`renderSlotRemoval`), and a starting host agent
// deletes those of indices nobody claims any more (a crash's leftovers).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { parseIpv4Cidr } from './slots.js';

const execFileAsync = promisify(execFile);

export const NFT_TABLE = 'nestbox';
const SLOT_IFACES_SET = 'slot_ifaces';
const SLOT_SOURCES_SET = 'slot_src4';
/** Comments of the source-check rules (tests and diagnostics read their counters by them). */
export const SPOOF_RULE_COMMENTS = {
  ipv6: 'nestbox: no IPv6 from slots',
  reversePath: 'nestbox: source not routed via this slot',
  slotAddress: 'nestbox: source is not the slot address',
} as const;

/** Address ranges a sandbox must never reach: LAN, CGNAT, loopback, link-local (cloud metadata). */
export const BLOCKED_IPV4_RANGES = ['0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12', '192.168.0.0/16', '224.0.0.0/4', '240.0.0.0/4'];

export interface NftRulesetOptions {
  /** The sandbox subnet (all slots), masqueraded towards the outside. */
  subnet: string;
  /** Host interface name prefix of the veth ends (`nbxv`). */
  vethPrefix: string;
  /**
   * Resolvers sandboxes may reach on port 53 even though they sit in a blocked range (a cloud
   * VM's resolver usually has a private address). Only forwarded traffic: never the host itself.
   */
  dnsServers: string[];
}

function assertVethPrefix(prefix: string): void {
  if (!/^[a-z0-9]{1,8}$/.test(prefix)) throw new Error(`invalid veth prefix ${prefix}`);
}

/** Host addresses and CIDRs only: nothing else may reach the nft file. */
export function assertIpv4Element(element: string): void {
  parseIpv4Cidr(element.includes('/') ? element : `${element}/32`);
}

export function renderNftRuleset(options: NftRulesetOptions): string {
  parseIpv4Cidr(options.subnet); // throws on garbage before it reaches nft
  assertVethPrefix(options.vethPrefix);
  for (const server of options.dnsServers) assertIpv4Element(server);
  const t = `inet ${NFT_TABLE}`;
  const veth = `"${options.vethPrefix}*"`;
  const lines = [
    `add table ${t}`,
    `add set ${t} blocked4 { type ipv4_addr; flags interval; }`,
    `flush set ${t} blocked4`,
    `add element ${t} blocked4 { ${BLOCKED_IPV4_RANGES.join(', ')} }`,
    `add set ${t} dns4 { type ipv4_addr; }`,
    `flush set ${t} dns4`,
    ...(options.dnsServers.length ? [`add element ${t} dns4 { ${options.dnsServers.join(', ')} }`] : []),
    // Slot veth → its egress chain. Elements belong to the slots' owners and survive re-applies.
    `add map ${t} egress { type ifname : verdict; }`,
    // Slot veth → the one source address it may send from. Elements belong to the slots' owners.
    `add set ${t} ${SLOT_IFACES_SET} { type ifname; }`,
    `add set ${t} ${SLOT_SOURCES_SET} { type ifname . ipv4_addr; }`,
    `add chain ${t} prerouting { type filter hook prerouting priority raw; policy accept; }`,
    `flush chain ${t} prerouting`,
    `add rule ${t} prerouting iifname ${veth} meta nfproto ipv6 counter drop comment "${SPOOF_RULE_COMMENTS.ipv6}"`,
    `add rule ${t} prerouting iifname ${veth} fib saddr . iif oif missing counter drop comment "${SPOOF_RULE_COMMENTS.reversePath}"`,
    `add rule ${t} prerouting iifname @${SLOT_IFACES_SET} iifname . ip saddr != @${SLOT_SOURCES_SET} counter drop comment "${SPOOF_RULE_COMMENTS.slotAddress}"`,
    `add chain ${t} input { type filter hook input priority 0; policy accept; }`,
    `flush chain ${t} input`,
    // No host service (control plane, host agent, database, sshd) is reachable from a sandbox;
    // only answers to connections the host opened get through (the hosted-port proxy).
    `add rule ${t} input iifname ${veth} ct state established,related accept`,
    `add rule ${t} input iifname ${veth} drop`,
    `add chain ${t} forward { type filter hook forward priority 0; policy accept; }`,
    `flush chain ${t} forward`,
    `add rule ${t} forward oifname ${veth} ct state established,related accept`,
    `add rule ${t} forward iifname ${veth} oifname ${veth} drop`,
    // The sandbox's own egress policy first: it can only narrow what follows, never widen it.
    `add rule ${t} forward iifname vmap @egress`,
    `add rule ${t} forward iifname ${veth} ip daddr @dns4 udp dport 53 accept`,
    `add rule ${t} forward iifname ${veth} ip daddr @dns4 tcp dport 53 accept`,
    `add rule ${t} forward iifname ${veth} ip daddr @blocked4 drop`,
    // Slots have no IPv6 addresses; refuse anything that tries.
    `add rule ${t} forward iifname ${veth} meta nfproto ipv6 drop`,
    `add chain ${t} postrouting { type nat hook postrouting priority srcnat; policy accept; }`,
    `flush chain ${t} postrouting`,
    `add rule ${t} postrouting ip saddr ${options.subnet} oifname != ${veth} masquerade`,
  ];
  return `${lines.join('\n')}\n`;
}

/** What the nft layer needs of an egress policy: domains are already resolved to addresses. */
export interface SlotEgressRules {
  mode: 'allow-all' | 'deny-all' | 'allow-list';
  /** IPv4 addresses and CIDRs (allow-list only). */
  addresses: string[];
  /** IPv4 addresses and CIDRs never reachable (allow-all and allow-list): dropped before any allow. */
  denied?: string[];
}

/**
 * The slot's egress chain, allow set and deny set, replaced in one transaction. Allow-all is an
 * empty chain, which is also what a scrubbed slot gets. The allow list and the deny list keep DNS
 * to the configured resolvers open so the sandbox can resolve names (a deny list covering a
 * resolver's address does not close DNS: deny-all does, so no data leaves through queries).
 */
export function renderSlotEgress(index: number, vethPrefix: string, rules: SlotEgressRules): string {
  if (!Number.isInteger(index) || index < 0) throw new Error(`invalid slot index ${index}`);
  assertVethPrefix(vethPrefix);
  const denied = rules.mode === 'deny-all' ? [] : rules.denied ?? [];
  for (const address of [...rules.addresses, ...denied]) assertIpv4Element(address);
  const t = `inet ${NFT_TABLE}`;
  const chain = `slot_${index}`;
  const set = `allow4_${index}`;
  const denySet = `deny4_${index}`;
  const lines = [
    `add table ${t}`,
    `add set ${t} dns4 { type ipv4_addr; }`,
    `add map ${t} egress { type ifname : verdict; }`,
    `add chain ${t} ${chain}`,
    `flush chain ${t} ${chain}`,
    `add set ${t} ${set} { type ipv4_addr; flags interval; auto-merge; }`,
    `flush set ${t} ${set}`,
    `add set ${t} ${denySet} { type ipv4_addr; flags interval; auto-merge; }`,
    `flush set ${t} ${denySet}`,
    `add element ${t} egress { "${vethPrefix}${index}" : jump ${chain} }`,
  ];
  if (rules.mode === 'deny-all') lines.push(`add rule ${t} ${chain} drop`);
  if (rules.mode === 'allow-list' || denied.length) {
    lines.push(`add rule ${t} ${chain} ip daddr @dns4 udp dport 53 return`, `add rule ${t} ${chain} ip daddr @dns4 tcp dport 53 return`);
  }
  if (denied.length) lines.push(`add element ${t} ${denySet} { ${denied.join(', ')} }`, `add rule ${t} ${chain} ip daddr @${denySet} drop`);
  if (rules.mode === 'allow-list') {
    if (rules.addresses.length) lines.push(`add element ${t} ${set} { ${rules.addresses.join(', ')} }`);
    lines.push(`add rule ${t} ${chain} ip daddr @${set} return`, `add rule ${t} ${chain} drop`);
  }
  return `${lines.join('\n')}\n`;
}

/** What the source check needs of a slot. */
export interface SlotIdentity {
  index: number;
  /** Host end of the slot's veth pair. */
  hostInterface: string;
  /** The only source address the slot may send from. */
  sandboxAddress: string;
}

function assertSlotIdentity(slot: SlotIdentity): void {
  if (!Number.isInteger(slot.index) || slot.index < 0) throw new Error(`invalid slot index ${slot.index}`);
  if (!/^[a-z0-9]{1,15}$/.test(slot.hostInterface)) throw new Error(`invalid slot interface ${slot.hostInterface}`);
  parseIpv4Cidr(`${slot.sandboxAddress}/32`);
}

/**
 * The slot's source-check elements: its veth is checked, and its address is the only source
 * allowed from it. Idempotent (`add element` of an existing element is no error), so the same
 * text serves a fresh build and a scrub.
 */
export function renderSlotSourceCheck(slot: SlotIdentity): string {
  assertSlotIdentity(slot);
  const t = `inet ${NFT_TABLE}`;
  return `${[
    `add table ${t}`,
    `add set ${t} ${SLOT_IFACES_SET} { type ifname; }`,
    `add set ${t} ${SLOT_SOURCES_SET} { type ifname . ipv4_addr; }`,
    `add element ${t} ${SLOT_SOURCES_SET} { "${slot.hostInterface}" . ${slot.sandboxAddress} }`,
    `add element ${t} ${SLOT_IFACES_SET} { "${slot.hostInterface}" }`,
  ].join('\n')}\n`;
}

/** The per-slot objects of one index that exist in the table right now (from `nft -j list table`). */
export interface SlotNftObjects {
  index: number;
  chain: boolean;
  allowSet: boolean;
  /** The deny set (absent on slots an older host agent built and never re-applied). */
  denySet?: boolean;
  /** Interface names keyed in the `egress` map / listed in `slot_ifaces` for this index. */
  egressElement: boolean;
  ifaceElement: boolean;
  /** Addresses paired with the slot's veth in `slot_src4`. */
  sourceAddresses: string[];
}

/** Deletes what exists of one slot's objects, in one transaction (nothing is referenced after it). */
export function renderSlotRemoval(objects: SlotNftObjects, vethPrefix: string): string {
  assertVethPrefix(vethPrefix);
  if (!Number.isInteger(objects.index) || objects.index < 0) throw new Error(`invalid slot index ${objects.index}`);
  for (const address of objects.sourceAddresses) parseIpv4Cidr(`${address}/32`);
  const t = `inet ${NFT_TABLE}`;
  const iface = `"${vethPrefix}${objects.index}"`;
  const lines: string[] = [];
  // Order matters: the map element jumps to the chain, the chain's rules use the set.
  if (objects.egressElement) lines.push(`delete element ${t} egress { ${iface} }`);
  if (objects.chain) lines.push(`flush chain ${t} slot_${objects.index}`, `delete chain ${t} slot_${objects.index}`);
  if (objects.allowSet) lines.push(`delete set ${t} allow4_${objects.index}`);
  if (objects.denySet) lines.push(`delete set ${t} deny4_${objects.index}`);
  if (objects.ifaceElement) lines.push(`delete element ${t} ${SLOT_IFACES_SET} { ${iface} }`);
  for (const address of objects.sourceAddresses) lines.push(`delete element ${t} ${SLOT_SOURCES_SET} { ${iface} . ${address} }`);
  return lines.length ? `${lines.join('\n')}\n` : '';
}

interface NftJsonSet {
  name: string;
  elem?: unknown[];
}

interface NftJsonMap {
  name: string;
  elem?: unknown[];
}

/**
 * Every index that has per-slot objects in the table, with what exists of each. One listing,
 * so a removal only names objects that are there (nft 1.0.6 has no `destroy`, and `delete` of
 * a missing object fails the whole transaction).
 */
export async function listSlotNftObjects(vethPrefix: string): Promise<Map<number, SlotNftObjects>> {
  assertVethPrefix(vethPrefix);
  const found = new Map<number, SlotNftObjects>();
  const entry = (index: number): SlotNftObjects => {
    let objects = found.get(index);
    if (!objects) found.set(index, (objects = { index, chain: false, allowSet: false, denySet: false, egressElement: false, ifaceElement: false, sourceAddresses: [] }));
    return objects;
  };
  const indexOfIface = (name: unknown): number | undefined => {
    if (typeof name !== 'string' || !name.startsWith(vethPrefix)) return undefined;
    const rest = name.slice(vethPrefix.length);
    return /^\d+$/.test(rest) ? Number(rest) : undefined;
  };
  let listing: { nftables?: Record<string, unknown>[] };
  try {
    const { stdout } = await execFileAsync('nft', ['-j', 'list', 'table', 'inet', NFT_TABLE], { maxBuffer: 64 * 1024 * 1024 });
    listing = JSON.parse(stdout) as { nftables?: Record<string, unknown>[] };
  } catch (error) {
    // No table yet: nothing of any slot exists.
    if (/No such file or directory/.test(String((error as { stderr?: string }).stderr ?? ''))) return found;
    throw error;
  }
  for (const item of listing.nftables ?? []) {
    const chain = item.chain as { name?: string } | undefined;
    const chainIndex = chain?.name ? /^slot_(\d+)$/.exec(chain.name)?.[1] : undefined;
    if (chainIndex !== undefined) entry(Number(chainIndex)).chain = true;
    const set = item.set as NftJsonSet | undefined;
    if (set) {
      const setIndex = /^allow4_(\d+)$/.exec(set.name)?.[1];
      if (setIndex !== undefined) entry(Number(setIndex)).allowSet = true;
      const denyIndex = /^deny4_(\d+)$/.exec(set.name)?.[1];
      if (denyIndex !== undefined) entry(Number(denyIndex)).denySet = true;
      if (set.name === SLOT_IFACES_SET) {
        for (const element of set.elem ?? []) {
          const index = indexOfIface(element);
          if (index !== undefined) entry(index).ifaceElement = true;
        }
      }
      if (set.name === SLOT_SOURCES_SET) {
        for (const element of set.elem ?? []) {
          const parts = (element as { concat?: unknown[] }).concat;
          const index = indexOfIface(parts?.[0]);
          if (index !== undefined && typeof parts?.[1] === 'string') entry(index).sourceAddresses.push(parts[1]);
        }
      }
    }
    const map = item.map as NftJsonMap | undefined;
    if (map?.name === 'egress') {
      // Map elements are [key, verdict] pairs.
      for (const element of map.elem ?? []) {
        const index = indexOfIface(Array.isArray(element) ? element[0] : undefined);
        if (index !== undefined) entry(index).egressElement = true;
      }
    }
  }
  return found;
}

/** Deletes every per-slot object of `index` that exists (the slot must be gone or claimed by the caller). */
export async function removeSlotNftObjects(index: number, vethPrefix: string): Promise<void> {
  const objects = (await listSlotNftObjects(vethPrefix)).get(index);
  if (!objects) return;
  const text = renderSlotRemoval(objects, vethPrefix);
  if (text) await applyNftRuleset(text);
}

export async function applyNftRuleset(ruleset: string): Promise<void> {
  const child = execFile('nft', ['-f', '-']);
  const done = new Promise<void>((resolve, reject) => {
    let stderr = '';
    child.stderr?.on('data', (chunk) => (stderr += chunk));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve() : reject(new Error(`nft -f failed (exit ${code}): ${stderr.trim()}`))));
  });
  child.stdin?.end(ruleset);
  await done;
}

/** The slot's egress chain as nft prints it (diagnostics and tests). */
export async function listSlotChain(index: number): Promise<string> {
  const { stdout } = await execFileAsync('nft', ['list', 'chain', 'inet', NFT_TABLE, `slot_${index}`]);
  return stdout;
}

export async function nftAvailable(): Promise<string | undefined> {
  try {
    const { stdout } = await execFileAsync('nft', ['--version']);
    return stdout.trim();
  } catch {
    return undefined;
  }
}
