// envd's plain HTTP routes: `GET/POST /files` and `/health` (e2b.md (d)), onto the toolbox's
// file operations (core/services/toolbox.ts).
import type { Request, Response } from 'express';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import type { Readable } from 'node:stream';
import { NestboxError } from '../../../core/errors.js';
import type { StreamHeaders } from '../../../core/guest.js';
import type { E2bDeps } from '../deps.js';
import { clientGoneSignal, streamedBody, streamedThrough } from '../../../http-kit/request-body.js';
import { renderEnvdHttpError } from '../errors.js';
import { nativeUploadForm, type NativeUploadForm } from './upload-form.js';
import { E2B_METADATA_PREFIX, e2bMetadata } from './filesystem.js';
import { homeRelative, type SandboxTarget } from '../target.js';
import { authenticateSandboxTraffic, authenticateSignature, e2bAccount, type SandboxRoute } from '../routing.js';
import { giveTo, ownerOf } from '../../sandbox-accounts.js';

/** The download headers passed on as the toolbox gives them. */
const PASSED_DOWNLOAD_HEADERS: [keyof StreamHeaders, string][] = [
  ['contentLength', 'content-length'],
  ['contentRange', 'content-range'],
  ['acceptRanges', 'accept-ranges'],
];

function queryValue(req: Request, name: string): string | undefined {
  const v = req.query[name];
  return typeof v === 'string' ? v : undefined;
}

/**
 * `/files` accepts the sandbox's token or a valid signature; a wrong token is refused even with
 * a good signature (e2b.md (d) "Auth rules"). The refusals carry envd's own messages (the SDK's
 * signing tests compare them): a wrong token "access token present in header but does not
 * match", neither token nor signature "missing signature query parameter".
 */
async function filesTarget(deps: E2bDeps, req: Request, route: SandboxRoute, operation: 'read' | 'write'): Promise<SandboxTarget> {
  const signature = queryValue(req, 'signature');
  if (req.headers['x-access-token']) {
    return authenticateSandboxTraffic(deps.core, req.headers, route).catch((err: unknown) => {
      // A token that is simply wrong gets envd's words; one that was good but has expired or
      // lost its key (Nestbox bounds tokens; envd's never end) keeps saying so.
      if (err instanceof NestboxError && err.code === 'unauthorized' && /^(invalid|missing) sandbox access token$/.test(err.message)) {
        throw new NestboxError('unauthorized', 'access token present in header but does not match');
      }
      throw err;
    });
  }
  if (!signature) throw new NestboxError('unauthorized', 'missing signature query parameter');
  return authenticateSignature(
    deps.core,
    route,
    { path: queryValue(req, 'path') ?? '', username: queryValue(req, 'username') ?? '', signature, expiration: queryValue(req, 'signature_expiration') },
    operation,
  );
}

interface WrittenEntry {
  name: string;
  type: 'file';
  path: string;
  metadata?: Record<string, string>;
}

/** What envd answers for each written file (e2b.md (d) POST /files); `metadata` only when it has some. */
function writtenEntry(path: string, metadata?: Record<string, string>): WrittenEntry {
  return { name: path.slice(path.lastIndexOf('/') + 1), type: 'file', path, ...(metadata ? { metadata } : {}) };
}

const METADATA_HEADER = 'x-metadata-';
/** envd's bounds: the whole attribute name (`user.e2b.<key>`) within Linux's 255 bytes, and all of a file's names and values within one 4 KiB ext4 block. */
const MAX_METADATA_KEY_BYTES = 255 - 'user.e2b.'.length;
const MAX_METADATA_TOTAL_BYTES = 4096;
const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;

/**
 * `X-Metadata-<key>: <value>` headers, as envd reads them: keys lowercased, the first value of
 * a repeated header, printable ASCII only, bounded. A bad set is a 400 naming `metadata`.
 */
function uploadMetadata(req: Request): Record<string, string> | undefined {
  let metadata: Record<string, string> | undefined;
  let total = 0;
  for (const [name, raw] of Object.entries(req.headers)) {
    if (!name.startsWith(METADATA_HEADER)) continue;
    const key = name.slice(METADATA_HEADER.length).toLowerCase();
    const value = Array.isArray(raw) ? (raw[0] ?? '') : (raw ?? '');
    if (key === '') continue;
    const invalid = (why: string): NestboxError => new NestboxError('validation_failed', `metadata: invalid metadata: ${why}`, { field: 'metadata' });
    if (key.length > MAX_METADATA_KEY_BYTES) throw invalid(`key ${JSON.stringify(key)} exceeds ${MAX_METADATA_KEY_BYTES} bytes`);
    if (!PRINTABLE_ASCII.test(key)) throw invalid(`key ${JSON.stringify(key)} is not printable ASCII`);
    if (!PRINTABLE_ASCII.test(value)) throw invalid(`value for key ${JSON.stringify(key)} is not printable ASCII`);
    total += 'user.e2b.'.length + key.length + value.length;
    (metadata ??= {})[key] = value;
  }
  if (total > MAX_METADATA_TOTAL_BYTES) throw new NestboxError('validation_failed', `metadata: invalid metadata: total metadata size ${total} exceeds ${MAX_METADATA_TOTAL_BYTES} bytes`, { field: 'metadata' });
  return metadata;
}

/**
 * Puts the upload's metadata on each written file (`user.e2b.<key>`, replacing any earlier
 * e2b set) and answers each entry with what the file then has, read back as envd does. A file
 * written anew is a new inode, so an upload without metadata leaves none behind: nothing to do.
 */
async function writtenEntries(deps: E2bDeps, target: SandboxTarget, paths: string[], metadata: Record<string, string> | undefined, signal: AbortSignal): Promise<WrittenEntry[]> {
  if (!metadata) return paths.map((path) => writtenEntry(path));
  const set = Object.fromEntries(Object.entries(metadata).map(([key, value]) => [`${E2B_METADATA_PREFIX}${key}`, value]));
  const entries: WrittenEntry[] = [];
  for (const path of paths) {
    const written = await deps.core.toolbox.writeFileMetadata(target.principal, target.sandboxId, { path, set, replacePrefix: E2B_METADATA_PREFIX }, { signal });
    entries.push(writtenEntry(path, e2bMetadata(written.metadata)));
  }
  return entries;
}

function requirePath(req: Request): string {
  const path = queryValue(req, 'path');
  if (!path) throw new NestboxError('validation_failed', 'path: required', { field: 'path' });
  return path;
}

export async function downloadFile(deps: E2bDeps, req: Request, res: Response, route: SandboxRoute): Promise<void> {
  try {
    const target = await filesTarget(deps, req, route, 'read');
    const path = requirePath(req);
    const account = await e2bAccount(deps.core, target, req.headers, queryValue(req, 'username'));
    const abort = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
    });
    const file = await deps.core.toolbox.readFile(
      target.principal,
      target.sandboxId,
      homeRelative(path, account.home),
      typeof req.headers.range === 'string' ? { range: req.headers.range } : {},
      { signal: abort.signal },
    );
    res.status(file.status);
    for (const [key, name] of PASSED_DOWNLOAD_HEADERS) {
      const v = file.headers[key];
      if (v !== undefined) res.setHeader(name, v);
    }
    const name = path.slice(path.lastIndexOf('/') + 1);
    res.setHeader('content-type', 'application/octet-stream');
    res.setHeader('content-disposition', `inline; filename="${name.replace(/[^\x20-\x7e]|["\\]/g, '_')}"`);
    await pipeline(file.body, res);
  } catch (err) {
    renderEnvdHttpError(res, err, deps.log);
  }
}

export async function uploadFiles(deps: E2bDeps, req: Request, res: Response, route: SandboxRoute): Promise<void> {
  // A body that says gzip but is not: the gunzip stream fails, which cuts the upload to the
  // guest mid-way; the client must hear that its body was bad (400), not that the host is
  // unreachable (502 "socket hang up", found by the fuzz suite).
  let badGzip: NestboxError | undefined;
  let form: NativeUploadForm | undefined;
  try {
    const target = await filesTarget(deps, req, route, 'write');
    const metadata = uploadMetadata(req);
    // Paths resolve in the request's user's home, and what is written belongs to that user.
    const account = await e2bAccount(deps.core, target, req.headers, queryValue(req, 'username'));
    const max = deps.maxUploadBytes;
    const declared = Number(req.headers['content-length'] ?? 0);
    if (declared > max) throw new NestboxError('payload_too_large', `body: ${declared} bytes exceeds the upload limit of ${max} bytes`);
    const contentType = String(req.headers['content-type'] ?? '');
    const path = queryValue(req, 'path');
    let body: Readable = streamedBody(req, max);
    if (String(req.headers['content-encoding'] ?? '').toLowerCase() === 'gzip') {
      const gunzip = createGunzip();
      gunzip.once('error', (err) => {
        badGzip = new NestboxError('validation_failed', `body: is not valid gzip (Content-Encoding: gzip): ${err.message}`, { field: 'body' });
      });
      body = streamedThrough(body, gunzip);
    }
    // A client that vanishes mid-body (or while a paused sandbox wakes) cancels the upstream write.
    const signal = clientGoneSignal(req, res);

    if (contentType.startsWith('multipart/form-data')) {
      // E2B's form (parts named `file` whose filename is the full target path, or `?path=` for
      // every part) re-encoded as the native one, streamed through (upload-form.ts).
      form = nativeUploadForm(body, contentType, path ? homeRelative(path, account.home) : undefined, account.home);
      const result = await deps.core.toolbox.uploadFiles(target.principal, target.sandboxId, { ...form, owner: ownerOf(account) }, { signal });
      if (badGzip) throw badGzip;
      const failed = result.results.find((r) => !r.ok);
      if (failed && !failed.ok) throw new NestboxError((failed.error.code as NestboxError['code']) ?? 'internal', failed.error.message);
      if (result.results.length === 0) throw new NestboxError('validation_failed', 'body: no file part named "file"', { field: 'file' });
      for (const r of result.results) await giveTo(deps.core.toolbox, target.principal, target.sandboxId, r.path, account);
      res.status(200).json(await writtenEntries(deps, target, result.results.map((r) => r.path), metadata, signal));
      return;
    }
    // application/octet-stream (envd ≥ 0.5.7): one file, `path` required.
    if (!path) throw new NestboxError('validation_failed', 'path: required for application/octet-stream uploads', { field: 'path' });
    const info = await deps.core.toolbox.writeFile(target.principal, target.sandboxId, homeRelative(path, account.home), body, { owner: ownerOf(account) }, { signal });
    if (badGzip) throw badGzip;
    await giveTo(deps.core.toolbox, target.principal, target.sandboxId, info.path, account);
    res.status(200).json(await writtenEntries(deps, target, [info.path], metadata, signal));
  } catch (err) {
    renderEnvdHttpError(res, badGzip ?? form?.failure() ?? err, deps.log);
  }
}

/**
 * 204 when the sandbox runs, 502 otherwise, as E2B's proxy answers for a dead sandbox
 * (isRunning() → false). Upstream envd needs no token here, but then anyone could probe which
 * sandbox ids exist (issue 11): without a valid token of this sandbox the answer is the same 401
 * for every id. The SDK always sends its token (it has one from create/connect).
 */
export async function health(deps: E2bDeps, res: Response, route: SandboxRoute, req: Request): Promise<void> {
  try {
    // One answer for every credential problem (missing, forged, another sandbox's, expired,
    // revoked), so it says nothing about the id either.
    const target = await authenticateSandboxTraffic(deps.core, req.headers, route).catch((err: unknown) => {
      if (err instanceof NestboxError && err.code === 'unauthorized') throw new NestboxError('unauthorized', 'unauthorized access, please provide a valid access token (X-Access-Token)');
      throw err;
    });
    const sandbox = await deps.core.sandboxes.get(target.principal, target.sandboxId);
    if (sandbox.state !== 'running') throw new NestboxError('invalid_state', `sandbox ${sandbox.id} is ${sandbox.state}`, { kind: 'sandbox' });
    res.status(204).end();
  } catch (err) {
    renderEnvdHttpError(res, err, deps.log);
  }
}
