// Guest-agent archive routes (image builds: COPY and COPY --from). Shared by the host side and
// the guest-agent bundle, so it imports nothing but zod. Conventions as in files.ts: errors are
// `{ error: { code, message } }` with core's codes; paths are the sandbox's (the agent runs in
// its root), a relative one resolves against the sandbox user's home.
//
// Routes:
//
//   POST /files/archive/extract?path=&owner=&mode=   body: a tar stream (plain or gzip,
//        detected from its first bytes; any Content-Type), streamed, never held whole
//        → 200 ArchiveExtractResponse.
//        `path`: the directory the entries are relative to (made, with its parents, when
//        missing; a symlink at `path` itself is followed, as a COPY destination is).
//        `owner`: `user[:group]`, names from the sandbox's /etc/passwd and /etc/group or numeric
//        ids, for every entry and every directory made for one or for `path` (a user alone: its primary
//        group); default the archive's own ids. `mode`: octal, e.g. 0755, for every file and
//        directory (not symlinks); default the archive's.
//        Rules (Docker COPY semantics, host/guest-agent/files-archive.ts):
//          - directories merge with what is there; a file, symlink or hard link replaces what
//            is at its name (a new inode renamed into place: never written through a link);
//            a directory is never replaced by a non-directory (409 conflict);
//          - an absolute name or a `..` component refuses the archive (400 naming `body`);
//            nothing is written through a symlink on the way to an entry, whether the sandbox
//            had it or the archive made it (400); a hard link may only name a file written
//            earlier by the same archive (400); symlink targets are kept as written;
//          - device nodes, fifos and non-file entry kinds are dropped;
//          - a body that is not tar (or gzip of tar) is a 400 naming `body`; a full disk 507
//            insufficient_storage; an unknown owner name a 400 naming `owner`.
//        Entries before a refused one stay written (the caller discards the build sandbox).
//   GET  /files/archive?path=   → 200 `Content-Type: application/x-tar`, streamed with
//        backpressure: `path` (a file, or a directory and everything under it), symlinks as
//        links (never followed), owners, modes and mtimes as on disk, entry names relative to
//        the sandbox root without a leading `/` (`srv/app/x` for /srv/app/x; `/` gives its
//        children). A missing path is a 404 not_found before the stream starts; a failure
//        after it started cuts the connection. A client that goes away stops the walk.
import { z } from 'zod';

export const ARCHIVE_EXTRACT_ROUTE = '/files/archive/extract';
export const ARCHIVE_ROUTE = '/files/archive';

export const ArchiveExtractResponse = z.object({
  /** Entries written (files, directories, symlinks, hard links). */
  entries: z.number().int().nonnegative(),
  /** Bytes of file content written. */
  bytes: z.number().int().nonnegative(),
});
export type ArchiveExtractResponse = z.infer<typeof ArchiveExtractResponse>;
