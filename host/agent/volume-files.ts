// File operations on a volume's contents served by the host agent itself, with or without a
// sandbox running (issue 19; E2B's volume-content API is translated onto these).
//
// A security boundary: the volume is written by sandboxes, so any entry in it may be a symlink
// (or be swapped for one while we work) pointing at a host path. No path given by a caller is
// ever resolved by the kernel as a whole. Every directory on the way is opened one component at
// a time with O_NOFOLLOW through `/proc/self/fd/<parent fd>/<name>` (Node's stand-in for
// openat(2): the magic link pins the parent we already hold, only the last component is looked
// up, and O_NOFOLLOW refuses it if it is a symlink), `.`/`..` are refused, and the final
// operation works on a descriptor (fstat, fchmod, fchown, read, write) or on one name inside a
// held directory (lstat, mkdir, unlink, rmdir: none of them follows a last-component symlink).
// A volume is a file system of its own mounted nodev/nosuid, so no hard link reaches outside it.
//   GET    files/list?path&depth      → {entries: Stat[]}
//   GET    files/stat?path            → Stat
//   GET    files/content?path         → bytes
//   PUT    files/content?path&mode&uid&gid&overwrite  (body: bytes) → Stat
//   POST   files/mkdir?path&parents&mode&uid&gid      → Stat (409 if it exists)
//   PATCH  files/stat?path  {mode?,uid?,gid?}        → Stat
//   DELETE files?path                                 → 204 (recursive)
import { constants, createReadStream, createWriteStream } from 'node:fs';
import { chmod, chown, close, fstat, ftruncate as ftruncateCb, lstat, mkdir, open, readdir, readlink, rmdir, unlink } from 'node:fs';
import { promisify } from 'node:util';
import type http from 'node:http';
import { pipeline } from 'node:stream/promises';
import type { Stats } from 'node:fs';

const openAsync = promisify(open);
const closeAsync = promisify(close);
const fstatAsync = promisify(fstat);
const lstatAsync = promisify(lstat);
const mkdirAsync = promisify(mkdir);
const readdirAsync = promisify(readdir);
const readlinkAsync = promisify(readlink);
const unlinkAsync = promisify(unlink);
const rmdirAsync = promisify(rmdir);
const chmodAsync = promisify(chmod);
const chownAsync = promisify(chown);

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_TRUNC, O_NOFOLLOW, O_DIRECTORY, O_NONBLOCK } = constants;
const MAX_LIST_ENTRIES = 10_000;
const MAX_DEPTH = 32;

export class VolumeFileError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface VolumeEntryStat {
  name: string;
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'unknown';
  size: number;
  mode: number;
  uid: number;
  gid: number;
  atime: string;
  mtime: string;
  ctime: string;
  target?: string;
}

/** The components of a path relative to the volume's top; `/` and `''` are the top itself. */
export function pathComponents(path: string): string[] {
  if (path.includes('\0')) throw new VolumeFileError(400, 'validation_failed', 'path: must not contain NUL');
  const parts = path.split('/').filter((part) => part !== '' && part !== '.');
  for (const part of parts) if (part === '..') throw new VolumeFileError(400, 'validation_failed', "path: must not contain '..'");
  if (parts.some((part) => Buffer.byteLength(part) > 255)) throw new VolumeFileError(400, 'validation_failed', 'path: a name is longer than 255 bytes');
  return parts;
}

const at = (dirFd: number, name: string) => `/proc/self/fd/${dirFd}/${name}`;

function mapFsError(error: unknown, path: string): never {
  const code = (error as NodeJS.ErrnoException).code;
  if (error instanceof VolumeFileError) throw error;
  if (code === 'ENOENT') throw new VolumeFileError(404, 'not_found', `path ${path} not found`);
  if (code === 'ELOOP' || code === 'ENOTDIR') throw new VolumeFileError(400, 'validation_failed', `path ${path}: a component is a symlink or not a directory (symlinks are never followed)`);
  if (code === 'EEXIST') throw new VolumeFileError(409, 'conflict', `path ${path} already exists`);
  if (code === 'ENOTEMPTY') throw new VolumeFileError(409, 'conflict', `path ${path}: directory not empty`);
  if (code === 'EISDIR') throw new VolumeFileError(400, 'validation_failed', `path ${path} is a directory`);
  if (code === 'ENOSPC' || code === 'EDQUOT') throw new VolumeFileError(507, 'insufficient_storage', `the volume is full (its size limit is reached) writing ${path}`);
  if (code === 'ENAMETOOLONG') throw new VolumeFileError(400, 'validation_failed', `path ${path}: name too long`);
  // A FIFO with no reader, a socket: nothing a file call can use.
  if (code === 'ENXIO' || code === 'EOPNOTSUPP') throw new VolumeFileError(400, 'validation_failed', `path ${path} is not a regular file or directory`);
  if (code === 'EPERM' || code === 'EACCES') throw new VolumeFileError(403, 'forbidden', `path ${path}: operation not permitted`);
  if (code === 'EINVAL') throw new VolumeFileError(400, 'validation_failed', `path ${path}: invalid operation`);
  throw error;
}

/** Opens the directory at `parts` below the volume's top, never following a symlink. Optionally makes missing ones. */
async function openDir(root: string, parts: string[], options: { create?: { mode: number; uid?: number; gid?: number } } = {}): Promise<number> {
  let fd = await openAsync(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  try {
    for (const part of parts) {
      let next: number;
      try {
        next = await openAsync(at(fd, part), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'ENOENT' || !options.create) throw error;
        await mkdirAsync(at(fd, part), options.create.mode).catch((e: NodeJS.ErrnoException) => {
          if (e.code !== 'EEXIST') throw e;
        });
        next = await openAsync(at(fd, part), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        if (options.create.uid !== undefined || options.create.gid !== undefined) await fchownFd(next, options.create.uid, options.create.gid);
      }
      await closeAsync(fd);
      fd = next;
    }
    return fd;
  } catch (error) {
    await closeAsync(fd).catch(() => {});
    throw error;
  }
}

async function fchownFd(fd: number, uid?: number, gid?: number): Promise<void> {
  // chown on the magic link of a held descriptor acts on what it refers to (never a lookup by name).
  await chownAsync(`/proc/self/fd/${fd}`, uid ?? -1, gid ?? -1);
}

function typeOf(stats: Stats): VolumeEntryStat['type'] {
  if (stats.isFile()) return 'file';
  if (stats.isDirectory()) return 'directory';
  if (stats.isSymbolicLink()) return 'symlink';
  return 'unknown';
}

async function statEntry(dirFd: number, name: string, path: string, stats?: Stats): Promise<VolumeEntryStat> {
  const s = stats ?? (await lstatAsync(at(dirFd, name)));
  const entry: VolumeEntryStat = {
    name,
    path,
    type: typeOf(s),
    size: s.size,
    mode: s.mode & 0o7777,
    uid: s.uid,
    gid: s.gid,
    atime: s.atime.toISOString(),
    mtime: s.mtime.toISOString(),
    ctime: s.ctime.toISOString(),
  };
  if (entry.type === 'symlink') entry.target = await readlinkAsync(at(dirFd, name)).catch(() => undefined);
  return entry;
}

const display = (parts: string[]) => '/' + parts.join('/');

/** Runs `task` with the parent directory of `parts` open (parts non-empty). */
async function inParent<T>(root: string, parts: string[], task: (dirFd: number, name: string) => Promise<T>, create?: { mode: number; uid?: number; gid?: number }): Promise<T> {
  const dirFd = await openDir(root, parts.slice(0, -1), create ? { create } : {});
  try {
    return await task(dirFd, parts[parts.length - 1]!);
  } finally {
    await closeAsync(dirFd).catch(() => {});
  }
}

async function statPath(root: string, parts: string[]): Promise<VolumeEntryStat> {
  if (parts.length === 0) {
    const fd = await openDir(root, []);
    try {
      return { ...(await statEntry(fd, '', '/', await fstatAsync(fd))), name: '' };
    } finally {
      await closeAsync(fd);
    }
  }
  return inParent(root, parts, (dirFd, name) => statEntry(dirFd, name, display(parts)));
}

async function list(root: string, parts: string[], depth: number): Promise<VolumeEntryStat[]> {
  const out: VolumeEntryStat[] = [];
  const walk = async (dirFd: number, prefix: string[], level: number) => {
    const names = (await readdirAsync(`/proc/self/fd/${dirFd}`)).sort();
    for (const name of names) {
      if (out.length >= MAX_LIST_ENTRIES) throw new VolumeFileError(400, 'validation_failed', `depth: more than ${MAX_LIST_ENTRIES} entries; list a smaller depth`);
      const entry = await statEntry(dirFd, name, display([...prefix, name])).catch((error: NodeJS.ErrnoException) => (error.code === 'ENOENT' ? undefined : Promise.reject(error)));
      if (!entry) continue;
      out.push(entry);
      if (entry.type === 'directory' && level < depth) {
        let child: number;
        try {
          child = await openAsync(at(dirFd, name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        } catch {
          continue; // swapped or removed meanwhile
        }
        try {
          await walk(child, [...prefix, name], level + 1);
        } finally {
          await closeAsync(child).catch(() => {});
        }
      }
    }
  };
  const fd = await openDir(root, parts);
  try {
    await walk(fd, parts, 1);
  } finally {
    await closeAsync(fd).catch(() => {});
  }
  return out;
}

async function removeTree(dirFd: number, name: string): Promise<void> {
  const stats = await lstatAsync(at(dirFd, name));
  if (!stats.isDirectory()) {
    await unlinkAsync(at(dirFd, name));
    return;
  }
  const child = await openAsync(at(dirFd, name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  try {
    for (const entry of await readdirAsync(`/proc/self/fd/${child}`)) await removeTree(child, entry);
  } finally {
    await closeAsync(child).catch(() => {});
  }
  await rmdirAsync(at(dirFd, name));
}

function intParam(url: URL, name: string, max: number): number | undefined {
  const raw = url.searchParams.get(name);
  if (raw === null || raw === '') return undefined;
  if (!/^\d+$/.test(raw) || Number(raw) > max) throw new VolumeFileError(400, 'validation_failed', `${name}: must be an integer from 0 to ${max}`);
  return Number(raw);
}

function boolParam(url: URL, name: string): boolean {
  const raw = url.searchParams.get(name);
  return raw === 'true' || raw === '1';
}

function send(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

async function readSmallJson(req: http.IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > 64 * 1024) throw new VolumeFileError(413, 'payload_too_large', 'body: too large');
    chunks.push(chunk as Buffer);
  }
  try {
    const value: unknown = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    if (!value || typeof value !== 'object' || Array.isArray(value)) throw new Error();
    return value as Record<string, unknown>;
  } catch {
    throw new VolumeFileError(400, 'validation_failed', 'body: must be a JSON object');
  }
}

const ID_MAX = 2 ** 32 - 2;

export async function handleVolumeFiles(root: string, rest: string[], req: http.IncomingMessage, res: http.ServerResponse, url: URL): Promise<void> {
  const rawPath = url.searchParams.get('path');
  try {
    if (rawPath === null) throw new VolumeFileError(400, 'validation_failed', 'path: required');
    const parts = pathComponents(rawPath);
    const route = `${req.method} ${rest.join('/')}`;
    const mode = intParam(url, 'mode', 0o7777);
    const uid = intParam(url, 'uid', ID_MAX);
    const gid = intParam(url, 'gid', ID_MAX);
    switch (route) {
      case 'GET list': {
        const depth = intParam(url, 'depth', MAX_DEPTH) ?? 1;
        return send(res, 200, { entries: await list(root, parts, Math.max(1, depth)) });
      }
      case 'GET stat':
        return send(res, 200, await statPath(root, parts));
      case 'GET content': {
        if (parts.length === 0) throw new VolumeFileError(400, 'validation_failed', 'path: is the volume itself, a directory');
        const fd = await inParent(root, parts, (dirFd, name) => openAsync(at(dirFd, name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK));
        const stats = await fstatAsync(fd).catch(async (error) => {
          await closeAsync(fd);
          throw error;
        });
        if (!stats.isFile()) {
          await closeAsync(fd);
          throw new VolumeFileError(400, 'validation_failed', `path ${display(parts)} is not a regular file`);
        }
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': stats.size });
        await pipeline(createReadStream('', { fd, autoClose: true }), res);
        return;
      }
      case 'PUT content': {
        if (parts.length === 0) throw new VolumeFileError(400, 'validation_failed', 'path: is the volume itself, a directory');
        const overwrite = url.searchParams.get('overwrite') !== 'false';
        const parents = boolParam(url, 'parents');
        const entry = await inParent(
          root,
          parts,
          async (dirFd, name) => {
            const fd = await openAsync(at(dirFd, name), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | (overwrite ? 0 : O_EXCL), mode ?? 0o644);
            const stats = await fstatAsync(fd);
            if (!stats.isFile()) {
              await closeAsync(fd);
              throw new VolumeFileError(400, 'validation_failed', `path ${display(parts)} is not a regular file`);
            }
            await promisify(ftruncateCb)(fd, 0);
            if (uid !== undefined || gid !== undefined) await fchownFd(fd, uid, gid);
            if (mode !== undefined) await chmodAsync(`/proc/self/fd/${fd}`, mode);
            await pipeline(req, createWriteStream('', { fd, autoClose: true }));
            return statEntry(dirFd, name, display(parts));
          },
          parents ? { mode: 0o755, uid, gid } : undefined,
        );
        return send(res, 201, entry);
      }
      case 'POST mkdir': {
        if (parts.length === 0) throw new VolumeFileError(409, 'conflict', 'path / already exists');
        const parents = boolParam(url, 'parents');
        const entry = await inParent(
          root,
          parts,
          async (dirFd, name) => {
            await mkdirAsync(at(dirFd, name), mode ?? 0o755);
            const fd = await openAsync(at(dirFd, name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
            try {
              if (uid !== undefined || gid !== undefined) await fchownFd(fd, uid, gid);
              if (mode !== undefined) await chmodAsync(`/proc/self/fd/${fd}`, mode);
            } finally {
              await closeAsync(fd);
            }
            return statEntry(dirFd, name, display(parts));
          },
          parents ? { mode: 0o755, uid, gid } : undefined,
        );
        return send(res, 201, entry);
      }
      case 'PATCH stat': {
        const body = await readSmallJson(req);
        const pick = (name: string, max: number) => {
          const value = body[name];
          if (value === undefined || value === null) return undefined;
          if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > max) throw new VolumeFileError(400, 'validation_failed', `${name}: must be an integer from 0 to ${max}`);
          return value;
        };
        const newMode = pick('mode', 0o7777);
        const newUid = pick('uid', ID_MAX);
        const newGid = pick('gid', ID_MAX);
        const work = async (fd: number) => {
          if (newUid !== undefined || newGid !== undefined) await fchownFd(fd, newUid, newGid);
          if (newMode !== undefined) await chmodAsync(`/proc/self/fd/${fd}`, newMode);
        };
        if (parts.length === 0) {
          const fd = await openDir(root, []);
          try {
            await work(fd);
          } finally {
            await closeAsync(fd);
          }
          return send(res, 200, await statPath(root, parts));
        }
        const entry = await inParent(root, parts, async (dirFd, name) => {
          // O_NOFOLLOW: a symlink is refused (ELOOP) rather than its target changed.
          const fd = await openAsync(at(dirFd, name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
          try {
            await work(fd);
          } finally {
            await closeAsync(fd);
          }
          return statEntry(dirFd, name, display(parts));
        });
        return send(res, 200, entry);
      }
      case 'DELETE ': {
        if (parts.length === 0) throw new VolumeFileError(400, 'validation_failed', 'path: the volume itself cannot be removed here');
        await inParent(root, parts, (dirFd, name) => removeTree(dirFd, name));
        res.writeHead(204).end();
        return;
      }
      default:
        throw new VolumeFileError(404, 'not_found', `no route ${req.method} ${url.pathname}`);
    }
  } catch (error) {
    try {
      mapFsError(error, rawPath ?? '');
    } catch (mapped) {
      if (mapped instanceof VolumeFileError) {
        if (res.headersSent) return void res.destroy();
        req.resume();
        return send(res, mapped.status, { error: { code: mapped.code, message: mapped.message } });
      }
      throw mapped;
    }
  }
}

