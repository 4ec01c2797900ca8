// Daytona's object storage for image build contexts (daytona-wave2.md §2). The SDK asks
// `GET /object-storage/push-access` for S3 credentials, then uploads each context tar with the
// AWS S3 client (path style, SigV4) to `<storageUrl>/<bucket>/<orgId>/<hash>/context.tar`,
// after a ListObjectsV2 that skips contexts already there. This file serves both: the route,
// and an S3-compatible endpoint at /daytona/s3 over core's ObjectStore, the same store the
// native API and E2B use; S3 key `<orgId>/<rest>` is the store's key `<rest>` of that organisation.
//
// Credentials are stateless: the access key names the organisation and an expiry, the secret and
// the session token are HMACs of it under a key derived from the server's master secret, so the
// endpoint checks a request without storing any credential (and a restart keeps them valid).
import { createHmac, createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { crc32 } from 'node:zlib';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import express, { type Request, type Response, type Router } from 'express';
import { SignatureV4 } from '@smithy/signature-v4';
import { Hash } from '@smithy/hash-node';
import { XmlNode, parseXML } from '@aws-sdk/xml-builder';
import { NestboxError, publicError } from '../../core/errors.js';
import type { StoredObject } from '../../core/object-store.js';
import type { Principal } from '../../core/types.js';
import type { ErrorLog } from '../../core/logger.js';
import { clientGoneSignal, streamedBody, streamedThrough } from '../../http-kit/request-body.js';
import { DAYTONA_PREFIX, publicOrigin, type DaytonaObjectStorage, type Log } from './context.js';

/** The SDK's own default bucket (it uses it when push-access names none). */
export const DAYTONA_BUCKET = 'daytona-volume-builds';
/** Any region name works for SigV4; this is the one S3 clients assume least about. */
export const DAYTONA_S3_REGION = 'us-east-1';
/** Where the S3 endpoint is mounted: the SDK keeps a storageUrl's path prefix (wave2 §2.1). */
export const DAYTONA_S3_PATH = `${DAYTONA_PREFIX}/s3`;
const CREDENTIAL_TTL_SECONDS = 3600;
/** x-amz-date may differ from our clock by this much (S3's own window). */
const MAX_CLOCK_SKEW_MS = 15 * 60 * 1000;
/** S3's limit for one PutObject or UploadPart. */
const MAX_SINGLE_UPLOAD_BYTES = 5 * 1024 ** 3;
const MAX_COMPLETE_BODY_BYTES = 1024 * 1024;
const MAX_LIST_KEYS = 1000;
const ACCESS_KEY_PREFIX = 'NBX';
const S3_XMLNS = 'http://s3.amazonaws.com/doc/2006-03-01/';

/** The key under which Daytona's context tar of `hash` is kept in the organisation's store. */
export function daytonaContextObjectKey(hash: string): string {
  return `${hash}/context.tar`;
}

export interface ObjectStorageOptions extends DaytonaObjectStorage {
  /** Largest single PutObject (NESTBOX_MAX_UPLOAD_BYTES, at most S3's 5 GiB). */
  maxUploadBytes: number;
  log: Log;
}

/** Daytona's StorageAccessDto. */
export interface StorageAccess {
  accessKey: string;
  secret: string;
  sessionToken: string;
  storageUrl: string;
  bucket: string;
  region: string;
  organizationId: string;
}

const mac = (key: Buffer, purpose: string, accessKey: string) => createHmac('sha256', key).update(`${purpose}:${accessKey}`).digest('base64url');

function sameText(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** Credentials for one organisation, valid for an hour from `now`. */
export function issueStorageAccess(req: IncomingMessage, principal: Principal, options: Pick<ObjectStorageOptions, 'credentialKey' | 'now' | 'publicUrl'>): StorageAccess {
  const now = options.now?.() ?? Date.now();
  const expires = Math.floor(now / 1000) + CREDENTIAL_TTL_SECONDS;
  // `/` would break SigV4's Credential=<key>/<scope>; base64url never has one.
  const accessKey = `${ACCESS_KEY_PREFIX}${Buffer.from(`1:${principal.organizationId}:${expires}`).toString('base64url')}`;
  return {
    accessKey,
    secret: mac(options.credentialKey, 'secret', accessKey),
    sessionToken: `${accessKey}.${mac(options.credentialKey, 'token', accessKey)}`,
    // Where the client reached this server, as the toolbox URLs are (or the declared public URL).
    storageUrl: `${options.publicUrl ?? publicOrigin(req)}${DAYTONA_S3_PATH}`,
    bucket: DAYTONA_BUCKET,
    region: DAYTONA_S3_REGION,
    organizationId: principal.organizationId,
  };
}

// ---- S3 errors ----

/** An S3 error: its code and status are what S3 clients parse (the XML `<Code>` decides the SDK's exception). */
class S3Error extends Error {
  constructor(readonly status: number, readonly code: string, message: string, readonly headers: Record<string, string> = {}) {
    super(message);
  }
}

const s3 = {
  accessDenied: (m: string) => new S3Error(403, 'AccessDenied', m),
  malformed: (m: string) => new S3Error(400, 'AuthorizationHeaderMalformed', m),
  invalidArgument: (m: string) => new S3Error(400, 'InvalidArgument', m),
  notImplemented: (m: string) => new S3Error(501, 'NotImplemented', m),
};

/** core's error catalogue in S3's words (the codes S3 clients know). */
function s3ErrorOf(err: unknown, log?: ErrorLog): S3Error {
  if (err instanceof S3Error) return err;
  const e = publicError(err, log, 'daytona s3');
  switch (e.code) {
    case 'not_found':
      return e.details?.kind === 'upload'
        ? new S3Error(404, 'NoSuchUpload', 'The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.')
        : new S3Error(404, 'NoSuchKey', 'The specified key does not exist.');
    case 'payload_too_large':
      return new S3Error(400, 'EntityTooLarge', `Your proposed upload exceeds the maximum allowed size: ${e.message}`);
    case 'validation_failed': {
      const field = String(e.details?.field ?? '');
      if (field === 'sha256') return new S3Error(400, 'XAmzContentSHA256Mismatch', "The provided 'x-amz-content-sha256' header does not match what was computed.");
      if (/^parts\[\d+\]$/.test(field)) return new S3Error(400, 'InvalidPart', `One or more of the specified parts could not be found: ${e.message}`);
      if (field.startsWith('parts')) return new S3Error(400, 'InvalidPartOrder', `The list of parts was not in ascending order: ${e.message}`);
      return s3.invalidArgument(e.message);
    }
    // Not 429: S3 clients retry a 429 as throttling, and a full quota does not clear by waiting.
    case 'quota_exceeded':
      return new S3Error(403, 'QuotaExceeded', e.message);
    case 'forbidden':
    case 'unauthorized':
    case 'organization_suspended':
      return s3.accessDenied(e.message);
    case 'not_supported':
      return s3.notImplemented(e.message);
    case 'insufficient_storage':
      return new S3Error(507, 'InsufficientStorage', e.message);
    default:
      return new S3Error(e.status >= 500 ? e.status : 400, e.status >= 500 ? 'InternalError' : 'InvalidRequest', e.message);
  }
}

function xml(root: XmlNode): string {
  return `<?xml version="1.0" encoding="UTF-8"?>\n${root.toString()}`;
}
const leaf = (name: string, value: string | number | boolean) => XmlNode.of(name, String(value));

function sendS3Error(req: Request, res: Response, err: S3Error): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  // Refused before its body was read (bad signature, a declared length past the limit): the
  // rest is read and dropped, so the client can finish sending and read this answer rather
  // than have its connection reset mid-write.
  if (!req.readableEnded && req.listenerCount('data') === 0) req.resume();
  res.status(err.status);
  for (const [k, v] of Object.entries(err.headers)) res.setHeader(k, v);
  // HEAD answers carry no body; the SDK reads the status (404 → NotFound).
  if (req.method === 'HEAD') return void res.end();
  const body = new XmlNode('Error').c(leaf('Code', err.code)).c(leaf('Message', err.message)).c(leaf('Resource', req.originalUrl.split('?')[0]));
  res.type('application/xml').send(xml(body));
}

/** Any failure in S3's XML shape: for what reaches /daytona/s3 before its router (a malformed URL). */
export function renderS3Error(req: Request, res: Response, err: unknown, log?: ErrorLog): void {
  sendS3Error(req, res, s3ErrorOf(err, log));
}

// ---- request parsing and SigV4 ----

interface S3Target {
  organizationId: string;
  bucket: string;
  /** The S3 key as sent (`<orgId>/…`), or undefined for a bucket-level call. */
  s3Key?: string;
  query: Record<string, string | string[]>;
}

/** The raw query as a map, each name and value decoded once (as the client signed them). */
function parseQuery(raw: string): Record<string, string | string[]> {
  const query: Record<string, string | string[]> = {};
  for (const pair of raw.split('&')) {
    if (!pair) continue;
    const eq = pair.indexOf('=');
    const name = decodeURIComponent((eq < 0 ? pair : pair.slice(0, eq)).replace(/\+/g, '%20'));
    const value = eq < 0 ? '' : decodeURIComponent(pair.slice(eq + 1).replace(/\+/g, '%20'));
    const existing = query[name];
    query[name] = existing === undefined ? value : ([] as string[]).concat(existing, value);
  }
  return query;
}

function one(query: Record<string, string | string[]>, name: string): string | undefined {
  const v = query[name];
  return Array.isArray(v) ? v[0] : v;
}

const AUTH_HEADER = /^AWS4-HMAC-SHA256 Credential=([^/,\s]+)\/(\d{8})\/([^/,\s]+)\/([^/,\s]+)\/([^/,\s]+),\s*SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$/;
const AMZ_DATE = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/;

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v.join(',') : v;
}

/**
 * Checks a request's SigV4 signature against the credentials its access key names, by signing
 * the request as received again (@smithy/signature-v4, the AWS SDK's own signer) and comparing
 * in constant time. Returns the organisation the credentials belong to.
 */
async function verifySignature(req: Request, options: ObjectStorageOptions): Promise<{ organizationId: string; query: Record<string, string | string[]>; rawPath: string }> {
  const [rawPath, rawQuery = ''] = req.originalUrl.split(/\?(.*)/s);
  let query: Record<string, string | string[]>;
  try {
    query = parseQuery(rawQuery);
  } catch {
    throw s3.invalidArgument('The query string is not valid percent-encoding.');
  }
  if (one(query, 'X-Amz-Signature') !== undefined) throw s3.notImplemented('Presigned URLs are not supported by this endpoint; sign the Authorization header.');
  const authorization = header(req, 'authorization');
  if (!authorization) throw s3.accessDenied('Anonymous access is not allowed; sign the request with the credentials of GET /object-storage/push-access.');
  const m = AUTH_HEADER.exec(authorization);
  if (!m) throw s3.malformed('The authorization header is malformed; expected AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=….');
  const [, accessKey, scopeDate, region, service, terminal, signedHeaderList, signature] = m;
  if (service !== 's3' || terminal !== 'aws4_request') throw s3.malformed(`The credential scope must name the service s3 and end in aws4_request, not ${service}/${terminal}.`);
  if (region !== DAYTONA_S3_REGION) throw s3.malformed(`The authorization header is malformed; the region '${region}' is wrong; expecting '${DAYTONA_S3_REGION}'.`);

  // The access key: NBX + base64url("1:<orgId>:<expiry seconds>").
  const decoded = accessKey.startsWith(ACCESS_KEY_PREFIX) ? Buffer.from(accessKey.slice(ACCESS_KEY_PREFIX.length), 'base64url').toString('utf8') : '';
  const parts = /^1:([A-Za-z0-9_-]{1,64}):(\d{1,12})$/.exec(decoded);
  if (!parts) throw new S3Error(403, 'InvalidAccessKeyId', 'The AWS Access Key Id you provided does not exist in our records.');
  const [, organizationId, expiresText] = parts;
  const token = header(req, 'x-amz-security-token');
  if (!token || !sameText(token, `${accessKey}.${mac(options.credentialKey, 'token', accessKey)}`)) {
    throw new S3Error(400, 'InvalidToken', 'The provided token is malformed or otherwise invalid.');
  }
  const now = options.now?.() ?? Date.now();
  if (Number(expiresText) * 1000 <= now) throw new S3Error(400, 'ExpiredToken', 'The provided token has expired; get new credentials from GET /object-storage/push-access.');

  const amzDate = header(req, 'x-amz-date') ?? '';
  const d = AMZ_DATE.exec(amzDate);
  if (!d) throw s3.accessDenied('The x-amz-date header is missing or not in the form YYYYMMDDTHHMMSSZ.');
  const signedAt = Date.UTC(+d[1], +d[2] - 1, +d[3], +d[4], +d[5], +d[6]);
  if (amzDate.slice(0, 8) !== scopeDate) throw s3.malformed(`The credential scope's date ${scopeDate} is not the date of x-amz-date ${amzDate}.`);
  if (Math.abs(now - signedAt) > MAX_CLOCK_SKEW_MS) throw new S3Error(403, 'RequestTimeTooSkewed', 'The difference between the request time and the server time is too large.');
  const signedNames = signedHeaderList.split(';');
  for (const required of ['host', 'x-amz-date', 'x-amz-content-sha256']) {
    if (!signedNames.includes(required)) throw s3.accessDenied(`The ${required} header must be signed.`);
  }

  // Exactly the headers the client signed, as received; the signer re-adds x-amz-date (the
  // same value) and takes the payload hash from x-amz-content-sha256.
  const headers: Record<string, string> = {};
  for (const name of signedNames) {
    const value = header(req, name);
    if (value !== undefined) headers[name] = value;
  }
  const signer = new SignatureV4({
    credentials: { accessKeyId: accessKey, secretAccessKey: mac(options.credentialKey, 'secret', accessKey) },
    region: DAYTONA_S3_REGION,
    service: 's3',
    sha256: Hash.bind(null, 'sha256'),
    // S3 signs the path as sent, without normalising or encoding it again.
    uriEscapePath: false,
    applyChecksum: false,
  });
  // The client signed the URL it was given. Behind a proxy at NESTBOX_PUBLIC_URL, the path may
  // have lost that URL's prefix and the Host header its public name: both forms are tried.
  const publicBase = options.publicUrl ? new URL(options.publicUrl) : undefined;
  const prefix = publicBase?.pathname.replace(/\/+$/, '') ?? '';
  const paths = prefix && !rawPath.startsWith(`${prefix}/`) ? [rawPath, `${prefix}${rawPath}`] : [rawPath];
  const hosts = publicBase && publicBase.host !== headers.host ? [headers.host, publicBase.host] : [headers.host];
  let matched = false;
  for (const path of paths) {
    for (const host of hosts) {
      const signed = await signer.sign(
        { method: req.method, protocol: 'http:', hostname: host ?? '', path, query, headers: { ...headers, host: host ?? '' } },
        { signingDate: new Date(signedAt), signableHeaders: new Set(signedNames) },
      );
      const expected = /Signature=([0-9a-f]{64})$/.exec(String(signed.headers.authorization))?.[1] ?? '';
      const expectedList = /SignedHeaders=([^,]+),/.exec(String(signed.headers.authorization))?.[1] ?? '';
      if (sameText(expected, signature) && expectedList === signedHeaderList) matched = true;
    }
  }
  if (!matched) {
    throw new S3Error(403, 'SignatureDoesNotMatch', 'The request signature we calculated does not match the signature you provided. Check your key and signing method.');
  }
  return { organizationId, query, rawPath };
}

function targetOf(rawPath: string, organizationId: string, query: Record<string, string | string[]>): S3Target {
  if (!rawPath.startsWith(`${DAYTONA_S3_PATH}/`)) throw s3.invalidArgument(`S3 requests go to ${DAYTONA_S3_PATH}/<bucket>/<key>.`);
  const rest = rawPath.slice(DAYTONA_S3_PATH.length + 1);
  const slash = rest.indexOf('/');
  let bucket: string;
  let s3Key: string | undefined;
  try {
    bucket = decodeURIComponent(slash < 0 ? rest : rest.slice(0, slash));
    s3Key = slash < 0 || slash === rest.length - 1 ? undefined : decodeURIComponent(rest.slice(slash + 1));
  } catch {
    throw s3.invalidArgument('The path is not valid percent-encoding.');
  }
  if (bucket !== DAYTONA_BUCKET) throw new S3Error(404, 'NoSuchBucket', `The specified bucket does not exist; it is ${DAYTONA_BUCKET}.`);
  return { organizationId, bucket, s3Key, query };
}

/** The store key of an S3 key, which must lie under the credentials' organisation. */
function storeKeyOf(target: S3Target): string {
  const prefix = `${target.organizationId}/`;
  if (!target.s3Key?.startsWith(prefix) || target.s3Key.length === prefix.length) throw s3.accessDenied(`Access Denied: these credentials reach only keys under ${prefix}`);
  return target.s3Key.slice(prefix.length);
}

// ---- body checks ----

type ChecksumAlgorithm = 'crc32' | 'sha1' | 'sha256';
const CHECKSUM_HEADERS = ['x-amz-checksum-crc32', 'x-amz-checksum-crc32c', 'x-amz-checksum-crc64nvme', 'x-amz-checksum-sha1', 'x-amz-checksum-sha256'];

/**
 * Verifies the body against the integrity headers the client sent (Content-MD5, the flexible
 * x-amz-checksum-*) as it passes, failing at its end, before the store commits anything.
 */
class BodyChecks extends Transform {
  private crc = 0;
  private readonly hashes: { name: string; hash: ReturnType<typeof createHash>; expected: string; encoding: 'base64' }[] = [];
  private readonly crcExpected?: string;
  constructor(req: IncomingMessage) {
    super();
    const md5 = header(req, 'content-md5');
    if (md5) this.hashes.push({ name: 'Content-MD5', hash: createHash('md5'), expected: md5, encoding: 'base64' });
    for (const name of CHECKSUM_HEADERS) {
      const value = header(req, name);
      if (value === undefined) continue;
      const algorithm = name.slice('x-amz-checksum-'.length) as ChecksumAlgorithm | 'crc32c' | 'crc64nvme';
      if (algorithm === 'crc32') this.crcExpected = value;
      else if (algorithm === 'sha1' || algorithm === 'sha256') this.hashes.push({ name, hash: createHash(algorithm), expected: value, encoding: 'base64' });
      // Node has no CRC32C or CRC64NVME; a checksum that cannot be checked is refused, not ignored.
      else throw s3.notImplemented(`${name} is not supported by this endpoint; use CRC32, SHA1 or SHA256.`);
    }
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    if (this.crcExpected !== undefined) this.crc = crc32(chunk, this.crc);
    for (const h of this.hashes) h.hash.update(chunk);
    done(null, chunk);
  }
  override _flush(done: TransformCallback): void {
    if (this.crcExpected !== undefined) {
      const got = Buffer.alloc(4);
      got.writeUInt32BE(this.crc >>> 0);
      if (got.toString('base64') !== this.crcExpected) return done(new S3Error(400, 'BadDigest', 'The CRC32 you specified did not match the calculated checksum.'));
    }
    for (const h of this.hashes) {
      if (h.hash.digest(h.encoding) !== h.expected) return done(new S3Error(400, 'BadDigest', `The ${h.name} you specified did not match the calculated checksum.`));
    }
    done();
  }
  /** The checksum headers to echo in the answer, as S3 does (each one verified). */
  static echoed(req: IncomingMessage): Record<string, string> {
    const out: Record<string, string> = {};
    for (const name of ['x-amz-checksum-crc32', 'x-amz-checksum-sha1', 'x-amz-checksum-sha256']) {
      const v = header(req, name);
      if (v !== undefined) out[name] = v;
    }
    return out;
  }
}

/** The payload hash the client signed: a hex SHA-256 the store verifies, or UNSIGNED-PAYLOAD. */
function payloadSha256(req: IncomingMessage): string | undefined {
  const value = header(req, 'x-amz-content-sha256') ?? '';
  if (/^[0-9a-f]{64}$/.test(value)) return value;
  if (value === 'UNSIGNED-PAYLOAD') return undefined;
  // aws-chunked bodies (STREAMING-…) interleave chunk signatures with the data.
  if (value.startsWith('STREAMING-')) throw s3.notImplemented(`x-amz-content-sha256 ${value} (aws-chunked bodies) is not supported; send the body's hex SHA-256 or UNSIGNED-PAYLOAD.`);
  throw s3.invalidArgument('x-amz-content-sha256 must be a hex SHA-256 or UNSIGNED-PAYLOAD.');
}

function declaredLength(req: IncomingMessage, max: number): void {
  const length = Number(header(req, 'content-length') ?? NaN);
  if (Number.isFinite(length) && length > max) throw new S3Error(400, 'EntityTooLarge', `Your proposed upload exceeds the maximum allowed size of ${max} bytes.`);
}

// ---- the endpoint ----

/** S3's conditional writes (If-None-Match: *, If-Match) would need a check-and-replace the store does not offer. */
function refuseConditionalWrite(req: IncomingMessage): void {
  for (const name of ['if-match', 'if-none-match']) {
    if (header(req, name) !== undefined) throw s3.notImplemented(`Conditional writes (${name}) are not supported.`);
  }
}

/**
 * GET/HEAD preconditions: If-Match / If-Unmodified-Since fail with 412, If-None-Match /
 * If-Modified-Since answer 304 (true when the answer has been sent).
 */
function notModified(req: Request, res: Response, object: StoredObject): boolean {
  const matches = (list: string) => list.split(',').map((t) => t.trim()).some((t) => t === '*' || t === object.etag || t === object.etag.replace(/"/g, '') || t === `W/${object.etag}`);
  const seconds = Math.floor(object.createdAt.getTime() / 1000);
  const since = (name: string) => {
    const v = header(req, name);
    const t = v === undefined ? NaN : Date.parse(v);
    return Number.isNaN(t) ? undefined : Math.floor(t / 1000);
  };
  const ifMatch = header(req, 'if-match');
  const unmodifiedSince = since('if-unmodified-since');
  if ((ifMatch !== undefined && !matches(ifMatch)) || (ifMatch === undefined && unmodifiedSince !== undefined && seconds > unmodifiedSince)) {
    throw new S3Error(412, 'PreconditionFailed', 'At least one of the pre-conditions you specified did not hold.');
  }
  const ifNoneMatch = header(req, 'if-none-match');
  const modifiedSince = since('if-modified-since');
  if ((ifNoneMatch !== undefined && matches(ifNoneMatch)) || (ifNoneMatch === undefined && modifiedSince !== undefined && seconds <= modifiedSince)) {
    res.setHeader('ETag', object.etag);
    res.setHeader('Last-Modified', object.createdAt.toUTCString());
    res.status(304).end();
    return true;
  }
  return false;
}

/**
 * One `bytes=` range (S3 serves no multi-range requests: those, like an absent header, get the
 * whole object); outside the object → 416 InvalidRange.
 */
function byteRange(value: string | undefined, size: number): { start: number; end: number } | undefined {
  if (value === undefined) return undefined;
  const m = /^bytes=(\d*)-(\d*)$/.exec(value.trim());
  if (!m || (m[1] === '' && m[2] === '')) return undefined;
  let start: number;
  let end: number;
  if (m[1] === '') {
    const suffix = Number(m[2]);
    if (suffix === 0) throw new S3Error(416, 'InvalidRange', 'The requested range is not satisfiable');
    start = Math.max(0, size - suffix);
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
    if (m[2] !== '' && Number(m[2]) < start) return undefined;
  }
  if (start >= size) throw new S3Error(416, 'InvalidRange', 'The requested range is not satisfiable');
  return { start, end };
}

/** Passes bytes start..end (inclusive) of what flows through, and drops the rest. */
function sliceOf(start: number, end: number): Transform {
  let offset = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      const from = Math.max(0, start - offset);
      const to = Math.min(chunk.length, end + 1 - offset);
      offset += chunk.length;
      done(null, to > from ? chunk.subarray(from, to) : undefined);
    },
  });
}

function objectHeaders(res: Response, object: StoredObject): void {
  res.setHeader('ETag', object.etag);
  res.setHeader('Last-Modified', object.createdAt.toUTCString());
  res.setHeader('Content-Length', String(object.size));
  res.setHeader('Content-Type', 'application/octet-stream');
  res.setHeader('x-amz-checksum-sha256', Buffer.from(object.sha256, 'hex').toString('base64'));
}

/** The S3 calls the AWS SDK makes for Daytona's context uploads, on the organisation's store. */
export function createS3Router(options: ObjectStorageOptions): Router {
  const { store, log } = options;
  const router = express.Router();
  const maxSingle = Math.min(options.maxUploadBytes, MAX_SINGLE_UPLOAD_BYTES);

  router.use((req: Request, res: Response) => {
    void serve(req, res).catch((err) => sendS3Error(req, res, s3ErrorOf(err, log)));
  });

  async function serve(req: Request, res: Response): Promise<void> {
    const { organizationId, query, rawPath } = await verifySignature(req, options);
    const target = targetOf(rawPath, organizationId, query);
    const has = (name: string) => query[name] !== undefined;
    res.setHeader('x-amz-request-id', randomBytes(8).toString('hex').toUpperCase());
    if (target.s3Key === undefined) {
      if (req.method === 'GET' && one(query, 'list-type') === '2') return listObjectsV2(req, res, target);
      if (req.method === 'HEAD') return void res.status(200).end();
      throw s3.notImplemented(`${req.method} on the bucket is not supported here; this endpoint serves ListObjectsV2 (list-type=2) and object calls.`);
    }
    if (has('x-amz-copy-source') || header(req, 'x-amz-copy-source')) throw s3.notImplemented('CopyObject is not supported.');
    const key = storeKeyOf(target);
    const uploadId = one(query, 'uploadId');
    switch (req.method) {
      case 'PUT':
        return uploadId !== undefined ? uploadPart(req, res, target, uploadId) : putObject(req, res, target, key);
      case 'POST':
        if (has('uploads')) return createMultipart(req, res, target, key);
        if (uploadId !== undefined) return completeMultipart(req, res, target, uploadId);
        throw s3.notImplemented('POST is supported for CreateMultipartUpload (?uploads) and CompleteMultipartUpload (?uploadId=) only.');
      case 'DELETE':
        if (uploadId !== undefined) {
          await store.abortMultipart(organizationId, uploadId);
        } else {
          await store.delete(organizationId, key);
        }
        return void res.status(204).end();
      case 'HEAD': {
        const object = await store.head(organizationId, key);
        if (!object) throw new S3Error(404, 'NotFound', 'Not Found');
        if (notModified(req, res, object)) return;
        objectHeaders(res, object);
        return void res.status(200).end();
      }
      case 'GET': {
        if (uploadId !== undefined) throw s3.notImplemented('ListParts is not supported.');
        const { object, body } = await openObject(organizationId, key);
        let range: { start: number; end: number } | undefined;
        try {
          if (notModified(req, res, object)) return void body.destroy();
          range = byteRange(header(req, 'range'), object.size);
        } catch (err) {
          body.destroy();
          throw err;
        }
        objectHeaders(res, object);
        let out: Readable = body;
        if (range) {
          res.status(206);
          res.setHeader('Content-Range', `bytes ${range.start}-${range.end}/${object.size}`);
          res.setHeader('Content-Length', String(range.end - range.start + 1));
          // The checksum is the whole object's; a part of it carries none (as S3 does).
          res.removeHeader('x-amz-checksum-sha256');
          out = streamedThrough(body, sliceOf(range.start, range.end));
        } else res.status(200);
        res.setHeader('Accept-Ranges', 'bytes');
        out.on('error', (err) => {
          log.warn({ err, organizationId }, 'object read failed while streaming');
          res.destroy();
        });
        out.pipe(res);
        res.on('close', () => body.destroy());
        return;
      }
      default:
        throw new S3Error(405, 'MethodNotAllowed', `The specified method ${req.method} is not allowed against this resource.`);
    }
  }

  /**
   * The object's facts and a stream of the same version: a replace between looking it up and
   * opening it is seen (the ETag changed) and the pair taken again.
   */
  async function openObject(organizationId: string, key: string): Promise<{ object: StoredObject; body: Readable }> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const before = await store.head(organizationId, key);
      if (!before) break;
      const body = await store.read(organizationId, key).catch((err) => {
        if (err instanceof NestboxError && err.code === 'not_found') return undefined;
        throw err;
      });
      if (!body) continue;
      const after = await store.head(organizationId, key);
      if (after && after.etag === before.etag && after.size === before.size) return { object: after, body };
      body.destroy();
    }
    const object = await store.head(organizationId, key);
    if (!object) throw new S3Error(404, 'NoSuchKey', 'The specified key does not exist.');
    throw new S3Error(503, 'SlowDown', 'The object is being replaced; please retry.');
  }

  async function putObject(req: Request, res: Response, target: S3Target, key: string): Promise<void> {
    refuseConditionalWrite(req);
    const expectSha256 = payloadSha256(req);
    declaredLength(req, maxSingle);
    const checks = new BodyChecks(req);
    const body = streamedThrough(streamedBody(req, maxSingle), checks);
    const stored = await store.put(target.organizationId, key, body, { maxBytes: maxSingle, expectSha256, signal: clientGoneSignal(req, res) });
    res.setHeader('ETag', stored.etag);
    for (const [k, v] of Object.entries(BodyChecks.echoed(req))) res.setHeader(k, v);
    res.status(200).end();
  }

  async function uploadPart(req: Request, res: Response, target: S3Target, uploadId: string): Promise<void> {
    const partNumber = Number(one(target.query, 'partNumber'));
    if (!Number.isInteger(partNumber) || partNumber < 1 || partNumber > 10_000) throw s3.invalidArgument('Part number must be an integer between 1 and 10000, inclusive.');
    const expectSha256 = payloadSha256(req);
    declaredLength(req, MAX_SINGLE_UPLOAD_BYTES);
    const checks = new BodyChecks(req);
    const body = streamedThrough(streamedBody(req, MAX_SINGLE_UPLOAD_BYTES), checks);
    const part = await store.putPart(target.organizationId, uploadId, partNumber, body, { maxBytes: MAX_SINGLE_UPLOAD_BYTES, expectSha256, signal: clientGoneSignal(req, res) });
    res.setHeader('ETag', part.etag);
    for (const [k, v] of Object.entries(BodyChecks.echoed(req))) res.setHeader(k, v);
    res.status(200).end();
  }

  async function createMultipart(_req: Request, res: Response, target: S3Target, key: string): Promise<void> {
    const { uploadId } = await store.createMultipart(target.organizationId, key);
    const result = new XmlNode('InitiateMultipartUploadResult').a('xmlns', S3_XMLNS).c(leaf('Bucket', target.bucket)).c(leaf('Key', target.s3Key!)).c(leaf('UploadId', uploadId));
    res.status(200).type('application/xml').send(xml(result));
  }

  async function completeMultipart(req: Request, res: Response, target: S3Target, uploadId: string): Promise<void> {
    const expectSha256 = payloadSha256(req);
    declaredLength(req, MAX_COMPLETE_BODY_BYTES);
    const raw = await buffer(streamedBody(req, MAX_COMPLETE_BODY_BYTES));
    if (expectSha256 !== undefined && createHash('sha256').update(raw).digest('hex') !== expectSha256) {
      throw new S3Error(400, 'XAmzContentSHA256Mismatch', "The provided 'x-amz-content-sha256' header does not match what was computed.");
    }
    let parts: { partNumber: number; etag: string }[];
    try {
      const doc = parseXML(raw.toString('utf8')) as { CompleteMultipartUpload?: { Part?: unknown } };
      const list = ([] as unknown[]).concat(doc.CompleteMultipartUpload?.Part ?? []) as { ETag?: unknown; PartNumber?: unknown }[];
      parts = list.map((p) => ({ partNumber: Number(p.PartNumber), etag: String(p.ETag ?? '') }));
    } catch {
      throw new S3Error(400, 'MalformedXML', 'The XML you provided was not well-formed or did not validate against our published schema.');
    }
    if (parts.length === 0) throw new S3Error(400, 'MalformedXML', 'CompleteMultipartUpload must list at least one Part.');
    // The parts' CRC32s were checked as each part arrived (BodyChecks); the ETags name them.
    const stored = await store.completeMultipart(target.organizationId, uploadId, parts);
    const s3Key = `${target.organizationId}/${stored.key}`;
    const result = new XmlNode('CompleteMultipartUploadResult').a('xmlns', S3_XMLNS)
      .c(leaf('Location', `${options.publicUrl ?? publicOrigin(req)}${DAYTONA_S3_PATH}/${target.bucket}/${s3Key.split('/').map(encodeURIComponent).join('/')}`))
      .c(leaf('Bucket', target.bucket)).c(leaf('Key', s3Key)).c(leaf('ETag', stored.etag));
    res.status(200).type('application/xml').send(xml(result));
  }

  async function listObjectsV2(_req: Request, res: Response, target: S3Target): Promise<void> {
    const { query, organizationId } = target;
    const prefix = one(query, 'prefix') ?? '';
    const orgPrefix = `${organizationId}/`;
    // What the real server's policy allowed: the organisation's prefix, with or without its slash.
    if (prefix !== organizationId && !prefix.startsWith(orgPrefix)) throw s3.accessDenied(`Access Denied: these credentials list only keys under ${orgPrefix}`);
    if (one(query, 'delimiter') !== undefined) throw s3.notImplemented('ListObjectsV2 with a delimiter is not supported.');
    const maxKeysText = one(query, 'max-keys');
    const maxKeys = maxKeysText === undefined ? MAX_LIST_KEYS : Number(maxKeysText);
    if (!Number.isInteger(maxKeys) || maxKeys < 0) throw s3.invalidArgument('max-keys must be a non-negative integer.');
    const limit = Math.min(maxKeys, MAX_LIST_KEYS);
    const encodingType = one(query, 'encoding-type');
    if (encodingType !== undefined && encodingType !== 'url') throw s3.invalidArgument('Invalid Encoding Method specified in Request');
    const continuation = one(query, 'continuation-token');
    const startAfter = one(query, 'start-after');
    let after: string | undefined;
    if (continuation !== undefined) {
      after = Buffer.from(continuation, 'base64url').toString('utf8');
      if (!after.startsWith(orgPrefix)) throw s3.invalidArgument('The continuation token provided is incorrect.');
    } else if (startAfter !== undefined) after = startAfter;
    const strip = (k: string) => (k.startsWith(orgPrefix) ? k.slice(orgPrefix.length) : k < orgPrefix ? undefined : '\u{10ffff}');
    const storePrefix = prefix.startsWith(orgPrefix) ? prefix.slice(orgPrefix.length) : '';
    const storeAfter = after === undefined ? undefined : strip(after);
    const found = limit === 0 ? [] : await store.list(organizationId, storePrefix, { startAfter: storeAfter, limit: limit + 1 });
    const page = found.slice(0, limit);
    const truncated = found.length > limit;
    const enc = (k: string) => (encodingType === 'url' ? encodeURIComponent(k).replace(/%2F/g, '/') : k);
    const result = new XmlNode('ListBucketResult').a('xmlns', S3_XMLNS).c(leaf('Name', target.bucket)).c(leaf('Prefix', enc(prefix)))
      .c(leaf('KeyCount', page.length)).c(leaf('MaxKeys', maxKeys)).c(leaf('IsTruncated', truncated));
    if (encodingType) result.c(leaf('EncodingType', encodingType));
    if (continuation !== undefined) result.c(leaf('ContinuationToken', continuation));
    if (startAfter !== undefined) result.c(leaf('StartAfter', enc(startAfter)));
    for (const object of page) {
      result.c(new XmlNode('Contents').c(leaf('Key', enc(`${orgPrefix}${object.key}`))).c(leaf('LastModified', object.createdAt.toISOString()))
        .c(leaf('ETag', object.etag)).c(leaf('Size', object.size)).c(leaf('StorageClass', 'STANDARD')));
    }
    if (truncated) result.c(leaf('NextContinuationToken', Buffer.from(`${orgPrefix}${page[page.length - 1].key}`).toString('base64url')));
    res.status(200).type('application/xml').send(xml(result));
  }

  return router;
}
