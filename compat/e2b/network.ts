// E2B's network options (e2b-wave2.md §6) onto core's egress policy, and back for getInfo.
//
// E2B's rule: an address in `allowOut` is reachable; otherwise one in `denyOut` is not;
// otherwise it is (allow beats deny, and allowOut alone restricts nothing). Core's rule is the
// other way round (deny wins), so the translation picks the core policy that lets exactly the
// same addresses through:
//   - denyOut covers everything (ALL_TRAFFIC, or allow_internet_access false): allow-list of
//     allowOut (deny-all when allowOut is empty);
//   - otherwise allow-all with denyOut minus allowOut as the deny list (E2B only takes addresses
//     and CIDRs there, and domains in allowOut only together with ALL_TRAFFIC, so the
//     difference is plain IPv4 arithmetic).
import { errors } from '../../core/errors.js';
import { ALL_IPV4, MAX_EGRESS_ENTRIES, coversAllIpv4, isIpv4Entry, parseEgressEntry, subtractIpv4 } from '../../core/egress.js';
import type { EgressPolicy } from '../../core/types.js';
import { notSupported } from './errors.js';

/** Upstream's text for domains in allowOut without ALL_TRAFFIC in denyOut (a 400). */
const DOMAINS_NEED_DENY_ALL = "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.";

function entries(value: unknown, field: string, kinds: 'addresses-and-domains' | 'addresses', isDenyOut = false): string[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw errors.validation(field, 'must be a list of strings');
  if (value.length > MAX_EGRESS_ENTRIES) throw errors.validation(field, `must have at most ${MAX_EGRESS_ENTRIES} entries`);
  return value.map((entry, index) => {
    const where = `${field}[${index}]`;
    // Upstream's own message for a deny entry that is no address or CIDR, after the field.
    if (isDenyOut && typeof entry === 'string' && !isIpv4Entry(entry.trim()) && !entry.includes(':')) throw errors.validation(where, `invalid denied CIDR ${entry}`);
    return parseEgressEntry(entry, where, kinds);
  });
}

const isUnset = (value: unknown) => value === undefined || value === null || (typeof value === 'object' && Object.keys(value).length === 0);

/**
 * The core policy for a create body (`network: {...}`, `allow_internet_access`) or an
 * updateNetwork body (the same fields at the top level); undefined when it sets none of them.
 */
export function e2bEgressPolicy(body: Record<string, unknown>): EgressPolicy | undefined {
  const nested = body.network && typeof body.network === 'object' && !Array.isArray(body.network);
  const network = (nested ? body.network : body) as Record<string, unknown>;
  const where = (name: string) => (nested ? `network.${name}` : name);
  if (!isUnset(network.egressProxy)) throw notSupported('network.egressProxy (no SOCKS5 egress proxy: sandboxes reach the internet directly)');
  if (!isUnset(network.rules)) throw notSupported('network.rules (no egress proxy rewrites requests: header transforms are not applied)');
  if (network.maskRequestHost !== undefined && network.maskRequestHost !== null) throw notSupported('network.maskRequestHost (hosted ports pass the Host header through unchanged)');
  if (Array.isArray(network.httpsPorts) && network.httpsPorts.length > 0) throw notSupported('network.httpsPorts (hosted ports reach the sandbox over plain HTTP)');

  const allowOut = entries(network.allowOut, where('allowOut'), 'addresses-and-domains');
  const denyOut = entries(network.denyOut, where('denyOut'), 'addresses', true);
  const internet = body.allow_internet_access ?? body.allowInternetAccess;
  if (internet !== undefined && internet !== null && typeof internet !== 'boolean') throw errors.validation('allow_internet_access', 'must be a boolean');
  // E2B: allow_internet_access false is denyOut ALL_TRAFFIC.
  if (internet === false) denyOut.push(ALL_IPV4);
  const blocksAll = denyOut.some(coversAllIpv4);
  if (!blocksAll && allowOut.some((entry) => !isIpv4Entry(entry))) throw errors.validation(where('allowOut'), DOMAINS_NEED_DENY_ALL);

  // Python 2.63's dnsServers: resolvers all traffic may reach when allowOut names a domain
  // (upstream allows 8.8.8.8 when it is left out; a sandbox here asks the host's resolvers, which
  // an allow list always lets through, so nothing is added then).
  const dnsServers = entries(network.dnsServers, where('dnsServers'), 'addresses');
  const withResolvers = allowOut.some((entry) => !isIpv4Entry(entry)) ? [...allowOut, ...dnsServers] : allowOut;
  if (blocksAll) return allowOut.length ? { mode: 'allow-list', allow: [...new Set(withResolvers)] } : { mode: 'deny-all' };
  if (denyOut.length === 0) return allowOut.length || internet !== undefined || network.denyOut !== undefined ? { mode: 'allow-all' } : undefined;
  const deny = subtractIpv4(denyOut, allowOut);
  if (deny.length > MAX_EGRESS_ENTRIES) throw errors.validation(where('denyOut'), `with the allowOut exceptions cut out it is ${deny.length} ranges; at most ${MAX_EGRESS_ENTRIES} are supported`);
  return deny.length ? { mode: 'allow-all', deny } : { mode: 'allow-all' };
}

/**
 * getInfo's `network` (allowOut / denyOut as E2B would have to be given them for the same
 * effect) and `allowInternetAccess`, from the policy in force. A core deny list under an
 * allow-list (only the native API sets one) comes back as the allow list with it cut out.
 */
export function e2bNetworkInfo(egress: EgressPolicy): { allowInternetAccess: boolean; network: { allowOut?: string[]; denyOut?: string[] } } {
  if (egress.mode === 'deny-all') return { allowInternetAccess: false, network: { denyOut: [ALL_IPV4] } };
  const deny = egress.deny ?? [];
  if (egress.mode === 'allow-all') return { allowInternetAccess: true, network: deny.length ? { denyOut: deny } : {} };
  const allow = egress.allow ?? [];
  const deniedAddresses = deny.filter(isIpv4Entry);
  const allowOut = [...subtractIpv4(allow.filter(isIpv4Entry), deniedAddresses), ...allow.filter((entry) => !isIpv4Entry(entry) && !deny.includes(entry))];
  return { allowInternetAccess: true, network: { ...(allowOut.length ? { allowOut } : {}), denyOut: [ALL_IPV4] } };
}
