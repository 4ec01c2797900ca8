// Per-sandbox egress policy, host side: turns a policy (allow all, deny all, allow a list of
// CIDRs and domains, and a deny list that wins over both) into the addresses the slot's nft
// chain allows and denies. Domains are resolved here, by the host agent, at apply time and again
// every refresh interval, because nftables matches addresses, not names; the sandbox's own DNS
// answers are not looked at. That is an approximation a user should know about: a name is
// allowed (or denied) as the addresses it resolved to (IPv4 only, as slots have no IPv6), any
// other name sharing those addresses (CDNs, shared hosting) is allowed (or denied) with it, and
// an address the name moves to is covered only after the next refresh.
import { lookup } from 'node:dns/promises';
import { canonicalIpv4 } from './slots.js';
import type { SlotEgressRules } from './nft.js';

export type EgressMode = 'allow-all' | 'deny-all' | 'allow-list';

export interface EgressPolicy {
  mode: EgressMode;
  allow?: string[];
  /** Never reachable (allow-all and allow-list), even where `allow` names them. */
  deny?: string[];
}

export type EgressResolver = (name: string) => Promise<string[]>;

/** getaddrinfo, like any program on the host: /etc/hosts, then the host's resolvers. */
export const systemResolver: EgressResolver = async (name) => (await lookup(name, { all: true, family: 4 })).map((entry) => entry.address);

const IPV4_ENTRY = /^\d{1,3}(?:\.\d{1,3}){3}(?:\/\d{1,2})?$/;
const RESOLVE_TIMEOUT_MS = 5_000;

export interface ResolvedEgress {
  rules: SlotEgressRules;
  /** Domains (allowed or denied) that resolved to nothing (the policy applies without them until a refresh finds them). */
  unresolved: string[];
  /** Whether the policy names domains (and so needs refreshing). */
  hasDomains: boolean;
}

/** One text per distinct rule set: a refresh re-applies only when this changes. */
export function egressRulesKey(rules: SlotEgressRules): string {
  return `${rules.mode}|${rules.addresses.join(',')}|${(rules.denied ?? []).join(',')}`;
}

export function splitAllowList(allow: readonly string[]): { cidrs: string[]; domains: string[] } {
  const cidrs: string[] = [];
  const domains: string[] = [];
  for (const entry of allow) {
    if (IPV4_ENTRY.test(entry)) cidrs.push(canonicalIpv4(entry));
    else domains.push(entry.toLowerCase().replace(/\.$/, ''));
  }
  return { cidrs, domains };
}

export async function resolveEgress(policy: EgressPolicy | undefined, resolver: EgressResolver = systemResolver): Promise<ResolvedEgress> {
  const mode = policy?.mode ?? 'allow-all';
  if (mode === 'deny-all') return { rules: { mode, addresses: [], denied: [] }, unresolved: [], hasDomains: false };
  const allowed = splitAllowList(mode === 'allow-list' ? policy?.allow ?? [] : []);
  const denied = splitAllowList(policy?.deny ?? []);
  const unresolved: string[] = [];
  const resolve = async (list: { cidrs: string[]; domains: string[] }): Promise<string[]> => {
    const addresses = new Set(list.cidrs);
    await Promise.all(
      list.domains.map(async (domain) => {
        const found = await withTimeout(resolver(domain), RESOLVE_TIMEOUT_MS).catch(() => [] as string[]);
        const valid = found.filter((address) => IPV4_ENTRY.test(address));
        if (!valid.length) unresolved.push(domain);
        for (const address of valid) addresses.add(canonicalIpv4(address));
      }),
    );
    return [...addresses].sort();
  };
  const [addresses, deniedAddresses] = await Promise.all([resolve(allowed), resolve(denied)]);
  return {
    rules: { mode, addresses, denied: deniedAddresses },
    unresolved: [...new Set(unresolved)].sort(),
    hasDomains: allowed.domains.length + denied.domains.length > 0,
  };
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
