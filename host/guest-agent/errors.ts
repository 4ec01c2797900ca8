// Errors the guest agent answers with. Codes are those of core's error catalogue so the host
// agent can pass an agent error through to API clients unchanged.
import type { ServerResponse } from 'node:http';

export class AgentHttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = 'AgentHttpError';
  }
}

/** A client mistake in one named field; the message always starts with the field name. */
export function validationFailed(field: string, detail: string): AgentHttpError {
  return new AgentHttpError(400, 'validation_failed', `${field}: ${detail}`);
}

export function notFound(message: string): AgentHttpError {
  return new AgentHttpError(404, 'not_found', message);
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const payload = Buffer.from(JSON.stringify(body));
  res.writeHead(status, {
    ...headers,
    'Content-Type': 'application/json',
    'Content-Length': String(payload.length),
  });
  res.end(payload);
}

export function sendError(res: ServerResponse, error: AgentHttpError): void {
  sendJson(res, error.status, { error: { code: error.code, message: error.message } }, error.headers);
}

interface ErrnoLike {
  code?: unknown;
  message?: unknown;
}

function errnoCode(error: unknown): string | undefined {
  const code = (error as ErrnoLike | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/**
 * Turns a filesystem error into the answer a client deserves. Anything caused by what the client
 * asked for (a missing file, a file where a directory was expected, a permission) is a 4xx;
 * only truly unexpected errors are left for the generic 500 handler.
 */
export function fsErrorToHttp(error: unknown, path: string): AgentHttpError | undefined {
  switch (errnoCode(error)) {
    case 'ENOENT':
      return notFound(`no such file or directory: ${path}`);
    case 'ENOTDIR':
      return notFound(`a parent of the path is not a directory: ${path}`);
    case 'EACCES':
    case 'EPERM':
      return new AgentHttpError(403, 'forbidden', `permission denied: ${path}`);
    case 'EROFS':
      return new AgentHttpError(403, 'forbidden', `read-only file system: ${path}`);
    case 'EISDIR':
      return validationFailed('path', `path is a directory: ${path}`);
    case 'ELOOP':
      return validationFailed('path', `too many levels of symbolic links: ${path}`);
    case 'ENAMETOOLONG':
      return validationFailed('path', `name too long: ${path}`);
    case 'EEXIST':
      return validationFailed('path', `a parent of the path exists and is not a directory: ${path}`);
    case 'ENOSPC':
    case 'EDQUOT':
      return new AgentHttpError(507, 'insufficient_storage', `no space left on the sandbox's disk writing ${path}`);
    default:
      return undefined;
  }
}

/** Rethrows a filesystem error as its HTTP form when it has one. */
export function rethrowFsError(error: unknown, path: string): never {
  throw fsErrorToHttp(error, path) ?? error;
}
