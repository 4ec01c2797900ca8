// Native operations that are served by the sandbox's guest agent share one shape: check the
// caller (core), build the guest path, stream the request body in and the answer back out.
// Guest-agent errors already have the native shape ({error:{code,message}}), so they pass
// through unchanged.
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { NestboxError } from '../../../core/errors.js';
import { SCOPES, type Scope } from '../../../core/types.js';
import type { NativeContext } from './context.js';
import { clientGoneSignal, streamedBody } from '../request-body.js';
import { keepActiveWhileOpen } from './websocket.js';
import { principalOf, sandboxIdOf } from './context.js';

export interface ForwardOptions {
  method?: string;
  /** Guest-agent path without the query, e.g. `/processes/p1/output`. */
  path: string;
  /** Query parameters passed through by name (only those present). */
  query?: readonly string[];
  /** `json`: the validated JSON body; `raw`: the request stream as is; default none. */
  body?: 'json' | 'raw';
  /** Replace the validated JSON body (after light translation by the handler). */
  jsonBody?: unknown;
  /** Used in the "cannot … a stopped sandbox" message. */
  operation: string;
  /** Answer with this status instead of the guest agent's when it succeeded (e.g. 202 for detach). */
  successStatus?: number;
  /** Upper bound for a raw body; more is a 413 while streaming. */
  maxBodyBytes?: number;
  /** A read of files that a stopped sandbox can answer too (from a read-only view of its disk). */
  fileRead?: boolean;
  /** A long-lived stream (Server-Sent Events): counted against the stream caps while open. */
  stream?: boolean;
}

const PASSED_RESPONSE_HEADERS = ['content-type', 'content-length', 'content-range', 'accept-ranges', 'content-disposition', 'cache-control'];
const PASSED_REQUEST_HEADERS = ['content-type', 'content-length', 'range', 'accept'];

export function scopeOf(ctx: NativeContext): Scope {
  const scope = (ctx.api.operation as { 'x-nestbox-scope'?: string })['x-nestbox-scope'];
  if (!scope || !SCOPES.includes(scope as Scope)) throw new NestboxError('internal', `operation ${ctx.api.operation.operationId} has no scope`);
  return scope as Scope;
}

export function guestQuery(ctx: NativeContext, names: readonly string[]): string {
  const params = new URLSearchParams();
  for (const name of names) {
    const value = ctx.req.query[name];
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) params.append(name, String(v));
  }
  const text = params.toString();
  return text ? `?${text}` : '';
}

export async function forwardToAgent(ctx: NativeContext, o: ForwardOptions): Promise<void> {
  const headers: Record<string, string> = {};
  let body: Buffer | Readable | undefined;
  if (o.body === 'raw') {
    for (const name of PASSED_REQUEST_HEADERS) {
      const v = ctx.req.headers[name];
      if (typeof v === 'string') headers[name] = v;
    }
    const max = o.maxBodyBytes ?? ctx.services.config.limits.maxUploadBytes;
    const declared = Number(ctx.req.headers['content-length'] ?? 0);
    if (declared > max) throw new NestboxError('payload_too_large', `body: ${declared} bytes exceeds the limit of ${max} bytes`);
    // Sent on chunked: the limiter may cut the body short, and the upstream must then see an
    // incomplete request rather than a short one.
    delete headers['content-length'];
    // Never the bare request: see request-body.ts for why every streamed body goes through it.
    body = streamedBody(ctx.req, max);
  } else {
    const accept = ctx.req.headers.accept;
    if (typeof accept === 'string') headers.accept = accept;
    if (typeof ctx.req.headers.range === 'string') headers.range = ctx.req.headers.range;
    if (o.body === 'json' || o.jsonBody !== undefined) {
      body = Buffer.from(JSON.stringify(o.jsonBody ?? ctx.api.request.requestBody ?? {}));
      headers['content-type'] = 'application/json';
    }
  }
  if (o.stream) ctx.services.streams.acquireUntilClosed({ keyId: principalOf(ctx).keyId, sandboxId: sandboxIdOf(ctx) }, ctx.res);
  // A client that goes away cancels the guest-agent request (and whatever it was doing).
  const signal = clientGoneSignal(ctx.req, ctx.res);
  const request = { method: o.method ?? ctx.req.method, path: o.path + guestQuery(ctx, o.query ?? []), headers, body, signal };
  const { sandboxes } = ctx.services;
  const upstream = o.fileRead
    ? await sandboxes.fileReadRequest(principalOf(ctx), sandboxIdOf(ctx), o.operation, request)
    : await sandboxes.agentRequest(principalOf(ctx), sandboxIdOf(ctx), scopeOf(ctx), o.operation, request);
  const status = upstream.statusCode ?? 502;
  ctx.res.status(o.successStatus && status < 300 ? o.successStatus : status);
  for (const name of PASSED_RESPONSE_HEADERS) {
    const v = upstream.headers[name];
    if (v !== undefined) ctx.res.setHeader(name, v);
  }
  // Server-sent events must reach the client as they happen, and an open stream is activity.
  if (String(upstream.headers['content-type'] ?? '').startsWith('text/event-stream')) {
    ctx.res.flushHeaders();
    keepActiveWhileOpen(ctx.services, sandboxIdOf(ctx), (stop) => ctx.res.once('close', stop));
  }
  await pipeline(upstream, ctx.res);
}

/** Path segment from a validated path parameter. */
export function param(ctx: NativeContext, name: string): string {
  return encodeURIComponent(String(ctx.api.request.params[name]));
}
