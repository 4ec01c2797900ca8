// The filesystem object store on a temp dir: what is visible when, what a failure leaves, the
// quota, multipart ETags, and a real kill -9 of a process in the middle of a write.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, writeFileSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { buffer } from 'node:stream/consumers';
import { build } from 'esbuild';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { NestboxError } from '../../core/errors.js';
import { FsObjectStore } from './fs-object-store.js';

const ORG = 'orgaaaaaaaaaaaaaaaa';
const OTHER = 'orgbbbbbbbbbbbbbbbb';
const md5 = (b: Buffer) => createHash('md5').update(b).digest('hex');
const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

let root: string;
let store: FsObjectStore;
const open = (extra: Partial<Parameters<typeof FsObjectStore.open>[0]> = {}) => FsObjectStore.open({ root, maxBytesPerOrganization: 64 * 1024 * 1024, ...extra });

beforeEach(async () => {
  root = mkdtempSync(join(tmpdir(), 'nbx-objects-'));
  store = await open();
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

async function errorOf(p: Promise<unknown>): Promise<NestboxError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(NestboxError);
    return err as NestboxError;
  }
  throw new Error('expected a failure');
}

/** Every file under the store except its directories. */
function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true }).filter((d) => d.isFile()).map((d) => join(d.parentPath, d.name));
}

describe('FsObjectStore', () => {
  it('puts, heads, reads, replaces and deletes; organisations never see each other', async () => {
    const body = Buffer.from('hello world');
    const stored = await store.put(ORG, 'a/b.txt', Readable.from([body]));
    expect(stored).toMatchObject({ key: 'a/b.txt', size: 11, sha256: sha256(body), etag: `"${md5(body)}"` });
    expect(await store.head(ORG, 'a/b.txt')).toMatchObject({ size: 11, etag: stored.etag });
    expect((await buffer(await store.read(ORG, 'a/b.txt'))).toString()).toBe('hello world');
    expect(await store.head(OTHER, 'a/b.txt')).toBeUndefined();
    expect((await errorOf(store.read(OTHER, 'a/b.txt'))).code).toBe('not_found');

    await store.put(ORG, 'a/b.txt', Readable.from([Buffer.from('v2')]));
    expect((await buffer(await store.read(ORG, 'a/b.txt'))).toString()).toBe('v2');
    // The replaced object's bytes are gone, not just unnamed.
    expect(filesUnder(join(root, 'orgs', ORG, 'blobs'))).toHaveLength(1);

    await store.delete(ORG, 'a/b.txt');
    await store.delete(ORG, 'a/b.txt');
    expect(await store.head(ORG, 'a/b.txt')).toBeUndefined();
    expect(filesUnder(join(root, 'orgs', ORG, 'blobs'))).toHaveLength(0);
  });

  it('keeps a stream open on an object readable while it is replaced', async () => {
    const first = randomBytes(256 * 1024);
    await store.put(ORG, 'k', Readable.from([first]));
    const reading = await store.read(ORG, 'k');
    await store.put(ORG, 'k', Readable.from([Buffer.from('second')]));
    expect(sha256(await buffer(reading))).toBe(sha256(first));
  });

  it('refuses bad keys: empty, NUL, "..", over 1024 bytes, lone surrogates; odd characters map to safe names', async () => {
    for (const key of ['', 'a\0b', '../x', 'a/../b', '..', 'x'.repeat(1025), 'é'.repeat(513), 'a\ud800b']) {
      const err = await errorOf(store.put(ORG, key, Readable.from([Buffer.from('x')])));
      expect(err.code).toBe('validation_failed');
      expect(err.details?.field).toBe('key');
    }
    expect((await errorOf(store.put('../etc', 'k', Readable.from([Buffer.from('x')])))).code).toBe('validation_failed');
    // Keys S3 allows, however they look as paths, stay inside the organisation's directory.
    const odd = ['/leading', 'a//b', './x', 'trailing/', 'x'.repeat(1024), 'sp ace/ünï/%2F'];
    for (const key of odd) await store.put(ORG, key, Readable.from([Buffer.from(key)]));
    for (const key of odd) expect((await buffer(await store.read(ORG, key))).toString()).toBe(key);
    for (const file of filesUnder(root)) expect(file.startsWith(join(root, 'tmp')) || file.startsWith(join(root, 'orgs', ORG))).toBe(true);
  });

  it('lists in key order with prefix, startAfter and limit', async () => {
    for (const key of ['b/2', 'a/1', 'b/1', 'b/10', 'c', 'b/é', 'b/z']) await store.put(ORG, key, Readable.from([Buffer.from(key)]));
    await store.put(OTHER, 'b/other', Readable.from([Buffer.from('x')]));
    const keys = async (prefix: string, o?: { startAfter?: string; limit?: number }) => (await store.list(ORG, prefix, o)).map((o) => o.key);
    expect(await keys('')).toEqual(['a/1', 'b/1', 'b/10', 'b/2', 'b/z', 'b/é', 'c']);
    expect(await keys('b/')).toEqual(['b/1', 'b/10', 'b/2', 'b/z', 'b/é']);
    expect(await keys('b/', { limit: 2 })).toEqual(['b/1', 'b/10']);
    expect(await keys('b/', { startAfter: 'b/10', limit: 2 })).toEqual(['b/2', 'b/z']);
    expect(await keys('nothing')).toEqual([]);
  });

  it('enforces maxBytes and expectSha256 keeping nothing, and an abort signal', async () => {
    await store.put(ORG, 'k', Readable.from([Buffer.from('old')]));
    const tooBig = await errorOf(store.put(ORG, 'k', Readable.from([randomBytes(1000), randomBytes(1000)]), { maxBytes: 1500 }));
    expect(tooBig.code).toBe('payload_too_large');
    const body = Buffer.from('content');
    const wrong = await errorOf(store.put(ORG, 'k', Readable.from([body]), { expectSha256: sha256(Buffer.from('other')) }));
    expect(wrong.code).toBe('validation_failed');
    expect(wrong.details?.field).toBe('sha256');
    const controller = new AbortController();
    const endless = new Readable({ read() {} });
    endless.push(randomBytes(1000));
    const aborted = store.put(ORG, 'k', endless, { signal: controller.signal });
    setTimeout(() => controller.abort(), 50);
    await expect(aborted).rejects.toThrow();
    // The old object is intact and no temp file is left.
    expect((await buffer(await store.read(ORG, 'k'))).toString()).toBe('old');
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect(await store.put(ORG, 'k', Readable.from([body]), { expectSha256: sha256(body).toUpperCase() })).toMatchObject({ size: 7 });
  });

  it('multipart: parts in any order and concurrently, retried parts, complete in order, S3 ETag, abort', async () => {
    const parts = [randomBytes(300_000), randomBytes(300_000), randomBytes(1234)];
    const { uploadId } = await store.createMultipart(ORG, 'big/context.tar');
    // A first version of part 2 that the client then sends again: complete uses the one it names.
    await store.putPart(ORG, uploadId, 2, Readable.from([randomBytes(10)]));
    const etags = await Promise.all([3, 1, 2].map((n) => store.putPart(ORG, uploadId, n, Readable.from([parts[n - 1]]))));
    const byNumber = new Map([3, 1, 2].map((n, i) => [n, etags[i].etag]));
    expect(byNumber.get(1)).toBe(`"${md5(parts[0])}"`);
    expect(await store.head(ORG, 'big/context.tar')).toBeUndefined();
    // Another organisation cannot touch the upload.
    expect((await errorOf(store.putPart(OTHER, uploadId, 1, Readable.from([Buffer.from('x')])))).details?.kind).toBe('upload');
    expect((await errorOf(store.completeMultipart(ORG, uploadId, [{ partNumber: 2, etag: byNumber.get(2)! }, { partNumber: 1, etag: byNumber.get(1)! }]))).code).toBe('validation_failed');
    expect((await errorOf(store.completeMultipart(ORG, uploadId, [{ partNumber: 1, etag: `"${md5(Buffer.from('nope'))}"` }]))).code).toBe('validation_failed');

    const stored = await store.completeMultipart(ORG, uploadId, [1, 2, 3].map((n) => ({ partNumber: n, etag: byNumber.get(n)! })));
    const whole = Buffer.concat(parts);
    const expectedEtag = `"${createHash('md5').update(Buffer.concat(parts.map((p) => createHash('md5').update(p).digest()))).digest('hex')}-3"`;
    expect(stored).toMatchObject({ key: 'big/context.tar', size: whole.length, sha256: sha256(whole), etag: expectedEtag });
    expect(sha256(await buffer(await store.read(ORG, 'big/context.tar')))).toBe(sha256(whole));
    expect((await errorOf(store.putPart(ORG, uploadId, 1, Readable.from([Buffer.from('x')])))).code).toBe('not_found');

    const second = await store.createMultipart(ORG, 'other');
    await store.putPart(ORG, second.uploadId, 1, Readable.from([Buffer.from('x')]));
    await store.abortMultipart(ORG, second.uploadId);
    expect((await errorOf(store.abortMultipart(ORG, second.uploadId))).code).toBe('not_found');
    expect((await errorOf(store.abortMultipart(ORG, '../../x'))).code).toBe('not_found');
    expect(await store.head(ORG, 'other')).toBeUndefined();
  });

  it('holds each organisation to its byte quota, parts of unfinished uploads included, and counts freed bytes back', async () => {
    store = await open({ maxBytesPerOrganization: 10_000 });
    await store.put(ORG, 'a', Readable.from([randomBytes(6000)]));
    const over = await errorOf(store.put(ORG, 'b', Readable.from([randomBytes(5000)])));
    expect(over.code).toBe('quota_exceeded');
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    // Another organisation has its own quota.
    await store.put(OTHER, 'b', Readable.from([randomBytes(9000)]));
    const { uploadId } = await store.createMultipart(ORG, 'm');
    await store.putPart(ORG, uploadId, 1, Readable.from([randomBytes(3000)]));
    expect((await errorOf(store.putPart(ORG, uploadId, 2, Readable.from([randomBytes(3000)])))).code).toBe('quota_exceeded');
    await store.abortMultipart(ORG, uploadId);
    await store.delete(ORG, 'a');
    await store.put(ORG, 'b', Readable.from([randomBytes(9000)]));
    // A restart measures what is on disk.
    const reopened = await open({ maxBytesPerOrganization: 10_000 });
    expect((await errorOf(reopened.put(ORG, 'c', Readable.from([randomBytes(2000)])))).code).toBe('quota_exceeded');
    await reopened.put(ORG, 'b', Readable.from([randomBytes(1000)]));
    await reopened.put(ORG, 'c', Readable.from([randomBytes(8000)]));
  });

  it('replicas on one directory: each sees what the others stored, in its quota too, and a key\'s writers take turns across them', async () => {
    // What the server passes with PostgreSQL (an advisory lock there; a shared in-memory one here).
    const held = new Map<string, Promise<void>>();
    let overlapped = false;
    let inside = 0;
    const acrossProcesses = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
      const before = held.get(name) ?? Promise.resolve();
      let done!: () => void;
      held.set(name, new Promise<void>((r) => (done = r)));
      await before;
      try {
        if (++inside > 1) overlapped = true;
        return await fn();
      } finally {
        inside--;
        done();
      }
    };
    const one = await open({ maxBytesPerOrganization: 10_000, remeasureUsageAfterMs: 0, acrossProcesses });
    const two = await open({ maxBytesPerOrganization: 10_000, remeasureUsageAfterMs: 0, acrossProcesses });
    await one.put(ORG, 'a', Readable.from([randomBytes(6000)]));
    // `two` counted nothing yet; it measures again before the write, so it sees `one`'s bytes.
    expect((await two.head(ORG, 'a'))?.size).toBe(6000);
    expect((await errorOf(two.put(ORG, 'b', Readable.from([randomBytes(5000)])))).code).toBe('quota_exceeded');
    await two.delete(ORG, 'a');
    await one.put(ORG, 'b', Readable.from([randomBytes(9000)]));
    // The same key written through both at once: one object, one blob, nothing left counted.
    await Promise.all([one.put(ORG, 'same', Readable.from([randomBytes(400)])), two.put(ORG, 'same', Readable.from([randomBytes(500)]))]);
    expect(overlapped).toBe(false);
    expect(filesUnder(join(root, 'orgs', ORG, 'blobs'))).toHaveLength(2);
    await two.delete(ORG, 'b');
    await one.put(ORG, 'c', Readable.from([randomBytes(9000)]));
  });

  it('sweeps temp files, unnamed blobs and uploads older than a day at open, and nothing younger', async () => {
    await store.put(ORG, 'kept', Readable.from([Buffer.from('x')]));
    const { uploadId } = await store.createMultipart(ORG, 'abandoned');
    await store.putPart(ORG, uploadId, 1, Readable.from([Buffer.from('part')]));
    writeFileSync(join(root, 'tmp', 'stale'), 'x');
    writeFileSync(join(root, 'orgs', ORG, 'blobs', 'f'.repeat(32)), 'orphan');
    const fresh = await open();
    expect(readdirSync(join(root, 'tmp'))).toEqual(['stale']);
    expect(readdirSync(join(root, 'orgs', ORG, 'blobs'))).toHaveLength(2);
    await fresh.putPart(ORG, uploadId, 2, Readable.from([Buffer.from('still open')]));

    const dayAndAMinute = Date.now() + 24 * 3600 * 1000 + 60_000;
    const later = await open({ now: () => dayAndAMinute });
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
    expect(readdirSync(join(root, 'orgs', ORG, 'blobs'))).toHaveLength(1);
    expect(readdirSync(join(root, 'orgs', ORG, 'uploads'))).toEqual([]);
    expect((await buffer(await later.read(ORG, 'kept'))).toString()).toBe('x');
  });

  it('a kill -9 in the middle of a write leaves no visible object and the old one intact', async () => {
    await store.put(ORG, 'ctx.tar', Readable.from([Buffer.from('old')]));
    // The store's own source, bundled, in a separate process that is killed mid-write.
    const bundle = join(root, 'store.mjs');
    await build({ entryPoints: [new URL('./fs-object-store.ts', import.meta.url).pathname], bundle: true, platform: 'node', format: 'esm', outfile: bundle, logLevel: 'silent' });
    const script = join(root, 'writer.mjs');
    writeFileSync(script, `
      import { Readable } from 'node:stream';
      import { FsObjectStore } from ${JSON.stringify(bundle)};
      const store = await FsObjectStore.open({ root: ${JSON.stringify(root)}, maxBytesPerOrganization: 1e9 });
      let sent = 0;
      const body = new Readable({ read() {
        if (sent < 4) { sent++; this.push(Buffer.alloc(256 * 1024, 1)); if (sent === 4) setTimeout(() => process.stdout.write('WRITING\\n'), 100); }
      } });
      store.put(${JSON.stringify(ORG)}, 'ctx.tar', body);
      setInterval(() => {}, 1000);
    `);
    const child = spawn(process.execPath, [script], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => d.toString().includes('WRITING') && resolve());
      child.once('exit', (code) => reject(new Error(`writer exited early (${code})`)));
    });
    const temps = readdirSync(join(root, 'tmp'));
    expect(temps).toHaveLength(1);
    child.kill('SIGKILL');
    await new Promise((resolve) => child.once('exit', resolve));

    const after = await open();
    expect((await buffer(await after.read(ORG, 'ctx.tar'))).toString()).toBe('old');
    expect((await after.list(ORG, '')).map((o) => o.key)).toEqual(['ctx.tar']);
    // The half-written temp file is swept once it is old.
    const old = (Date.now() - 25 * 3600 * 1000) / 1000;
    utimesSync(join(root, 'tmp', temps[0]), old, old);
    await open();
    expect(readdirSync(join(root, 'tmp'))).toEqual([]);
  });
});
