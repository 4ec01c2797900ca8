// HTTP/1.1 reverse proxying shared by both hops of a hosted port (control plane → host agent →
// sandbox). Bodies stream both ways and are never buffered; an upgrade (WebSocket or any other
// protocol) becomes a byte-for-byte relay once the upstream answers 101, so framing, subprotocols
// and extensions are the two ends' business.
import http from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { pipeline } from 'node:stream/promises';

/** Headers that describe one connection, not the message (RFC 9110 §7.6.1), never forwarded. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

export interface ProxyTarget {
  host: string;
  port: number;
  /** Path and query as the upstream should see them. */
  path: string;
  /** The request headers to send (see `forwardableHeaders`). */
  headers: http.OutgoingHttpHeaders;
  agent?: http.Agent | false;
  /** Give up connecting (not the whole request) after this long. */
  connectTimeoutMs?: number;
}

/**
 * The request's end-to-end headers: hop-by-hop ones, those the Connection header names, and
 * `drop` (lower case) removed. Raw pairs keep repeated headers (cookies) as they came.
 */
export function forwardableHeaders(req: http.IncomingMessage, drop: readonly string[] = []): http.OutgoingHttpHeaders {
  const named = new Set(
    String(req.headers.connection ?? '')
      .split(',')
      .map((token) => token.trim().toLowerCase())
      .filter(Boolean),
  );
  const out: http.OutgoingHttpHeaders = {};
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i].toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name) || drop.includes(name)) continue;
    const value = req.rawHeaders[i + 1];
    const existing = out[name];
    if (existing === undefined) out[name] = value;
    else if (name === 'cookie') out[name] = `${String(existing)}; ${value}`;
    else out[name] = Array.isArray(existing) ? [...existing, value] : [String(existing), value];
  }
  return out;
}

/** Response headers to pass back (raw pairs, so several Set-Cookie stay several). */
export function forwardableResponseHeaders(res: http.IncomingMessage, drop: readonly string[] = []): string[] {
  const named = new Set(
    String(res.headers.connection ?? '')
      .split(',')
      .map((token) => token.trim().toLowerCase())
      .filter(Boolean),
  );
  const out: string[] = [];
  for (let i = 0; i < res.rawHeaders.length; i += 2) {
    const name = res.rawHeaders[i].toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name) || drop.includes(name)) continue;
    out.push(res.rawHeaders[i], res.rawHeaders[i + 1]);
  }
  return out;
}

export interface ProxyHttpHooks {
  /** Nothing answered (refused, unreachable, reset before a response): answer the client. */
  onUpstreamError(error: NodeJS.ErrnoException): void;
  /** Extra response headers (raw pairs), or a veto that answers the client some other way. */
  onResponse?(upstream: http.IncomingMessage): { headers?: string[]; handled?: boolean } | void;
  /** Response headers never passed back, lower case. */
  dropResponseHeaders?: readonly string[];
  /** Rewrites the upstream's header pairs (raw, as passed back) before they reach the client. */
  rewriteResponseHeaders?(raw: string[]): string[];
}

/** Streams `req` to the target and the answer back to `res`; a client that leaves aborts upstream. */
export function proxyHttp(req: http.IncomingMessage, res: http.ServerResponse, target: ProxyTarget, hooks: ProxyHttpHooks): void {
  const upstreamReq = http.request({ host: target.host, port: target.port, method: req.method, path: target.path, headers: target.headers, agent: target.agent });
  let connectTimer: NodeJS.Timeout | undefined;
  if (target.connectTimeoutMs) {
    connectTimer = setTimeout(() => upstreamReq.destroy(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), target.connectTimeoutMs);
    upstreamReq.once('socket', (socket) => {
      // A reused keep-alive socket is connected already.
      if (!socket.connecting) clearTimeout(connectTimer);
      else socket.once('connect', () => clearTimeout(connectTimer));
    });
  }
  upstreamReq.once('response', (upstream) => {
    clearTimeout(connectTimer);
    const extra = hooks.onResponse?.(upstream);
    if (extra?.handled) {
      upstream.resume();
      return;
    }
    const passed = forwardableResponseHeaders(upstream, hooks.dropResponseHeaders);
    const headers = [...(hooks.rewriteResponseHeaders?.(passed) ?? passed), ...(extra?.headers ?? [])];
    res.writeHead(upstream.statusCode ?? 502, upstream.statusMessage, headers);
    pipeline(upstream, res).catch(() => res.destroy());
  });
  upstreamReq.once('error', (error: NodeJS.ErrnoException) => {
    clearTimeout(connectTimer);
    if (res.headersSent) res.destroy();
    else hooks.onUpstreamError(error);
  });
  res.once('close', () => {
    if (!res.writableFinished) upstreamReq.destroy();
  });
  // A request without a body is sent at once (headers in one write), not after the client's
  // empty stream has been read to its end.
  if (req.headers['content-length'] === undefined && req.headers['transfer-encoding'] === undefined) {
    req.resume();
    upstreamReq.end();
  } else {
    pipeline(req, upstreamReq).catch(() => upstreamReq.destroy());
  }
}

export interface ProxyUpgradeHooks {
  onUpstreamError(error: NodeJS.ErrnoException): void;
  /** The upstream refused the upgrade with an ordinary response (relayed as is unless this handles it). */
  onRefused?(upstream: http.IncomingMessage, body: Buffer): boolean | void;
  /** Both sides are connected (the relay runs until either closes). */
  onOpen?(done: Promise<void>): void;
  /** Rewrites the upstream's header pairs (101 or refusal) before they reach the client. */
  rewriteResponseHeaders?(raw: string[]): string[];
}

const MAX_REFUSAL_BODY = 64 * 1024;

/** Relays an upgrade request; once the upstream says 101, bytes flow both ways untouched. */
export function proxyUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer, target: ProxyTarget, hooks: ProxyUpgradeHooks): void {
  const headers = { ...target.headers, connection: 'upgrade', upgrade: String(req.headers.upgrade ?? 'websocket') };
  const upstreamReq = http.request({ host: target.host, port: target.port, method: req.method, path: target.path, headers, agent: false });
  let connectTimer: NodeJS.Timeout | undefined;
  if (target.connectTimeoutMs) {
    connectTimer = setTimeout(() => upstreamReq.destroy(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), target.connectTimeoutMs);
  }
  socket.once('error', () => upstreamReq.destroy());
  upstreamReq.once('upgrade', (upstream, upstreamSocket, upstreamHead) => {
    clearTimeout(connectTimer);
    const lines = [`HTTP/1.1 ${upstream.statusCode ?? 101} ${upstream.statusMessage || STATUS_CODES[upstream.statusCode ?? 101] || ''}`];
    const raw = hooks.rewriteResponseHeaders?.(upstream.rawHeaders) ?? upstream.rawHeaders;
    for (let i = 0; i < raw.length; i += 2) lines.push(`${raw[i]}: ${raw[i + 1]}`);
    socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (upstreamHead.length) socket.write(upstreamHead);
    if (head.length) upstreamSocket.write(head);
    const done = new Promise<void>((resolve) => {
      const close = () => {
        upstreamSocket.destroy();
        socket.destroy();
        resolve();
      };
      upstreamSocket.once('close', close);
      socket.once('close', close);
      upstreamSocket.once('error', close);
      socket.once('error', close);
      // HTTP server sockets allow half-open connections, so a peer's FIN alone closes nothing:
      // a client that hangs up would leave both hops open for as long as the far end stays
      // (holding descriptors and a stream slot). Either side ending ends the relay, once what
      // is already buffered has been written.
      const finish = () => {
        (upstreamSocket as Duplex & { destroySoon?: () => void }).destroySoon?.() ?? upstreamSocket.end();
        (socket as Duplex & { destroySoon?: () => void }).destroySoon?.() ?? socket.end();
      };
      upstreamSocket.once('end', finish);
      socket.once('end', finish);
    });
    upstreamSocket.pipe(socket);
    socket.pipe(upstreamSocket);
    hooks.onOpen?.(done);
  });
  upstreamReq.once('response', (upstream) => {
    clearTimeout(connectTimer);
    const chunks: Buffer[] = [];
    let size = 0;
    upstream.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= MAX_REFUSAL_BODY) chunks.push(chunk);
    });
    upstream.once('end', () => {
      const body = Buffer.concat(chunks);
      if (hooks.onRefused?.(upstream, body)) return;
      const lines = [`HTTP/1.1 ${upstream.statusCode ?? 502} ${upstream.statusMessage || STATUS_CODES[upstream.statusCode ?? 502] || ''}`];
      const forwardable = forwardableResponseHeaders(upstream, ['content-length']);
      const passed = hooks.rewriteResponseHeaders?.(forwardable) ?? forwardable;
      for (let i = 0; i < passed.length; i += 2) lines.push(`${passed[i]}: ${passed[i + 1]}`);
      lines.push(`content-length: ${body.length}`, 'connection: close');
      socket.end(Buffer.concat([Buffer.from(`${lines.join('\r\n')}\r\n\r\n`), body]));
    });
    upstream.once('error', () => socket.destroy());
  });
  upstreamReq.once('error', (error: NodeJS.ErrnoException) => {
    clearTimeout(connectTimer);
    hooks.onUpstreamError(error);
  });
  upstreamReq.end();
}

/** An HTTP answer written straight onto a socket that was never upgraded. */
export function writeRawResponse(socket: Duplex, status: number, headers: Record<string, string>, body: string): void {
  const lines = [`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}`];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  lines.push(`content-length: ${Buffer.byteLength(body)}`, 'connection: close');
  socket.end(`${lines.join('\r\n')}\r\n\r\n${body}`);
}
