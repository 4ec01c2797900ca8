// Calls into a sandbox's guest agent, always through core (scope, visibility, running state and
// activity are core's business; sandboxes.agentRequest). Only request shaping lives here.
import { serverSentEvents } from '../../host/protocol/sse.js';
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import { isErrorCode, NestboxError } from '../../core/errors.js';
import type { Principal, Scope } from '../../core/types.js';
import type { Services } from '../../src/services.js';

/** Who acts on which sandbox, resolved once per request by the router. */
export interface SandboxTarget {
  principal: Principal;
  sandboxId: string;
}

export interface GuestCall {
  scope: Scope;
  /** Used in core's "cannot … a stopped sandbox" message. */
  operation: string;
  method: string;
  /** Guest-agent path with query. */
  path: string;
  json?: unknown;
  body?: Readable | Buffer;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Reads that core may serve from a stopped sandbox's disk. */
  fileRead?: boolean;
}

export async function guestRequest(services: Services, target: SandboxTarget, call: GuestCall): Promise<IncomingMessage> {
  const headers = { ...call.headers };
  let body = call.body;
  if (call.json !== undefined) {
    body = Buffer.from(JSON.stringify(call.json));
    headers['content-type'] = 'application/json';
  }
  const request = { method: call.method, path: call.path, headers, body, signal: call.signal };
  return call.fileRead
    ? services.sandboxes.fileReadRequest(target.principal, target.sandboxId, call.operation, request)
    : services.sandboxes.agentRequest(target.principal, target.sandboxId, call.scope, call.operation, request);
}

export async function readAll(res: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** The guest agent's `{error:{code,message}}` (or the host agent's, same shape) as a core error. */
export async function guestError(res: IncomingMessage): Promise<NestboxError> {
  const text = (await readAll(res)).toString('utf8');
  try {
    const parsed = JSON.parse(text) as { error?: { code?: string; message?: string } };
    const code = parsed.error?.code ?? '';
    if (isErrorCode(code)) return new NestboxError(code, parsed.error?.message ?? code);
  } catch {
    // Not JSON: fall through to a status-based error.
  }
  const status = res.statusCode ?? 500;
  const code = status === 404 ? 'not_found' : status === 409 ? 'conflict' : status === 400 ? 'validation_failed' : 'internal';
  return new NestboxError(code, text || `the sandbox's agent answered ${status}`);
}

/** A JSON guest call; non-2xx becomes the matching core error. 204 gives undefined. */
export async function guestJson<T>(services: Services, target: SandboxTarget, call: GuestCall): Promise<{ status: number; body: T }> {
  const res = await guestRequest(services, target, call);
  const status = res.statusCode ?? 502;
  if (status >= 400) throw await guestError(res);
  const raw = await readAll(res);
  return { status, body: (raw.length ? JSON.parse(raw.toString('utf8')) : undefined) as T };
}


/** Open a guest SSE route (`Accept: text/event-stream`); errors before the stream are core errors. */
export async function guestEvents<T>(services: Services, target: SandboxTarget, call: Omit<GuestCall, 'method'>): Promise<AsyncGenerator<T>> {
  const res = await guestRequest(services, target, { ...call, method: 'GET', headers: { ...call.headers, accept: 'text/event-stream' } });
  if ((res.statusCode ?? 502) >= 400) throw await guestError(res);
  return serverSentEvents<T>(res);
}

/**
 * E2B paths may start with `~` (the user's home); the guest agent resolves relative paths
 * against the home, so `~/x` becomes `x` (e2b.md (d) GET /files: "starting with ~/").
 */
export function guestPath(path: string): string {
  if (path === '~') return '.';
  if (path.startsWith('~/')) return path.slice(2) || '.';
  return path;
}
