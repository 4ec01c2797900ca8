// File operations. Bodies are always streamed: the agent runs in a sandbox with little memory,
// and a file can be larger than all of it.
import { randomBytes } from 'node:crypto';
import { constants, type Stats } from 'node:fs';
import { lstat, mkdir, open, readdir, readlink, realpath, rename, stat, unlink, type FileHandle } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { posix } from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { FileInfo, ListResponse } from '../agent-protocol/types.js';
import { AgentHttpError, rethrowFsError, validationFailed } from './errors.js';
import { createScavengeNudge } from './memory.js';
import { baseName } from './paths.js';
import { parseRangeHeader } from './range.js';

const DEFAULT_NEW_FILE_MODE = 0o644;

/** Shared by all transfers: what matters is the agent's total garbage, not one stream's. */
const noteStreamedBytes = createScavengeNudge(4 * 1024 * 1024);

function fileType(info: Stats): FileInfo['type'] {
  if (info.isFile()) return 'file';
  if (info.isDirectory()) return 'dir';
  if (info.isSymbolicLink()) return 'symlink';
  return 'other';
}

async function describe(absolutePath: string, info: Stats): Promise<FileInfo> {
  const entry: FileInfo = {
    name: baseName(absolutePath),
    path: absolutePath,
    type: fileType(info),
    size: info.size,
    mode: info.mode & 0o7777,
    mtime: info.mtime.toISOString(),
  };
  if (info.isSymbolicLink()) entry.symlinkTarget = await readlink(absolutePath);
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

export async function listDirectory(absolutePath: string): Promise<ListResponse> {
  let names: string[];
  try {
    // Follows a symlink to a directory, as `ls` does for the path it was given.
    const target = await stat(absolutePath);
    if (!target.isDirectory()) throw validationFailed('path', `not a directory: ${absolutePath}`);
    names = await readdir(absolutePath);
  } catch (error) {
    if (error instanceof AgentHttpError) throw error;
    return rethrowFsError(error, absolutePath);
  }
  const described = await Promise.all(
    names.map(async (name) => {
      const entryPath = posix.join(absolutePath, name);
      // An entry removed between readdir and lstat simply is not there any more.
      return describe(entryPath, await lstat(entryPath)).catch(() => undefined);
    }),
  );
  const entries = described.filter((entry): entry is FileInfo => entry !== undefined);
  // Code-unit order: deterministic and locale-independent, like `LC_ALL=C ls`.
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return { entries };
}

async function openForReading(absolutePath: string): Promise<{ handle: FileHandle; size: number }> {
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
    return { handle, size: info.size };
  } catch (error) {
    await handle.close().catch(() => {});
    throw error;
  }
}

export async function sendFile(req: IncomingMessage, res: ServerResponse, absolutePath: string): Promise<void> {
  const { handle, size } = await openForReading(absolutePath);
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
  const fileStream = handle.createReadStream({ start, end });
  fileStream.on('data', (chunk: string | Buffer) => noteStreamedBytes(chunk.length));
  await pipeline(fileStream, res);
}

/** Where a write really lands: through a symlink that resolves, onto the path itself otherwise. */
async function writeTarget(absolutePath: string): Promise<{ path: string; existing: Stats | undefined }> {
  const linkInfo = await lstat(absolutePath).catch(() => undefined);
  let path = absolutePath;
  if (linkInfo?.isSymbolicLink()) path = await realpath(absolutePath).catch(() => absolutePath);
  const existing = await stat(path).catch(() => undefined);
  if (existing?.isDirectory()) throw validationFailed('path', `path is a directory: ${absolutePath}`);
  return { path, existing };
}

function tempPathBeside(target: string): string {
  const suffix = randomBytes(6).toString('hex');
  return posix.join(posix.dirname(target), `.${posix.basename(target)}.nestbox-upload-${suffix}.tmp`);
}

/**
 * A Writable straight onto a FileHandle that leaves the handle open, so it can still be fsynced
 * and chmodded afterwards. (FileHandle.createWriteStream with autoClose:false keeps a reference
 * that makes a later handle.close() wait forever on Node 20.)
 */
function handleWriter(handle: FileHandle): Writable {
  const writeFully = async (chunk: Buffer): Promise<void> => {
    let offset = 0;
    while (offset < chunk.length) {
      const { bytesWritten } = await handle.write(chunk, offset, chunk.length - offset);
      offset += bytesWritten;
    }
  };
  return new Writable({
    write(chunk: Buffer, _encoding, callback) {
      noteStreamedBytes(chunk.length);
      writeFully(chunk).then(() => callback(), callback);
    },
  });
}

async function streamIntoTempFile(req: IncomingMessage, tempPath: string, mode: number): Promise<void> {
  const handle = await open(tempPath, 'wx', 0o600);
  try {
    // pipeline applies backpressure: the request socket is paused whenever the disk lags, so
    // memory use is bounded by stream buffers, never by the body size.
    await pipeline(req, handleWriter(handle));
    await handle.sync();
    await handle.chmod(mode);
  } finally {
    await handle.close().catch(() => {});
  }
}

/**
 * Writes the request body atomically: readers see either the old file or the complete new one,
 * and an interrupted upload leaves the old file as it was.
 */
export async function receiveFile(req: IncomingMessage, absolutePath: string, requestedMode: number | undefined): Promise<FileInfo> {
  let tempPath: string | undefined;
  try {
    await mkdir(posix.dirname(absolutePath), { recursive: true });
    const target = await writeTarget(absolutePath);
    const mode = requestedMode ?? (target.existing ? target.existing.mode & 0o7777 : DEFAULT_NEW_FILE_MODE);
    tempPath = tempPathBeside(target.path);
    await streamIntoTempFile(req, tempPath, mode);
    await rename(tempPath, target.path);
    tempPath = undefined;
    return await describe(target.path, await lstat(target.path));
  } catch (error) {
    if (tempPath) await unlink(tempPath).catch(() => {});
    if (error instanceof AgentHttpError) throw error;
    return rethrowFsError(error, absolutePath);
  }
}
