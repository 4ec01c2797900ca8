// Egress policies as the APIs accept them, and the IPv4 range arithmetic the front doors need to
// translate their vendors' rules onto them. Pure functions: the host agent enforces a policy
// (host/network), core only checks and stores it.
//
// The model: a mode (`allow-all`, `deny-all`, `allow-list`), an `allow` list (allow-list only)
// and a `deny` list (allow-all and allow-list). Deny wins: an address a deny entry covers is
// unreachable even where the allow list names it. Entries are IPv4 addresses, IPv4 CIDRs or
// domain names; sandboxes have no IPv6, so IPv6 is never reachable and never accepted.
import { errors } from './errors.js';
import type { EgressPolicy } from './types.js';

export const EGRESS_MODES = ['allow-all', 'deny-all', 'allow-list'] as const;
export const MAX_EGRESS_ENTRIES = 256;
/** Every IPv4 address (E2B's `ALL_TRAFFIC`). */
export const ALL_IPV4 = '0.0.0.0/0';

const IPV4_CIDR = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:\/(\d{1,2}))?$/;
const DOMAIN = /^(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

/** Is this (normalised) entry an IPv4 address or CIDR rather than a domain? */
export function isIpv4Entry(entry: string): boolean {
  return IPV4_CIDR.test(entry);
}

/**
 * One list entry, normalised (trimmed, lower-cased, no trailing dot), or a 400 naming `where`.
 * `kinds` narrows what the caller's API accepts there (E2B's deny list takes no domains).
 */
export function parseEgressEntry(entry: unknown, where: string, kinds: 'addresses-and-domains' | 'addresses' = 'addresses-and-domains'): string {
  if (typeof entry !== 'string') throw errors.validation(where, 'must be a string');
  const value = entry.trim().toLowerCase().replace(/\.$/, '');
  const cidr = IPV4_CIDR.exec(value);
  if (cidr) {
    if (cidr.slice(1, 5).some((octet) => Number(octet) > 255) || (cidr[5] !== undefined && Number(cidr[5]) > 32)) throw errors.validation(where, `"${entry}" is not a valid IPv4 address or CIDR`);
    return value;
  }
  if (value.includes(':')) throw errors.validation(where, `"${entry}": IPv6 is not supported (sandboxes have IPv4 only, so no IPv6 address is ever reachable)`);
  if (kinds === 'addresses') throw errors.validation(where, `"${entry}" is not an IPv4 address or CIDR`);
  if (value.startsWith('*.')) throw errors.validation(where, `"${entry}": wildcard domains are not supported (the host resolves each name to its addresses)`);
  if (!DOMAIN.test(value)) throw errors.validation(where, `"${entry}" is neither an IPv4 address, an IPv4 CIDR nor a domain name`);
  return value;
}

function parseList(list: unknown, field: string): string[] {
  if (!Array.isArray(list)) throw errors.validation(field, 'must be an array of IPv4 addresses, IPv4 CIDRs and domain names');
  if (list.length > MAX_EGRESS_ENTRIES) throw errors.validation(field, `must have at most ${MAX_EGRESS_ENTRIES} entries`);
  const entries: string[] = [];
  list.forEach((entry, index) => {
    const value = parseEgressEntry(entry, `${field}[${index}]`);
    if (!entries.includes(value)) entries.push(value);
  });
  return entries;
}

const isEmptyList = (value: unknown) => value === undefined || (Array.isArray(value) && value.length === 0);

/**
 * An egress policy as the API accepts it (a 400 naming the field otherwise): entries lower-cased,
 * duplicates dropped, empty lists left out. `allow` belongs to allow-list only; `deny` to
 * allow-all and allow-list (deny-all already denies everything).
 */
export function validateEgress(input: unknown, field = 'egress'): EgressPolicy {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) throw errors.validation(field, 'must be an object with a mode');
  const { mode, allow, deny, ...rest } = input as { mode?: unknown; allow?: unknown; deny?: unknown };
  const extra = Object.keys(rest)[0];
  if (extra !== undefined) throw errors.validation(`${field}.${extra}`, 'is not a known field');
  if (!EGRESS_MODES.includes(mode as EgressPolicy['mode'])) throw errors.validation(`${field}.mode`, `must be one of ${EGRESS_MODES.join(', ')}`);
  const policy: EgressPolicy = { mode: mode as EgressPolicy['mode'] };
  if (mode === 'allow-list') {
    if (!Array.isArray(allow)) throw errors.validation(`${field}.allow`, 'is required with mode "allow-list" (an array of CIDRs and domains)');
    policy.allow = parseList(allow, `${field}.allow`);
  } else if (!isEmptyList(allow)) {
    throw errors.validation(`${field}.allow`, 'is only allowed with mode "allow-list"');
  }
  if (mode === 'deny-all') {
    if (!isEmptyList(deny)) throw errors.validation(`${field}.deny`, 'is not allowed with mode "deny-all" (nothing is reachable already)');
  } else if (deny !== undefined) {
    const entries = parseList(deny, `${field}.deny`);
    if (entries.length) policy.deny = entries;
  }
  return policy;
}

// ---- IPv4 ranges --------------------------------------------------------------------------------

/** An inclusive range of IPv4 addresses as unsigned 32-bit numbers. */
type Range = [number, number];

function rangeOf(entry: string): Range {
  const match = IPV4_CIDR.exec(entry);
  if (!match) throw new Error(`not an IPv4 address or CIDR: ${entry}`);
  const address = match.slice(1, 5).reduce((value, octet) => value * 256 + Number(octet), 0);
  const size = 2 ** (32 - Number(match[5] ?? 32));
  const start = address - (address % size);
  return [start, start + size - 1];
}

function addressText(value: number): string {
  return [24, 16, 8, 0].map((shift) => Math.floor(value / 2 ** shift) % 256).join('.');
}

/** The fewest CIDRs covering exactly [start, end]. */
function cidrsOf([start, end]: Range): string[] {
  const out: string[] = [];
  let next = start;
  while (next <= end) {
    // The largest block aligned at `next` that does not run past `end`.
    let bits = 32;
    while (bits > 0 && next % 2 ** (33 - bits) === 0 && next + 2 ** (33 - bits) - 1 <= end) bits--;
    out.push(bits === 32 ? addressText(next) : `${addressText(next)}/${bits}`);
    next += 2 ** (32 - bits);
  }
  return out;
}

/**
 * The addresses of `from` that none of `minus` covers, as CIDRs (bare addresses for /32s). Both
 * lists hold IPv4 addresses and CIDRs only. E2B's allow list is a set of exceptions to its deny
 * list; core's deny wins, so the translation hands core the deny list with the exceptions cut out.
 */
export function subtractIpv4(from: readonly string[], minus: readonly string[]): string[] {
  const holes = minus.map(rangeOf);
  const out: string[] = [];
  for (const range of mergeRanges(from.map(rangeOf))) {
    let pieces: Range[] = [range];
    for (const [holeStart, holeEnd] of holes) {
      pieces = pieces.flatMap(([start, end]): Range[] => {
        if (holeEnd < start || holeStart > end) return [[start, end]];
        const left: Range[] = holeStart > start ? [[start, holeStart - 1]] : [];
        const right: Range[] = holeEnd < end ? [[holeEnd + 1, end]] : [];
        return [...left, ...right];
      });
    }
    for (const piece of pieces) out.push(...cidrsOf(piece));
  }
  return out;
}

/** Overlapping or adjacent ranges joined, in address order. */
function mergeRanges(ranges: Range[]): Range[] {
  const merged: Range[] = [];
  for (const [start, end] of [...ranges].sort((a, b) => a[0] - b[0])) {
    const last = merged[merged.length - 1];
    if (last && start <= last[1] + 1) last[1] = Math.max(last[1], end);
    else merged.push([start, end]);
  }
  return merged;
}

/** Does this IPv4 entry cover every address? */
export const coversAllIpv4 = (entry: string): boolean => isIpv4Entry(entry) && rangeOf(entry)[0] === 0 && rangeOf(entry)[1] === 2 ** 32 - 1;
