// The host nftables table that isolates sandboxes. One table (`inet nestbox`) shared by every
// host agent on the machine. Applies are never destructive: the base chains and sets are
// created if missing and flushed-and-refilled inside one `nft -f` transaction, so two host
// agents starting side by side (tests do) never wipe each other's per-slot egress chains, and
// rules never half-exist.
//
// Per-slot egress: the forward chain jumps through a verdict map keyed by the slot's host veth
// (`iifname vmap @egress`) into `slot_<i>`, a chain that either does nothing (allow all), drops
// (deny all) or returns for the slot's allowed addresses and drops the rest (allow list). The
// isolation rules come after the jump, so a `return` never lets a sandbox reach what isolation
// forbids (host, other slots, private and link-local ranges).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { parseIpv4Cidr } from './network.js';

const execFileAsync = promisify(execFile);

export const NFT_TABLE = 'nestbox';

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
}

/**
 * The slot's egress chain and allow set, replaced in one transaction. Allow-all is an empty
 * chain, which is also what a scrubbed slot gets. The allow list keeps DNS to the configured
 * resolvers open so the sandbox can resolve the names it was allowed; deny-all closes DNS too
 * (no data leaves through queries).
 */
export function renderSlotEgress(index: number, vethPrefix: string, rules: SlotEgressRules): string {
  if (!Number.isInteger(index) || index < 0) throw new Error(`invalid slot index ${index}`);
  assertVethPrefix(vethPrefix);
  for (const address of rules.addresses) assertIpv4Element(address);
  const t = `inet ${NFT_TABLE}`;
  const chain = `slot_${index}`;
  const set = `allow4_${index}`;
  const lines = [
    `add table ${t}`,
    `add set ${t} dns4 { type ipv4_addr; }`,
    `add map ${t} egress { type ifname : verdict; }`,
    `add chain ${t} ${chain}`,
    `flush chain ${t} ${chain}`,
    `add set ${t} ${set} { type ipv4_addr; flags interval; auto-merge; }`,
    `flush set ${t} ${set}`,
    `add element ${t} egress { "${vethPrefix}${index}" : jump ${chain} }`,
  ];
  if (rules.mode === 'deny-all') lines.push(`add rule ${t} ${chain} drop`);
  if (rules.mode === 'allow-list') {
    if (rules.addresses.length) lines.push(`add element ${t} ${set} { ${rules.addresses.join(', ')} }`);
    lines.push(
      `add rule ${t} ${chain} ip daddr @dns4 udp dport 53 return`,
      `add rule ${t} ${chain} ip daddr @dns4 tcp dport 53 return`,
      `add rule ${t} ${chain} ip daddr @${set} return`,
      `add rule ${t} ${chain} drop`,
    );
  }
  return `${lines.join('\n')}\n`;
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
