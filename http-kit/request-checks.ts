// Checks every front door runs on a request before any of it reaches core, the database or a
// guest agent. No Nestbox API accepts a NUL byte in a URL or a JSON string: PostgreSQL cannot
// store one in text, and no path, command or name can contain one. Each check names the field.
import type { ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';
import { NestboxError } from '../core/errors.js';

/** The dotted name of the first string (value or key) in `value` that holds a NUL byte. */
export function nulFieldIn(value: unknown, prefix: string, depth = 0): string | undefined {
  if (typeof value === 'string') return value.includes('\0') ? prefix : undefined;
  // JSON bodies are at most a few MiB, but nesting is bounded too: no stack overflow on [[[[…]]]].
  if (value === null || typeof value !== 'object' || depth > 64) return undefined;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = nulFieldIn(value[i], `${prefix}[${i}]`, depth + 1);
      if (found) return found;
    }
    return undefined;
  }
  for (const [k, v] of Object.entries(value)) {
    const name = prefix ? `${prefix}.${k}` : k;
    if (k.includes('\0')) return name;
    const found = nulFieldIn(v, name, depth + 1);
    if (found) return found;
  }
  return undefined;
}

function nulError(field: string): NestboxError {
  return new NestboxError('validation_failed', `${field}: must not contain NUL bytes`, { field });
}

/**
 * The URL: its path must be valid percent-encoded UTF-8 without NUL (`/sandboxes/%ED%A0%80`
 * made the native router throw "URI malformed"), and so must every query value.
 */
export function requestTargetProblem(req: Request): NestboxError | undefined {
  let path: string;
  try {
    path = decodeURIComponent(req.path);
  } catch {
    return new NestboxError('validation_failed', 'path: is not valid percent-encoded UTF-8', { field: 'path' });
  }
  if (path.includes('\0')) return nulError('path');
  const rawQuery = req.originalUrl.includes('?') ? req.originalUrl.slice(req.originalUrl.indexOf('?') + 1) : '';
  if (rawQuery) {
    // URLSearchParams never throws (bad escapes become U+FFFD), so test each escape the way
    // the routes will decode it.
    for (const part of rawQuery.split('&')) {
      const [rawName, ...rest] = part.split('=');
      const rawValue = rest.join('=');
      const name = safeDecode(rawName) ?? rawName;
      const value = safeDecode(rawValue);
      if (value === undefined || safeDecode(rawName) === undefined) {
        return new NestboxError('validation_failed', `${name}: is not valid percent-encoded UTF-8`, { field: name, location: 'query' });
      }
      if (value.includes('\0') || name.includes('\0')) return nulError(name.replace(/\0/g, '\\0'));
    }
  }
  return undefined;
}

function safeDecode(s: string): string | undefined {
  try {
    return decodeURIComponent(s.replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}

/** Express middleware for after a JSON body parser: a NUL anywhere in the body is a 400 naming the field. */
export function rejectNulInJsonBody(render: (res: Response, err: NestboxError) => void) {
  return (req: Request, res: Response, next: NextFunction): void => {
    const field = req.body !== undefined && typeof req.body === 'object' ? nulFieldIn(req.body, '') : undefined;
    if (field !== undefined) return render(res, nulError(field ? `body.${field}` : 'body'));
    next();
  };
}

/**
 * Has the client gone (closed its connection) before the answer was complete? Then an error
 * from the stream being written ("Premature close", EPIPE) is the client's leaving, not a
 * server fault: there is nobody to answer and nothing to log as internal.
 */
export function clientHasGone(res: ServerResponse): boolean {
  return !res.writableFinished && (res.destroyed || res.socket === null || res.socket.destroyed);
}
