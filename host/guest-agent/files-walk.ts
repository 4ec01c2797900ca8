// A depth-first walk of a directory tree in code-unit order, shared by find and search. It never
// follows symlinks (a link to "/" must not turn a search of one project into a search of the
// whole sandbox, and links cannot create cycles this way), and it counts the directories it
// could not read instead of failing or hiding them.
import type { Dirent } from 'node:fs';
import { opendir } from 'node:fs/promises';
import { posix } from 'node:path';
import { compareCodeUnits } from './files.js';

export interface WalkEntry {
  path: string; // absolute
  relativePath: string; // from the walk's root, "/"-separated
  name: string;
  dirent: Dirent;
}

export interface WalkStats {
  unreadableDirs: number;
}

/** Trees deeper than this are not descended further (a guard, not an expected limit). */
const MAX_WALK_DEPTH = 256;

async function readSortedEntries(directory: string): Promise<Dirent[] | undefined> {
  try {
    const entries: Dirent[] = [];
    // opendir streams the directory rather than building one huge array up front in libuv.
    for await (const entry of await opendir(directory)) entries.push(entry);
    entries.sort((a, b) => compareCodeUnits(a.name, b.name));
    return entries;
  } catch {
    return undefined;
  }
}

export async function* walkTree(root: string, stats: WalkStats, signal?: AbortSignal): AsyncGenerator<WalkEntry> {
  async function* walk(directory: string, relativeDirectory: string, depth: number): AsyncGenerator<WalkEntry> {
    const entries = await readSortedEntries(directory);
    if (entries === undefined) {
      stats.unreadableDirs++;
      return;
    }
    for (const dirent of entries) {
      if (signal?.aborted) return;
      const path = posix.join(directory, dirent.name);
      const relativePath = relativeDirectory === '' ? dirent.name : `${relativeDirectory}/${dirent.name}`;
      yield { path, relativePath, name: dirent.name, dirent };
      if (dirent.isDirectory() && depth < MAX_WALK_DEPTH) yield* walk(path, relativePath, depth + 1);
    }
  }
  yield* walk(root, '', 1);
}
