// One id per HTTP request through the control plane, on a child logger every line about that
// request can use (`requestId`). A caller's own X-Request-Id (a proxy's or a client's) is kept
// when it is a plain token, so a line can be found by the id the caller already has; otherwise
// the id is a fresh UUID. The id is not echoed in the response: the answers stay as they were.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '../../core/logger.js';

export const REQUEST_ID_HEADER = 'x-request-id';
/** What a caller's id may look like: nothing that could forge a second field or a new line. */
const CALLER_ID = /^[A-Za-z0-9._:-]{1,128}$/;

const loggers = new WeakMap<IncomingMessage, Logger>();

/** What a front door learnt about a request once it routed and authenticated it. */
export interface RequestNotes {
  /** The operation (native operationId) the request is. */
  operation?: string;
  organizationId?: string;
  sandboxId?: string;
}
const notes = new WeakMap<IncomingMessage, RequestNotes>();

function requestIdFor(req: IncomingMessage): string {
  const given = req.headers[REQUEST_ID_HEADER];
  return typeof given === 'string' && CALLER_ID.test(given) ? given : randomUUID();
}

/**
 * Middleware (first in the app): gives the request its id and child logger, and writes one
 * debug line when the answer is finished (method, path without the query — signed URLs carry
 * secrets there — status, duration).
 */
export function assignRequestIds(logger: Logger) {
  return (req: IncomingMessage, res: ServerResponse, next: () => void): void => {
    const requestLog = logger.child({ requestId: requestIdFor(req) });
    loggers.set(req, requestLog);
    const started = performance.now();
    // Taken now: routers rewrite req.url on the way down.
    const path = (req.url ?? '').split('?', 1)[0];
    res.once('finish', () => {
      // On the request's logger as it is by then: with the organisation and sandbox once known.
      requestLogger(req, requestLog).debug({ method: req.method, path, status: res.statusCode, ms: Math.round(performance.now() - started) }, `${req.method} ${path} ${res.statusCode}`);
    });
    next();
  };
}

/**
 * Records who the request is from and what it is about (a front door calls this once it knows):
 * every later line on its logger, the finished-request line included, carries them.
 */
export function noteRequest(req: IncomingMessage, found: RequestNotes): void {
  notes.set(req, { ...notes.get(req), ...found });
  const log = loggers.get(req);
  const { organizationId, sandboxId } = found;
  if (!log || (organizationId === undefined && sandboxId === undefined)) return;
  loggers.set(req, log.child(sandboxId === undefined ? { organizationId } : organizationId === undefined ? { sandboxId } : { organizationId, sandboxId }));
}

/** What noteRequest recorded about `req`. */
export function requestNotes(req: IncomingMessage): RequestNotes | undefined {
  return notes.get(req);
}

/** The request's child logger (carrying its `requestId`), or `fallback` before one was assigned. */
export function requestLogger(req: IncomingMessage, fallback: Logger): Logger {
  return loggers.get(req) ?? fallback;
}
