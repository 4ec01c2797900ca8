// File operations. Bodies are always streamed: the agent runs in a sandbox with little memory,
// and a file can be larger than all of it.
import { giveCreatedDirectories, type Owner } from './files-ownership.js';
import { randomBytes } from 'node:crypto';
import { constants, type Stats } from 'node:fs';
import { chown, lstat, mkdir, open, readdir, readlink, realpath, rename, stat, statfs, unlink, type FileHandle } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { posix } from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { FileInfo, ListResponse } from '../agent-protocol/types.js';
import { AgentHttpError, rethrowFsError, validationFailed } from './errors.js';
import { sandboxAccounts } from './files-owners.js';
import { markAgentWrite } from './files-write-marks.js';
import { createScavengeNudge } from './memory.js';
import { baseName } from './paths.js';
import { parseRangeHeader } from './range.js';

export const DEFAULT_NEW_FILE_MODE = 0o644;

/** Deepest `depth` GET /files/list accepts. */
export const MAX_LIST_DEPTH = 32;

/** Shared by all transfers: what matters is the agent's total garbage, not one stream's. */
export const noteStreamedBytes = createScavengeNudge(4 * 1024 * 1024);

function fileType(info: Stats): FileInfo['type'] {
  if (info.isFile()) return 'file';
  if (info.isDirectory()) return 'dir';
  if (info.isSymbolicLink()) return 'symlink';
  return 'other';
}

export async function describe(absolutePath: string, info: Stats): Promise<FileInfo> {
  const { owner, group } = await sandboxAccounts.names(info.uid, info.gid);
  const entry: FileInfo = {
    name: baseName(absolutePath),
    path: absolutePath,
    type: fileType(info),
    size: info.size,
    mode: info.mode & 0o7777,
    mtime: info.mtime.toISOString(),
    owner,
    group,
    uid: info.uid,
    gid: info.gid,
  };
  if (info.isSymbolicLink()) {
    entry.symlinkTarget = await readlink(absolutePath);
    // Where the link finally leads (every link followed), for clients that describe a link by
    // its target; a dangling or looping link simply has none.
    const resolvedPath = await realpath(absolutePath).catch(() => undefined);
    const resolved = resolvedPath === undefined ? undefined : await stat(resolvedPath).catch(() => undefined);
    if (resolvedPath !== undefined && resolved) entry.symlinkResolved = { path: resolvedPath, type: fileType(resolved), mode: resolved.mode & 0o7777 };
  }
  return entry;
}

/** FileInfo of the path itself (a symlink is described, not followed). */
export async function statPath(absolutePath: string): Promise<FileInfo> {
  try {
    return await describe(absolutePath, await lstat(absolutePath));
  } catch (error) {
    return rethrowFsError(error, absolutePath);
  }
}

/** Parses `depth` of GET /files/list: absent = 1 (direct children), at most MAX_LIST_DEPTH. */
export function parseListDepth(raw: string | null | undefined): number {
  if (raw === null || raw === undefined || raw === '') return 1;
  if (!/^\d+$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_LIST_DEPTH) {
    throw validationFailed('depth', `expected an integer from 1 to ${MAX_LIST_DEPTH}, got ${JSON.stringify(raw)}`);
  }
  return Number(raw);
}

/** Code-unit order: deterministic and locale-independent, like `LC_ALL=C ls`. */
export function compareCodeUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Described children of one directory; entries that vanish between readdir and lstat are skipped. */
async function describeChildren(directory: string, names: string[]): Promise<{ entry: FileInfo; isDirectory: boolean }[]> {
  const described = await Promise.all(
    names.map(async (name) => {
      const entryPath = posix.join(directory, name);
      try {
        const info = await lstat(entryPath);
        return { entry: await describe(entryPath, info), isDirectory: info.isDirectory() };
      } catch {
        return undefined;
      }
    }),
  );
  return described.filter((item): item is { entry: FileInfo; isDirectory: boolean } => item !== undefined);
}

/**
 * Lists a directory `depth` levels deep. The path itself may be a symlink to a directory (as
 * `ls` follows the path it was given), but symlinked directories below it are never descended
 * into: that keeps the walk finite and inside what the caller asked for.
 */
export async function listDirectory(absolutePath: string, depth = 1, maxEntries = 200_000): Promise<ListResponse> {
  let names: string[];
  try {
    const target = await stat(absolutePath);
    if (!target.isDirectory()) throw validationFailed('path', `not a directory: ${absolutePath}`);
    names = await readdir(absolutePath);
  } catch (error) {
    if (error instanceof AgentHttpError) throw error;
    return rethrowFsError(error, absolutePath);
  }
  const entries: FileInfo[] = [];
  let level: { directory: string; names: string[] }[] = [{ directory: absolutePath, names }];
  for (let currentDepth = 1; currentDepth <= depth && level.length > 0; currentDepth++) {
    const nextLevel: { directory: string; names: string[] }[] = [];
    for (const { directory, names: childNames } of level) {
      for (const { entry, isDirectory } of await describeChildren(directory, childNames)) {
        entries.push(entry);
        if (entries.length > maxEntries) {
          throw new AgentHttpError(413, 'payload_too_large', `depth: the listing has more than ${maxEntries} entries; ask for a smaller depth or a deeper path`);
        }
        if (isDirectory && currentDepth < depth) {
          // An unreadable subdirectory is still listed; it just contributes no children.
          const grandchildren = await readdir(entry.path).catch(() => undefined);
          if (grandchildren) nextLevel.push({ directory: entry.path, names: grandchildren });
        }
      }
    }
    level = nextLevel;
  }
  entries.sort((a, b) => compareCodeUnits(a.path, b.path));
  return { entries };
}

/**
 * Filesystems whose st_size says nothing about what a read returns: procfs reports 0 for
 * /proc/cpuinfo, sysfs 4096 for a five-byte attribute, and so on (statfs f_type magic numbers).
 */
const UNSIZED_FILESYSTEMS = new Set<number>([
  0x9fa0, // proc
  0x62656572, // sysfs
  0x64626720, // debugfs
  0x74726163, // tracefs
  0x73636673, // securityfs
  0x62656570, // configfs
  0x27e0eb, // cgroup
  0x63677270, // cgroup2
  0xcafe4a11, // bpf
  0xde5e81e4, // efivarfs
]);
const FUSE_MAGIC = 0x65735546;

/**
 * LXCFS (host/drivers/local/lxcfs.ts) binds FUSE files over /proc/meminfo, /proc/cpuinfo and
 * friends: their st_size is computed for whoever stats them, not for the read that follows, so a
 * FUSE file under /proc or /sys is as unsized as procfs itself. (Other FUSE files keep their size:
 * sshfs and the like report it truly, and Range requests need it.)
 */
function sizeUntrusted(absolutePath: string, fsType: number | undefined): boolean {
  if (fsType === undefined) return false;
  if (UNSIZED_FILESYSTEMS.has(fsType)) return true;
  return fsType === FUSE_MAGIC && /^\/(proc|sys)\//.test(absolutePath);
}

export interface OpenedFile {
  handle: FileHandle;
  /** st_size of the opened descriptor. */
  size: number;
  /**
   * False when the size cannot be trusted: a pseudo-filesystem's file, or a regular file whose
   * st_size is 0 (procfs and friends report 0 for files that do have content). Such a file is
   * read until EOF instead.
   */
  sizeKnown: boolean;
}

export async function openForReading(absolutePath: string): Promise<OpenedFile> {
  let handle: FileHandle;
  try {
    // O_NONBLOCK so opening a FIFO cannot park a libuv thread forever waiting for a writer.
    handle = await open(absolutePath, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (error) {
    return rethrowFsError(error, absolutePath);
  }
  try {
    // Size from the opened descriptor, not the path, so a concurrent rename cannot make
    // Content-Length disagree with the bytes we send.
    const info = await handle.stat();
    if (info.isDirectory()) throw validationFailed('path', `path is a directory: ${absolutePath}`);
    if (!info.isFile()) throw validationFailed('path', `not a regular file: ${absolutePath}`);
    const fsType = info.size === 0 ? undefined : (await statfs(absolutePath).catch(() => undefined))?.type;
    const sizeKnown = info.size > 0 && !sizeUntrusted(absolutePath, fsType);
    return { handle, size: info.size, sizeKnown };
  } catch (error) {
    await handle.close().catch(() => {});
    throw error;
  }
}

/** Read size of files streamed until EOF. */
const UNSIZED_CHUNK_BYTES = 64 * 1024;

/**
 * The bytes of a file whose size is not known in advance, read at the descriptor's own position
 * (sequentially, as `cat` reads /proc) until EOF. The handle stays open; the caller closes it.
 */
export async function* readUntilEof(handle: FileHandle, first?: Buffer): AsyncGenerator<Buffer> {
  if (first && first.length > 0) yield first;
  for (;;) {
    const buffer = Buffer.allocUnsafe(UNSIZED_CHUNK_BYTES);
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
    if (bytesRead === 0) return;
    noteStreamedBytes(bytesRead);
    yield buffer.subarray(0, bytesRead);
  }
}

/**
 * A file of unknown size: 200 with no Content-Length (chunked), read until EOF; a Range is
 * ignored (there is no size to resolve it against). Resolves false, sending nothing, when the
 * first read finds EOF: it is empty after all, and is answered as any empty file.
 */
async function sendUnsizedFile(res: ServerResponse, handle: FileHandle): Promise<boolean> {
  const first = Buffer.allocUnsafe(UNSIZED_CHUNK_BYTES);
  const { bytesRead } = await handle.read(first, 0, first.length, null);
  if (bytesRead === 0) return false;
  try {
    res.writeHead(200, { 'Content-Type': 'application/octet-stream' });
    await pipeline(Readable.from(readUntilEof(handle, first.subarray(0, bytesRead))), res);
  } finally {
    await handle.close().catch(() => {});
  }
  return true;
}

export async function sendFile(req: IncomingMessage, res: ServerResponse, absolutePath: string): Promise<void> {
  const { handle, size: statSize, sizeKnown } = await openForReading(absolutePath);
  let size = statSize;
  if (!sizeKnown) {
    try {
      if (await sendUnsizedFile(res, handle)) return;
    } catch (error) {
      await handle.close().catch(() => {});
      if (res.headersSent) throw error;
      return rethrowFsError(error, absolutePath);
    }
    size = 0;
  }
  const range = parseRangeHeader(req.headers.range, size);
  if (range.kind === 'unsatisfiable') {
    await handle.close().catch(() => {});
    throw new AgentHttpError(416, 'range_not_satisfiable', `range: ${req.headers.range} cannot be satisfied for a file of ${size} bytes`, {
      'Content-Range': `bytes */${size}`,
    });
  }
  const { start, end } = range.kind === 'partial' ? range.range : { start: 0, end: size - 1 };
  const headers: Record<string, string> = {
    'Content-Type': 'application/octet-stream',
    'Content-Length': String(Math.max(0, end - start + 1)),
    'Accept-Ranges': 'bytes',
  };
  if (range.kind === 'partial') headers['Content-Range'] = `bytes ${start}-${end}/${size}`;
  res.writeHead(range.kind === 'partial' ? 206 : 200, headers);
  if (size === 0) {
    await handle.close();
    res.end();
    return;
  }
  // The stream owns and closes the handle; pipeline destroys it if the client goes away.
  // Reads of READ_CHUNK_BYTES, not the default 64 KiB: each read is a thread-pool round trip.
  const fileStream = handle.createReadStream({ start, end, highWaterMark: READ_CHUNK_BYTES });
  let sent = 0;
  fileStream.on('data', (chunk: string | Buffer) => {
    sent += chunk.length;
    noteStreamedBytes(chunk.length);
  });
  await pipeline(fileStream, res);
  // A file that shrank after the stat ends the stream short of the Content-Length promised: the
  // client would wait forever for the rest on a kept-alive connection, so the connection goes.
  if (sent !== end - start + 1) res.destroy();
}

/** Where a write really lands: through a symlink that resolves, onto the path itself otherwise. */
export async function writeTarget(absolutePath: string): Promise<{ path: string; existing: Stats | undefined }> {
  const linkInfo = await lstat(absolutePath).catch(() => undefined);
  let path = absolutePath;
  if (linkInfo?.isSymbolicLink()) path = await realpath(absolutePath).catch(() => absolutePath);
  const existing = await stat(path).catch(() => undefined);
  if (existing?.isDirectory()) throw validationFailed('path', `path is a directory: ${absolutePath}`);
  return { path, existing };
}

export function tempPathBeside(target: string): string {
  const suffix = randomBytes(6).toString('hex');
  return posix.join(posix.dirname(target), `.${posix.basename(target)}.nestbox-upload-${suffix}.tmp`);
}

const UPLOAD_TEMP_NAME = /^\..+\.nestbox-upload-[0-9a-f]{12}\.tmp$/;

/** The agent's own in-flight upload files (tempPathBeside): an implementation detail watchers must not report. */
export function isUploadTempPath(path: string): boolean {
  return UPLOAD_TEMP_NAME.test(posix.basename(path));
}

/**
 * A Writable straight onto a FileHandle that leaves the handle open, so it can still be fsynced
 * and chmodded afterwards. (FileHandle.createWriteStream with autoClose:false keeps a reference
 * that makes a later handle.close() wait forever on Node 20.)
 */
export function handleWriter(handle: FileHandle): Writable {
  const writeFully = async (chunk: Buffer): Promise<void> => {
    let offset = 0;
    while (offset < chunk.length) {
      const { bytesWritten } = await handle.write(chunk, offset, chunk.length - offset);
      offset += bytesWritten;
    }
  };
  // One gathering write; the rare short one (a signal, the disk filling) finishes from where it stopped.
  const writeAll = async (buffers: Buffer[], total: number): Promise<void> => {
    if (buffers.length === 1) return writeFully(buffers[0]);
    const { bytesWritten } = await handle.writev(buffers);
    if (bytesWritten < total) await writeFully(Buffer.concat(buffers, total).subarray(bytesWritten));
  };
  return new Writable({
    // Chunks arrive from the socket at up to 64 KiB each while one write is on the thread
    // pool; they queue here (up to this much) and go to the disk together in one writev, so a
    // 50 MiB upload takes a few hundred writes instead of thousands of thread-pool round trips.
    highWaterMark: WRITE_BATCH_BYTES,
    write(chunk: Buffer, _encoding, callback) {
      noteStreamedBytes(chunk.length);
      writeFully(chunk).then(() => callback(), callback);
    },
    writev(chunks, callback) {
      let total = 0;
      for (const { chunk } of chunks) total += (chunk as Buffer).length;
      noteStreamedBytes(total);
      writeAll(chunks.map(({ chunk }) => chunk as Buffer), total).then(() => callback(), callback);
    },
  });
}

/** Upload bytes gathered into one write (handleWriter), and the read size of downloads. */
const WRITE_BATCH_BYTES = 512 * 1024;
const READ_CHUNK_BYTES = 512 * 1024;

async function streamIntoTempFile(body: Readable, tempPath: string, mode: number): Promise<Stats> {
  const handle = await open(tempPath, 'wx', 0o600);
  try {
    // pipeline applies backpressure: the request socket is paused whenever the disk lags, so
    // memory use is bounded by stream buffers, never by the body size.
    const writer = handleWriter(handle);
    await pipeline(body, writer);
    await handle.sync();
    await handle.chmod(mode);
    return await handle.stat();
  } finally {
    await handle.close().catch(() => {});
  }
}

/**
 * Writes the request body atomically: readers see either the old file or the complete new one,
 * and an interrupted upload leaves the old file as it was.
 */
export async function receiveFile(body: Readable, absolutePath: string, requestedMode: number | undefined, owner?: Owner): Promise<FileInfo> {
  let tempPath: string | undefined;
  try {
    const firstCreated = await mkdir(posix.dirname(absolutePath), { recursive: true });
    await giveCreatedDirectories(firstCreated, posix.dirname(absolutePath), owner);
    const target = await writeTarget(absolutePath);
    const mode = requestedMode ?? (target.existing ? target.existing.mode & 0o7777 : DEFAULT_NEW_FILE_MODE);
    tempPath = tempPathBeside(target.path);
    const written = await streamIntoTempFile(body, tempPath, mode);
    if (owner) await chown(tempPath, owner.uid, owner.gid);
    // Watchers report this rename as the write it is (files-write-marks.ts).
    markAgentWrite(written, target.existing !== undefined);
    await rename(tempPath, target.path);
    tempPath = undefined;
    return await describe(target.path, await lstat(target.path));
  } catch (error) {
    if (tempPath) await unlink(tempPath).catch(() => {});
    if (error instanceof AgentHttpError) throw error;
    return rethrowFsError(error, absolutePath);
  }
}
