// Daytona's build-context storage (daytona-wave2.md §2): GET /object-storage/push-access and the
// S3 endpoint it points at, through the real AWS SDK v3 (@aws-sdk/client-s3, @aws-sdk/lib-storage,
// the clients @daytonaio/sdk itself uploads with) and through the Daytona SDK's own upload.
import http from 'node:http';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  UploadPartCommand,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { SignatureV4 } from '@smithy/signature-v4';
import { Hash } from '@smithy/hash-node';
import { Daytona, Image } from '@daytonaio/sdk';
import * as tar from 'tar';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDaytonaEnv, rawFetch, type DaytonaTestEnv } from './helpers.js';
import { issueStorageAccess, type StorageAccess } from '../../compat/daytona/object-storage.js';
import { daytonaOptionsOf } from '../../src/http/app.js';

let env: DaytonaTestEnv;
let access: StorageAccess;
let otherAccess: StorageAccess;
let otherKey: string;
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const md5 = (b: Buffer) => createHash('md5').update(b).digest('hex');

async function pushAccess(key: string): Promise<StorageAccess> {
  const res = await fetch(`${env.apiUrl}/object-storage/push-access`, { headers: { authorization: `Bearer ${key}` } });
  expect(res.status).toBe(200);
  return (await res.json()) as StorageAccess;
}

function clientOf(a: StorageAccess, overrides: { secret?: string } = {}): S3Client {
  return new S3Client({
    endpoint: a.storageUrl,
    region: a.region,
    forcePathStyle: true,
    credentials: { accessKeyId: a.accessKey, secretAccessKey: overrides.secret ?? a.secret, sessionToken: a.sessionToken },
    maxAttempts: 1,
  });
}

/** The S3 error an SDK call failed with: its code (the XML <Code>) and HTTP status. */
async function s3Failure(p: Promise<unknown>): Promise<{ name: string; status?: number; message: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as { name: string; message: string; $metadata?: { httpStatusCode?: number } };
    return { name: e.name, status: e.$metadata?.httpStatusCode, message: e.message };
  }
  throw new Error('expected the S3 call to fail');
}

/** A request signed by hand (the AWS SDK's signer), for what the SDK never sends: Expect, a wrong payload hash. */
async function signedRequest(a: StorageAccess, method: string, key: string, body: Buffer, headers: Record<string, string>, signingDate = new Date()): Promise<{ status: number; text: string; continued: boolean }> {
  const url = new URL(`${a.storageUrl}/${a.bucket}/${key}`);
  const signer = new SignatureV4({ credentials: { accessKeyId: a.accessKey, secretAccessKey: a.secret, sessionToken: a.sessionToken }, region: a.region, service: 's3', sha256: Hash.bind(null, 'sha256'), uriEscapePath: false });
  const signed = await signer.sign({ method, protocol: 'http:', hostname: url.hostname, port: Number(url.port), path: url.pathname, query: {}, headers: { host: url.host, 'content-length': String(body.length), 'x-amz-content-sha256': sha256(body), ...headers } }, { signingDate });
  return new Promise((resolve, reject) => {
    let continued = false;
    const req = http.request({ host: url.hostname, port: url.port, method, path: url.pathname, headers: signed.headers });
    req.on('continue', () => {
      continued = true;
      req.end(body);
    });
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text, continued }));
    });
    req.on('error', reject);
    if (!headers.expect) req.end(body);
    else req.flushHeaders();
  });
}

beforeAll(async () => {
  // 32 MiB per organisation, 21 MiB per PutObject (NESTBOX_MAX_UPLOAD_BYTES).
  env = await startDaytonaEnv({ NESTBOX_ORG_MAX_OBJECT_BYTES: String(32 * 1024 * 1024), NESTBOX_MAX_UPLOAD_BYTES: String(21 * 1024 * 1024) });
  const org = await env.server.server.services.auth.createOrganization('s3-other');
  otherKey = (await env.server.server.services.auth.createApiKey(org.id, { name: 'other', preset: 'admin' })).key;
  access = await pushAccess(env.server.apiKey);
  otherAccess = await pushAccess(otherKey);
});
afterAll(async () => {
  await env?.server.close();
});

describe('Daytona object storage (push-access + S3 endpoint)', () => {
  it('push-access answers a StorageAccessDto for the caller\'s organisation, pointing at this server', async () => {
    expect(access).toMatchObject({ bucket: 'daytona-volume-builds', region: 'us-east-1', storageUrl: `${env.server.url}/daytona/s3` });
    for (const field of ['accessKey', 'secret', 'sessionToken', 'organizationId'] as const) expect(typeof access[field]).toBe('string');
    expect(access.organizationId).not.toBe(otherAccess.organizationId);
    expect(access.accessKey).not.toBe(otherAccess.accessKey);
    // No key, no credentials (Daytona's 401 shape).
    const res = await fetch(`${env.apiUrl}/object-storage/push-access`);
    expect(res.status).toBe(401);
    // With NESTBOX_PUBLIC_URL set (TLS in front), storageUrl is built on it: the Python SDK's S3
    // client (obstore) refuses plain-HTTP endpoints.
    const fakeReq = { headers: { host: '127.0.0.1:1' }, socket: {} } as unknown as http.IncomingMessage;
    const principal = { organizationId: access.organizationId, keyId: 'k', scopes: new Set<never>(), sandboxIds: null };
    const { credentialKey } = daytonaOptionsOf(env.server.server.services).objectStorage;
    expect(issueStorageAccess(fakeReq, principal, { credentialKey, publicUrl: 'https://nestbox.example.com/base' }).storageUrl).toBe('https://nestbox.example.com/base/daytona/s3');
    expect(issueStorageAccess(fakeReq, principal, { credentialKey }).storageUrl).toBe('http://127.0.0.1:1/daytona/s3');
    // Other object-storage routes are still a 501 that names what is missing.
    expect((await rawFetch(env, '/daytona/api/object-storage/pull-access')).status).toBe(501);
  });

  it('PutObject, HeadObject, GetObject, ListObjectsV2 with a prefix, DeleteObject', async () => {
    const s3 = clientOf(access);
    const org = access.organizationId;
    const body = randomBytes(64 * 1024);
    const put = await s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar`, Body: body }));
    expect(put.ETag).toBe(`"${md5(body)}"`);
    // In the server's one object store, as the organisation's key without the org prefix.
    expect(await env.server.server.services.objects.head(org, 'small/context.tar')).toMatchObject({ size: body.length, sha256: sha256(body) });

    const head = await s3.send(new HeadObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` }));
    expect(head.ContentLength).toBe(body.length);
    expect(head.ETag).toBe(put.ETag);
    const got = await s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` }));
    expect(sha256(Buffer.from(await got.Body!.transformToByteArray()))).toBe(sha256(body));

    await s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/small/other`, Body: 'x' }));
    await s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/zzz/context.tar`, Body: 'y' }));
    // The SDK's own existence check: prefix <org>/<hash>/ and max-keys 1.
    const one = await s3.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${org}/small/`, MaxKeys: 1 }));
    expect(one.KeyCount).toBe(1);
    expect(one.IsTruncated).toBe(true);
    expect(one.Contents?.map((c) => c.Key)).toEqual([`${org}/small/context.tar`]);
    const next = await s3.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${org}/small/`, ContinuationToken: one.NextContinuationToken }));
    expect(next.Contents?.map((c) => c.Key)).toEqual([`${org}/small/other`]);
    const none = await s3.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${org}/missing/`, MaxKeys: 1 }));
    expect(none.KeyCount).toBe(0);
    expect(none.Contents).toBeUndefined();
    const all = await s3.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: org }));
    expect(all.Contents?.map((c) => c.Key)).toEqual([`${org}/small/context.tar`, `${org}/small/other`, `${org}/zzz/context.tar`]);

    await s3.send(new DeleteObjectCommand({ Bucket: access.bucket, Key: `${org}/small/other` }));
    expect((await s3Failure(s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${org}/small/other` })))).name).toBe('NoSuchKey');
    expect((await s3Failure(s3.send(new HeadObjectCommand({ Bucket: access.bucket, Key: `${org}/small/other` })))).status).toBe(404);
  });

  it('a >5 MiB upload through lib-storage (concurrent parts), and parts sent out of order by hand', async () => {
    const s3 = clientOf(access);
    const org = access.organizationId;
    const body = randomBytes(12 * 1024 * 1024 + 777);
    await new Upload({ client: s3, params: { Bucket: access.bucket, Key: `${org}/big/context.tar`, Body: Readable.from([body]) }, queueSize: 4, partSize: 5 * 1024 * 1024 }).done();
    const stored = await env.server.server.services.objects.head(org, 'big/context.tar');
    expect(stored).toMatchObject({ size: body.length, sha256: sha256(body) });
    expect(stored!.etag).toMatch(/^"[0-9a-f]{32}-3"$/);

    const parts = [randomBytes(5 * 1024 * 1024), randomBytes(1000)];
    const { UploadId } = await s3.send(new CreateMultipartUploadCommand({ Bucket: access.bucket, Key: `${org}/manual/context.tar` }));
    const second = await s3.send(new UploadPartCommand({ Bucket: access.bucket, Key: `${org}/manual/context.tar`, UploadId, PartNumber: 2, Body: parts[1] }));
    const first = await s3.send(new UploadPartCommand({ Bucket: access.bucket, Key: `${org}/manual/context.tar`, UploadId, PartNumber: 1, Body: parts[0] }));
    expect(await env.server.server.services.objects.head(org, 'manual/context.tar')).toBeUndefined();
    const done = await s3.send(new CompleteMultipartUploadCommand({
      Bucket: access.bucket,
      Key: `${org}/manual/context.tar`,
      UploadId,
      MultipartUpload: { Parts: [{ PartNumber: 1, ETag: first.ETag }, { PartNumber: 2, ETag: second.ETag }] },
    }));
    expect(done.Key).toBe(`${org}/manual/context.tar`);
    const whole = Buffer.concat(parts);
    const got = await s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${org}/manual/context.tar` }));
    expect(sha256(Buffer.from(await got.Body!.transformToByteArray()))).toBe(sha256(whole));

    const aborted = await s3.send(new CreateMultipartUploadCommand({ Bucket: access.bucket, Key: `${org}/aborted/context.tar` }));
    await s3.send(new AbortMultipartUploadCommand({ Bucket: access.bucket, Key: `${org}/aborted/context.tar`, UploadId: aborted.UploadId }));
    expect((await s3Failure(s3.send(new UploadPartCommand({ Bucket: access.bucket, Key: `${org}/aborted/context.tar`, UploadId: aborted.UploadId, PartNumber: 1, Body: 'x' })))).name).toBe('NoSuchUpload');
  });

  it('refuses a bad signature, expired credentials, a wrong bucket and a body that is not the one signed', async () => {
    const org = access.organizationId;
    const bad = await s3Failure(clientOf(access, { secret: 'not-the-secret' }).send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/bad`, Body: 'x' })));
    expect(bad).toMatchObject({ name: 'SignatureDoesNotMatch', status: 403 });

    // Credentials minted an hour and a minute ago, exactly as push-access mints them.
    const { credentialKey } = daytonaOptionsOf(env.server.server.services).objectStorage;
    const fakeReq = { headers: { host: new URL(env.server.url).host }, socket: {} } as unknown as http.IncomingMessage;
    const principal = { organizationId: org, keyId: 'k', scopes: new Set<never>(), sandboxIds: null };
    const expired = issueStorageAccess(fakeReq, principal, { credentialKey, now: () => Date.now() - 3660_000 });
    expect(await s3Failure(clientOf(expired).send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${org}/` })))).toMatchObject({ name: 'ExpiredToken', status: 400 });

    const wrongBucket = await s3Failure(clientOf(access).send(new PutObjectCommand({ Bucket: 'another-bucket', Key: `${org}/x`, Body: 'x' })));
    expect(wrongBucket).toMatchObject({ name: 'NoSuchBucket', status: 404 });

    const signedFor = Buffer.from('the body that was signed');
    const res = await signedRequest(access, 'PUT', `${org}/tampered`, Buffer.from('another body, same size!'), { 'x-amz-content-sha256': sha256(signedFor) });
    expect(res.status).toBe(400);
    expect(res.text).toContain('<Code>XAmzContentSHA256Mismatch</Code>');
    expect(await env.server.server.services.objects.head(org, 'tampered')).toBeUndefined();
    // Unsigned, signed too long ago, a key that escapes with "..", a body past the upload limit.
    const anonymous = await fetch(`${access.storageUrl}/${access.bucket}/${org}/small/context.tar`);
    expect(anonymous.status).toBe(403);
    expect(await anonymous.text()).toContain('<Code>AccessDenied</Code>');
    // A URL refused before any router (malformed percent-encoding) still gets S3's shape.
    const malformed = await fetch(`${access.storageUrl}/${access.bucket}/${org}/%ZZ`);
    expect(malformed.status).toBe(400);
    expect(await malformed.text()).toContain('<Code>InvalidArgument</Code>');
    const skewed = await signedRequest(access, 'PUT', `${org}/skewed`, Buffer.from('x'), {}, new Date(Date.now() - 20 * 60_000));
    expect(skewed.status).toBe(403);
    expect(skewed.text).toContain('<Code>RequestTimeTooSkewed</Code>');
    expect(await s3Failure(clientOf(access).send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/a/../../other/x`, Body: 'x' })))).toMatchObject({ status: 400 });
    expect(await s3Failure(clientOf(access).send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/huge`, Body: Buffer.alloc(21 * 1024 * 1024 + 1) })))).toMatchObject({ name: 'EntityTooLarge', status: 400 });
    expect(await env.server.server.services.objects.head(org, 'huge')).toBeUndefined();
    // A flexible checksum that does not match the body (the SDK sends CRC32) is refused too.
    const crc = await signedRequest(access, 'PUT', `${org}/tampered`, Buffer.from('body'), { 'x-amz-checksum-crc32': 'AAAAAA==' });
    expect(crc.status).toBe(400);
    expect(crc.text).toContain('<Code>BadDigest</Code>');
    expect(await env.server.server.services.objects.head(org, 'tampered')).toBeUndefined();
  });

  it('answers Expect: 100-continue before the body is sent', async () => {
    const body = randomBytes(3 * 1024 * 1024);
    const res = await signedRequest(access, 'PUT', `${access.organizationId}/continued`, body, { expect: '100-continue' });
    expect(res).toMatchObject({ status: 200, continued: true });
    expect(await env.server.server.services.objects.head(access.organizationId, 'continued')).toMatchObject({ size: body.length, sha256: sha256(body) });
  });

  it("refuses another organisation's prefix (AccessDenied) and keeps each organisation's objects apart", async () => {
    const org = access.organizationId;
    const theirs = clientOf(otherAccess);
    for (const call of [
      () => theirs.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` })),
      () => theirs.send(new HeadObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` })),
      () => theirs.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/planted/context.tar`, Body: 'x' })),
      () => theirs.send(new DeleteObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` })),
      () => theirs.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${org}/` })),
      () => theirs.send(new ListObjectsV2Command({ Bucket: access.bucket })),
      () => theirs.send(new CreateMultipartUploadCommand({ Bucket: access.bucket, Key: `${org}/planted/context.tar` })),
    ]) {
      expect(await s3Failure(call())).toMatchObject({ status: 403 });
    }
    expect(await s3Failure(theirs.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` })))).toMatchObject({ name: 'AccessDenied' });
    expect(await env.server.server.services.objects.head(org, 'small/context.tar')).toBeDefined();
    expect(await env.server.server.services.objects.head(org, 'planted/context.tar')).toBeUndefined();
    // Their own prefix works, and is theirs only.
    await theirs.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${otherAccess.organizationId}/small/context.tar`, Body: 'theirs' }));
    const mine = await clientOf(access).send(new GetObjectCommand({ Bucket: access.bucket, Key: `${org}/small/context.tar` }));
    expect(Buffer.from(await mine.Body!.transformToByteArray()).toString()).not.toBe('theirs');
    // An upload id of one organisation is unknown to the other, even under its own prefix.
    const { UploadId } = await clientOf(access).send(new CreateMultipartUploadCommand({ Bucket: access.bucket, Key: `${org}/mp/context.tar` }));
    expect(await s3Failure(theirs.send(new UploadPartCommand({ Bucket: access.bucket, Key: `${otherAccess.organizationId}/mp/context.tar`, UploadId, PartNumber: 1, Body: 'x' })))).toMatchObject({ name: 'NoSuchUpload', status: 404 });
  });

  it("holds the organisation to its byte quota (NESTBOX_ORG_MAX_OBJECT_BYTES): QuotaExceeded, and nothing kept", async () => {
    const theirs = clientOf(otherAccess);
    const org = otherAccess.organizationId;
    await theirs.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/q1`, Body: randomBytes(20 * 1024 * 1024) }));
    const over = await s3Failure(theirs.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/q2`, Body: randomBytes(20 * 1024 * 1024) })));
    expect(over).toMatchObject({ name: 'QuotaExceeded', status: 403 });
    expect(await env.server.server.services.objects.head(org, 'q2')).toBeUndefined();
    await theirs.send(new DeleteObjectCommand({ Bucket: access.bucket, Key: `${org}/q1` }));
    await theirs.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${org}/q2`, Body: randomBytes(20 * 1024 * 1024) }));
    await theirs.send(new DeleteObjectCommand({ Bucket: access.bucket, Key: `${org}/q2` }));
  });

  it('the Daytona SDK uploads an Image context before POST /snapshots, and skips it the second time (the build itself: images.test.ts)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nbx-ctx-'));
    try {
      mkdirSync(join(dir, 'sub'));
      writeFileSync(join(dir, 'a.txt'), 'hello');
      writeFileSync(join(dir, 'sub', 'b.txt'), randomBytes(1000));
      // `default`, not debianSlim: its python base is on Docker Hub, which tests never reach.
      const image = Image.base('default').addLocalDir(dir, '/app');
      const daytona = new Daytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey });
      const store = env.server.server.services.objects;
      const org = access.organizationId;

      // The context upload before POST /snapshots is what this test covers.
      expect((await daytona.snapshot.create({ name: 'ctx-snap', image })).state).toBe('active');
      const contexts = (await store.list(org, '')).filter((o) => o.key.endsWith('/context.tar') && /^[0-9a-f]{32}\//.test(o.key));
      expect(contexts).toHaveLength(1);
      const entries: string[] = [];
      await new Promise<void>((resolve, reject) => {
        const parser = new tar.Parser({ onReadEntry: (entry) => { entries.push(entry.path); entry.resume(); } });
        parser.on('end', resolve);
        parser.on('error', reject);
        void store.read(org, contexts[0].key).then((s) => s.pipe(parser), reject);
      });
      const root = dir.slice(1);
      expect(entries).toEqual(expect.arrayContaining([`${root}/`, `${root}/a.txt`, `${root}/sub/`, `${root}/sub/b.txt`]));

      // The second run lists the prefix, finds it and does not upload again.
      expect((await daytona.snapshot.create({ name: 'ctx-snap-2', image })).state).toBe('active');
      const again = (await store.list(org, '')).filter((o) => o.key.endsWith('/context.tar') && /^[0-9a-f]{32}\//.test(o.key));
      expect(again).toHaveLength(1);
      expect(again[0].createdAt.getTime()).toBe(contexts[0].createdAt.getTime());
      expect(sha256(await buffer(await store.read(org, again[0].key)))).toBe(again[0].sha256);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
