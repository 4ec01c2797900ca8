// Tar archives in and out of the sandbox (image builds: COPY unpacks the build context's files,
// COPY --from reads another stage's tree). See agent-protocol/archive.ts for the wire contract.
//
// Extraction uses node-tar's parser only for reading the stream (plain or gzip, detected from
// the first bytes) and does the file system work itself, because the rules differ from
// node-tar's unpacker: a symlink's target is kept as written (node-tar rewrites absolute targets
// and drops ones with `..`, which would change what an image's links point at), a directory
// is never replaced by a file, and a hard link may only name a file this archive wrote. What
// stays the same as node-tar's protections, and is checked for every entry:
//   - no name is absolute or has a `..` component (the whole archive is refused: 400);
//   - nothing is written through a symlink the archive made: every directory on the way to an
//     entry is lstat-checked (or was made by this extraction); a link the sandbox already had to a
//     directory is followed, as Docker does (it resolves inside the sandbox). Files are
//     written to a new temp file and
//     renamed over what was there, so a link or a hard-linked file at the name is replaced,
//     never written into;
//   - device nodes and fifos are dropped (the sandbox gets its devices from the launcher).
// The agent runs in the sandbox's own root, so every path here is the sandbox's.
import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { chmod, chown, lchown, link, lstat, lutimes, mkdir, open, readdir, realpath, rename, stat, symlink, unlink, utimes, type FileHandle } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadEntry } from 'tar';
import type { ArchiveExtractResponse } from '../agent-protocol/archive.js';
import { AgentHttpError, fsErrorToHttp, validationFailed } from './errors.js';
import { sandboxAccounts } from './files-owners.js';
import { giveCreatedDirectories, type Owner } from './files-ownership.js';
import { resolveRunAs } from './processes/users.js';

type Tar = typeof import('tar');
let tarModule: Promise<Tar> | undefined;
// Loaded at the first archive request, not at every agent start: only image builds use it.
const loadTar = (): Promise<Tar> => (tarModule ??= import('tar'));

export interface ExtractOptions {
  /** Every entry's owner instead of the archive's ids. */
  owner?: Owner;
  /** Every file's and directory's permission bits instead of the archive's (symlinks have none). */
  mode?: number;
  /** The client went away: stop reading and writing. */
  signal?: AbortSignal;
  /** Where `user` names resolve (tests). */
  passwdPath?: string;
}

const FILE_TYPES = new Set(['File', 'OldFile', 'ContiguousFile']);
const DROPPED_TYPES = new Set(['CharacterDevice', 'BlockDevice', 'FIFO']);
const DEFAULT_DIRECTORY_MODE = 0o755;

/**
 * `user[:group]`: names from the sandbox's /etc/passwd and /etc/group, or numeric ids. A user
 * without a group gets its primary group (a numeric uid without an account: the same number).
 */
export async function resolveArchiveOwner(raw: string | null | undefined, passwdPath?: string): Promise<Owner | undefined> {
  if (raw === null || raw === undefined || raw === '') return undefined;
  const [user, group, ...rest] = raw.split(':');
  if (rest.length || !user || group === '') throw validationFailed('owner', `expected user[:group] (names or numeric ids), got ${JSON.stringify(raw)}`);
  let account: { uid?: number; gid?: number };
  try {
    account = await resolveRunAs(user, passwdPath);
  } catch (error) {
    if (error instanceof AgentHttpError) throw validationFailed('owner', error.message.replace(/^user: /, ''));
    throw error;
  }
  const uid = account.uid ?? 0;
  const gid = group === undefined ? (account.gid ?? uid) : await sandboxAccounts.resolveGroup(group, 'owner');
  if (gid > 0xfffffffe) throw validationFailed('owner', `gid out of range: ${group}`);
  return { uid, gid };
}

/** An entry's name as path components under the extraction root ('' = the root itself); refuses escapes. */
function entryComponents(name: string, field: string): string[] {
  if (name.includes('\0')) throw validationFailed('body', `${field} ${JSON.stringify(name)} contains a NUL byte`);
  if (name.startsWith('/')) throw validationFailed('body', `${field} ${JSON.stringify(name)} is absolute; archive entries must be relative`);
  const parts = name.split('/').filter((part) => part !== '' && part !== '.');
  if (parts.includes('..')) throw validationFailed('body', `${field} ${JSON.stringify(name)} has a ".." component; archive entries must stay under the extraction path`);
  return parts;
}

function errnoCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** A file system failure as the answer it deserves (disk full: 507, as uploads answer). */
function fsFailure(error: unknown, path: string): unknown {
  if (error instanceof AgentHttpError) return error;
  if (errnoCode(error) === 'EINVAL' && (error as { syscall?: string }).syscall?.includes('chown')) {
    return validationFailed('owner', `the sandbox has no such user or group id (${path})`);
  }
  return fsErrorToHttp(error, path) ?? error;
}

class Extraction {
  entries = 0;
  bytes = 0;
  /** Directories (relative, '/'-joined; '' = root) known to be real directories: made or lstat-checked here. */
  private readonly directories = new Set<string>(['']);
  /** Symbolic links this archive made: never followed by a later entry. */
  private readonly links = new Set<string>();
  /** Regular files this archive wrote: the only targets a hard link may name. */
  private readonly files = new Set<string>();
  /** Directory times are set last: writing into a directory changes its mtime. */
  private readonly directoryTimes: { path: string; mtime: Date }[] = [];
  /** Fired when the extraction fails (the body broke, the client left): a file in flight waits for no more data. */
  private readonly stopped = new AbortController();
  private readonly whenStopped = new Promise<never>((_resolve, reject) => {
    this.stopped.signal.addEventListener('abort', () => reject(new Error('the extraction stopped')), { once: true });
  });

  constructor(
    private readonly root: string,
    private readonly options: ExtractOptions,
  ) {
    this.whenStopped.catch(() => {});
  }

  stop(): void {
    this.stopped.abort();
  }

  private absolute(parts: string[]): string {
    return parts.length ? posix.join(this.root, ...parts) : this.root;
  }

  /** Every directory above the entry exists and is a real directory (made when missing, never through a link). */
  private async ensureParents(parts: string[]): Promise<void> {
    for (let depth = 1; depth < parts.length; depth++) {
      const key = parts.slice(0, depth).join('/');
      if (this.directories.has(key)) continue;
      const path = this.absolute(parts.slice(0, depth));
      const info = await lstat(path).catch((error: unknown) => {
        if (errnoCode(error) === 'ENOENT') return undefined;
        throw error;
      });
      // A link the sandbox already had to one of its directories is followed, as Docker's COPY
      // follows them (Debian's merged /usr: /bin -> usr/bin). The agent's root is the sandbox's,
      // so the link resolves inside the sandbox whatever it says; a link this archive made is
      // never followed (an archive cannot redirect its own later entries).
      if (info?.isSymbolicLink() && !this.links.has(key)) {
        const target = await stat(path).catch(() => undefined);
        if (target?.isDirectory()) {
          this.directories.add(key);
          continue;
        }
      }
      if (info && !info.isDirectory()) {
        const what = info.isSymbolicLink() ? 'a symbolic link' : 'not a directory';
        throw validationFailed('body', `entry ${JSON.stringify(parts.join('/'))}: ${JSON.stringify(key)} is ${what}; archive entries are never written through links`);
      }
      if (!info) {
        await mkdir(path, { mode: DEFAULT_DIRECTORY_MODE });
        await chmod(path, DEFAULT_DIRECTORY_MODE);
        if (this.options.owner) await chown(path, this.options.owner.uid, this.options.owner.gid);
      }
      this.directories.add(key);
    }
  }

  private owner(entry: ReadEntry): Owner {
    return this.options.owner ?? { uid: entry.uid ?? 0, gid: entry.gid ?? 0 };
  }

  private mode(entry: ReadEntry, fallback: number): number {
    return this.options.mode ?? (typeof entry.mode === 'number' ? entry.mode & 0o7777 : fallback);
  }

  /** What is at the entry's name now (lstat: a link is itself, never its target). */
  private async existing(path: string) {
    return lstat(path).catch((error: unknown) => {
      if (errnoCode(error) === 'ENOENT') return undefined;
      throw error;
    });
  }

  /** A non-directory entry replaces what is at its name, except a directory (409: directories merge, never vanish). */
  private async clearForNonDirectory(parts: string[], path: string): Promise<void> {
    const key = parts.join('/');
    const info = await this.existing(path);
    if (info?.isDirectory()) throw new AgentHttpError(409, 'conflict', `entry ${JSON.stringify(key)}: a directory is there; an archive never replaces a directory with a non-directory`);
    this.files.delete(key);
    if (info) await unlink(path);
  }

  async handle(entry: ReadEntry): Promise<void> {
    const type = entry.type;
    if (DROPPED_TYPES.has(type) || !(FILE_TYPES.has(type) || type === 'Directory' || type === 'SymbolicLink' || type === 'Link')) {
      // Device nodes and fifos, and kinds that are not file system objects: dropped.
      entry.resume();
      return;
    }
    const parts = entryComponents(entry.path, 'entry');
    const path = this.absolute(parts);
    if (parts.length === 0 && type !== 'Directory') throw validationFailed('body', `entry ${JSON.stringify(entry.path)} names the extraction path itself and is not a directory`);
    try {
      await this.ensureParents(parts);
      if (type === 'Directory') await this.directory(entry, parts, path);
      else if (FILE_TYPES.has(type)) await this.file(entry, parts, path);
      else if (type === 'SymbolicLink') await this.symlink(entry, parts, path);
      else await this.hardLink(entry, parts, path);
    } catch (error) {
      throw fsFailure(error, path);
    }
    this.entries++;
  }

  private async directory(entry: ReadEntry, parts: string[], path: string): Promise<void> {
    entry.resume();
    const key = parts.join('/');
    const info = await this.existing(path);
    // The sandbox's own link to a directory stays (a COPY to /bin/x of a merged-/usr image
    // carries a `bin/` entry, which must not replace the link with an empty directory).
    if (info?.isSymbolicLink() && !this.links.has(key) && (await stat(path).catch(() => undefined))?.isDirectory()) {
      this.directories.add(key);
      return;
    }
    if (info && !info.isDirectory()) {
      this.files.delete(key);
      await unlink(path);
    }
    const existed = info?.isDirectory() ?? false;
    if (!existed) await mkdir(path, { mode: DEFAULT_DIRECTORY_MODE });
    this.directories.add(key);
    // A directory that was there keeps its owner, mode and times (as Docker's COPY leaves
    // /usr alone when it copies into /usr/local/bin); one made here gets the archive's (or the
    // requested) owner and mode. It is a real directory: chmod and chown cannot follow a link.
    if (existed) return;
    const owner = this.owner(entry);
    await chown(path, owner.uid, owner.gid);
    await chmod(path, this.mode(entry, DEFAULT_DIRECTORY_MODE));
    if (entry.mtime) this.directoryTimes.push({ path, mtime: entry.mtime });
  }

  private async file(entry: ReadEntry, parts: string[], path: string): Promise<void> {
    const key = parts.join('/');
    const info = await this.existing(path);
    if (info?.isDirectory()) {
      entry.resume();
      throw new AgentHttpError(409, 'conflict', `entry ${JSON.stringify(key)}: a directory is there; an archive never replaces a directory with a file`);
    }
    // A new file beside the old name, renamed over it: a link or a hard-linked file at the name
    // is replaced, never written through. O_EXCL|O_NOFOLLOW: the temp name is ours alone.
    const temp = posix.join(posix.dirname(path), `.${posix.basename(path).slice(0, 200)}.nestbox-${randomBytes(6).toString('hex')}`);
    let handle: FileHandle | undefined = await open(temp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      const chunks = (entry as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
      for (;;) {
        // The entry's data ends, or the extraction stops (then no more data would ever come).
        const next = await Promise.race([chunks.next(), this.whenStopped]);
        if (next.done) break;
        const chunk = next.value;
        let offset = 0;
        while (offset < chunk.length) offset += (await handle.write(chunk, offset)).bytesWritten;
        this.bytes += chunk.length;
      }
      const owner = this.owner(entry);
      await handle.chown(owner.uid, owner.gid);
      // After chown: chown clears set-id bits, which an image's files may carry.
      await handle.chmod(this.mode(entry, 0o644));
      if (entry.mtime) await handle.utimes(entry.atime ?? entry.mtime, entry.mtime);
      await handle.close();
      handle = undefined;
      await rename(temp, path);
      this.files.add(key);
    } catch (error) {
      await handle?.close().catch(() => {});
      await unlink(temp).catch(() => {});
      throw error;
    }
  }

  private async symlink(entry: ReadEntry, parts: string[], path: string): Promise<void> {
    entry.resume();
    const target = entry.linkpath;
    if (!target || target.includes('\0')) throw validationFailed('body', `entry ${JSON.stringify(entry.path)}: a symbolic link needs a target without NUL bytes`);
    await this.clearForNonDirectory(parts, path);
    // The target is kept as written (absolute or relative): it is resolved in the sandbox when
    // used, and this extraction never writes through it.
    await symlink(target, path);
    this.links.add(parts.join('/'));
    const owner = this.owner(entry);
    await lchown(path, owner.uid, owner.gid);
    if (entry.mtime) await lutimes(path, entry.atime ?? entry.mtime, entry.mtime);
  }

  private async hardLink(entry: ReadEntry, parts: string[], path: string): Promise<void> {
    entry.resume();
    const targetParts = entryComponents(entry.linkpath ?? '', 'hard link target of');
    const targetKey = targetParts.join('/');
    // Only a file this archive wrote: never a file that was there before, inside or outside the path.
    if (!this.files.has(targetKey)) {
      throw validationFailed('body', `entry ${JSON.stringify(entry.path)}: hard link to ${JSON.stringify(entry.linkpath)}, which is not a file earlier in this archive`);
    }
    await this.clearForNonDirectory(parts, path);
    await link(this.absolute(targetParts), path);
    this.files.add(parts.join('/'));
  }

  async finish(): Promise<void> {
    for (const { path, mtime } of this.directoryTimes.reverse()) await utimes(path, mtime, mtime).catch(() => {});
  }
}

/**
 * Unpacks a tar stream (plain or gzip) at `root` (made when missing). Streamed: the body is read
 * as fast as entries are written, one entry at a time. Fails on the first refused entry; what
 * was written before it stays (an image build fails its step and discards the sandbox).
 */
export async function extractArchive(body: Readable, rootPath: string, options: ExtractOptions = {}): Promise<ArchiveExtractResponse> {
  const { Parser } = await loadTar();
  let root: string;
  try {
    const firstCreated = await mkdir(rootPath, { recursive: true, mode: DEFAULT_DIRECTORY_MODE });
    // Directories made for the path belong to `owner` too (as COPY --chown makes its destination).
    await giveCreatedDirectories(firstCreated, rootPath, options.owner);
    root = await realpath(rootPath);
    if (!(await lstat(root)).isDirectory()) throw validationFailed('path', `not a directory: ${rootPath}`);
  } catch (error) {
    body.resume();
    throw fsFailure(error, rootPath);
  }
  const extraction = new Extraction(root, options);
  return new Promise<ArchiveExtractResponse>((resolve, reject) => {
    let failed = false;
    let queue = Promise.resolve();
    const parser = new Parser({ strict: true });
    const fail = (error: unknown): void => {
      if (failed) return;
      failed = true;
      extraction.stop();
      body.unpipe?.();
      body.destroy();
      reject(error);
    };
    parser.on('entry', (entry: ReadEntry) => {
      // Entries come one at a time (the next once this one's data has been read); the queue
      // keeps their file system work in order too.
      queue = queue.then(() => (failed ? void entry.resume() : extraction.handle(entry))).catch((error: unknown) => {
        entry.resume();
        fail(error);
      });
    });
    parser.on('error', (error: Error) => fail(validationFailed('body', `not a valid tar archive (plain or gzip): ${error.message.replace(/^TAR_\w+: /, '')}`)));
    parser.on('end', () => {
      queue
        .then(() => extraction.finish())
        .then(() => {
          if (!failed) resolve({ entries: extraction.entries, bytes: extraction.bytes });
        })
        .catch(fail);
    });
    options.signal?.addEventListener('abort', () => fail(new Error('the client went away')), { once: true });
    body.on('error', (error) => fail(error));
    body.on('data', (chunk: Buffer) => {
      if (failed) return;
      if (parser.write(chunk) === false) body.pause();
    });
    parser.on('drain', () => {
      if (!failed) body.resume();
    });
    body.on('end', () => {
      if (!failed) parser.end();
    });
  });
}

/**
 * A tar stream of `absolutePath` (a file, or a directory and everything under it) with names
 * relative to the sandbox root. Symlinks are archived as links, never followed; backpressure
 * from the client paces the walk, and a client that goes away stops it.
 */
export async function sendArchive(res: ServerResponse, absolutePath: string): Promise<void> {
  try {
    await lstat(absolutePath);
  } catch (error) {
    throw fsErrorToHttp(error, absolutePath) ?? error;
  }
  const { Pack } = await loadTar();
  // The root has no name of its own: its children are the archive's top-level names.
  const names = absolutePath === '/' ? (await readdir('/')).sort() : [absolutePath.slice(1)];
  const pack = new Pack({ cwd: '/', portable: false, follow: false, strict: false });
  res.writeHead(200, { 'content-type': 'application/x-tar' });
  for (const name of names) pack.add(name);
  pack.end();
  await pipeline(pack as unknown as Readable, res);
}
