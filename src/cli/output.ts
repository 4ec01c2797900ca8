// What the client commands print: JSON on stdout with --json (and nothing else there), else
// short human text; errors are one line on stderr (see errorLine).
import { InvalidArgumentError } from 'commander';
import { NativeApiError } from '../client/native-client.js';
import { ConfigError } from '../config.js';

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** Columns padded to their widest cell; the last column is not padded. */
export function printTable(header: string[], rows: (string | number | null | undefined)[][]): void {
  const cells = [header, ...rows.map((r) => r.map((c) => (c === null || c === undefined ? '-' : String(c))))];
  const widths = header.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  for (const row of cells) process.stdout.write(`${row.map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i]!))).join('  ')}\n`);
}

/** `2 m`, `3 h`, `4 d`: how long ago an ISO time was. */
export function age(iso: string | null | undefined): string {
  if (!iso) return '-';
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return `${Math.floor(seconds)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

/** A failure the CLI explains itself (a bad argument commander cannot see, a lost connection): one line. */
export class CliError extends Error {
  override name = 'CliError';
}

/** The one line an error is reported as (no stack trace for anything a user can cause). */
export function errorLine(err: unknown): string {
  if (err instanceof NativeApiError) return `error: ${err.code}: ${err.message}`;
  if (err instanceof CliError || err instanceof InvalidArgumentError) return `error: ${err.message}`;
  if (err instanceof ConfigError) return err.message;
  // An image pull's failure (not_found, unauthorized…) is the user's to read, not a stack trace.
  if (err instanceof Error && err.name === 'ImageError') return `${(err as Error & { code: string }).code}: ${err.message}`;
  // fetch's "fetch failed" hides the reason (ECONNREFUSED, ENOTFOUND…) in its cause.
  if (err instanceof TypeError && err.message === 'fetch failed') {
    const cause = err.cause as { code?: string; message?: string } | undefined;
    return `error: cannot reach the server: ${cause?.code ?? cause?.message ?? 'network error'}`;
  }
  return err instanceof Error ? (err.stack ?? err.message) : String(err);
}

// ── argument parsers (commander's argParser: a bad value is an InvalidArgumentError naming it) ──

export function positiveInteger(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n <= 0) throw new InvalidArgumentError('must be a positive integer');
  return n;
}

export function positiveNumber(value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError('must be a positive number');
  return n;
}

export function portNumber(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > 65535) throw new InvalidArgumentError('must be a port number (1-65535)');
  return n;
}

/** For a repeatable `K=V` option: collects into one record. */
export function keyValue(value: string, previous: Record<string, string> = {}): Record<string, string> {
  const eq = value.indexOf('=');
  if (eq <= 0) throw new InvalidArgumentError(`"${value}" is not KEY=VALUE`);
  return { ...previous, [value.slice(0, eq)]: value.slice(eq + 1) };
}

export function repeatable(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

export function egressPolicy(value: string): { mode: 'allow-all' | 'deny-all' | 'allow-list'; allow?: string[] } {
  if (value === 'deny-all' || value === 'allow-all') return { mode: value };
  const allow = value.split(',').map((s) => s.trim()).filter(Boolean);
  if (!allow.length) throw new InvalidArgumentError('deny-all, allow-all, or a comma-separated list of hosts/CIDRs');
  return { mode: 'allow-list', allow };
}

export function httpUrl(value: string): string {
  let u: URL;
  try {
    u = new URL(value);
  } catch {
    throw new InvalidArgumentError(`"${value}" is not a URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new InvalidArgumentError('must be an http:// or https:// URL');
  return value.replace(/\/+$/, '');
}
