// The one error catalogue. Every failure that crosses a layer is a NestboxError with a code
// from this table; each front door (native, Daytona, E2B) renders the same object in its own
// shape, so the status code is decided once, here.

export const ERROR_CATALOGUE = {
  validation_failed: { status: 400, title: 'The request is invalid' },
  unauthorized: { status: 401, title: 'Missing or invalid credentials' },
  forbidden: { status: 403, title: 'The credentials do not allow this' },
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
  /** An organisation limit (sandboxes, vCPUs, memory): a 429 whose Retry-After is `retryAfterSeconds`. */
  quotaExceeded(limit: string, message: string, details: { max: number; current: number; requested: number; retryAfterSeconds: number }): NestboxError {
    return new NestboxError('quota_exceeded', message, { limit, ...details });
  },
};

/** Seconds a 429 asks the client to wait (`Retry-After`): from the error's details, else 1. */
export function retryAfterSeconds(err: NestboxError): number {
  const value = err.details?.retryAfterSeconds;
  return typeof value === 'number' && Number.isInteger(value) && value > 0 ? value : 1;
}

/** Turn anything thrown into a NestboxError without leaking internals for unexpected errors. */
export function toNestboxError(err: unknown): NestboxError {
  if (err instanceof NestboxError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new NestboxError('internal', message);
}
