// core's ObjectStore (core/object-store.ts) over a directory of the data dir. Layout:
//
//   <root>/tmp/                         every write starts here (same file system: rename is atomic)
//   <root>/orgs/<orgId>/keys/<h>.json   one object's record {key, blob, size, sha256, etag, createdAt}
//   <root>/orgs/<orgId>/blobs/<id>      its bytes, named by a random id the record points at
//   <root>/orgs/<orgId>/uploads/<uploadId>/upload.json          a multipart upload {key, createdAt}
//   <root>/orgs/<orgId>/uploads/<uploadId>/part-<n>-<md5hex>    its parts, one file per version sent
//
// `<h>` is the SHA-256 of the key: a key is up to 1024 bytes of anything but NUL, far more than a
// file name may hold, and hashing means no key can ever name a path outside its organisation.
// An object becomes visible only when its record is renamed into `keys/` (after its blob is
// complete and synced), so a kill -9 at any moment leaves either the old object or the new one;
// what a crash strands (temp files, blobs no record names, abandoned uploads) is swept at open
// once it is a day old, an age no live write reaches.
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, open, readdir, readFile, rename, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { NestboxError, errors } from '../../core/errors.js';
import type { ObjectStore, PutObjectOptions, StoredObject } from '../../core/object-store.js';

export interface FsObjectStoreOptions {
  /** Directory of the store (`<data dir>/objects`). */
  root: string;
  /** Bytes one organisation may hold: objects plus the parts of unfinished uploads. */
  maxBytesPerOrganization: number;
  /** Temp files, unreferenced blobs and uploads older than this are removed at open (default a day). */
  staleAfterMs?: number;
  /** Clock, for tests of expiry. */
  now?: () => number;
  /**
   * Several control-plane replicas share this directory (a shared file system): how old this
   * process's count of an organisation's bytes may get before it is measured on disk again
   * (what the other replicas stored meanwhile). Unset: this process is the only writer and its
   * count, measured once, stays exact.
   */
  remeasureUsageAfterMs?: number;
  /**
   * Runs `fn` alone for `lockKey` across every process sharing the directory (a PostgreSQL
   * advisory lock with replicas); this process's own writers are serialised in any case.
   */
  acrossProcesses?: <T>(lockKey: string, fn: () => Promise<T>) => Promise<T>;
}

/** An organisation's bytes as this process counts them, and the part of them it is writing now. */
interface UsageCount {
  bytes: number;
  /** Bytes of this process's writes not yet committed (temp files no other process can see). */
  inFlight: number;
  measuredAt: number;
}

const DAY_MS = 24 * 3600 * 1000;
const MAX_KEY_BYTES = 1024;
const MAX_PART_NUMBER = 10_000;
const ORG_ID = /^[A-Za-z0-9_-]{1,64}$/;
const UPLOAD_ID = /^[0-9a-f]{32}$/;
const PART_FILE = /^part-(\d{1,5})-([0-9a-f]{32})$/;
const SHA256_HEX = /^[0-9a-f]{64}$/;

interface ObjectRecord {
  key: string;
  blob: string;
  size: number;
  sha256: string;
  etag: string;
  createdAt: string;
}

interface UploadRecord {
  key: string;
  createdAt: string;
}

/** Refuses a key that is empty, too long, has a NUL or a `..` segment (validation_failed, field `key`). */
export function checkObjectKey(key: string): void {
  if (typeof key !== 'string' || key.length === 0) throw errors.validation('key', 'must not be empty');
  if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES) throw errors.validation('key', `must be at most ${MAX_KEY_BYTES} bytes`);
  if (key.includes('\0')) throw errors.validation('key', 'must not contain a NUL byte');
  if (key.split('/').includes('..')) throw errors.validation('key', 'must not contain a ".." segment');
  // A lone surrogate has no UTF-8 form: two different keys would hash alike.
  if (Buffer.from(key, 'utf8').toString('utf8') !== key) throw errors.validation('key', 'must be valid Unicode');
}

function checkOrganization(organizationId: string): void {
  if (!ORG_ID.test(organizationId)) throw errors.validation('organizationId', 'is not a valid organisation id');
}

function noSuchUpload(uploadId: string): NestboxError {
  return new NestboxError('not_found', `upload ${uploadId} not found`, { kind: 'upload', id: uploadId });
}

function isMissing(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

/** ENOSPC and EDQUOT are the host's disk being full, not a bug: the catalogue's 507. */
function diskError(err: unknown): unknown {
  const code = (err as NodeJS.ErrnoException)?.code;
  if (code === 'ENOSPC' || code === 'EDQUOT') return new NestboxError('insufficient_storage', 'the object store has no space left');
  return err;
}

/** Hashes and counts a body as it passes, and stops it past a byte limit. */
class Digester extends Transform {
  readonly sha256 = createHash('sha256');
  readonly md5 = createHash('md5');
  bytes = 0;
  constructor(private readonly limit: number, private readonly tooLarge: () => NestboxError) {
    super();
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.bytes += chunk.length;
    if (this.bytes > this.limit) return done(this.tooLarge());
    this.sha256.update(chunk);
    this.md5.update(chunk);
    done(null, chunk);
  }
}

export class FsObjectStore implements ObjectStore {
  private readonly root: string;
  private readonly tmpDir: string;
  private readonly quota: number;
  private readonly now: () => number;
  /** Bytes each organisation holds (committed objects, parts, and writes under way), loaded at first use. */
  private readonly usage = new Map<string, Promise<UsageCount>>();
  private readonly remeasureAfterMs: number | undefined;
  private readonly acrossProcesses: FsObjectStoreOptions['acrossProcesses'];
  /** The last commit or delete queued per key (see `exclusive`). */
  private readonly keyLocks = new Map<string, Promise<void>>();

  private constructor(options: FsObjectStoreOptions) {
    this.root = options.root;
    this.tmpDir = join(options.root, 'tmp');
    this.quota = options.maxBytesPerOrganization;
    this.now = options.now ?? Date.now;
    this.remeasureAfterMs = options.remeasureUsageAfterMs;
    this.acrossProcesses = options.acrossProcesses;
  }

  /** Creates the directories and removes what crashed writes left behind (older than `staleAfterMs`). */
  static async open(options: FsObjectStoreOptions): Promise<FsObjectStore> {
    const store = new FsObjectStore(options);
    await mkdir(store.tmpDir, { recursive: true, mode: 0o700 });
    await mkdir(join(store.root, 'orgs'), { recursive: true, mode: 0o700 });
    await store.sweep(options.staleAfterMs ?? DAY_MS);
    return store;
  }

  // ---- paths ----

  private orgDir(organizationId: string): string {
    checkOrganization(organizationId);
    return join(this.root, 'orgs', organizationId);
  }
  private recordPath(organizationId: string, key: string): string {
    return join(this.orgDir(organizationId), 'keys', `${createHash('sha256').update(key, 'utf8').digest('hex')}.json`);
  }
  private uploadDir(organizationId: string, uploadId: string): string {
    if (!UPLOAD_ID.test(uploadId)) throw noSuchUpload(uploadId);
    return join(this.orgDir(organizationId), 'uploads', uploadId);
  }
  private tempPath(): string {
    return join(this.tmpDir, `${this.now()}-${randomBytes(8).toString('hex')}`);
  }

  // ---- quota ----

  /** The count as it stands, for adjusting it after a change this process made (never re-measured there). */
  private async countOf(organizationId: string): Promise<UsageCount> {
    let entry = this.usage.get(organizationId);
    if (!entry) {
      entry = this.measure(organizationId).then((bytes) => ({ bytes, inFlight: 0, measuredAt: this.now() }));
      this.usage.set(organizationId, entry);
      entry.catch(() => this.usage.delete(organizationId));
    }
    return entry;
  }

  /** The count a new write is checked against: measured on disk again when other replicas may have changed it. */
  private async usageOf(organizationId: string): Promise<UsageCount> {
    const count = await this.countOf(organizationId);
    if (this.remeasureAfterMs !== undefined && this.now() - count.measuredAt > this.remeasureAfterMs) {
      // Other replicas write to the same directory: what is on disk now, plus this process's
      // writes under way (their temp files are not counted on disk). A write another replica
      // has under way is not seen, so together they may pass the quota by that much; and a
      // commit that lands during the measurement may be counted twice or not at all until the
      // next one. Both last at most `remeasureAfterMs`.
      count.measuredAt = this.now();
      count.bytes = (await this.measure(organizationId)) + count.inFlight;
    }
    return count;
  }

  private async measure(organizationId: string): Promise<number> {
    const dir = this.orgDir(organizationId);
    let bytes = 0;
    for (const record of await this.records(organizationId)) bytes += record.size;
    for (const uploadId of await readdir(join(dir, 'uploads')).catch(() => [] as string[])) {
      for (const name of await readdir(join(dir, 'uploads', uploadId)).catch(() => [] as string[])) {
        if (PART_FILE.test(name)) bytes += (await stat(join(dir, 'uploads', uploadId, name)).catch(() => ({ size: 0 }))).size;
      }
    }
    return bytes;
  }

  /** A write's bytes are on disk where a measurement sees them (committed), or given back: no longer in flight. */
  private async landed(organizationId: string, bytes: number): Promise<void> {
    (await this.countOf(organizationId)).inFlight -= bytes;
  }

  /**
   * Streams `body` into a new temp file, hashing it, counting its bytes against the quota as they
   * arrive. The temp file is synced; on any failure it is removed and the bytes given back.
   */
  private async writeTemp(organizationId: string, body: Readable, options: PutObjectOptions = {}): Promise<{ path: string; size: number; sha256: string; md5: Buffer }> {
    const usage = await this.usageOf(organizationId);
    const limit = options.maxBytes ?? Number.MAX_SAFE_INTEGER;
    let counted = 0;
    const quota = this.quota;
    const digester = new Digester(limit, () => new NestboxError('payload_too_large', `body: is larger than ${limit} bytes`, { field: 'body', max: limit }));
    // The quota is checked per chunk against what the organisation holds now, writes under way
    // included, so concurrent uploads cannot pass it together.
    const meter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        if (usage.bytes + chunk.length > quota) {
          return done(errors.quotaExceeded('object_storage_bytes', `the organisation's object storage is full (${quota} bytes)`, { max: quota, current: usage.bytes, requested: chunk.length, retryAfterSeconds: 60 }));
        }
        usage.bytes += chunk.length;
        usage.inFlight += chunk.length;
        counted += chunk.length;
        done(null, chunk);
      },
    });
    const path = this.tempPath();
    try {
      // `flush`: the bytes reach the disk before the file is closed, so the rename that
      // publishes it can never name a file a crash would leave short.
      await pipeline(body, digester, meter, createWriteStream(path, { flags: 'wx', mode: 0o600, flush: true }), { signal: options.signal }).catch((err) => {
        throw diskError(err);
      });
      const sha256 = digester.sha256.digest('hex');
      if (options.expectSha256 !== undefined && sha256 !== options.expectSha256.toLowerCase()) {
        throw new NestboxError('validation_failed', `sha256: the body's SHA-256 is ${sha256}, not ${options.expectSha256}`, { field: 'sha256' });
      }
      return { path, size: digester.bytes, sha256, md5: digester.md5.digest() };
    } catch (err) {
      await rm(path, { force: true });
      usage.bytes -= counted;
      usage.inFlight -= counted;
      throw err;
    }
  }

  // ---- objects ----

  async put(organizationId: string, key: string, body: Readable, options: PutObjectOptions = {}): Promise<StoredObject> {
    checkObjectKey(key);
    if (options.expectSha256 !== undefined && !SHA256_HEX.test(options.expectSha256.toLowerCase())) throw errors.validation('sha256', 'must be 64 hex digits');
    const temp = await this.writeTemp(organizationId, body, options);
    try {
      return await this.commit(organizationId, key, temp.path, { size: temp.size, sha256: temp.sha256, etag: `"${temp.md5.toString('hex')}"` });
    } catch (err) {
      await rm(temp.path, { force: true });
      (await this.countOf(organizationId)).bytes -= temp.size;
      throw diskError(err);
    } finally {
      await this.landed(organizationId, temp.size);
    }
  }

  /** Moves a complete temp file in as the key's object: blob first, then the record (the switch). */
  private async commit(organizationId: string, key: string, tempPath: string, facts: { size: number; sha256: string; etag: string }): Promise<StoredObject> {
    return this.exclusive(organizationId, key, () => this.switchIn(organizationId, key, tempPath, facts));
  }

  /**
   * Runs `fn` alone for this key: two writers of one key must not both take the same previous
   * object as theirs to replace (the loser's blob would be left unnamed and still counted).
   */
  private async exclusive<T>(organizationId: string, key: string, inProcess: () => Promise<T>): Promise<T> {
    const lockKey = `${organizationId}\0${key}`;
    // With replicas on one directory, the same key's writers in other processes wait too.
    const across = this.acrossProcesses;
    const fn = across ? () => across(`object:${lockKey}`, inProcess) : inProcess;
    const before = this.keyLocks.get(lockKey) ?? Promise.resolve();
    const run = before.then(fn, fn);
    const settled = run.then(() => undefined, () => undefined);
    this.keyLocks.set(lockKey, settled);
    void settled.then(() => {
      if (this.keyLocks.get(lockKey) === settled) this.keyLocks.delete(lockKey);
    });
    return run;
  }

  private async switchIn(organizationId: string, key: string, tempPath: string, facts: { size: number; sha256: string; etag: string }): Promise<StoredObject> {
    const dir = this.orgDir(organizationId);
    await mkdir(join(dir, 'blobs'), { recursive: true, mode: 0o700 });
    await mkdir(join(dir, 'keys'), { recursive: true, mode: 0o700 });
    const blob = randomBytes(16).toString('hex');
    await rename(tempPath, join(dir, 'blobs', blob));
    const record: ObjectRecord = { key, blob, ...facts, createdAt: new Date(this.now()).toISOString() };
    const recordTemp = this.tempPath();
    await writeFile(recordTemp, JSON.stringify(record), { mode: 0o600, flush: true });
    const recordPath = this.recordPath(organizationId, key);
    const previous = await this.readRecord(recordPath);
    await rename(recordTemp, recordPath);
    await syncDir(join(dir, 'keys'));
    if (previous) {
      await rm(join(dir, 'blobs', previous.blob), { force: true });
      (await this.countOf(organizationId)).bytes -= previous.size;
    }
    return toStored(record);
  }

  private async readRecord(path: string): Promise<ObjectRecord | undefined> {
    try {
      return JSON.parse(await readFile(path, 'utf8')) as ObjectRecord;
    } catch (err) {
      if (isMissing(err)) return undefined;
      throw err;
    }
  }

  async head(organizationId: string, key: string): Promise<StoredObject | undefined> {
    checkObjectKey(key);
    const record = await this.readRecord(this.recordPath(organizationId, key));
    return record && toStored(record);
  }

  async read(organizationId: string, key: string): Promise<Readable> {
    checkObjectKey(key);
    const dir = this.orgDir(organizationId);
    // A replace between reading the record and opening its blob removes that blob: the record
    // read again then names the new one. Once open, the bytes stay readable whatever follows.
    for (let attempt = 0; attempt < 3; attempt++) {
      const record = await this.readRecord(this.recordPath(organizationId, key));
      if (!record) break;
      try {
        const handle = await open(join(dir, 'blobs', record.blob), 'r');
        // The stream owns the handle (and closes it at the end or on destroy).
        return handle.createReadStream();
      } catch (err) {
        if (!isMissing(err)) throw err;
      }
    }
    throw errors.notFound('object', key);
  }

  private async records(organizationId: string): Promise<ObjectRecord[]> {
    const dir = join(this.orgDir(organizationId), 'keys');
    const names = await readdir(dir).catch((err) => (isMissing(err) ? [] : Promise.reject(err)));
    const out: ObjectRecord[] = [];
    for (const name of names) {
      if (!name.endsWith('.json')) continue;
      const record = await this.readRecord(join(dir, name));
      if (record) out.push(record);
    }
    return out;
  }

  async list(organizationId: string, prefix: string, options: { startAfter?: string; limit?: number } = {}): Promise<StoredObject[]> {
    const limit = options.limit ?? 1000;
    if (!Number.isInteger(limit) || limit < 0) throw errors.validation('limit', 'must be a non-negative integer');
    const startAfter = options.startAfter;
    // Key order is S3's: by UTF-8 bytes (which for JS strings is code point order, not UTF-16's).
    const matching = (await this.records(organizationId))
      .filter((r) => r.key.startsWith(prefix) && (startAfter === undefined || compareKeys(r.key, startAfter) > 0))
      .sort((a, b) => compareKeys(a.key, b.key));
    return matching.slice(0, limit).map(toStored);
  }

  async delete(organizationId: string, key: string): Promise<void> {
    checkObjectKey(key);
    const recordPath = this.recordPath(organizationId, key);
    await this.exclusive(organizationId, key, async () => {
      const record = await this.readRecord(recordPath);
      if (!record) return;
      // The record goes first: from then on the object is gone, whatever happens to its blob.
      await unlink(recordPath).catch((err) => (isMissing(err) ? undefined : Promise.reject(err)));
      await rm(join(this.orgDir(organizationId), 'blobs', record.blob), { force: true });
      (await this.countOf(organizationId)).bytes -= record.size;
    });
  }

  // ---- multipart ----

  async createMultipart(organizationId: string, key: string): Promise<{ uploadId: string }> {
    checkObjectKey(key);
    const uploadId = randomBytes(16).toString('hex');
    const dir = this.uploadDir(organizationId, uploadId);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const record: UploadRecord = { key, createdAt: new Date(this.now()).toISOString() };
    await writeFile(join(dir, 'upload.json'), JSON.stringify(record), { mode: 0o600, flush: true });
    return { uploadId };
  }

  private async upload(organizationId: string, uploadId: string): Promise<{ dir: string; record: UploadRecord }> {
    const dir = this.uploadDir(organizationId, uploadId);
    try {
      return { dir, record: JSON.parse(await readFile(join(dir, 'upload.json'), 'utf8')) as UploadRecord };
    } catch (err) {
      if (isMissing(err)) throw noSuchUpload(uploadId);
      throw err;
    }
  }

  async putPart(organizationId: string, uploadId: string, partNumber: number, body: Readable, options: PutObjectOptions = {}): Promise<{ etag: string; size: number }> {
    if (!Number.isInteger(partNumber) || partNumber < 1 || partNumber > MAX_PART_NUMBER) throw errors.validation('partNumber', `must be an integer from 1 to ${MAX_PART_NUMBER}`);
    const { dir } = await this.upload(organizationId, uploadId);
    const temp = await this.writeTemp(organizationId, body, options);
    const md5 = temp.md5.toString('hex');
    try {
      // Each version of a part keeps its own file (named by its MD5): a retried or concurrent
      // send of the same number never tears another, and complete picks the one it names.
      await rename(temp.path, join(dir, `part-${partNumber}-${md5}`));
    } catch (err) {
      await rm(temp.path, { force: true });
      (await this.countOf(organizationId)).bytes -= temp.size;
      if (isMissing(err)) throw noSuchUpload(uploadId);
      throw diskError(err);
    } finally {
      await this.landed(organizationId, temp.size);
    }
    return { etag: `"${md5}"`, size: temp.size };
  }

  async completeMultipart(organizationId: string, uploadId: string, parts: { partNumber: number; etag: string }[]): Promise<StoredObject> {
    const { dir, record } = await this.upload(organizationId, uploadId);
    if (parts.length === 0) throw errors.validation('parts', 'must list at least one part');
    const files: { path: string; md5: string }[] = [];
    let previous = 0;
    for (const [i, part] of parts.entries()) {
      if (!Number.isInteger(part.partNumber) || part.partNumber <= previous) throw errors.validation(`parts[${i}].partNumber`, 'part numbers must be in ascending order, each once');
      previous = part.partNumber;
      const md5 = part.etag.replace(/^"|"$/g, '').toLowerCase();
      const path = join(dir, `part-${part.partNumber}-${md5}`);
      if (!/^[0-9a-f]{32}$/.test(md5) || !(await stat(path).then(() => true, () => false))) {
        throw errors.validation(`parts[${i}]`, `part ${part.partNumber} with ETag ${part.etag} was not uploaded`);
      }
      files.push({ path, md5 });
    }
    // The object is the parts joined, in the listed order; its ETag is S3's: the MD5 of the
    // parts' binary MD5s, a dash, the number of parts.
    const tempPath = this.tempPath();
    const sha256 = createHash('sha256');
    let size = 0;
    async function* joined(): AsyncGenerator<Buffer> {
      for (const file of files) {
        for await (const chunk of createReadStream(file.path) as AsyncIterable<Buffer>) {
          sha256.update(chunk);
          size += chunk.length;
          yield chunk;
        }
      }
    }
    try {
      await pipeline(joined, createWriteStream(tempPath, { flags: 'wx', mode: 0o600, flush: true }));
    } catch (err) {
      await rm(tempPath, { force: true });
      // A part gone while being joined: the upload was aborted (or completed) meanwhile.
      if (isMissing(err)) throw noSuchUpload(uploadId);
      throw diskError(err);
    }
    const etag = `"${createHash('md5').update(Buffer.concat(files.map((f) => Buffer.from(f.md5, 'hex')))).digest('hex')}-${files.length}"`;
    // The parts' bytes were counted when they arrived; the object takes them over.
    const usage = await this.countOf(organizationId);
    const partBytes = await partsSize(dir);
    usage.bytes += size;
    // Until its record is written the joined object is a temp file no measurement sees.
    usage.inFlight += size;
    let stored: StoredObject;
    try {
      stored = await this.commit(organizationId, record.key, tempPath, { size, sha256: sha256.digest('hex'), etag });
    } catch (err) {
      usage.bytes -= size;
      await rm(tempPath, { force: true });
      throw diskError(err);
    } finally {
      usage.inFlight -= size;
    }
    await rm(dir, { recursive: true, force: true });
    usage.bytes -= partBytes;
    return stored;
  }

  async abortMultipart(organizationId: string, uploadId: string): Promise<void> {
    const { dir } = await this.upload(organizationId, uploadId);
    const bytes = await partsSize(dir);
    await rm(dir, { recursive: true, force: true });
    (await this.countOf(organizationId)).bytes -= bytes;
  }

  // ---- crash recovery ----

  /** Temp files, blobs no record names and uploads not completed, once older than `staleMs`. */
  private async sweep(staleMs: number): Promise<void> {
    const cutoff = this.now() - staleMs;
    const old = async (path: string) => (await stat(path).catch(() => undefined))?.mtimeMs ?? Infinity;
    for (const name of await readdir(this.tmpDir)) {
      const path = join(this.tmpDir, name);
      if ((await old(path)) < cutoff) await rm(path, { recursive: true, force: true });
    }
    for (const org of await readdir(join(this.root, 'orgs'))) {
      if (!ORG_ID.test(org)) continue;
      const dir = join(this.root, 'orgs', org);
      const referenced = new Set((await this.records(org)).map((r) => r.blob));
      for (const blob of await readdir(join(dir, 'blobs')).catch(() => [] as string[])) {
        const path = join(dir, 'blobs', blob);
        if (!referenced.has(blob) && (await old(path)) < cutoff) await rm(path, { force: true });
      }
      for (const uploadId of await readdir(join(dir, 'uploads')).catch(() => [] as string[])) {
        const path = join(dir, 'uploads', uploadId);
        // The upload's age is its record's (parts may be younger); a dir without one is debris.
        const created = await readFile(join(path, 'upload.json'), 'utf8').then((t) => Date.parse((JSON.parse(t) as UploadRecord).createdAt), () => -Infinity);
        if (created < cutoff && (await old(path)) < cutoff) await rm(path, { recursive: true, force: true });
      }
    }
  }
}

async function partsSize(dir: string): Promise<number> {
  let bytes = 0;
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    if (PART_FILE.test(name)) bytes += (await stat(join(dir, name)).catch(() => ({ size: 0 }))).size;
  }
  return bytes;
}

async function syncDir(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

function toStored(record: ObjectRecord): StoredObject {
  return { key: record.key, size: record.size, sha256: record.sha256, etag: record.etag, createdAt: new Date(record.createdAt) };
}

/** S3 orders keys by their UTF-8 bytes. */
export function compareKeys(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}
