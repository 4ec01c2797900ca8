// Metadata operations: mkdir, move, delete, chmod, chown. Each answers with the FileInfo clients
// would otherwise have to fetch with a second round trip.
import { giveCreatedDirectories, type Owner } from './files-ownership.js';
import { chmod, chown, cp, lstat, mkdir, rename, rm, rmdir, stat, unlink } from 'node:fs/promises';
import { posix } from 'node:path';
import type { FileInfo } from '../agent-protocol/types.js';
import { AgentHttpError, fsErrorToHttp, rethrowFsError, validationFailed } from './errors.js';
import { describe } from './files.js';
import { sandboxAccounts } from './files-owners.js';

const DEFAULT_DIRECTORY_MODE = 0o755;

function errnoCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

function conflict(message: string): AgentHttpError {
  return new AgentHttpError(409, 'conflict', message);
}

async function describePath(absolutePath: string): Promise<FileInfo> {
  try {
    return await describe(absolutePath, await lstat(absolutePath));
  } catch (error) {
    return rethrowFsError(error, absolutePath);
  }
}

/** `mkdir -p`: 201 when something was created, 200 when the directory was already there. */
export async function makeDirectory(absolutePath: string, mode: number | undefined, owner?: Owner): Promise<{ created: boolean; info: FileInfo }> {
  // stat, not lstat: a symlink to a directory satisfies `mkdir -p` too.
  const existing = await stat(absolutePath).catch(() => undefined);
  if (existing) {
    if (!existing.isDirectory()) throw conflict(`path: exists and is not a directory: ${absolutePath}`);
    return { created: false, info: await describePath(absolutePath) };
  }
  const finalMode = mode ?? DEFAULT_DIRECTORY_MODE;
  try {
    const firstCreated = await mkdir(absolutePath, { recursive: true, mode: finalMode });
    // The umask may have cleared bits of the requested mode; the last directory gets exactly
    // what was asked for, as `mkdir -p -m` does. A concurrent creator wins silently.
    if (firstCreated !== undefined) await chmod(absolutePath, finalMode);
    await giveCreatedDirectories(firstCreated, absolutePath, owner);
    return { created: firstCreated !== undefined, info: await describePath(absolutePath) };
  } catch (error) {
    if (error instanceof AgentHttpError) throw error;
    const code = errnoCode(error);
    if (code === 'ENOTDIR' || code === 'EEXIST') {
      throw conflict(`path: a parent of the path exists and is not a directory: ${absolutePath}`);
    }
    return rethrowFsError(error, absolutePath);
  }
}

/** Copies then deletes: the fallback when `from` and `to` are on different filesystems. */
async function moveAcrossFilesystems(from: string, to: string): Promise<void> {
  await cp(from, to, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true, force: true, errorOnExist: false });
  await rm(from, { recursive: true, force: true });
}

/**
 * Renames `from` to `to`. Without overwrite an existing `to` is a conflict; the check and the
 * rename are two steps, so a racing creator of `to` can still be replaced (Node has no
 * renameat2(RENAME_NOREPLACE)).
 */
export async function movePath(from: string, to: string, overwrite: boolean): Promise<FileInfo> {
  if (from === to) throw validationFailed('to', `is the same path as from: ${to}`);
  if (from === '/') throw validationFailed('from', 'cannot move the root directory');
  const source = await lstat(from).catch((error: unknown) => rethrowFsError(error, from));
  if (source.isDirectory() && (to + '/').startsWith(from + '/')) {
    throw validationFailed('to', `cannot move a directory into itself: ${from} → ${to}`);
  }
  const target = await lstat(to).catch(() => undefined);
  if (target && !overwrite) throw conflict(`to: already exists: ${to}`);
  if (target?.isDirectory() && !source.isDirectory()) throw conflict(`to: is a directory and cannot be replaced by a file: ${to}`);
  if (target && !target.isDirectory() && source.isDirectory()) throw conflict(`to: is not a directory and cannot be replaced by one: ${to}`);
  try {
    await mkdir(posix.dirname(to), { recursive: true });
  } catch (error) {
    const code = errnoCode(error);
    if (code === 'ENOTDIR' || code === 'EEXIST') throw validationFailed('to', `a parent of the path is not a directory: ${to}`);
    return rethrowFsError(error, to);
  }
  try {
    await rename(from, to);
  } catch (error) {
    const code = errnoCode(error);
    if (code === 'EXDEV') {
      if (target) await rm(to, { recursive: true, force: true });
      await moveAcrossFilesystems(from, to).catch((copyError: unknown) => rethrowFsError(copyError, to));
    } else if (code === 'ENOTEMPTY' || code === 'EEXIST') {
      throw conflict(`to: is a directory that is not empty: ${to}`);
    } else {
      const mapped = fsErrorToHttp(error, `${from} → ${to}`);
      throw mapped ?? error;
    }
  }
  return describePath(to);
}

/** DELETE /files. A symlink is removed itself, never what it points to. */
export async function removePath(absolutePath: string, recursive: boolean): Promise<void> {
  if (absolutePath === '/') throw validationFailed('path', 'refusing to remove the root directory');
  const info = await lstat(absolutePath).catch((error: unknown) => rethrowFsError(error, absolutePath));
  try {
    if (!info.isDirectory()) {
      await unlink(absolutePath);
    } else if (recursive) {
      await rm(absolutePath, { recursive: true, force: false, maxRetries: 2 });
    } else {
      await rmdir(absolutePath);
    }
  } catch (error) {
    const code = errnoCode(error);
    if (code === 'ENOTEMPTY' || code === 'EEXIST') {
      throw validationFailed('recursive', `must be true to remove a directory that is not empty: ${absolutePath}`);
    }
    if (code === 'EBUSY') throw conflict(`path: is in use (a mount point?): ${absolutePath}`);
    return rethrowFsError(error, absolutePath);
  }
}

/** Parses `recursive=true|false` (absent = false); anything else is a 400 naming the field. */
export function parseBooleanParam(raw: string | null, field: string, fallback = false): boolean {
  if (raw === null || raw === '') return fallback;
  if (raw === 'true' || raw === '1') return true;
  if (raw === 'false' || raw === '0') return false;
  throw validationFailed(field, `expected true or false, got ${JSON.stringify(raw)}`);
}

/** chmod follows a symlink, as chmod(1) does (Linux cannot change a symlink's own mode). */
export async function changeMode(absolutePath: string, mode: number): Promise<FileInfo> {
  try {
    await chmod(absolutePath, mode);
  } catch (error) {
    return rethrowFsError(error, absolutePath);
  }
  return describePath(absolutePath);
}

/** chown follows a symlink, as chown(1) does without -h. Unchanged ids are passed as -1. */
export async function changeOwner(absolutePath: string, owner: string | number | undefined, group: string | number | undefined): Promise<FileInfo> {
  if (owner === undefined && group === undefined) throw validationFailed('owner', 'owner or group is required');
  const uid = owner === undefined ? -1 : await sandboxAccounts.resolveUser(owner, 'owner');
  const gid = group === undefined ? -1 : await sandboxAccounts.resolveGroup(group, 'group');
  try {
    await chown(absolutePath, uid, gid);
  } catch (error) {
    return rethrowFsError(error, absolutePath);
  }
  return describePath(absolutePath);
}
