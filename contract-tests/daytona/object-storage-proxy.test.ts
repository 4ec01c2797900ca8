// The Daytona S3 endpoint in-process (its router over the filesystem object store in a temp dir,
// no sandbox host needed), through the real AWS SDK: behind a reverse proxy at NESTBOX_PUBLIC_URL
// that strips a path prefix and rewrites Host (as a TLS terminator in front of Nestbox does: the
// SDK signs the public URL it was handed), ranged and conditional GETs, conditional writes.
import http from 'node:http';
import { randomBytes, createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { GetObjectCommand, HeadObjectCommand, ListObjectsV2Command, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createS3Router, issueStorageAccess, type StorageAccess } from '../../compat/daytona/object-storage.js';
import { FsObjectStore } from '../../src/object-store/fs-object-store.js';
import { createLogger } from '../../src/logger.js';

const ORG = 'orgproxyproxyproxy1';
let root: string;
let server: http.Server;
let proxy: http.Server;
let access: StorageAccess;

function listen(s: http.Server): Promise<number> {
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve((s.address() as AddressInfo).port)));
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'nbx-s3proxy-'));
  const store = await FsObjectStore.open({ root, maxBytesPerOrganization: 1e9 });
  const credentialKey = randomBytes(32);
  proxy = http.createServer();
  const proxyPort = await listen(proxy);
  const publicUrl = `http://localhost:${proxyPort}/base`;
  const app = express();
  app.use('/daytona/s3', createS3Router({ store, credentialKey, publicUrl, maxUploadBytes: 1e9, log: createLogger({ level: 'error' }) }));
  server = http.createServer(app);
  const port = await listen(server);
  // The proxy: strips /base, and sends the upstream's own Host.
  proxy.on('request', (req, res) => {
    const upstream = http.request({ host: '127.0.0.1', port, method: req.method, path: (req.url ?? '/').replace(/^\/base/, ''), headers: { ...req.headers, host: `127.0.0.1:${port}` } }, (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    });
    upstream.on('error', () => res.destroy());
    req.pipe(upstream);
  });
  const fakeReq = { headers: { host: `127.0.0.1:${port}` }, socket: {} } as unknown as http.IncomingMessage;
  access = issueStorageAccess(fakeReq, { organizationId: ORG, keyId: 'k', scopes: new Set(), sandboxIds: null }, { credentialKey, publicUrl });
});
afterAll(async () => {
  proxy?.closeAllConnections();
  server?.closeAllConnections();
  await new Promise((r) => proxy?.close(r));
  await new Promise((r) => server?.close(r));
  rmSync(root, { recursive: true, force: true });
});

describe('Daytona S3 endpoint behind a prefix-stripping proxy (NESTBOX_PUBLIC_URL)', () => {
  it('verifies requests the SDK signed for the public URL', async () => {
    expect(access.storageUrl).toMatch(/^http:\/\/localhost:\d+\/base\/daytona\/s3$/);
    const s3 = new S3Client({ endpoint: access.storageUrl, region: access.region, forcePathStyle: true, maxAttempts: 1, credentials: { accessKeyId: access.accessKey, secretAccessKey: access.secret, sessionToken: access.sessionToken } });
    const body = randomBytes(7 * 1024 * 1024);
    await new Upload({ client: s3, params: { Bucket: access.bucket, Key: `${ORG}/h/context.tar`, Body: body } }).done();
    await s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${ORG}/small`, Body: 'x' }));
    const listed = await s3.send(new ListObjectsV2Command({ Bucket: access.bucket, Prefix: `${ORG}/h/`, MaxKeys: 1 }));
    expect(listed.Contents?.map((c) => c.Key)).toEqual([`${ORG}/h/context.tar`]);
    const got = await s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${ORG}/h/context.tar` }));
    const bytes = Buffer.from(await got.Body!.transformToByteArray());
    expect(createHash('sha256').update(bytes).digest('hex')).toBe(createHash('sha256').update(body).digest('hex'));
    // A wrong secret is still refused through the proxy.
    const wrong = new S3Client({ endpoint: access.storageUrl, region: access.region, forcePathStyle: true, maxAttempts: 1, credentials: { accessKeyId: access.accessKey, secretAccessKey: 'nope', sessionToken: access.sessionToken } });
    await expect(wrong.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${ORG}/small`, Body: 'y' }))).rejects.toMatchObject({ name: 'SignatureDoesNotMatch' });
  });
});

describe('Daytona S3 endpoint: ranges and preconditions', () => {
  const client = () => new S3Client({ endpoint: access.storageUrl, region: access.region, forcePathStyle: true, maxAttempts: 1, credentials: { accessKeyId: access.accessKey, secretAccessKey: access.secret, sessionToken: access.sessionToken } });
  const body = Buffer.from('0123456789abcdef');

  it('serves one byte range (206 with Content-Range), refuses one outside the object (416)', async () => {
    const s3 = client();
    await s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${ORG}/r`, Body: body }));
    for (const [range, text, contentRange] of [['bytes=2-5', '2345', 'bytes 2-5/16'], ['bytes=10-', 'abcdef', 'bytes 10-15/16'], ['bytes=-3', 'def', 'bytes 13-15/16'], ['bytes=14-99', 'ef', 'bytes 14-15/16']]) {
      const got = await s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${ORG}/r`, Range: range }));
      expect(got.$metadata.httpStatusCode).toBe(206);
      expect(got.ContentRange).toBe(contentRange);
      expect(Buffer.from(await got.Body!.transformToByteArray()).toString()).toBe(text);
    }
    await expect(s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${ORG}/r`, Range: 'bytes=16-20' }))).rejects.toMatchObject({ name: 'InvalidRange', $metadata: { httpStatusCode: 416 } });
  });

  it('answers If-None-Match with 304 and a failed If-Match with 412; refuses conditional writes', async () => {
    const s3 = client();
    const { ETag } = await s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${ORG}/c`, Body: body }));
    await expect(s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${ORG}/c`, IfNoneMatch: ETag }))).rejects.toMatchObject({ $metadata: { httpStatusCode: 304 } });
    await expect(s3.send(new HeadObjectCommand({ Bucket: access.bucket, Key: `${ORG}/c`, IfMatch: '"00000000000000000000000000000000"' }))).rejects.toMatchObject({ $metadata: { httpStatusCode: 412 } });
    const ok = await s3.send(new GetObjectCommand({ Bucket: access.bucket, Key: `${ORG}/c`, IfMatch: ETag }));
    expect(Buffer.from(await ok.Body!.transformToByteArray()).toString()).toBe(body.toString());
    await expect(s3.send(new PutObjectCommand({ Bucket: access.bucket, Key: `${ORG}/c`, Body: 'x', IfNoneMatch: '*' }))).rejects.toMatchObject({ name: 'NotImplemented', $metadata: { httpStatusCode: 501 } });
  });
});
