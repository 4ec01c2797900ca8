// GET /files/search: grep over a tree. Files are streamed line by line, so a huge file costs
// one chunk plus one (capped) line of memory, never its whole size.
//
// Known limit: the regex runs on the agent's event loop, so a pathological pattern (catastrophic
// backtracking) stalls this sandbox's agent until it finishes. Lines are capped at 1 MiB to keep
// that bounded by the input, and only the caller's own sandbox is affected.
import { constants } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { posix } from 'node:path';
import type { SearchMatch, SearchResponse } from '../agent-protocol/files.js';
import { AgentHttpError, rethrowFsError, validationFailed } from './errors.js';
import type { GlobMatcher } from './files-glob.js';
import { noteStreamedBytes } from './files.js';
import { walkTree, type WalkStats } from './files-walk.js';

/** A NUL within this many leading bytes marks a file as binary (as git and grep do). */
const BINARY_SNIFF_BYTES = 8 * 1024;
/** Longer lines are searched in their first MiB only. */
const MAX_LINE_BYTES = 1024 * 1024;
/** Characters of a matching line returned in `text`. */
const MAX_MATCH_TEXT = 1000;

export interface SearchQuery {
  query: string;
  regex: boolean;
  caseSensitive: boolean;
  glob?: GlobMatcher;
  maxResults: number;
}

/** Returns the 0-based index of the first match in a line, or -1. */
type LineMatcher = (line: string) => number;

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

export function compileLineMatcher(query: string, regex: boolean, caseSensitive: boolean): LineMatcher {
  if (!regex && caseSensitive) return (line) => line.indexOf(query);
  let compiled: RegExp;
  try {
    compiled = new RegExp(regex ? query : escapeRegExp(query), caseSensitive ? '' : 'i');
  } catch (error) {
    throw validationFailed('query', `invalid regular expression: ${(error as Error).message}`);
  }
  return (line) => {
    const match = compiled.exec(line);
    return match ? match.index : -1;
  };
}

interface FileSearchOutcome {
  kind: 'searched' | 'binary' | 'unreadable';
}

/**
 * Streams one file and reports each matching line through `onMatch`, which returns false to
 * stop (the result limit was reached).
 */
async function searchFile(path: string, matchLine: LineMatcher, onMatch: (match: SearchMatch) => boolean, signal?: AbortSignal): Promise<FileSearchOutcome & { stopped: boolean }> {
  let handle;
  try {
    // O_NONBLOCK: a FIFO or a blocking pseudo-file must never park a libuv thread.
    handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch {
    return { kind: 'unreadable', stopped: false };
  }
  try {
    const info = await handle.stat();
    if (!info.isFile()) return { kind: 'unreadable', stopped: false };
    const stream = handle.createReadStream({ highWaterMark: 64 * 1024, autoClose: false });
    let sniffed = 0;
    let lineNumber = 0;
    let pieces: Buffer[] = [];
    let pieceBytes = 0;

    const finishLine = (): boolean => {
      lineNumber++;
      const text = (pieces.length === 1 ? pieces[0] : Buffer.concat(pieces)).toString('utf8');
      pieces = [];
      pieceBytes = 0;
      const line = text.endsWith('\r') ? text.slice(0, -1) : text;
      const index = matchLine(line);
      if (index === -1) return true;
      return onMatch({ path, line: lineNumber, column: index + 1, text: line.length > MAX_MATCH_TEXT ? line.slice(0, MAX_MATCH_TEXT) : line });
    };

    try {
      for await (const chunk of stream as AsyncIterable<Buffer>) {
        if (signal?.aborted) return { kind: 'searched', stopped: true };
        noteStreamedBytes(chunk.length);
        if (sniffed < BINARY_SNIFF_BYTES) {
          const window = chunk.subarray(0, BINARY_SNIFF_BYTES - sniffed);
          if (window.includes(0)) return { kind: 'binary', stopped: false };
          sniffed += window.length;
        }
        let start = 0;
        for (let newline = chunk.indexOf(10, start); newline !== -1; newline = chunk.indexOf(10, start)) {
          keepPiece(chunk.subarray(start, newline));
          start = newline + 1;
          if (!finishLine()) return { kind: 'searched', stopped: true };
        }
        keepPiece(chunk.subarray(start));
      }
    } catch {
      return { kind: 'unreadable', stopped: false };
    } finally {
      stream.destroy();
    }
    // A last line without a trailing newline is still a line.
    if (pieceBytes > 0 && !finishLine()) return { kind: 'searched', stopped: true };
    return { kind: 'searched', stopped: false };

    function keepPiece(piece: Buffer): void {
      if (piece.length === 0 || pieceBytes >= MAX_LINE_BYTES) return;
      const room = MAX_LINE_BYTES - pieceBytes;
      // Copy: the chunk must not stay alive for as long as a long line accumulates.
      const kept = Buffer.from(piece.length > room ? piece.subarray(0, room) : piece);
      pieces.push(kept);
      pieceBytes += kept.length;
    }
  } finally {
    await handle.close().catch(() => {});
  }
}

export async function searchFiles(root: string, search: SearchQuery, signal?: AbortSignal): Promise<SearchResponse> {
  if (search.query === '') throw validationFailed('query', 'required');
  const matchLine = compileLineMatcher(search.query, search.regex, search.caseSensitive);
  // The path given is followed (like the list route); symlinks below it are not.
  const rootInfo = await stat(root).catch((error: unknown) => rethrowFsError(error, root));
  const matches: SearchMatch[] = [];
  const response: SearchResponse = { matches, truncated: false, unreadableDirs: 0, unreadableFiles: 0, binaryFilesSkipped: 0 };
  const onMatch = (match: SearchMatch): boolean => {
    if (matches.length === search.maxResults) {
      response.truncated = true;
      return false;
    }
    matches.push(match);
    return true;
  };
  const account = (outcome: FileSearchOutcome): void => {
    if (outcome.kind === 'binary') response.binaryFilesSkipped++;
    else if (outcome.kind === 'unreadable') response.unreadableFiles++;
  };

  if (!rootInfo.isDirectory()) {
    // A single file.
    const outcome = await searchFile(root, matchLine, onMatch, signal);
    if (outcome.kind === 'unreadable') throw new AgentHttpError(400, 'validation_failed', `path: not a readable regular file or directory: ${root}`);
    account(outcome);
    return response;
  }
  const stats: WalkStats = { unreadableDirs: 0 };
  for await (const entry of walkTree(root, stats, signal)) {
    if (!entry.dirent.isFile()) continue;
    if (search.glob && !search.glob.test(entry.name, entry.relativePath)) continue;
    const outcome = await searchFile(posix.join(root, entry.relativePath), matchLine, onMatch, signal);
    account(outcome);
    if (outcome.stopped) break;
  }
  response.unreadableDirs = stats.unreadableDirs;
  return response;
}
