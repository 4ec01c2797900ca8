// E2B's own error shapes for the same core errors (e2b.md section (f)). Core decides what went
// wrong and its status; this file only decides how E2B clients must see it.
import type { Response } from 'express';
import { Code, ConnectError } from '@connectrpc/connect';
import { NestboxError, publicError, hasRetryAfter, retryAfterSeconds, toNestboxError } from '../../core/errors.js';
import { clientHasGone } from '../../http-kit/request-checks.js';
import type { ErrorLog } from '../../core/logger.js';

/**
 * Control plane: `{code, message}` with `code` equal to the HTTP status, because the SDK reads
 * `code` from the body to tell 404 (SandboxNotFoundError / kill → false) and 409 (pause →
 * false) apart (e2b.md (f) "Observed trap").
 */
export function renderControlPlaneError(res: Response, err: unknown, log?: ErrorLog): void {
  // A client that went away mid-answer: nobody to tell, nothing internal to log.
  if (clientHasGone(res)) return void res.destroy();
  // The last-resort guard: a 500 shows only a reference, the log has the rest.
  const e = publicError(err, log, 'e2b control plane');
  if (res.headersSent) {
    res.destroy();
    return;
  }
  // The SDK waits Retry-After and retries (up to its `retries`), then raises RateLimitError.
  if (hasRetryAfter(e)) res.setHeader('Retry-After', String(retryAfterSeconds(e)));
  res.status(e.status).json({ code: e.status, message: e.message });
}

/** Does this error say that the sandbox itself is gone or not running (rather than a file or process)? */
export function isSandboxUnavailable(e: NestboxError): boolean {
  const kind = e.details?.kind;
  if (kind === 'sandbox' && (e.code === 'not_found' || e.code === 'invalid_state')) return true;
  return e.code === 'host_unavailable';
}

/**
 * envd plain HTTP (`/files`, `/health`): `{code, message}` too. A sandbox that is gone or not
 * running answers 502, as E2B's edge proxy does, which the SDK turns into TimeoutError
 * (e2b.md (f) "envd HTTP").
 */
export function renderEnvdHttpError(res: Response, err: unknown, log?: ErrorLog): void {
  if (clientHasGone(res)) return void res.destroy();
  const e = publicError(err, log, 'e2b envd');
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const status = isSandboxUnavailable(e) ? 502 : e.status;
  if (status === 429) res.setHeader('Retry-After', String(retryAfterSeconds(e)));
  res.status(status).json({ code: status, message: status === 502 ? unavailableMessage(e) : e.message });
}

/**
 * The message of a "sandbox not there" answer. E2B's proxy says the sandbox "was not found",
 * and the Python SDK reads exactly that to tell a sandbox that is gone (killed, timed out:
 * SandboxNotRunningException, and a health probe's `false`) from one it cannot reach.
 */
export function unavailableMessage(e: NestboxError): string {
  return e.details?.kind === 'sandbox' ? `The sandbox was not found (${e.message})` : e.message;
}

const CONNECT_CODES: Record<string, Code> = {
  validation_failed: Code.InvalidArgument,
  unauthorized: Code.Unauthenticated,
  forbidden: Code.PermissionDenied,
  organization_suspended: Code.PermissionDenied,
  not_found: Code.NotFound,
  method_not_allowed: Code.Unimplemented,
  invalid_state: Code.FailedPrecondition,
  conflict: Code.AlreadyExists,
  payload_too_large: Code.InvalidArgument,
  unsupported_media_type: Code.InvalidArgument,
  range_not_satisfiable: Code.OutOfRange,
  limit_reached: Code.ResourceExhausted,
  rate_limited: Code.ResourceExhausted,
  quota_exceeded: Code.ResourceExhausted,
  internal: Code.Internal,
  not_supported: Code.Unimplemented,
  host_unavailable: Code.Unavailable,
  agent_unavailable: Code.Unavailable,
  insufficient_storage: Code.ResourceExhausted,
  timeout: Code.DeadlineExceeded,
};

/**
 * envd Connect RPCs: a ConnectError whose code the SDK maps to its classes (e2b.md (f) "envd
 * Connect errors"). A sandbox that is gone or not running is `unavailable`, which the SDK
 * reports as "sandbox is probably not running anymore".
 */
export function toConnectError(err: unknown, log?: ErrorLog): ConnectError {
  if (err instanceof ConnectError) return err;
  const e = publicError(err, log, 'e2b envd rpc');
  if (isSandboxUnavailable(e)) return new ConnectError(unavailableMessage(e), Code.Unavailable);
  return new ConnectError(e.message, CONNECT_CODES[e.code] ?? Code.Unknown);
}

/**
 * The error an RPC ends with when it failed because its client cancelled it (closed the
 * stream, hit its own deadline): the guest call it was waiting on breaks too, which is the
 * client's doing, not an internal error.
 */
export function rpcError(err: unknown, signal: AbortSignal, log?: ErrorLog): ConnectError {
  if (signal.aborted && !(err instanceof ConnectError)) {
    // Its own deadline (Connect-Timeout-Ms) aborts the call with deadline_exceeded as the reason.
    return signal.reason instanceof ConnectError ? signal.reason : new ConnectError('the call was cancelled by the client', Code.Canceled);
  }
  return toConnectError(err, log);
}

export function notSupported(what: string): NestboxError {
  return new NestboxError('not_supported', `${what} is not supported by this Nestbox server`);
}
