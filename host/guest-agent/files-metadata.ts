// File metadata: the `user.*` extended attributes of files, read and written through the
// nestbox-pty helper's --xattr mode (pty-helper/nestbox-xattr.c; Node has no xattr API). Names
// are given and reported without the `user.` prefix. See agent-protocol/files.ts METADATA.
import { spawn } from 'node:child_process';
import type { FileMetadataResponse } from '../agent-protocol/files.js';
import { AgentHttpError, validationFailed } from './errors.js';

/** The Linux limit on a whole attribute name (`user.` included). */
const MAX_NAME_BYTES = 255 - 'user.'.length;
/** Largest value accepted: ext4 keeps all of a file's attributes in one 4 KiB block. */
const MAX_VALUE_BYTES = 4096;

const ERRNO_ENOSPC = 28;
const ERRNO_EDQUOT = 122;
const ERRNO_ENOTSUP = 95;
const ERRNO_ENOENT = 2;
const ERRNO_E2BIG = 7;
const ERRNO_ERANGE = 34;
const ERRNO_EPERM = 1;
const ERRNO_EACCES = 13;
const ERRNO_ENOTDIR = 20;
const ERRNO_EINVAL = 22;
const ERRNO_ENAMETOOLONG = 36;
const ERRNO_ELOOP = 40;

function run(helper: string, args: string[], input: Buffer): Promise<{ code: number; stdout: Buffer; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(helper, ['--xattr', ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => stderr.push(chunk));
    child.once('error', (error: NodeJS.ErrnoException) => {
      if (error.code === 'ENOENT') reject(new AgentHttpError(501, 'not_supported', `file metadata: the helper ${helper} is not in this sandbox`));
      else reject(error);
    });
    child.once('close', (code) => resolve({ code: code ?? 1, stdout: Buffer.concat(stdout), stderr: Buffer.concat(stderr).toString('utf8') }));
    child.stdin.on('error', () => {});
    child.stdin.end(input);
  });
}

function decodePairs(line: string): Record<string, string> {
  const metadata: Record<string, string> = {};
  for (const pair of line.split(' ')) {
    if (!pair) continue;
    const [name, value = ''] = pair.split('=');
    // The API carries text: a name or value that is not UTF-8 (set by other tools) is skipped.
    try {
      const decoder = new TextDecoder('utf-8', { fatal: true });
      metadata[decoder.decode(Buffer.from(name, 'hex'))] = decoder.decode(Buffer.from(value, 'hex'));
    } catch {
      continue;
    }
  }
  return metadata;
}

/**
 * The `user.*` attributes of each path, in order. A missing path, one on a filesystem without
 * user attributes, or one with none has `{}`.
 */
export async function readMetadata(helper: string, paths: string[]): Promise<Record<string, string>[]> {
  if (paths.length === 0) return [];
  const { code, stdout, stderr } = await run(helper, ['get'], Buffer.concat(paths.map((path) => Buffer.from(`${path}\0`, 'utf8'))));
  if (code !== 0) throw new AgentHttpError(500, 'internal', `file metadata: reading failed: ${stderr.trim()}`);
  const lines = stdout.toString('utf8').split('\n');
  return paths.map((path, index) => {
    const line = lines[index] ?? '';
    if (line.startsWith('!')) {
      const errno = Number(line.slice(1));
      if (errno === ERRNO_EACCES || errno === ERRNO_EPERM) return {};
      throw new AgentHttpError(500, 'internal', `file metadata: reading ${path} failed (errno ${errno})`);
    }
    return decodePairs(line);
  });
}

export function validateMetadata(set: Record<string, string>): void {
  for (const [name, value] of Object.entries(set)) {
    if (name === '' || name.includes('\0')) throw validationFailed('metadata', 'names must be non-empty and contain no NUL byte');
    if (Buffer.byteLength(name) > MAX_NAME_BYTES) throw validationFailed('metadata', `name ${JSON.stringify(name)} is longer than ${MAX_NAME_BYTES} bytes`);
    if (Buffer.byteLength(value) > MAX_VALUE_BYTES) throw validationFailed('metadata', `value of ${JSON.stringify(name)} is longer than ${MAX_VALUE_BYTES} bytes`);
  }
}

/**
 * Sets `user.<name>` for each entry of `set`; with `replacePrefix`, the file's other attributes
 * under `user.<replacePrefix>` are removed first, so that set is replaced. Answers what the file
 * then has.
 */
export async function writeMetadata(helper: string, path: string, set: Record<string, string>, replacePrefix = ''): Promise<FileMetadataResponse> {
  validateMetadata(set);
  if (replacePrefix.includes('\0')) throw validationFailed('replacePrefix', 'must not contain a NUL byte');
  const input = Object.entries(set)
    .map(([name, value]) => `${Buffer.from(name, 'utf8').toString('hex')}=${Buffer.from(value, 'utf8').toString('hex')}\n`)
    .join('');
  const { code, stderr } = await run(helper, ['set', path, replacePrefix], Buffer.from(input));
  if (code !== 0) {
    const errno = Number(/^errno (\d+)/.exec(stderr)?.[1]);
    const detail = stderr.trim().replace(/^errno \d+: /, '');
    if (errno === ERRNO_ENOENT || errno === ERRNO_ENOTDIR) throw new AgentHttpError(404, 'not_found', `path: no such file: ${path}`);
    if (errno === ERRNO_ELOOP || errno === ERRNO_ENAMETOOLONG) throw validationFailed('path', `cannot be resolved: ${path} (${detail})`);
    if (errno === ERRNO_EINVAL) throw validationFailed('metadata', `refused by the filesystem of ${path} (${detail})`);
    // A filesystem without user attributes (procfs, sysfs) keeps none: not an error, and the
    // answer reads back what is there, so it never claims metadata that was not kept.
    if (errno === ERRNO_ENOTSUP) return { path, metadata: {} };
    if (errno === ERRNO_ENOSPC || errno === ERRNO_EDQUOT || errno === ERRNO_E2BIG || errno === ERRNO_ERANGE) {
      throw new AgentHttpError(507, 'insufficient_storage', `metadata: no room for it on ${path} (${detail})`);
    }
    if (errno === ERRNO_EPERM || errno === ERRNO_EACCES) throw new AgentHttpError(403, 'forbidden', `path: may not set metadata on ${path} (${detail})`);
    throw new AgentHttpError(500, 'internal', `file metadata: writing ${path} failed: ${detail}`);
  }
  const [metadata] = await readMetadata(helper, [path]);
  return { path, metadata };
}
