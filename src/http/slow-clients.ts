// Slow and stalled clients (slowloris): a connection that sends its request a byte at a time, or
// announces a body and stops sending it, or asks for an upgrade nobody answers, holds a socket
// (and, for a streamed body, an upstream request through the host agent to the guest) for as
// long as it likes. Three bounds, all configurable (src/config.ts, README "Configuration"):
//  - Node's own: headers within headersTimeout, the whole request within requestTimeout;
//  - a body that stops arriving for bodyIdleTimeout is cut (408), which also aborts whatever
//    it was being streamed into — time spent waiting on our side (a sandbox waking, a slow
//    disk: data we received but have not read yet) does not count against the client;
//  - an upgrade request not answered within upgradeTimeout has its socket closed.
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import type { NextFunction, Request, Response } from 'express';
import { NestboxError } from '../../core/errors.js';
import type { Config } from '../config.js';

/** Longer than the clients' idle pools (httpx 5 s, Node's agent and undici 4–5 s). */
const IDLE_KEEP_ALIVE_MS = 65_000;

export function applyServerTimeouts(server: http.Server, timeouts: Config['http']): void {
  server.headersTimeout = timeouts.headersTimeoutMs;
  server.requestTimeout = timeouts.requestTimeoutMs;
  // An idle keep-alive connection is closed by whichever side times out first. Node's default
  // (5 s) equals the idle expiry of Python's httpx pool (the e2b and daytona SDKs), so the server
  // could close a connection just as the client reused it: the request then failed with
  // ECONNRESET. The server holds idle connections longer than its clients do, as load balancers
  // do; each is still bounded by the process's descriptor limit and closed at shutdown.
  server.keepAliveTimeout = IDLE_KEEP_ALIVE_MS;
  // Node checks both deadlines on this interval; a short timeout (tests) needs a short check.
  const smallest = Math.min(timeouts.headersTimeoutMs, timeouts.requestTimeoutMs || Infinity);
  if (smallest < 30_000) (server as { connectionsCheckingInterval?: number }).connectionsCheckingInterval = Math.max(100, Math.floor(smallest / 4));
}

function hasBody(req: http.IncomingMessage): boolean {
  const length = req.headers['content-length'];
  return (length !== undefined && length !== '0') || req.headers['transfer-encoding'] !== undefined;
}

/**
 * Cut a request whose body stalls for `idleMs`. Watches the socket's byte count rather than the
 * body stream, so it never changes how the body is read (no 'data' listener, no flowing mode).
 */
export function watchBodyIdle(req: http.IncomingMessage, res: http.ServerResponse, idleMs: number): void {
  if (!hasBody(req) || req.complete) return;
  const socket = req.socket;
  let seenBytes = socket.bytesRead;
  let quietSince = Date.now();
  const stop = () => clearInterval(timer);
  const timer = setInterval(() => {
    if (req.complete || req.destroyed || socket.destroyed) return stop();
    if (socket.bytesRead !== seenBytes || req.readableLength > 0 || req.readableFlowing === false) {
      // Bytes came in, or we hold bytes nobody has read yet, or the reader paused the body
      // (backpressure from upstream): the wait is ours, not the client's.
      seenBytes = socket.bytesRead;
      quietSince = Date.now();
      return;
    }
    if (Date.now() - quietSince < idleMs) return;
    stop();
    const error = new NestboxError('timeout', `body: no data arrived for ${idleMs} ms; the request was cut off`);
    if (!res.headersSent && socket.writable) {
      const text = JSON.stringify({ error: error.toJSON() });
      socket.write(`HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`);
    }
    // The body stream fails with this error: its consumers (and the upstream request) stop too.
    req.destroy(error);
  }, Math.max(50, Math.min(1000, Math.floor(idleMs / 4))));
  timer.unref();
  req.once('end', stop);
  req.once('close', stop);
  res.once('close', stop);
}

/** Express middleware form of watchBodyIdle, mounted before every route. */
export function bodyIdleTimeout(idleMs: number) {
  return (req: Request, res: Response, next: NextFunction): void => {
    watchBodyIdle(req, res, idleMs);
    next();
  };
}

/**
 * Close an upgrade request's socket if nothing has been written to it within `timeoutMs`: no
 * 101, no refusal. Every answer (accept or refuse) writes to the socket first, so an answered
 * upgrade is never touched; the relay after a 101 has its own lifetime.
 */
export function guardUpgrades(server: http.Server, timeoutMs: number): void {
  server.on('upgrade', (_req: http.IncomingMessage, socket: Duplex & { bytesWritten?: number }) => {
    const timer = setTimeout(() => {
      if (!socket.destroyed && !socket.bytesWritten) socket.destroy();
    }, timeoutMs);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
  });
}
