// Sending fuzzed requests and judging the answers. Raw node:http, so paths go on the wire
// exactly as generated (bad escapes, latin-1 bytes) and headers can be odd.
import http from 'node:http';
import { readFileSync, readdirSync } from 'node:fs';
import { ERROR_CATALOGUE } from '../../core/errors.js';

export type ApiShape = 'native' | 'daytona-api' | 'daytona-toolbox' | 'e2b' | 'envd-http' | 'connect' | 'code-interpreter';

export interface FuzzRequest {
  api: ApiShape;
  /** What generated it, for failure reports. */
  label: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: Buffer;
}

export interface FuzzResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The first 64 KiB of the body. */
  text: string;
  /** Milliseconds until the status line and headers arrived. */
  headersMs: number;
}

/** A single answer must arrive within this (issue 11: "no hang over 10 s"). */
export const RESPONSE_DEADLINE_MS = 10_000;
/** Streams (SSE, Connect server streams) are read this long after their headers, then dropped. */
const STREAM_READ_MS = 300;
const MAX_BODY = 64 * 1024;

const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });

export function destroyAgent(): void {
  agent.destroy();
}

/**
 * Send one request. A kept-alive socket the server closed just as it was reused fails with
 * "socket hang up" before the server saw the request (a client-side race, not a server fault):
 * that one case is retried once on a fresh connection.
 */
export async function send(baseUrl: string, r: FuzzRequest): Promise<FuzzResponse> {
  try {
    return await sendOnce(baseUrl, r, agent);
  } catch (err) {
    if (!(err as { reusedSocket?: boolean }).reusedSocket) throw err;
    return sendOnce(baseUrl, r, false);
  }
}

function sendOnce(baseUrl: string, r: FuzzRequest, viaAgent: http.Agent | false): Promise<FuzzResponse> {
  const u = new URL(baseUrl);
  const started = Date.now();
  return new Promise((resolve, reject) => {
    let settled = false;
    const finish = (fn: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      fn();
    };
    let req: http.ClientRequest;
    try {
      // node sends a DELETE's (or GET's) body without any framing unless told its length: the
      // server would read it as the next request. Every body gets a Content-Length.
      const headers = r.body !== undefined ? { ...r.headers, 'content-length': String(r.body.length) } : r.headers;
      req = http.request({ host: u.hostname, port: u.port, method: r.method, path: r.path, headers, agent: viaAgent });
    } catch (err) {
      // node refused to send it (e.g. an invalid header): not the server's doing.
      return reject(Object.assign(err as Error, { clientSide: true }));
    }
    const deadline = setTimeout(() => {
      req.destroy();
      finish(() => reject(new Error(`no response within ${RESPONSE_DEADLINE_MS} ms`)));
    }, RESPONSE_DEADLINE_MS);
    req.on('response', (res) => {
      const headersMs = Date.now() - started;
      const chunks: Buffer[] = [];
      let size = 0;
      const done = () =>
        finish(() => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString('utf8'), headersMs }));
      const streaming = /event-stream|connect\+|grpc/.test(String(res.headers['content-type'] ?? '')) || res.headers['transfer-encoding'] === 'chunked';
      const stop = streaming ? setTimeout(() => { res.destroy(); done(); }, STREAM_READ_MS) : undefined;
      res.on('data', (c: Buffer) => {
        if (size < MAX_BODY) chunks.push(c);
        size += c.length;
        if (size >= MAX_BODY) { res.destroy(); done(); }
      });
      res.on('end', () => { if (stop) clearTimeout(stop); done(); });
      res.on('error', () => { if (stop) clearTimeout(stop); done(); });
      res.on('close', () => { if (stop) clearTimeout(stop); done(); });
    });
    req.on('error', (err) => finish(() => reject(Object.assign(err, { reusedSocket: req.reusedSocket && (err as NodeJS.ErrnoException).code === 'ECONNRESET' }))));
    req.end(r.body);
  });
}

export function isParserRejection(res: FuzzResponse): boolean {
  return (res.status === 400 || res.status === 431) && res.text === '' && res.headers['content-type'] === undefined && res.headers.connection === 'close';
}

const CONNECT_CODES = new Set(['canceled', 'unknown', 'invalid_argument', 'deadline_exceeded', 'not_found', 'already_exists', 'permission_denied', 'resource_exhausted', 'failed_precondition', 'aborted', 'out_of_range', 'unimplemented', 'internal', 'unavailable', 'data_loss', 'unauthenticated']);
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Is this error answer in the API's own documented shape? Returns the problem, or undefined. */
export function errorShapeProblem(api: ApiShape, res: FuzzResponse, method: string): string | undefined {
  if (method === 'HEAD') return undefined;
  // Node's HTTP parser refuses some requests before any route sees them (a request target with
  // raw non-ASCII bytes, headers over the size limit): a bare status line, no API involved.
  if (isParserRejection(res)) return undefined;
  // The Connect protocol answers a wrong HTTP method (405) or a content type the RPC does not
  // take (415) with a bare status, before any RPC runs; envd (connect-go) does the same.
  if (api === 'connect' && (res.status === 405 || res.status === 415) && res.text === '') return undefined;
  if (api === 'code-interpreter') return res.text.length > 0 ? undefined : 'empty error body';
  let body: unknown;
  try {
    body = JSON.parse(res.text);
  } catch {
    return `error body is not JSON: ${res.text.slice(0, 200)}`;
  }
  if (!isObject(body)) return 'error body is not an object';
  switch (api) {
    case 'native': {
      const e = body.error;
      if (!isObject(e) || typeof e.code !== 'string' || typeof e.message !== 'string') return 'not {error:{code,message}}';
      if (!(e.code in ERROR_CATALOGUE)) return `unknown code ${e.code}`;
      return undefined;
    }
    case 'daytona-api':
    case 'daytona-toolbox':
      if (body.statusCode !== res.status || typeof body.message !== 'string' || typeof body.error !== 'string' || typeof body.timestamp !== 'string' || typeof body.path !== 'string') return 'not Daytona {statusCode,message,error,timestamp,path}';
      if (api === 'daytona-toolbox' && typeof body.method !== 'string') return 'Daytona toolbox error without method';
      return undefined;
    case 'e2b':
    case 'envd-http':
      return body.code === res.status && typeof body.message === 'string' ? undefined : 'not E2B {code: status, message}';
    case 'connect':
      return typeof body.code === 'string' && CONNECT_CODES.has(body.code) ? undefined : 'not a Connect error {code, message}';
  }
  return undefined;
}

/**
 * Text that must never appear in an answer: SQL (knex quotes it with $n placeholders), stack
 * frames, and paths of this host (the data dir, the checkout, node_modules, the image store).
 */
export function leakProblem(text: string, hostPaths: string[]): string | undefined {
  if (/\b(select|insert into|update|delete from)\b[^"]{0,400}\$\d/i.test(text)) return 'SQL in the body';
  if (/invalid byte sequence for encoding|violates (not-null|check|foreign key|unique) constraint|syntax error at or near/i.test(text)) return 'database error text in the body';
  if (/\n\s+at .+[:(]\d+:\d+\)?/.test(text) || /at [\w.<>]+ \((file:\/\/)?\/[^)]+:\d+:\d+\)/.test(text)) return 'a stack trace in the body';
  for (const p of hostPaths) if (p && text.includes(p)) return `host path ${p} in the body`;
  if (text.includes('node_modules')) return 'node_modules path in the body';
  return undefined;
}

/** Resident set size of a process, from /proc (bytes). */
export function rssOf(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

/** Direct children of this process whose command line mentions `needle` (the local host agent). */
export function childPids(needle: string): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== process.pid) continue;
      if (readFileSync(`/proc/${entry}/cmdline`, 'utf8').includes(needle)) out.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}
