// Plumbing shared by the Daytona control plane and toolbox translators: who is calling, the
// public URLs the SDK is handed back, and calls to the sandbox's guest agent through core.
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import type { NextFunction, Request, Response } from 'express';
import { isErrorCode, NestboxError, type ErrorCode } from '../../core/errors.js';
import type { Principal, Scope } from '../../core/types.js';
import type { Services } from '../../src/services.js';
import { renderDaytonaError, type DaytonaDaemonCode, type DaytonaSurface } from './errors.js';

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

/** Express handler wrapper: any throw becomes Daytona's error shape for that surface. */
export function handle(services: Services, surface: DaytonaSurface, fn: (req: Request, res: Response) => Promise<void>) {
  return (req: Request, res: Response, _next: NextFunction): void => {
    fn(req, res).catch((err) => renderDaytonaError(res, err, surface, services.log));
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

export interface AgentCall {
  method: string;
  /** Guest-agent path with its query string. */
  path: string;
  json?: unknown;
  body?: Readable | Buffer;
  headers?: Record<string, string>;
  scope: Scope;
  /** For "cannot … a stopped sandbox" messages. */
  operation: string;
  /** Read-only file calls that a stopped sandbox can answer from its kept disk. */
  fileRead?: boolean;
  /** Which Daytona daemon code the SDK should see for each core error code of the guest. */
  daytonaCodes?: Partial<Record<ErrorCode, DaytonaDaemonCode>>;
  signal?: AbortSignal;
}

/** Send a request to the sandbox's guest agent; the stream is returned as is. */
export async function agentRaw(services: Services, principal: Principal, sandboxId: string, call: AgentCall): Promise<IncomingMessage> {
  const headers: Record<string, string> = { ...call.headers };
  let body = call.body;
  if (call.json !== undefined) {
    body = Buffer.from(JSON.stringify(call.json));
    headers['content-type'] = 'application/json';
  }
  const request = { method: call.method, path: call.path, headers, body, signal: call.signal };
  return call.fileRead
    ? services.sandboxes.fileReadRequest(principal, sandboxId, call.operation, request)
    : services.sandboxes.agentRequest(principal, sandboxId, call.scope, call.operation, request);
}

async function readBody(res: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** The guest agent's `{error:{code,message}}` as a NestboxError carrying the Daytona code that applies. */
export async function agentFailure(res: IncomingMessage, daytonaCodes?: AgentCall['daytonaCodes']): Promise<NestboxError> {
  const text = (await readBody(res)).toString('utf8');
  let code: ErrorCode = (res.statusCode ?? 500) === 404 ? 'not_found' : 'internal';
  let message = text || `the sandbox agent answered ${res.statusCode}`;
  try {
    const parsed = JSON.parse(text) as { error?: { code?: string; message?: string } };
    if (parsed.error?.code && isErrorCode(parsed.error.code)) code = parsed.error.code;
    if (parsed.error?.message) message = parsed.error.message;
  } catch {
    // not JSON: keep the text
  }
  const daytonaCode = daytonaCodes?.[code];
  return new NestboxError(code, message, daytonaCode ? { daytonaCode } : undefined);
}

/** A JSON call to the guest agent; a guest error is thrown as a NestboxError. */
export async function agentJson<T>(services: Services, principal: Principal, sandboxId: string, call: AgentCall): Promise<{ status: number; body: T }> {
  const res = await agentRaw(services, principal, sandboxId, call);
  const status = res.statusCode ?? 502;
  if (status >= 400) throw await agentFailure(res, call.daytonaCodes);
  const buf = await readBody(res);
  return { status, body: (buf.length ? JSON.parse(buf.toString('utf8')) : undefined) as T };
}

/** File routes: a missing or forbidden path gets the daemon codes that select DaytonaFileNotFoundError etc. */
export const FILE_CODES: AgentCall['daytonaCodes'] = { not_found: 'FILE_NOT_FOUND', forbidden: 'FILE_ACCESS_DENIED' };
/** Process and session routes. */
export const PROCESS_CODES: AgentCall['daytonaCodes'] = { not_found: 'PROCESS_NOT_FOUND' };

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

export function q(params: Record<string, string | number | boolean | undefined>): string {
  const sp = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined) sp.set(k, String(v));
  const s = sp.toString();
  return s ? `?${s}` : '';
}
