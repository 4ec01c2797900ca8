// The host nftables table that isolates sandboxes. One table (`inet nestbox`) owned by the host
// agent, replaced atomically on every apply: the same file first creates (no-op if present),
// deletes and recreates the table inside one `nft -f` transaction, so rules never half-exist.
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

export function renderNftRuleset(options: NftRulesetOptions): string {
  parseIpv4Cidr(options.subnet); // throws on garbage before it reaches nft
  if (!/^[a-z0-9]{1,8}$/.test(options.vethPrefix)) throw new Error(`invalid veth prefix ${options.vethPrefix}`);
  for (const server of options.dnsServers) parseIpv4Cidr(`${server}/32`);
  const veth = `"${options.vethPrefix}*"`;
  const dnsSet = options.dnsServers.length ? `\n  set dns4 { type ipv4_addr; elements = { ${options.dnsServers.join(', ')} } }` : '';
  const dnsRules = options.dnsServers.length
    ? `\n    iifname ${veth} ip daddr @dns4 udp dport 53 accept\n    iifname ${veth} ip daddr @dns4 tcp dport 53 accept`
    : '';
  return `table inet ${NFT_TABLE} {}
delete table inet ${NFT_TABLE}
table inet ${NFT_TABLE} {
  set blocked4 { type ipv4_addr; flags interval; elements = { ${BLOCKED_IPV4_RANGES.join(', ')} } }${dnsSet}
  chain input {
    type filter hook input priority 0; policy accept;
    # No host service (control plane, host agent, database, sshd) is reachable from a sandbox;
    # only answers to connections the host opened get through.
    iifname ${veth} ct state established,related accept
    iifname ${veth} drop
  }
  chain forward {
    type filter hook forward priority 0; policy accept;
    oifname ${veth} ct state established,related accept${dnsRules}
    iifname ${veth} oifname ${veth} drop
    iifname ${veth} ip daddr @blocked4 drop
    # Slots have no IPv6 addresses; refuse anything that tries.
    iifname ${veth} meta nfproto ipv6 drop
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr ${options.subnet} oifname != ${veth} masquerade
  }
}
`;
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

export async function nftAvailable(): Promise<string | undefined> {
  try {
    const { stdout } = await execFileAsync('nft', ['--version']);
    return stdout.trim();
  } catch {
    return undefined;
  }
}
