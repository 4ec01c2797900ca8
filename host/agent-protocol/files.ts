// Guest-agent file routes beyond content/stat/list (those are in types.ts). Like types.ts this
// file is shared by the host side and the guest-agent bundle, so it imports nothing but zod.
//
// Conventions (all routes):
// - JSON in and out unless noted; errors are `{ error: { code, message } }` with core's codes:
//   validation_failed 400 (the message starts with the field name), forbidden 403,
//   not_found 404, conflict 409, payload_too_large 413, insufficient_storage 507, internal 500.
// - Paths are resolved inside the sandbox; a relative path resolves against the sandbox user's
//   home. A NUL byte in a path is a 400 naming the field.
// - FileInfo is the one in types.ts (now with owner, group, uid, gid).
//
// Routes:
//
//   GET    /files/list?path=&depth=N        → { entries: FileInfo[] }. depth 1 (default) = the
//          direct children, 2 adds grandchildren, …; at most 32. Sorted by path (code units).
//          Symlinked directories below `path` are listed but never descended into; directories
//          that cannot be read are listed without children. More than 200,000 entries → 413.
//   POST   /files/mkdir    MkdirRequest     → 201 FileInfo (mkdir -p), 200 FileInfo if it was
//          already a directory, 409 conflict if it exists as anything else.
//   POST   /files/move     MoveRequest      → 200 FileInfo of `to`. 409 if `to` exists and
//          !overwrite; parents of `to` created. A directory can only replace an empty one.
//   DELETE /files?path=&recursive=true|false → 204. 404 missing; 400 naming `recursive` for a
//          non-empty directory without recursive=true; 400 naming `path` for "/". A symlink is
//          removed itself, never its target.
//   POST   /files/chmod    ChmodRequest     → 200 FileInfo (follows a symlink, like chmod(1)).
//   POST   /files/chown    ChownRequest     → 200 FileInfo (follows a symlink, like chown(1)).
//          owner/group: a name or a numeric id; unknown names are a 400 naming owner/group.
//   GET    /files/find?path=&pattern=&maxResults= → FindResponse. The glob matches the entry's
//          name, or, when it contains "/", its path relative to `path`. Globs: `*` `?` `[a-z]`
//          `[!a-z]` `{a,b}` and `**` (any number of directories). Directories that cannot be
//          read are counted in `unreadableDirs`. maxResults default 1000, at most 100000.
//   GET    /files/search?path=&query=&regex=&caseSensitive=&glob=&maxResults= → SearchResponse.
//          One match per matching line (the first occurrence gives the column). `path` may be a
//          file or a directory; binary files (a NUL in the first 8 KiB) are skipped and
//          counted; symlinks and special files are not read. Lines longer than 1 MiB are
//          searched in their first MiB only. regex default false, caseSensitive default true.
//   POST   /files/replace  ReplaceRequest   → ReplaceResponse, one result per path in order.
//          Each file is rewritten atomically (temp file + rename, mode and owner kept); a file
//          with no occurrence is left untouched. Files must be UTF-8 text of at most
//          maxReplaceFileBytes (default 64 MiB), else a per-file validation_failed /
//          payload_too_large error. With regex, `replace` may use $1, $<name>, $&.
//   POST   /files/upload   multipart/form-data (streamed) → UploadResponse; see UPLOAD below.
//   POST   /files/download DownloadRequest  → multipart/form-data (streamed); see DOWNLOAD.
//   POST   /files/metadata/read FileMetadataReadRequest → FileMetadataReadResponse; see METADATA.
//   POST   /files/metadata FileMetadataWriteRequest → 200 FileMetadataResponse; see METADATA.
//   GET    /files/watch?path=&recursive=   → WebSocket or SSE stream of WatchEvent; see WATCH.
//   POST   /files/watchers CreateWatcherRequest → 201 { watcherId } (409 beyond 1000 watchers)
//   GET    /files/watchers/{watcherId}/events → WatcherEventsResponse (drains the buffer)
//   DELETE /files/watchers/{watcherId}      → 204; 404 for an unknown or expired watcher.
//
// UPLOAD (multipart/form-data, any boundary, chunked or not):
//   Daytona form: for each file i a text field `files[i].path` (the destination) followed by
//   the file part `files[i].file`; the part's filename and Content-Type are ignored.
//   Simple form: a text field `path` followed by a file part named `file`.
//   `?path=` in the query, when given, is the destination of every `file` part without a
//   preceding `path` field (a single-file write). `?base=<absolute dir>` makes relative
//   destinations resolve against it instead of the sandbox user's home (a compat layer's user).
//   `?owner=<uid>:<gid>` (also on PUT /files/content, and `owner` in MkdirRequest) gives each
//   written file and every directory made for it to that account (host/guest-agent/files-ownership.ts). A part's filename is never a destination
//   (E2B's full-path filenames are turned into `path` fields by compat/e2b).
//   Each file streams to a temp file beside its destination and is renamed into place;
//   parents are created; a replaced file keeps its mode (new files 0644). Answer: 200
//   UploadResponse when every file succeeded, 207 with the same shape when some failed.
//   A body above the server's maxUploadBytes (default: no limit) is a 413 payload_too_large;
//   files completed before the limit was hit stay written, the file in flight is discarded.
//
// DOWNLOAD: 200 `Content-Type: multipart/form-data; boundary=<b>`, one part per requested
//   path, in request order, each file streamed after the previous one:
//     success: Content-Disposition: form-data; name="file"; filename="<requested path>"
//              Content-Type: application/octet-stream
//              Content-Length: <size>
//     failure: Content-Disposition: form-data; name="error"; filename="<requested path>"
//              Content-Type: application/json
//              body {"error":{"code":"not_found","message":"…","status":404}}
//              (the Content-Length is always sent: compat/daytona rewrites these bodies to
//              Daytona's daemon shape by it, passing file parts through unparsed)
//   The filename is the requested path byte-for-byte when it is printable ASCII without `"`
//   or `\`; otherwise `filename="<ASCII fallback, others as _>"; filename*=utf-8''<RFC 5987
//   percent-encoded path>` (busboy and browsers prefer filename*). A file that fails after its
//   part started (vanished, I/O error) ends the response abruptly: the connection is cut, so a
//   client never mistakes a short file for a whole one.
//
// WATCH: `GET /files/watch?path=&recursive=true|false`
//   - WebSocket upgrade: one JSON text frame per WatchEvent. The server closes with 1000 when
//     the watched directory disappears, 1011 on an internal failure.
//   - Server-Sent Events for a plain GET with `Accept: text/event-stream`: each event is
//     `data: <WatchEvent JSON>\n\n` (no `event:` field, so EventSource's onmessage sees all).
//     A plain GET without that Accept header is a 400 naming `accept`.
//   - Errors before the stream starts are ordinary JSON errors: 404 missing path, 400 not a
//     directory (the WebSocket handshake is answered with that HTTP response).
//   - First message `{type:"ready"}` once every watch is in place (act after it, not before);
//     `{type:"keepalive"}` every 15 s; then change events. Bursts are coalesced per path over
//     ~50 ms (many writes → one write), but a create or remove is never dropped: a file created
//     and deleted within one window is reported as create then remove.
//   - Classification: create (new path, including a file moved in and the target of a rename
//     within the watch), write (content or mtime changed), remove, rename (the OLD path of an
//     entry that reappeared elsewhere in the watch; the new path gets a create), chmod (mode
//     or owner changed). Moving an entry out of the watched tree is reported as remove (the
//     kernel event carries no destination). Entries found in a newly created directory are
//     reported as create. With recursive=false, only direct children are watched. A recursive
//     watch covers at most 65,536 directories (inotify watches are a shared, limited resource).
//     Symlinked directories are reported as entries but not watched inside.
//   - The agent's own writes (PUT /files/content, uploads, replace) land by renaming a temp
//     file into place but are reported as the in-place write they stand for, as E2B's envd
//     reports one: a new file as create, chmod, then write (when it has content), an
//     overwritten file as write (host/guest-agent/files-write-marks.ts). The same holds for
//     such a file found in a newly created directory.
//
// METADATA: a file's metadata is its `user.*` extended attributes, names reported and given
//   without `user.` (symlinks followed). Read: one entry per requested path, in order; a path
//   that is missing, has none, or whose filesystem keeps no user attributes has `{}`; names or
//   values that are not UTF-8 are left out. Write: sets `user.<name>` for each entry of `set`;
//   with `replacePrefix`, the file's other attributes under `user.<replacePrefix>` are removed,
//   so that group is replaced as a whole (E2B keeps its under `e2b.`). Names at most 250 bytes,
//   values at most 4096 (400 naming `metadata`); 404 missing path; 507 when the file has no
//   room left for them. On a filesystem without user attributes nothing is kept and the answer
//   says so (`metadata: {}`). The agent
//   reaches xattrs through nestbox-pty's --xattr mode; without that helper both answer 501.
//
// Polling watchers buffer the same events (not ready/keepalive) up to 10,000, counting what
// overflowed in `dropped` (reset on each drain). A drain first reads what the kernel has queued
// and classifies the batch being coalesced at once, so a change whose call has returned (an
// upload, a command that wrote a file) is among the events it answers. A watcher not polled for 10 minutes is
// removed; its watch ends when its directory disappears (events still drain once).
import { z } from 'zod';
import { FileInfo } from './types.js';

/** Octal permission text such as "755" or "0644". */
const OctalMode = z.string().regex(/^[0-7]{3,4}$/, 'expected an octal permission string such as "755" or "0644"');

// owner: `<uid>:<gid>`; the directories made are given to it (as ?owner= on uploads and writes).
export const MkdirRequest = z.object({ path: z.string(), mode: OctalMode.optional(), owner: z.string().optional() }).strict();
export type MkdirRequest = z.infer<typeof MkdirRequest>;

export const MoveRequest = z.object({ from: z.string(), to: z.string(), overwrite: z.boolean().optional() }).strict();
export type MoveRequest = z.infer<typeof MoveRequest>;

export const ChmodRequest = z.object({ path: z.string(), mode: OctalMode }).strict();
export type ChmodRequest = z.infer<typeof ChmodRequest>;

/** A user or group given by name or by numeric id (as a number or decimal text). */
const Principal = z.union([z.string().min(1), z.number().int().min(0)]);
export const ChownRequest = z
  .object({ path: z.string(), owner: Principal.optional(), group: Principal.optional() })
  .strict();
export type ChownRequest = z.infer<typeof ChownRequest>;

export const FindResponse = z.object({
  paths: z.array(z.string()), // absolute
  truncated: z.boolean(),
  unreadableDirs: z.number().int(),
});
export type FindResponse = z.infer<typeof FindResponse>;

export const SearchMatch = z.object({
  path: z.string(), // absolute
  line: z.number().int(), // 1-based
  column: z.number().int(), // 1-based, in UTF-16 code units of the decoded line
  text: z.string(), // the whole line, capped at 1000 characters
});
export type SearchMatch = z.infer<typeof SearchMatch>;

export const SearchResponse = z.object({
  matches: z.array(SearchMatch),
  truncated: z.boolean(),
  unreadableDirs: z.number().int(),
  unreadableFiles: z.number().int(),
  binaryFilesSkipped: z.number().int(),
});
export type SearchResponse = z.infer<typeof SearchResponse>;

export const ReplaceRequest = z
  .object({
    paths: z.array(z.string()).min(1).max(10_000),
    find: z.string().min(1),
    replace: z.string(),
    regex: z.boolean().optional(),
  })
  .strict();
export type ReplaceRequest = z.infer<typeof ReplaceRequest>;

export const FileError = z.object({ code: z.string(), message: z.string() });
export type FileError = z.infer<typeof FileError>;

export const ReplaceResult = z.object({
  path: z.string(), // as resolved (absolute)
  replacements: z.number().int(),
  error: FileError.optional(),
});
export const ReplaceResponse = z.object({ results: z.array(ReplaceResult) });
export type ReplaceResponse = z.infer<typeof ReplaceResponse>;

export const UploadResult = z.union([
  z.object({ path: z.string(), size: z.number().int(), ok: z.literal(true) }),
  z.object({ path: z.string(), ok: z.literal(false), error: FileError }),
]);
export type UploadResult = z.infer<typeof UploadResult>;
export const UploadResponse = z.object({ results: z.array(UploadResult) });
export type UploadResponse = z.infer<typeof UploadResponse>;

export const DownloadRequest = z
  .object({
    paths: z.array(z.string()).min(1).max(10_000),
    // Absolute directory relative paths resolve against (as upload's ?base=); the parts are
    // still named by the paths as requested.
    base: z.string().startsWith('/', 'must be an absolute path').optional(),
  })
  .strict();
export type DownloadRequest = z.infer<typeof DownloadRequest>;

/** Body of a download `error` part. */
export const DownloadErrorPart = z.object({
  error: z.object({ code: z.string(), message: z.string(), status: z.number().int() }),
});
export type DownloadErrorPart = z.infer<typeof DownloadErrorPart>;

const Metadata = z.record(z.string(), z.string());

export const FileMetadataReadRequest = z.object({ paths: z.array(z.string()).min(1).max(200_000) }).strict();
export type FileMetadataReadRequest = z.infer<typeof FileMetadataReadRequest>;

export const FileMetadataResponse = z.object({ path: z.string(), metadata: Metadata });
export type FileMetadataResponse = z.infer<typeof FileMetadataResponse>;

export const FileMetadataReadResponse = z.object({ entries: z.array(FileMetadataResponse) });
export type FileMetadataReadResponse = z.infer<typeof FileMetadataReadResponse>;

export const FileMetadataWriteRequest = z
  .object({ path: z.string(), set: Metadata, replacePrefix: z.string().max(200).optional() })
  .strict();
export type FileMetadataWriteRequest = z.infer<typeof FileMetadataWriteRequest>;

export const WatchChangeType = z.enum(['create', 'write', 'remove', 'rename', 'chmod']);
export type WatchChangeType = z.infer<typeof WatchChangeType>;

export const WatchChangeEvent = z.object({
  type: WatchChangeType,
  path: z.string(), // absolute
  isDir: z.boolean(),
  at: z.string(), // ISO 8601, when the agent observed it
});
export type WatchChangeEvent = z.infer<typeof WatchChangeEvent>;

export const WatchEvent = z.union([
  WatchChangeEvent,
  z.object({ type: z.literal('ready') }),
  z.object({ type: z.literal('keepalive') }),
]);
export type WatchEvent = z.infer<typeof WatchEvent>;

export const CreateWatcherRequest = z.object({ path: z.string(), recursive: z.boolean().optional() }).strict();
export type CreateWatcherRequest = z.infer<typeof CreateWatcherRequest>;

export const CreateWatcherResponse = z.object({ watcherId: z.string() });
export type CreateWatcherResponse = z.infer<typeof CreateWatcherResponse>;

export const WatcherEventsResponse = z.object({
  events: z.array(WatchChangeEvent),
  dropped: z.number().int(), // events lost to the full buffer since the previous drain
  closed: z.boolean(), // the watched directory is gone; no more events will come
});
export type WatcherEventsResponse = z.infer<typeof WatcherEventsResponse>;

export { FileInfo };
