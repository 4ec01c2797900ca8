// Which resolvers sandboxes get: the only host-side addresses the isolation rules let them reach.
// Both drivers render the same answer into the shared nftables table and the sandboxes' resolv.conf.
import { readFile } from 'node:fs/promises';

/** IPv4 resolvers from the host's resolv.conf that a sandbox can use (not loopback). */
export async function hostDnsServers(resolvConf = '/etc/resolv.conf'): Promise<string[]> {
  const text = await readFile(resolvConf, 'utf8').catch(() => '');
  return text
    .split('\n')
    .map((line) => /^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/.exec(line)?.[1])
    .filter((address): address is string => !!address && !address.startsWith('127.'));
}

/** Used when the host names no usable resolver (only loopback ones, or none). */
const FALLBACK_DNS = ['1.1.1.1', '8.8.8.8'];

/**
 * The resolvers sandboxes may reach (the only host-side exception in the isolation rules):
 * the configured ones, else the host's own, else public fallbacks. One answer for both drivers
 * and the tests, so every host agent renders the same DNS allowance into the shared table.
 */
export async function sandboxDnsServers(configured?: string[]): Promise<string[]> {
  const found = configured ?? (await hostDnsServers());
  return found.length ? found : FALLBACK_DNS;
}
