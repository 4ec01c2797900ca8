// envd's `filesystem.Filesystem` service translated onto the toolbox's file operations
// (e2b.md (c) "RPC-by-RPC usage"; core/services/toolbox.ts).
import { posix } from 'node:path';
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import type { MessageInitShape } from '@bufbuild/protobuf';
import { timestampFromDate } from '@bufbuild/protobuf/wkt';
import type { FileInfo } from '../../../core/guest.js';
import { NestboxError } from '../../../core/errors.js';
import type { E2bDeps } from '../deps.js';
import { EventType, FileType, Filesystem, type EntryInfoSchema, type FilesystemEventSchema } from '../gen/filesystem/filesystem_pb.js';
import { isSandboxUnavailable, rpcError } from '../errors.js';
import { homeRelative, type SandboxTarget } from '../target.js';
import { e2bAccount } from '../routing.js';
import { giveTo, ownerOf } from '../../sandbox-accounts.js';
import type { ErrorLog } from '../../../core/logger.js';

type EntryInit = MessageInitShape<typeof EntryInfoSchema>;
type FilesystemEventInit = MessageInitShape<typeof FilesystemEventSchema>;
export type ResolveTarget = (ctx: HandlerContext) => Promise<SandboxTarget>;

const TYPE: Record<FileInfo['type'], FileType> = {
  file: FileType.FILE,
  dir: FileType.DIRECTORY,
  symlink: FileType.SYMLINK,
  // Devices, sockets and fifos: envd reports them as files too; SDK lists skip unspecified.
  other: FileType.FILE,
};

/** `ls -l` style permissions as Go's FileMode.String() prints them (what envd sends). */
export function permissionString(type: FileInfo['type'], mode: number): string {
  const kind = type === 'dir' ? 'd' : type === 'symlink' ? 'L' : '-';
  let out = '';
  for (let shift = 6; shift >= 0; shift -= 3) {
    const bits = (mode >> shift) & 7;
    out += (bits & 4 ? 'r' : '-') + (bits & 2 ? 'w' : '-') + (bits & 1 ? 'x' : '-');
  }
  return kind + out;
}

/**
 * envd describes a symlink by where it leads: `type` and `mode` of the final target,
 * `symlinkTarget` its absolute resolved path; the permissions string stays the link's own
 * (`Lrwxrwxrwx`). A dangling link has no type (unspecified, which SDK lists skip) and names
 * itself as its target, as envd's resolution falls back to the path.
 */
export function entryInfo(f: FileInfo): EntryInit {
  const link = f.type === 'symlink';
  const resolved = link ? f.symlinkResolved : undefined;
  return {
    name: f.name,
    type: link ? (resolved ? TYPE[resolved.type] : FileType.UNSPECIFIED) : TYPE[f.type],
    path: f.path,
    size: BigInt(Math.max(0, Math.trunc(f.size))),
    mode: (link ? (resolved?.mode ?? 0) : f.mode) & 0o7777,
    permissions: permissionString(f.type, f.mode),
    owner: f.owner,
    group: f.group,
    modifiedTime: timestampFromDate(new Date(f.mtime)),
    ...(link ? { symlinkTarget: resolved?.path ?? f.path } : {}),
  };
}

/**
 * envd keeps a file's metadata in `user.e2b.<key>` extended attributes and shows it with the
 * prefix stripped (other `user.*` attributes are not its business): the toolbox's metadata has
 * names without `user.`, so only the `e2b.` ones are shown here.
 */
export const E2B_METADATA_PREFIX = 'e2b.';

export function e2bMetadata(metadata: Record<string, string> | undefined): Record<string, string> | undefined {
  if (!metadata) return undefined;
  const shown: Record<string, string> = {};
  for (const [name, value] of Object.entries(metadata)) {
    if (name.startsWith(E2B_METADATA_PREFIX) && name.length > E2B_METADATA_PREFIX.length) shown[name.slice(E2B_METADATA_PREFIX.length)] = value;
  }
  return Object.keys(shown).length > 0 ? shown : undefined;
}

const EVENT_TYPE: Record<string, EventType> = {
  create: EventType.CREATE,
  write: EventType.WRITE,
  remove: EventType.REMOVE,
  rename: EventType.RENAME,
  chmod: EventType.CHMOD,
};

/** A watcher id carries the watched root (names are reported relative to it), so nothing is kept here. */
function encodeWatcherId(guestId: string, root: string, includeEntry: boolean): string {
  return `${includeEntry ? 1 : 0}.${Buffer.from(root).toString('base64url')}.${guestId}`;
}

function decodeWatcherId(id: string): { guestId: string; root: string; includeEntry: boolean } {
  const [include, root, ...rest] = id.split('.');
  const guestId = rest.join('.');
  if (!guestId || root === undefined) throw new ConnectError(`watcher ${id} not found`, Code.NotFound);
  return { guestId, includeEntry: include === '1', root: Buffer.from(root, 'base64url').toString('utf8') };
}

/** RPC errors as Connect errors; a 500's details go to the log, not the client. */
const errorsTo = (log: ErrorLog) => <A extends unknown[], R>(fn: (...a: A) => Promise<R>) => async (...a: A): Promise<R> => {
  try {
    return await fn(...a);
  } catch (err) {
    throw rpcError(err, (a[1] as HandlerContext).signal, log);
  }
};

export function filesystemService(deps: E2bDeps, resolve: ResolveTarget): Partial<ServiceImpl<typeof Filesystem>> {
  const { toolbox } = deps.core;
  const withErrors = errorsTo(deps.log);
  const stat = (target: SandboxTarget, path: string, signal?: AbortSignal, home?: string): Promise<FileInfo> =>
    toolbox.statFile(target.principal, target.sandboxId, homeRelative(path, home), { signal });
  /** The account the request acts as (its Basic user, else E2B's `user`). */
  const accountOf = (target: SandboxTarget, ctx: HandlerContext) => e2bAccount(deps.core, target, ctx.requestHeader);
  const homeOf = async (target: SandboxTarget, ctx: HandlerContext) => (await accountOf(target, ctx)).home;

  /**
   * EntryInfo with each file's metadata, as envd's Stat, ListDir and Move answer. Best effort,
   * as envd's: a file whose metadata cannot be read is described without it.
   */
  async function entriesWithMetadata(target: SandboxTarget, infos: FileInfo[], signal?: AbortSignal): Promise<EntryInit[]> {
    const entries = infos.map(entryInfo);
    if (infos.length === 0) return entries;
    const read = await toolbox.readFileMetadata(target.principal, target.sandboxId, { paths: infos.map((f) => f.path) }, { signal }).catch((err: unknown) => {
      if (signal?.aborted) throw err;
      return undefined;
    });
    read?.forEach((found, index) => {
      const metadata = e2bMetadata(found.metadata);
      if (metadata) entries[index].metadata = metadata;
    });
    return entries;
  }
  const entryWithMetadata = async (target: SandboxTarget, info: FileInfo, signal?: AbortSignal): Promise<EntryInit> =>
    (await entriesWithMetadata(target, [info], signal))[0];

  async function filesystemEvent(target: SandboxTarget, root: string, e: { type: string; path: string }, includeEntry: boolean): Promise<FilesystemEventInit | undefined> {
    const type = EVENT_TYPE[e.type];
    if (type === undefined) return undefined;
    const event: FilesystemEventInit = { name: posix.relative(root, e.path) || posix.basename(e.path), type };
    if (includeEntry && type !== EventType.REMOVE && type !== EventType.RENAME) {
      const info = await stat(target, e.path).catch(() => undefined);
      if (info) event.entry = entryInfo(info);
    }
    return event;
  }

  return {
    stat: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      return { entry: await entryWithMetadata(target, await stat(target, req.path, ctx.signal, await homeOf(target, ctx)), ctx.signal) };
    }),

    makeDir: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const account = await accountOf(target, ctx);
      let result;
      try {
        result = await toolbox.makeDirectory(target.principal, target.sandboxId, { path: homeRelative(req.path, account.home), owner: ownerOf(account) }, { signal: ctx.signal });
      } catch (err) {
        // Exists as something else: envd's already_exists too (makeDir → false).
        if (err instanceof NestboxError && err.code === 'conflict') throw new ConnectError(err.message, Code.AlreadyExists);
        throw err;
      }
      // It was already a directory: the SDK's makeDir() returns false on already_exists.
      if (!result.created) throw new ConnectError(`directory ${req.path} already exists`, Code.AlreadyExists);
      // envd creates it as the request's user.
      await giveTo(toolbox, target.principal, target.sandboxId, result.info.path, account);
      return { entry: entryInfo(await stat(target, result.info.path, ctx.signal)) };
    }),

    move: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      // rename(2) semantics, like envd: an existing destination is replaced.
      const home = await homeOf(target, ctx);
      const info = await toolbox.moveFile(target.principal, target.sandboxId, { from: homeRelative(req.source, home), to: homeRelative(req.destination, home), overwrite: true }, { signal: ctx.signal });
      // A moved file keeps its metadata (attributes stay with the inode).
      return { entry: await entryWithMetadata(target, info, ctx.signal) };
    }),

    listDir: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      // depth 0 (the proto3 default when absent) means 1, as upstream.
      const depth = Math.min(Math.max(req.depth || 1, 1), 32);
      const list = await toolbox.listFiles(target.principal, target.sandboxId, { path: homeRelative(req.path || '.', await homeOf(target, ctx)), depth }, { signal: ctx.signal });
      return { entries: await entriesWithMetadata(target, list.entries, ctx.signal) };
    }),

    remove: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      try {
        await toolbox.deleteFile(target.principal, target.sandboxId, { path: homeRelative(req.path, await homeOf(target, ctx)), recursive: true }, { signal: ctx.signal });
      } catch (err) {
        // envd removes like `rm -rf`: a path that is already gone is a success. (The native
        // API keeps its 404; only a missing file is forgiven here, never a missing sandbox.)
        if (!(err instanceof NestboxError && err.code === 'not_found' && !isSandboxUnavailable(err))) throw err;
      }
      return {};
    }),

    watchDir: async function* (req, ctx) {
      try {
        const target = await resolve(ctx);
        // A server stream for as long as it runs: counted against the stream caps (429 beyond them).
        deps.streams.acquireUntilAborted({ keyId: target.principal.keyId, sandboxId: target.sandboxId }, ctx.signal);
        const root = (await stat(target, req.path, ctx.signal, await homeOf(target, ctx))).path;
        const stream = await toolbox.watchFiles(target.principal, target.sandboxId, { path: root, recursive: req.recursive }, { signal: ctx.signal });
        for await (const e of stream.events()) {
          // The first message must be start (e2b.md (h) 3); the guest's ready means every watch is in place.
          if (e.type === 'ready') yield { event: { case: 'start', value: {} } };
          else if (e.type === 'keepalive') yield { event: { case: 'keepalive', value: {} } };
          else {
            const event = await filesystemEvent(target, root, e, req.includeEntry);
            if (event) yield { event: { case: 'filesystem', value: event } };
          }
        }
      } catch (err) {
        throw rpcError(err, ctx.signal, deps.log);
      }
    },

    createWatcher: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const root = (await stat(target, req.path, ctx.signal, await homeOf(target, ctx))).path;
      const created = await toolbox.createWatcher(target.principal, target.sandboxId, { path: root, recursive: req.recursive }, { signal: ctx.signal });
      return { watcherId: encodeWatcherId(created.watcherId, root, req.includeEntry) };
    }),

    getWatcherEvents: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const w = decodeWatcherId(req.watcherId);
      const drained = await toolbox.watcherEvents(target.principal, target.sandboxId, w.guestId, { signal: ctx.signal });
      const events: FilesystemEventInit[] = [];
      for (const e of drained.events) {
        const event = await filesystemEvent(target, w.root, e, w.includeEntry);
        if (event) events.push(event);
      }
      return { events };
    }),

    removeWatcher: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const w = decodeWatcherId(req.watcherId);
      await toolbox.deleteWatcher(target.principal, target.sandboxId, w.guestId, { signal: ctx.signal });
      return {};
    }),
  };
}
