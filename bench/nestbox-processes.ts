// What the scale-out benchmarks (placement.ts, replicas.ts) share: a database of their own on a
// PostgreSQL server, `nestbox` processes started the way an operator starts them (server
// replicas, extra host agents with a secret from `nestbox host-secret`), and reading a
// Prometheus scrape. Everything listens on and talks to loopback only.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { promisify } from 'node:util';
import knexFactory from 'knex';
import { CLI_ENTRY } from '../src/paths.js';

const execFileAsync = promisify(execFile);

/** The PostgreSQL server the scale-out parts use when `--postgres` is not given (the test suite's). */
export const DEFAULT_BENCH_POSTGRES = process.env.NESTBOX_TEST_DATABASE_URL ?? 'postgres://nestbox:nestbox@127.0.0.1:5432/postgres';

export interface BenchDatabase {
  url: string;
  drop(): Promise<void>;
}

/**
 * A brand-new database on the server `serverUrl` points at, so replicas start on an empty schema
 * and nothing of another run (buckets, hosts, sandboxes) is counted; dropped by `drop`.
 * Undefined when no PostgreSQL answers there (the caller says the part was not run).
 */
export async function freshDatabase(serverUrl: string): Promise<BenchDatabase | undefined> {
  const name = `nbx_bench_${randomBytes(6).toString('hex')}`;
  const admin = knexFactory({ client: 'pg', connection: serverUrl, pool: { min: 0, max: 1 }, acquireConnectionTimeout: 5000 });
  try {
    await admin.raw(`CREATE DATABASE ${name}`);
  } catch {
    return undefined;
  } finally {
    await admin.destroy();
  }
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: async () => {
      const a = knexFactory({ client: 'pg', connection: serverUrl, pool: { min: 0, max: 1 } });
      await a.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).finally(() => a.destroy());
    },
  };
}

export interface NestboxProcess {
  child: ChildProcess;
  /** Its stdout and stderr, kept for an error message. */
  output: string[];
  running(): boolean;
  /** SIGTERM, and wait for it to exit (a host agent closes its slot pool first). */
  stop(): Promise<void>;
}

/** `node dist/src/cli.js <args>` with exactly `env` (plus PATH and HOME). */
export function spawnNestbox(args: string[], env: Record<string, string>): NestboxProcess {
  const output: string[] = [];
  const child = spawn(process.execPath, [CLI_ENTRY(), ...args], { env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/root', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const keep = (d: Buffer) => {
    output.push(String(d));
    // Only the tail matters (an error message); a chatty process must not grow this without end.
    if (output.length > 400) output.splice(0, 200);
  };
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  const running = () => child.exitCode === null && child.signalCode === null;
  return {
    child,
    output,
    running,
    stop: async () => {
      if (!running()) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

/** A host agent's own secret, as an operator gets it: `nestbox host-secret <id>` with the deployment's NESTBOX_HOST_SECRET. */
export async function hostSecretOf(sharedSecret: string, hostId: string): Promise<string> {
  const { stdout } = await execFileAsync(process.execPath, [CLI_ENTRY(), 'host-secret', hostId], { env: { PATH: process.env.PATH, NESTBOX_HOST_SECRET: sharedSecret } });
  return stdout.trim();
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
    s.on('error', reject);
  });
}

/** Polls `fn` every `intervalMs` until it returns something truthy; throws naming `what` after `timeoutMs`. */
export async function waitFor<T>(what: string, fn: () => Promise<T | undefined | false>, timeoutMs: number, intervalMs = 200): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as T;
    } catch (err) {
      last = err;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ''}`);
}

/**
 * One Prometheus text scrape, as sample → value (`name{label="v",…}` exactly as written). Enough
 * for reading a histogram's _sum and _count and a gauge; comments are skipped.
 */
export async function scrape(url: string, token: string): Promise<Map<string, number>> {
  const res = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${token}` } });
  if (res.status !== 200) throw new Error(`${url}/metrics answered ${res.status}`);
  const samples = new Map<string, number>();
  for (const line of (await res.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    samples.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return samples;
}
