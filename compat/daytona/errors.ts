// Daytona's error shapes (daytona.md (f)). The SDK builds its error class from the HTTP status,
// takes `message` only when it is a string, and picks a more specific class when the body has
// `source: "DAYTONA_DAEMON"` plus one of its known `code`s. Core's NestboxError is rendered
// here; nothing else decides a Daytona status.
import { STATUS_CODES } from 'node:http';
import type { Response } from 'express';
import { NestboxError, publicError, hasRetryAfter, retryAfterSeconds, type ErrorCode } from '../../core/errors.js';
import { clientHasGone } from '../../http-kit/request-checks.js';
import type { ErrorLog } from '../../core/logger.js';

export type DaytonaSurface = 'api' | 'toolbox';

/**
 * The toolbox error codes the SDK maps to classes (daytona.md (f)). A translator that knows
 * which Daytona code applies puts it in the error's details as `daytonaCode`.
 */
export type DaytonaDaemonCode =
  | 'FILE_NOT_FOUND' | 'FILE_ACCESS_DENIED' | 'INVALID_FILE_PATH' | 'FILE_READ_FAILED'
  | 'PROCESS_EXECUTION_TIMEOUT' | 'PROCESS_NOT_FOUND' | 'SESSION_ENDED' | 'COMMAND_ALREADY_COMPLETED'
  | 'LSP_SERVER_NOT_INITIALIZED'
  | 'GIT_AUTH_FAILED' | 'GIT_REPO_NOT_FOUND' | 'GIT_BRANCH_NOT_FOUND' | 'GIT_BRANCH_EXISTS' | 'GIT_PUSH_REJECTED'
  | 'GIT_DIRTY_WORKTREE' | 'GIT_MERGE_CONFLICT' | 'GIT_TRANSPORT_FAILED' | 'GIT_REMOTE_REJECTED';

/** A NestboxError that names the Daytona daemon code the SDK should see. */
export function daemonError(code: ConstructorParameters<typeof NestboxError>[0], message: string, daytonaCode?: DaytonaDaemonCode): NestboxError {
  return new NestboxError(code, message, daytonaCode ? { daytonaCode } : undefined);
}

/** Which Daytona daemon code the SDK should see for each core error code of a guest answer. */
export type DaemonCodes = Partial<Record<ErrorCode, DaytonaDaemonCode>>;

/** File routes: a missing or forbidden path gets the daemon codes that select DaytonaFileNotFoundError etc. */
export const FILE_CODES: DaemonCodes = { not_found: 'FILE_NOT_FOUND', forbidden: 'FILE_ACCESS_DENIED' };
/** Process, session and PTY routes. */
export const PROCESS_CODES: DaemonCodes = { not_found: 'PROCESS_NOT_FOUND' };

/**
 * `err` with the Daytona daemon code `codes` gives its core code, if it is about what the guest
 * was asked (a file, a process, a session). An error about the sandbox itself (core names it
 * with `kind: 'sandbox'`: not found, not running) keeps its plain shape, so the SDK raises
 * DaytonaNotFoundError for a missing sandbox rather than DaytonaFileNotFoundError; so does an
 * error that already names its daemon code.
 */
export function withDaemonCode(err: unknown, codes: DaemonCodes): unknown {
  if (!(err instanceof NestboxError) || err.details?.kind === 'sandbox' || err.details?.daytonaCode !== undefined) return err;
  const daytonaCode = codes[err.code];
  return daytonaCode ? new NestboxError(err.code, err.message, { ...err.details, daytonaCode }) : err;
}

/** A toolbox call whose guest errors carry the Daytona daemon codes of `codes` (withDaemonCode). */
export async function daemonCall<T>(codes: DaemonCodes, call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (err) {
    throw withDaemonCode(err, codes);
  }
}

/** A Daytona feature Nestbox does not have: a 501 that names it (never a fake success). */
export function notSupported(feature: string, why = 'Nestbox does not implement it'): NestboxError {
  return new NestboxError('not_supported', `${feature} is not supported by this Nestbox server's Daytona-compatible API: ${why}`, { feature });
}

/**
 * Daemon codes whose HTTP status differs from the catalogue's for their core code: a command
 * past its timeout is core's `timeout` (504, a gateway's word) but the daemon's 408.
 */
const DAEMON_STATUS: Partial<Record<DaytonaDaemonCode, number>> = { PROCESS_EXECUTION_TIMEOUT: 408 };

/** The HTTP status Daytona's server gives `err` on `surface`. */
export function daytonaStatus(err: NestboxError, surface: DaytonaSurface): number {
  const daytonaCode = surface === 'toolbox' && typeof err.details?.daytonaCode === 'string' ? (err.details.daytonaCode as DaytonaDaemonCode) : undefined;
  return (daytonaCode && DAEMON_STATUS[daytonaCode]) || err.status;
}

export function daytonaErrorBody(err: NestboxError, surface: DaytonaSurface, path: string, method: string): Record<string, unknown> {
  const status = daytonaStatus(err, surface);
  const body: Record<string, unknown> = {
    statusCode: status,
    message: err.message,
    // NestJS puts the HTTP reason phrase here (appendix B).
    error: STATUS_CODES[status] ?? 'Error',
    // Nestbox's own catalogue code, for people; the SDK only maps daemon codes with a source.
    code: err.code,
    timestamp: new Date().toISOString(),
    path,
  };
  if (surface === 'toolbox') {
    body.method = method;
    const daytonaCode = typeof err.details?.daytonaCode === 'string' ? err.details.daytonaCode : undefined;
    if (daytonaCode) {
      body.code = daytonaCode;
      body.source = 'DAYTONA_DAEMON';
    }
  }
  return body;
}

export function renderDaytonaError(res: Response, err: unknown, surface: DaytonaSurface, log?: ErrorLog): void {
  // A client that went away mid-answer: nobody to tell, nothing internal to log.
  if (clientHasGone(res)) return void res.destroy();
  // The last-resort guard: a 500 shows only a reference, the log has the rest.
  const e = publicError(err, log, `daytona ${surface}`);
  if (res.headersSent) {
    // The answer is already streaming: cutting the connection is the only honest signal left.
    res.destroy();
    return;
  }
  // The SDK maps 429 to DaytonaRateLimitError.
  if (hasRetryAfter(e)) res.setHeader('Retry-After', String(retryAfterSeconds(e)));
  res.status(daytonaStatus(e, surface)).json(daytonaErrorBody(e, surface, res.req.originalUrl.split('?')[0], res.req.method));
}
