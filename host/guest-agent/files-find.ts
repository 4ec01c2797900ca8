// GET /files/find: entries whose name (or relative path) matches a glob.
import { stat } from 'node:fs/promises';
import type { FindResponse } from '../agent-protocol/files.js';
import { rethrowFsError, validationFailed } from './errors.js';
import type { GlobMatcher } from './files-glob.js';
import { walkTree, type WalkStats } from './files-walk.js';

export const DEFAULT_MAX_RESULTS = 1000;
export const MAX_MAX_RESULTS = 100_000;

export function parseMaxResults(raw: string | null): number {
  if (raw === null || raw === '') return DEFAULT_MAX_RESULTS;
  if (!/^\d+$/.test(raw) || Number(raw) < 1 || Number(raw) > MAX_MAX_RESULTS) {
    throw validationFailed('maxResults', `expected an integer from 1 to ${MAX_MAX_RESULTS}, got ${JSON.stringify(raw)}`);
  }
  return Number(raw);
}

/** The directory a find or search starts from must exist and be a directory. */
export async function requireDirectory(absolutePath: string): Promise<void> {
  const info = await stat(absolutePath).catch((error: unknown) => rethrowFsError(error, absolutePath));
  if (!info.isDirectory()) throw validationFailed('path', `not a directory: ${absolutePath}`);
}

export async function findPaths(root: string, matcher: GlobMatcher, maxResults: number, signal?: AbortSignal): Promise<FindResponse> {
  await requireDirectory(root);
  const stats: WalkStats = { unreadableDirs: 0 };
  const paths: string[] = [];
  let truncated = false;
  for await (const entry of walkTree(root, stats, signal)) {
    if (!matcher.test(entry.name, entry.relativePath)) continue;
    // Looking one match past the limit tells "exactly maxResults" from "there were more".
    if (paths.length === maxResults) {
      truncated = true;
      break;
    }
    paths.push(entry.path);
  }
  return { paths, truncated, unreadableDirs: stats.unreadableDirs };
}
