// POST /files/replace: find-and-replace across files. Each file is rewritten atomically (temp
// file beside it, then rename), so a reader never sees half a replacement and a failure leaves
// the original untouched. A replace is whole-file by nature (a pattern may span lines), so files
// are read into memory; maxReplaceFileBytes bounds that.
import { constants } from 'node:fs';
import { open, rename, unlink } from 'node:fs/promises';
import type { ReplaceRequest, ReplaceResponse } from '../agent-protocol/files.js';
import { AgentHttpError, fsErrorToHttp, validationFailed } from './errors.js';
import { tempPathBeside, writeTarget } from './files.js';
import { markAgentWrite } from './files-write-marks.js';
import { resolveSandboxPath } from './paths.js';

type ReplaceResult = ReplaceResponse['results'][number];

interface Replacer {
  apply(text: string): { text: string; count: number };
}

function compileReplacer(request: ReplaceRequest): Replacer {
  if (!request.regex) {
    // split/join: the replacement is taken literally, `$&` and all.
    return {
      apply(text) {
        const parts = text.split(request.find);
        return { text: parts.join(request.replace), count: parts.length - 1 };
      },
    };
  }
  let pattern: RegExp;
  try {
    pattern = new RegExp(request.find, 'g');
  } catch (error) {
    throw validationFailed('find', `invalid regular expression: ${(error as Error).message}`);
  }
  return {
    apply(text) {
      let count = 0;
      for (const _ of text.matchAll(pattern)) count++;
      return { text: count === 0 ? text : text.replace(pattern, request.replace), count };
    },
  };
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

async function replaceInFile(absolutePath: string, replacer: Replacer, maxBytes: number): Promise<number> {
  const { path: target } = await writeTarget(absolutePath);
  const handle = await open(target, constants.O_RDONLY | constants.O_NONBLOCK);
  let original: Buffer;
  let mode: number;
  let uid: number;
  let gid: number;
  try {
    const info = await handle.stat();
    if (!info.isFile()) throw validationFailed('paths', `not a regular file: ${absolutePath}`);
    if (info.size > maxBytes) {
      throw new AgentHttpError(413, 'payload_too_large', `paths: ${absolutePath} is ${info.size} bytes, above the replace limit of ${maxBytes}`);
    }
    ({ mode, uid, gid } = info);
    original = await handle.readFile();
  } finally {
    await handle.close().catch(() => {});
  }
  let text: string;
  try {
    text = strictUtf8.decode(original);
  } catch {
    throw validationFailed('paths', `not a UTF-8 text file: ${absolutePath}`);
  }
  const { text: replaced, count } = replacer.apply(text);
  if (count === 0) return 0;

  const tempPath = tempPathBeside(target);
  try {
    const output = await open(tempPath, 'wx', 0o600);
    try {
      await output.writeFile(replaced, 'utf8');
      await output.sync();
      // Keep the file's identity as far as a new inode allows: permissions and ownership.
      await output.chown(uid, gid).catch(() => {});
      await output.chmod(mode & 0o7777);
      // Watchers report the rename below as a write of the file (files-write-marks.ts).
      markAgentWrite(await output.stat(), true);
    } finally {
      await output.close().catch(() => {});
    }
    await rename(tempPath, target);
  } catch (error) {
    await unlink(tempPath).catch(() => {});
    throw error;
  }
  return count;
}

function errorOf(error: unknown, path: string): { code: string; message: string } {
  const mapped = error instanceof AgentHttpError ? error : fsErrorToHttp(error, path);
  if (mapped) return { code: mapped.code, message: mapped.message };
  return { code: 'internal', message: `internal error: ${(error as Error)?.message ?? String(error)}` };
}

export async function replaceInFiles(request: ReplaceRequest, home: string, maxFileBytes: number): Promise<ReplaceResponse> {
  // Validate everything first: a bad path or pattern should change nothing at all.
  const paths = request.paths.map((raw, index) => resolveSandboxPath(raw, home, `paths[${index}]`));
  const replacer = compileReplacer(request);
  const results: ReplaceResult[] = [];
  for (const path of paths) {
    try {
      results.push({ path, replacements: await replaceInFile(path, replacer, maxFileBytes) });
    } catch (error) {
      results.push({ path, replacements: 0, error: errorOf(error, path) });
    }
  }
  return { results };
}
