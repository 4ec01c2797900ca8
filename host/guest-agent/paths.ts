// Path handling. The agent runs inside the sandbox's own root, so any absolute path already
// means "inside the sandbox"; the only thing left to decide is what a relative path is relative
// to. It is always the sandbox user's home, never the agent's working directory, so a request
// cannot depend on where the agent happened to be started.
import { posix } from 'node:path';
import { validationFailed } from './errors.js';

/** Resolves a client-supplied path; `undefined`/empty means "not given". */
export function resolveSandboxPath(raw: string | null | undefined, home: string, field = 'path'): string {
  if (raw === null || raw === undefined || raw === '') throw validationFailed(field, 'required');
  if (raw.includes('\0')) throw validationFailed(field, 'must not contain a NUL byte');
  return posix.resolve(home, raw);
}

/** Like resolveSandboxPath, but an absent path means the home directory. */
export function resolveOptionalSandboxPath(raw: string | null | undefined, home: string, field = 'path'): string {
  if (raw === null || raw === undefined || raw === '') return posix.resolve(home);
  return resolveSandboxPath(raw, home, field);
}

/** Display name of a path; the root has no basename, so it is called "/". */
export function baseName(absolutePath: string): string {
  return posix.basename(absolutePath) || '/';
}

/** Parses an octal permission string such as "644" or "0755" into mode bits. */
export function parseFileMode(raw: string | null | undefined): number | undefined {
  if (raw === null || raw === undefined || raw === '') return undefined;
  if (!/^[0-7]{3,4}$/.test(raw)) {
    throw validationFailed('mode', `expected an octal permission string such as "644" or "0755", got ${JSON.stringify(raw)}`);
  }
  return Number.parseInt(raw, 8);
}
