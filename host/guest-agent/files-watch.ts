// Watching a directory tree for changes.
//
// Node's fs.watch reports only "rename" or "change" plus a name, so on its own it cannot tell a
// create from a remove from a rename, nor a write from a chmod. This module keeps a small memory
// of every entry it has seen per watched directory (inode, type, mode, owner, size, mtime) and
// classifies by comparing that memory with a fresh lstat. Raw events are coalesced per path over
// a short window, which both merges bursts (a thousand writes → one write) and puts the two
// halves of a rename (moved-from, moved-to) into the same batch, where the matching inode turns
// "one vanished, one appeared" into a rename.
//
// Recursion is done here, one non-recursive fs.watch per directory, rather than with
// `fs.watch(…, {recursive: true})`: Node 20's recursive mode on Linux is a JS emulation with
// known gaps for directories created after the start, and this way a new directory is scanned
// right after its watch is in place, so files created in it before that are not missed.
import { watch, type FSWatcher, type Stats } from 'node:fs';
import { lstat, readdir, stat } from 'node:fs/promises';
import { posix } from 'node:path';
import type { WatchChangeEvent, WatchChangeType } from '../agent-protocol/files.js';
import { AgentHttpError, rethrowFsError, validationFailed } from './errors.js';
import { isUploadTempPath } from './files.js';
import { agentWriteOf } from './files-write-marks.js';

/** Quiet time after the last raw event before a batch is classified. */
const COALESCE_QUIET_MS = 50;
/** Longest a raw event waits, even while events keep coming. */
const COALESCE_MAX_MS = 250;
/** More directories than this in one recursive watch are not watched (inotify watches are a shared, limited resource). */
export const MAX_WATCHED_DIRECTORIES = 65_536;

interface EntryState {
  dev: number;
  ino: number;
  isDir: boolean;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtimeMs: number;
}

interface WatchedDirectory {
  watcher: FSWatcher;
  entries: Map<string, EntryState>;
}

interface PendingEntry {
  directory: string;
  name: string;
  changes: number;
  renames: number;
}

export type WatchEndReason = 'removed' | 'error';

export interface TreeWatcherOptions {
  root: string;
  recursive: boolean;
  onEvent: (event: WatchChangeEvent) => void;
  /** Called once when the watch ends by itself (the root vanished, or a fatal watch error). */
  onEnd?: (reason: WatchEndReason, message: string) => void;
}

function stateOf(info: Stats): EntryState {
  return { dev: info.dev, ino: info.ino, isDir: info.isDirectory(), mode: info.mode, uid: info.uid, gid: info.gid, size: info.size, mtimeMs: info.mtimeMs };
}

function errnoCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

export class TreeWatcher {
  private readonly directories = new Map<string, WatchedDirectory>();
  private pending = new Map<string, PendingEntry>();
  private rescans = new Set<string>();
  private quietTimer: NodeJS.Timeout | undefined;
  private maxTimer: NodeJS.Timeout | undefined;
  private processing: Promise<void> = Promise.resolve();
  private rootIno = 0;
  private closed = false;

  private constructor(private readonly options: TreeWatcherOptions) {}

  /**
   * Starts watching; resolves once every watch is in place and the tree's current state is
   * known (the moment to send `ready`). 404 for a missing path, 400 for a non-directory.
   */
  static async start(options: TreeWatcherOptions): Promise<TreeWatcher> {
    const info = await stat(options.root).catch((error: unknown) => rethrowFsError(error, options.root));
    if (!info.isDirectory()) throw validationFailed('path', `not a directory: ${options.root}`);
    const tree = new TreeWatcher(options);
    tree.rootIno = info.ino;
    try {
      await tree.watchDirectory(options.root, { emitCreates: false, required: true });
    } catch (error) {
      tree.close();
      throw error;
    }
    return tree;
  }

  /**
   * Resolves once every change made before the call has been classified and delivered: what the
   * kernel has queued is read first (one turn of the event loop), then the batch being
   * coalesced is classified at once instead of after its quiet time. A polled watcher drains
   * after this, so a change whose call has returned is already among its events.
   */
  async settle(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve));
    if (this.closed) return;
    if (this.pending.size > 0 || this.rescans.size > 0) this.flushSoon();
    await this.processing;
  }

  get watchedDirectoryCount(): number {
    return this.directories.size;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.quietTimer);
    clearTimeout(this.maxTimer);
    for (const directory of this.directories.values()) directory.watcher.close();
    this.directories.clear();
    this.pending.clear();
  }

  private end(reason: WatchEndReason, message: string): void {
    if (this.closed) return;
    this.close();
    this.options.onEnd?.(reason, message);
  }

  private emit(type: WatchChangeType, path: string, isDir: boolean): void {
    // An upload lands through a temp file renamed into place: watchers see only the result.
    if (this.closed || isUploadTempPath(path)) return;
    this.options.onEvent({ type, path, isDir, at: new Date().toISOString() });
  }

  /**
   * Puts a watch on `directory`, then records (and with emitCreates, reports) what is in it. The
   * watch comes first so nothing created in between can fall through the cracks; anything both
   * scanned and reported by the new watch is deduplicated by the entry memory.
   */
  private async watchDirectory(directory: string, how: { emitCreates: boolean; required: boolean }): Promise<void> {
    if (this.closed || this.directories.has(directory)) return;
    if (this.directories.size >= MAX_WATCHED_DIRECTORIES) return;
    let watcher: FSWatcher;
    try {
      watcher = watch(directory, { persistent: false }, (eventType, filename) => this.onRawEvent(directory, eventType, filename));
    } catch (error) {
      if (!how.required) return;
      if (errnoCode(error) === 'ENOSPC') {
        throw new AgentHttpError(500, 'internal', `path: the sandbox's inotify watch limit is reached (fs.inotify.max_user_watches); cannot watch ${directory}`);
      }
      return rethrowFsError(error, directory);
    }
    watcher.on('error', (error) => this.onWatcherError(directory, error));
    const watched: WatchedDirectory = { watcher, entries: new Map() };
    this.directories.set(directory, watched);

    const names = await readdir(directory).catch(() => [] as string[]);
    for (const name of names) {
      if (this.closed) return;
      const path = posix.join(directory, name);
      const info = await lstat(path).catch(() => undefined);
      // Already recorded through an event of the new watch: that path reported it.
      if (!info || watched.entries.has(name)) continue;
      const state = stateOf(info);
      watched.entries.set(name, state);
      if (how.emitCreates) this.emitArrival(path, state, { replaced: false, contentChanged: false });
      if (state.isDir && this.options.recursive) await this.watchDirectory(path, { emitCreates: how.emitCreates, required: false });
    }
  }

  /**
   * An entry that is new at its path. The agent's own writes land by a rename from a temp file
   * (files-write-marks.ts) but are reported as the in-place write they stand for, in the order
   * an in-place writer produces them: a new file is create, chmod (its mode is set), then write
   * when it has content; an overwritten one is a write.
   */
  private emitArrival(path: string, state: EntryState, how: { replaced: boolean; contentChanged: boolean }): void {
    const agentWrite = state.isDir ? undefined : agentWriteOf(state);
    if (agentWrite) {
      if (how.replaced) {
        this.emit('write', path, false);
        return;
      }
      this.emit('create', path, false);
      this.emit('chmod', path, false);
      if (state.size > 0) this.emit('write', path, false);
      return;
    }
    this.emit('create', path, state.isDir);
    if (how.contentChanged && !state.isDir) this.emit('write', path, false);
  }

  /** Stops watching `directory` and everything below it (it was removed or moved away). */
  private forgetDirectory(directory: string): void {
    const prefix = `${directory}/`;
    for (const [path, watched] of this.directories) {
      if (path === directory || path.startsWith(prefix)) {
        watched.watcher.close();
        this.directories.delete(path);
      }
    }
  }

  private onWatcherError(directory: string, error: Error): void {
    if (directory === this.options.root) {
      // Usually the root itself went away (inotify's IN_IGNORED); the check tells which.
      this.schedule(() => this.checkRoot(`watch failed: ${error.message}`));
      return;
    }
    this.directories.get(directory)?.watcher.close();
    this.directories.delete(directory);
  }

  private onRawEvent(directory: string, eventType: string, filename: string | Buffer | null): void {
    if (this.closed || !this.directories.has(directory)) return;
    if (filename === null || filename === undefined) {
      this.rescans.add(directory);
    } else {
      const name = filename.toString();
      const key = `${directory}\0${name}`;
      let entry = this.pending.get(key);
      if (!entry) {
        entry = { directory, name, changes: 0, renames: 0 };
        this.pending.set(key, entry);
      }
      if (eventType === 'change') entry.changes++;
      else entry.renames++;
    }
    clearTimeout(this.quietTimer);
    this.quietTimer = setTimeout(() => this.flushSoon(), COALESCE_QUIET_MS);
    this.maxTimer ??= setTimeout(() => this.flushSoon(), COALESCE_MAX_MS);
  }

  private flushSoon(): void {
    clearTimeout(this.quietTimer);
    clearTimeout(this.maxTimer);
    this.quietTimer = undefined;
    this.maxTimer = undefined;
    const batch = this.pending;
    const rescans = this.rescans;
    this.pending = new Map();
    this.rescans = new Set();
    this.schedule(() => this.classify(batch, rescans));
  }

  /** Batches are classified one after another, so the entry memory is never updated concurrently. */
  private schedule(task: () => Promise<void>): void {
    this.processing = this.processing.then(task).catch((error: unknown) => {
      this.end('error', `watch failed: ${(error as Error)?.message ?? String(error)}`);
    });
  }

  private async checkRoot(reason: string): Promise<void> {
    const info = await stat(this.options.root).catch(() => undefined);
    if (!info || !info.isDirectory() || info.ino !== this.rootIno) {
      this.emit('remove', this.options.root, true);
      this.end('removed', `the watched directory was removed: ${this.options.root}`);
      return;
    }
    if (!this.directories.has(this.options.root)) this.end('error', reason);
  }

  private async classify(batch: Map<string, PendingEntry>, rescans: Set<string>): Promise<void> {
    if (this.closed) return;
    // A rescan (an event without a name) touches every name the directory has or had.
    for (const directory of rescans) {
      const watched = this.directories.get(directory);
      if (!watched) continue;
      const names = new Set([...watched.entries.keys(), ...(await readdir(directory).catch(() => [] as string[]))]);
      for (const name of names) {
        const key = `${directory}\0${name}`;
        if (!batch.has(key)) batch.set(key, { directory, name, changes: 0, renames: 1 });
      }
    }

    interface Observation {
      pending: PendingEntry;
      path: string;
      before: EntryState | undefined;
      after: EntryState | undefined;
    }
    const observations: Observation[] = [];
    let rootTouched = false;
    for (const pending of batch.values()) {
      const watched = this.directories.get(pending.directory);
      if (!watched) continue; // its directory went away meanwhile
      const path = posix.join(pending.directory, pending.name);
      const before = watched.entries.get(pending.name);
      const info = await lstat(path).catch(() => undefined);
      const after = info ? stateOf(info) : undefined;
      // Events about a watched directory itself carry its own name; they are not children.
      if (!before && !after && pending.name === posix.basename(pending.directory)) {
        if (pending.directory === this.options.root) rootTouched = true;
        continue;
      }
      observations.push({ pending, path, before, after });
    }

    // Inodes that (re)appeared in this batch: a vanished entry whose inode is among them moved.
    const appearedInodes = new Map<number, Observation>();
    for (const observation of observations) {
      const { before, after } = observation;
      if (after && (!before || before.ino !== after.ino)) appearedInodes.set(after.ino, observation);
    }

    for (const observation of observations) {
      if (this.closed) return;
      const { pending, path, before, after } = observation;
      const watched = this.directories.get(pending.directory);
      if (!watched) continue;

      if (before && (!after || after.ino !== before.ino)) {
        // The old entry is gone: moved within the watch, or removed (moved out looks the same).
        // The same inode number elsewhere is a move, unless it is the agent's own write: inode
        // numbers are reused at once (a file the agent replaces here frees its number for the
        // next file it writes), and the agent's writes come from temp files, never from a move
        // of a watched entry.
        const target = appearedInodes.get(before.ino);
        const moved =
          target !== undefined &&
          target !== observation &&
          target.after !== undefined &&
          target.after.isDir === before.isDir &&
          agentWriteOf(target.after) === undefined;
        if (moved) {
          this.emit('rename', path, before.isDir);
        } else if (!after) {
          this.emit('remove', path, before.isDir);
        }
        watched.entries.delete(pending.name);
        if (before.isDir) this.forgetDirectory(path);
      }

      if (after && (!before || before.ino !== after.ino)) {
        // New at this path: created, moved in, or the target of a rename (which replaces).
        this.emitArrival(path, after, { replaced: before !== undefined && !before.isDir, contentChanged: pending.changes > 0 });
        watched.entries.set(pending.name, after);
        if (after.isDir && this.options.recursive) {
          // A directory moved within the watch keeps its contents; only new ones are announced.
          const movedHere = observations.some((other) => other !== observation && other.before?.ino === after.ino);
          await this.watchDirectory(path, { emitCreates: !movedHere, required: false });
        }
      } else if (before && after) {
        // Same inode: attributes or content changed.
        if (before.mode !== after.mode || before.uid !== after.uid || before.gid !== after.gid) this.emit('chmod', path, after.isDir);
        if (!after.isDir && (before.size !== after.size || before.mtimeMs !== after.mtimeMs)) this.emit('write', path, false);
        watched.entries.set(pending.name, after);
      } else if (!before && !after) {
        // Appeared and vanished within one window: still worth knowing both happened.
        this.emit('create', path, false);
        this.emit('remove', path, false);
      }
    }
    if (rootTouched) await this.checkRoot('watch failed');
  }
}
