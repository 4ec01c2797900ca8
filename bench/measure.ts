// What every benchmark part shares: a JSON call to the native API, timing, and how figures are
// printed (quantiles of a sample, milliseconds).
import { spawn } from 'node:child_process';
import http from 'node:http';
import { fileURLToPath } from 'node:url';

export interface Call {
  status: number;
  body: string;
}

/** One request with the API key; the body is sent as JSON, the answer read whole as UTF-8. */
export function call(base: string, key: string, method: string, path: string, body?: unknown): Promise<Call> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(new URL(base + path), { method, headers: { authorization: `Bearer ${key}`, ...(payload ? { 'content-type': 'application/json' } : {}) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

/** How long `fn` took (ms), with its value. */
export async function timed<T>(fn: () => Promise<T>): Promise<[number, T]> {
  const start = performance.now();
  const value = await fn();
  return [performance.now() - start, value];
}

/** The q-quantile of a sample (nearest rank). */
export const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};

export const ms = (n: number): string => `${n.toFixed(1)} ms`;

/** Runs one job of bench/http-client.ts in a process of its own and returns what it measured. */
export function clientJob(job: import('./http-client.js').ClientJob): Promise<import('./http-client.js').ClientResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [fileURLToPath(new URL('./http-client.js', import.meta.url)), JSON.stringify(job)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(out) as import('./http-client.js').ClientResult) : reject(new Error(`bench client (${job.kind} ${job.url}) failed: ${err.trim()}`))));
  });
}
