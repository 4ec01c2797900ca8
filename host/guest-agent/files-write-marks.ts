// Files the agent itself has just written. Every write of the agent (PUT /files/content,
// uploads, replace) streams into a temp file and renames it into place, so readers never see
// half a file; to inotify that is "a new inode appeared at this path", which a watcher would
// report as a create even when an existing file was overwritten. Watch clients expect what an
// in-place write looks like (E2B's envd writes in place: a new file is create, chmod, write; an
// overwritten one is write). So each such write marks its temp file (inode, size and mtime, which
// a rename keeps), before the rename, and the watcher (files-watch.ts) classifies a file it
// finds marked as the agent's write.
//
// The mark is taken before the rename, so no watcher can see the new inode before its mark.
// Marks are few and short-lived: kept for ten seconds (a batch is classified within a quarter
// second, or when a polled watcher is drained), at most MAX_MARKS of them.

const MARK_LIFETIME_MS = 10_000;
const MAX_MARKS = 4096;

export interface AgentWriteMark {
  /** Whether the destination existed (as a file) before: an overwrite, not a new file. */
  replaced: boolean;
  markedAt: number;
}

const marks = new Map<string, AgentWriteMark>();

/** A file is one written by the agent only if nothing changed since: the same inode, size and mtime (inode numbers are reused at once, a reused one has another mtime). */
interface FileIdentity {
  dev: number;
  ino: number;
  size: number;
  mtimeMs: number;
}

const keyOf = (file: FileIdentity): string => `${file.dev}:${file.ino}:${file.size}:${file.mtimeMs}`;

function prune(now: number): void {
  // Insertion order is age order: stop at the first one still young.
  for (const [key, mark] of marks) {
    if (marks.size <= MAX_MARKS && now - mark.markedAt < MARK_LIFETIME_MS) break;
    marks.delete(key);
  }
}

/** Called with the temp file's identity just before it is renamed onto its destination. */
export function markAgentWrite(file: FileIdentity, replaced: boolean, now = Date.now()): void {
  const key = keyOf(file);
  marks.delete(key);
  marks.set(key, { replaced, markedAt: now });
  prune(now);
}

/** The mark of an inode written by the agent within the mark lifetime, if any (several watchers may ask). */
export function agentWriteOf(file: FileIdentity, now = Date.now()): AgentWriteMark | undefined {
  const mark = marks.get(keyOf(file));
  if (!mark || now - mark.markedAt >= MARK_LIFETIME_MS) return undefined;
  return mark;
}
