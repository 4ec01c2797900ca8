// HTTP-only plumbing of the native handlers that call the toolbox (core/services/toolbox.ts):
// reading validated parameters, the streamed request body, the client-gone signal, and writing
// the toolbox's typed streams back with their headers and backpressure. No guest path, no
// guest body: those belong to the typed guest client behind core.
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { NestboxError } from '../../../core/errors.js';
import type { ByteStream, CallOptions, StreamHeaders } from '../../../core/guest.js';
import type { NativeContext } from './context.js';
import { clientGoneSignal, streamedBody } from '../../../http-kit/request-body.js';
import { principalOf, queryString, sandboxIdOf } from './context.js';

/** A client that goes away cancels the guest call (and whatever it was doing). */
export function untilClientGone(ctx: NativeContext): CallOptions {
  return { signal: clientGoneSignal(ctx.req, ctx.res) };
}

/** A validated path parameter. */
export function param(ctx: NativeContext, name: string): string {
  return String(ctx.api.request.params[name]);
}

/** A validated JSON body (the spec has checked its shape). */
export function jsonBody<T>(ctx: NativeContext): T {
  return (ctx.api.request.requestBody ?? {}) as T;
}

export function queryNumber(ctx: NativeContext, name: string): number | undefined {
  const v = queryString(ctx, name);
  return v === undefined ? undefined : Number(v);
}

export function queryBoolean(ctx: NativeContext, name: string): boolean | undefined {
  const v = queryString(ctx, name);
  return v === undefined ? undefined : v === 'true';
}

/** The raw request body, cut at `maxBytes` (413 up front when the declared length is larger). */
export function rawBody(ctx: NativeContext, maxBytes = ctx.services.config.limits.maxUploadBytes): Readable {
  const declared = Number(ctx.req.headers['content-length'] ?? 0);
  if (declared > maxBytes) throw new NestboxError('payload_too_large', `body: ${declared} bytes exceeds the limit of ${maxBytes} bytes`);
  // Never the bare request: see request-body.ts for why every streamed body goes through it.
  return streamedBody(ctx.req, maxBytes);
}

/**
 * Server-Sent Events only: the stream routes answer a plain GET with a 400 naming `accept`
 * (a WebSocket upgrade is the other way in, see websocket.ts).
 */
export function requireEventStream(ctx: NativeContext, pattern: RegExp, message: string): void {
  if (!pattern.test(String(ctx.req.headers.accept ?? ''))) throw new NestboxError('validation_failed', `accept: ${message}`);
}

/** A long-lived stream: counted against the stream caps until the response closes (429 beyond). */
export function countStream(ctx: NativeContext): void {
  ctx.services.streams.acquireUntilClosed({ keyId: principalOf(ctx).keyId, sandboxId: sandboxIdOf(ctx) }, ctx.res);
}

const HEADER_NAMES: Record<keyof StreamHeaders, string> = {
  contentType: 'content-type',
  contentLength: 'content-length',
  contentRange: 'content-range',
  acceptRanges: 'accept-ranges',
  contentDisposition: 'content-disposition',
  cacheControl: 'cache-control',
};

/** Writes a toolbox stream out as it comes (Server-Sent Events flushed at once). */
export async function sendStream(ctx: NativeContext, stream: ByteStream): Promise<void> {
  ctx.res.status(stream.status);
  for (const [key, name] of Object.entries(HEADER_NAMES) as [keyof StreamHeaders, string][]) {
    const value = stream.headers[key];
    if (value !== undefined) ctx.res.setHeader(name, value);
  }
  if ((stream.headers.contentType ?? '').startsWith('text/event-stream')) ctx.res.flushHeaders();
  await pipeline(stream.body, ctx.res);
}
