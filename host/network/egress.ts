// Per-sandbox egress policy, host side: turns a policy (allow all, deny all, allow a list of
// CIDRs and domains) into the addresses the slot's nft chain allows. Domains are resolved here,
// by the host agent, at apply time and again every refresh interval, because nftables matches
// addresses, not names. That is an approximation a user should know about: a name is allowed
// as the addresses it resolved to (IPv4 only, as slots have no IPv6), any other name sharing
// those addresses (CDNs, shared hosting) is reachable too, and an address the name moves to is
// reachable only after the next refresh.
import { lookup } from 'node:dns/promises';
import { canonicalIpv4 } from './slots.js';
import type { SlotEgressRules } from './nft.js';

export type EgressMode = 'allow-all' | 'deny-all' | 'allow-list';

export interface EgressPolicy {
  mode: EgressMode;
  allow?: string[];
}

export type EgressResolver = (name: string) => Promise<string[]>;

/** getaddrinfo, like any program on the host: /etc/hosts, then the host's resolvers. */
export const systemResolver: EgressResolver = async (name) => (await lookup(name, { all: true, family: 4 })).map((entry) => entry.address);

const IPV4_ENTRY = /^\d{1,3}(?:\.\d{1,3}){3}(?:\/\d{1,2})?$/;
const RESOLVE_TIMEOUT_MS = 5_000;

export interface ResolvedEgress {
  rules: SlotEgressRules;
  /** Domains that resolved to nothing (the policy applies without them until a refresh finds them). */
  unresolved: string[];
  /** Whether the policy names domains (and so needs refreshing). */
  hasDomains: boolean;
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
  if (mode !== 'allow-list') return { rules: { mode, addresses: [] }, unresolved: [], hasDomains: false };
  const { cidrs, domains } = splitAllowList(policy?.allow ?? []);
  const addresses = new Set(cidrs);
  const unresolved: string[] = [];
  await Promise.all(
    domains.map(async (domain) => {
      const found = await withTimeout(resolver(domain), RESOLVE_TIMEOUT_MS).catch(() => [] as string[]);
      const valid = found.filter((address) => IPV4_ENTRY.test(address));
      if (!valid.length) unresolved.push(domain);
      for (const address of valid) addresses.add(canonicalIpv4(address));
    }),
  );
  return { rules: { mode, addresses: [...addresses].sort() }, unresolved: unresolved.sort(), hasDomains: domains.length > 0 };
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
