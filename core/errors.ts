// The one error catalogue. Every failure that crosses a layer is a NestboxError with a code
// from this table; each front door (native, Daytona, E2B) renders the same object in its own
// shape, so the status code is decided once, here.
import type { Logger } from './logger.js';

export const ERROR_CATALOGUE = {
  validation_failed: { status: 400, title: 'The request is invalid' },
  unauthorized: { status: 401, title: 'Missing or invalid credentials' },
  forbidden: { status: 403, title: 'The credentials do not allow this' },
  // The caller's organisation is suspended by the platform operator: every key and credential of
  // it is refused, whatever it asks, until the organisation is unsuspended.
  organization_suspended: { status: 403, title: 'The organisation is suspended' },
  not_found: { status: 404, title: 'Not found' },
  method_not_allowed: { status: 405, title: 'Method not allowed' },
  invalid_state: { status: 409, title: 'The object is not in a state that allows this' },
  conflict: { status: 409, title: 'Conflict' },
  payload_too_large: { status: 413, title: 'The request body is too large' },
  unsupported_media_type: { status: 415, title: 'Unsupported content type' },
  range_not_satisfiable: { status: 416, title: 'The requested byte range is outside the file' },
  limit_reached: { status: 429, title: 'A limit was reached' },
  rate_limited: { status: 429, title: 'Too many requests' },
  quota_exceeded: { status: 429, title: 'An organisation quota was reached' },
  internal: { status: 500, title: 'Internal error' },
  not_supported: { status: 501, title: 'Not supported' },
  host_unavailable: { status: 503, title: 'The sandbox host is not reachable' },
  // Something answered on the guest agent's channel without the per-boot proof that it is the
  // agent (a workload impersonating it, or an agent that lost its key): never passed on.
  agent_unavailable: { status: 502, title: "The sandbox's agent did not answer as itself" },
  insufficient_storage: { status: 507, title: "The sandbox's disk is full" },
  timeout: { status: 504, title: 'The operation timed out' },
  // No live host has room for the request (capacity × overcommit − reserve − what is placed):
  // a 503 with Retry-After; room comes back as sandboxes stop or hosts are added.
  capacity_exhausted: { status: 503, title: 'No host has room for this sandbox right now' },
} as const;

export type ErrorCode = keyof typeof ERROR_CATALOGUE;

export function isErrorCode(code: string): code is ErrorCode {
  return Object.prototype.hasOwnProperty.call(ERROR_CATALOGUE, code);
}

export class NestboxError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details?: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = 'NestboxError';
    this.code = code;
    this.status = ERROR_CATALOGUE[code].status;
    this.details = details;
  }

  toJSON(): { code: ErrorCode; message: string; details?: Record<string, unknown> } {
    return this.details
      ? { code: this.code, message: this.message, details: this.details }
      : { code: this.code, message: this.message };
  }
}

export const errors = {
  validation(field: string, problem: string): NestboxError {
    return new NestboxError('validation_failed', `${field}: ${problem}`, { field });
  },
  notFound(kind: string, id: string): NestboxError {
    return new NestboxError('not_found', `${kind} ${id} not found`, { kind, id });
  },
  /** A state conflict names both the state the object is in and the state(s) the operation needs. */
  invalidState(kind: string, id: string, current: string, wanted: readonly string[], operation: string): NestboxError {
    return new NestboxError(
      'invalid_state',
      `cannot ${operation} ${kind} ${id}: it is ${current} (needs ${wanted.join(' or ')})`,
      { kind, id, state: current, wanted: [...wanted], operation },
    );
  },
  unauthorized(message = 'missing or invalid API key'): NestboxError {
    return new NestboxError('unauthorized', message);
  },
  forbidden(message: string): NestboxError {
    return new NestboxError('forbidden', message);
  },
  internal(message: string): NestboxError {
    return new NestboxError('internal', message);
  },
  organizationSuspended(organizationId: string): NestboxError {
    return new NestboxError('organization_suspended', `organisation ${organizationId} is suspended; ask the platform operator to unsuspend it`, { organizationId });
  },
  /** An organisation limit (sandboxes, vCPUs, memory): a 429 whose Retry-After is `retryAfterSeconds`. */
  quotaExceeded(limit: string, message: string, details: { max: number; current: number; requested: number; retryAfterSeconds: number }): NestboxError {
    return new NestboxError('quota_exceeded', message, { limit, ...details });
  },
};

/** Whether an answer carries `Retry-After`: every 429, and a 503 capacity_exhausted. */
export function hasRetryAfter(err: NestboxError): boolean {
  return err.status === 429 || err.code === 'capacity_exhausted';
}

/** Seconds a 429 asks the client to wait (`Retry-After`): from the error's details, else 1. */
export function retryAfterSeconds(err: NestboxError): number {
  const value = err.details?.retryAfterSeconds;
  return typeof value === 'number' && Number.isInteger(value) && value > 0 ? value : 1;
}


/** What a client sees for every 500: the details stay in the server log, under this reference. */
export const INTERNAL_ERROR_MESSAGE = 'internal error; the server log has the details';

/** body-parser / http-errors objects: `status` + `expose` mean the message was written for clients. */
interface HttpError {
  status?: number;
  statusCode?: number;
  expose?: boolean;
  type?: string;
  message?: string;
}

const CLIENT_ERROR_CODES: Record<number, ErrorCode> = {
  400: 'validation_failed',
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  405: 'method_not_allowed',
  409: 'conflict',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  416: 'range_not_satisfiable',
  429: 'rate_limited',
};

/** A client mistake reported by express or body-parser (bad JSON, unknown charset, bad percent-encoding in a route parameter…). */
function fromHttpError(err: HttpError): NestboxError | undefined {
  const status = err.status ?? err.statusCode;
  if (typeof status !== 'number' || status < 400 || status >= 500 || err.expose !== true) return undefined;
  const code = CLIENT_ERROR_CODES[status] ?? 'validation_failed';
  switch (err.type) {
    case 'entity.parse.failed':
      return new NestboxError('validation_failed', 'body: is not valid JSON', { field: 'body' });
    case 'entity.too.large':
      return new NestboxError('payload_too_large', 'body: is larger than this route accepts', { field: 'body' });
    case 'charset.unsupported':
      return new NestboxError('unsupported_media_type', `content-type: ${err.message ?? 'unsupported charset'}; send UTF-8`, { field: 'content-type' });
    case 'encoding.unsupported':
      return new NestboxError('unsupported_media_type', `content-encoding: ${err.message ?? 'unsupported'}`, { field: 'content-encoding' });
    case 'request.aborted':
    case 'request.size.invalid':
      return new NestboxError('validation_failed', 'body: ended before its declared length', { field: 'body' });
    default:
      return new NestboxError(code, err.message ?? ERROR_CATALOGUE[code].title);
  }
}

/**
 * PostgreSQL "data exception" errors (SQLSTATE class 22: NUL bytes or invalid UTF-8 in text,
 * numbers out of range, malformed values) are always caused by a value the client sent that
 * no validation caught. They are the client's mistake (400), and their text (which quotes the
 * SQL) never reaches the client. PGlite raises the same codes.
 */
function fromDatabaseDataError(err: { code?: unknown }): NestboxError | undefined {
  if (typeof err.code !== 'string' || !/^22[0-9A-Z]{3}$/.test(err.code)) return undefined;
  const problem: Record<string, string> = {
    '22021': 'a text value contains a NUL byte or invalid UTF-8',
    '22P05': 'a text value contains a NUL byte or a character that cannot be stored',
    '22003': 'a number is out of range',
    '22001': 'a text value is too long',
    '22P02': 'a value is not in the expected form',
    '22007': 'a date or time is not valid',
    '22008': 'a date or time is out of range',
  };
  return new NestboxError('validation_failed', `request: ${problem[err.code] ?? 'a value is not valid'}`);
}

/**
 * Turn anything thrown into a NestboxError. Errors Nestbox did not raise itself (a bug, a
 * library's surprise) become `internal`, keeping their text for logs and the original as
 * `cause`; that text may quote SQL, stack frames or host paths, so front doors render errors
 * through publicError, never this directly.
 */
export function toNestboxError(err: unknown): NestboxError {
  if (err instanceof NestboxError) return err;
  // decodeURIComponent / encodeURIComponent only throw on what a client sent: malformed
  // percent-encoding, or text with an unpaired UTF-16 surrogate (possible in JSON strings).
  if (err instanceof URIError) return new NestboxError('validation_failed', 'request: a value is not valid percent-encoded UTF-8 (or holds an unpaired surrogate)');
  if (err && typeof err === 'object') {
    const known = fromHttpError(err as HttpError) ?? fromDatabaseDataError(err as { code?: unknown });
    if (known) return known;
  }
  const internal = new NestboxError('internal', err instanceof Error ? err.message : String(err));
  (internal as { cause?: unknown }).cause = err;
  return internal;
}

let internalErrorCount = 0;

/**
 * The error a front door may show a client: the last-resort guard of every API's error
 * renderer. 4xx and the meaningful 5xx (501, 502, 503, 504, 507) keep their message; a 500
 * (whatever raised it: a bug, or a lower layer's `internal` whose text may quote host paths)
 * is logged in full with a reference and shown only as that reference.
 */
export function publicError(err: unknown, log?: Pick<Logger, 'error'>, where = 'api'): NestboxError {
  const e = toNestboxError(err);
  if (e.status !== 500) return e;
  const ref = `${Date.now().toString(36)}-${(++internalErrorCount).toString(36)}`;
  const cause = (e as { cause?: unknown }).cause ?? e;
  const summary = `${where}: internal error ${ref}: ${e === cause ? '' : `${e.message}: `}${cause instanceof Error ? cause.message : String(cause)}`;
  // The stack travels in `err`, the reference as a field to search by. Without a logger (a
  // caller outside any server), stderr still gets the whole story.
  if (log) log.error({ reference: ref, err: cause }, summary);
  else console.error(`${summary}${cause instanceof Error && cause.stack ? `\n${cause.stack}` : ''}`);
  return new NestboxError('internal', `${INTERNAL_ERROR_MESSAGE} (reference ${ref})`, { reference: ref });
}

/**
 * The code an HTTP status stands for when an answer carries no code of this catalogue (an
 * unknown code from a newer peer, a proxy's HTML page, an empty body): the same for every hop,
 * so a 409 is a `conflict` whichever path it took.
 */
const STATUS_FALLBACK_CODES: Record<number, ErrorCode> = {
  ...CLIENT_ERROR_CODES,
  501: 'not_supported',
  503: 'host_unavailable',
  504: 'timeout',
  507: 'insufficient_storage',
};

/** Upper bound of an error body worth reading (errors are a line of JSON). */
export const MAX_ERROR_BODY_BYTES = 64 * 1024;

/**
 * THE decoder of the `{error:{code,message,details?}}` answers that host agents and guest
 * agents send (every hop: control plane ← host agent ← guest agent, and the files view).
 * A code of this catalogue is kept with its message and details; anything else is named by
 * its HTTP status (STATUS_FALLBACK_CODES; other 4xx `validation_failed`, other 5xx
 * `internal`), keeping the peer's message when it sent one. `who` names the peer in the
 * message of an answer without our shape.
 */
export function decodeErrorBody(status: number, body: string, who = 'the sandbox agent'): NestboxError {
  let code: unknown;
  let message: unknown;
  let details: unknown;
  try {
    const parsed = JSON.parse(body) as { error?: { code?: unknown; message?: unknown; details?: unknown } } | null;
    code = parsed?.error?.code;
    message = parsed?.error?.message;
    details = parsed?.error?.details;
  } catch {
    // Not JSON: described by the status below.
  }
  const text = typeof message === 'string' ? message : `${who} answered HTTP ${status}${body ? `: ${body.slice(0, 200)}` : ''}`;
  if (typeof code === 'string' && isErrorCode(code)) {
    const known = details && typeof details === 'object' && !Array.isArray(details) ? (details as Record<string, unknown>) : undefined;
    return new NestboxError(code, text, known);
  }
  const fallback = STATUS_FALLBACK_CODES[status] ?? (status >= 400 && status < 500 ? 'validation_failed' : 'internal');
  return new NestboxError(fallback, text);
}
