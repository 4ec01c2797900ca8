// Plumbing shared by the Daytona control plane and toolbox translators: who is calling, the
// public URLs the SDK is handed back, query parameters, and the handler wrappers. The sandbox
// itself is reached only through core's toolbox (compat-port.ts), never by a guest path.
import type { IncomingMessage } from 'node:http';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import { NestboxError } from '../../core/errors.js';
import type { Principal } from '../../core/types.js';
import { renderDaytonaError, type DaytonaSurface } from './errors.js';
import type { Logger } from '../../core/logger.js';
import type { ObjectStore } from '../../core/object-store.js';

/** Where the compat layer is mounted (src/http/app.ts): users set DAYTONA_API_URL=<origin>/daytona/api. */
export const DAYTONA_PREFIX = '/daytona';

export interface DaytonaLocals {
  principal: Principal;
}

export function principalOf(res: Response): Principal {
  const principal = (res.locals as Partial<DaytonaLocals>).principal;
  if (!principal) throw new NestboxError('unauthorized', 'missing or invalid API key');
  return principal;
}

export function bearerToken(req: IncomingMessage): string | undefined {
  const header = req.headers.authorization;
  return header?.startsWith('Bearer ') ? header.slice(7).trim() : undefined;
}

/** Public origin as the client reached us, so returned URLs work through the same door. */
export function publicOrigin(req: IncomingMessage): string {
  const encrypted = (req.socket as { encrypted?: boolean }).encrypted === true;
  return `${encrypted ? 'https' : 'http'}://${req.headers.host ?? '127.0.0.1'}`;
}

/** daytona.md (c): the SDK builds every toolbox URL as `toolboxProxyUrl + "/" + id`. */
export function toolboxProxyUrl(req: IncomingMessage): string {
  return `${publicOrigin(req)}${DAYTONA_PREFIX}/toolbox`;
}

/** Where internal failures are logged (a 500 shows the client only a reference). */
/** The server's logger (core/logger.ts); errors go to it with their fields. */
export type Log = Logger;

/** The server's stream caps (held per API key and per sandbox; beyond a cap, rate_limited). */
export interface StreamSlots {
  /** Holds a slot until `emitter` (the client's socket) emits 'close'; throws rate_limited beyond the caps. */
  acquireUntilClosed(owner: { keyId?: string; sandboxId: string }, emitter: { once(event: 'close', listener: () => void): unknown }): unknown;
}

/** What the server gives the Daytona layer for build-context storage (object-storage.ts). */
export interface DaytonaObjectStorage {
  /** The server's one object store (the native API and E2B use the same). */
  store: ObjectStore;
  /** HMAC key of the S3 credentials, derived from the master secret (never the secret itself). */
  credentialKey: Buffer;
  /**
   * The server's public base URL (NESTBOX_PUBLIC_URL), when the operator set one: `storageUrl`
   * is built on it rather than on the origin the request reached (behind a TLS proxy the
   * request says http, and the Python SDK's S3 client refuses plain-HTTP endpoints).
   */
  publicUrl?: string;
  /** Clock, for tests of expiry. */
  now?: () => number;
}

/**
 * What the Daytona layer needs besides core's port (core/compat-port.ts): a few values of the
 * server's configuration and the HTTP-level services that are not core's. Built where the
 * router is mounted (src/http/app.ts `daytonaOptionsOf`), so this layer imports nothing of src/.
 */
export interface DaytonaOptions {
  /** The native API's upload limit (NESTBOX_MAX_UPLOAD_BYTES), enforced while streaming. */
  maxUploadBytes: number;
  /** The longest sandbox timeout (NESTBOX_MAX_TIMEOUT_SECONDS): Daytona's intervals are capped by it. */
  maxTimeoutSeconds: number;
  /** The region of this server's hosts (NESTBOX_REGION): the one `target` accepted and reported. */
  region: string;
  /** The snapshot a create without `snapshot` starts from (NESTBOX_DAYTONA_DEFAULT_SNAPSHOT); undefined: the `default` image. */
  defaultSnapshot?: string;
  /** Caps on long-lived streams: each toolbox WebSocket holds a slot while it is open. */
  streams: StreamSlots;
  /** Build-context storage: push-access credentials and the S3 endpoint (object-storage.ts). */
  objectStorage: DaytonaObjectStorage;
  log: Log;
}

/** Express handler wrapper: any throw becomes Daytona's error shape for that surface. */
export function handle(log: Log, surface: DaytonaSurface, fn: (req: Request, res: Response) => Promise<void>) {
  return (req: Request, res: Response, _next: NextFunction): void => {
    fn(req, res).catch((err) => renderDaytonaError(res, err, surface, log));
  };
}

/** `X-Daytona-SDK-Version` (daytona.md appendix A): the real daemon gates response formats on it. */
export function sdkVersion(req: IncomingMessage): [number, number, number] | undefined {
  let raw = req.headers['x-daytona-sdk-version'];
  if (Array.isArray(raw)) raw = raw[0];
  if (!raw) {
    const proto = String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim()).find((p) => p.startsWith('X-Daytona-SDK-Version~'));
    raw = proto?.slice('X-Daytona-SDK-Version~'.length);
  }
  const m = raw ? /^(\d+)\.(\d+)\.(\d+)/.exec(raw) : null;
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : undefined;
}

/**
 * Session logs and synchronous session output come as JSON {output, stdout, stderr} for SDK
 * 0.167.0 and later (and unversioned "dev" clients); older SDKs want text with the 3-byte
 * stream markers and demultiplex it themselves (daytona.md (h) 9, appendix A).
 */
export function wantsMarkedText(req: IncomingMessage): boolean {
  const v = sdkVersion(req);
  if (!v) return false;
  return v[0] === 0 && v[1] < 167;
}

export const STDOUT_MARKER = Buffer.from([1, 1, 1]);
export const STDERR_MARKER = Buffer.from([2, 2, 2]);

export function markedText(stdout: string, stderr: string): string {
  let out = '';
  if (stdout) out += STDOUT_MARKER.toString('latin1') + stdout;
  if (stderr) out += STDERR_MARKER.toString('latin1') + stderr;
  return out;
}

/** One toolbox request as the translators see it: the caller, the sandbox, the exchange. */
export interface ToolboxCall {
  req: Request;
  res: Response;
  principal: Principal;
  sandboxId: string;
}

/** Wraps a toolbox translator into an express handler (errors in Daytona's toolbox shape). */
export type ToolboxHandler = (fn: (c: ToolboxCall) => Promise<void>) => RequestHandler;

export function queryString(req: Request, name: string): string | undefined {
  const v = req.query[name];
  if (v === undefined) return undefined;
  return String(Array.isArray(v) ? v[0] : v);
}

export function requireQuery(req: Request, name: string): string {
  const v = queryString(req, name);
  if (v === undefined || v === '') throw new NestboxError('validation_failed', `${name}: is required`, { field: name });
  return v;
}
