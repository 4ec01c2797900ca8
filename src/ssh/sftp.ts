// The gateway's SFTP subsystem (what `sftp` and OpenSSH 9's `scp` speak) over the toolbox's
// file operations, so paths resolve inside the sandbox exactly as the file API's do. A file
// opened for writing is one streamed upload (writes must come in order, as OpenSSH's clients
// send them; the file appears, atomically, when the handle is closed); one opened for reading
// is a streamed download, reopened at the asked offset when a read jumps.
import { posix } from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import ssh2 from 'ssh2';
import type { Attributes, FileEntry, SFTPWrapper } from 'ssh2';
import type { Logger } from '../../core/logger.js';
import { toNestboxError } from '../../core/errors.js';
import type { FileInfo } from '../../core/guest.js';
import type { Toolbox } from '../../core/services/toolbox.js';
import type { Principal } from '../../core/types.js';

const { OPEN_MODE, STATUS_CODE } = ssh2.utils.sftp;
/** Where relative paths start: the home of root, the account the gateway's sessions use. */
const HOME = '/root';
/** Open handles per SFTP session. */
const MAX_HANDLES = 64;
const MAX_READ = 256 * 1024;

const TYPE_BITS = { file: 0o100000, dir: 0o040000, symlink: 0o120000, other: 0 } as const;

function attrsOf(info: FileInfo, follow: boolean): Attributes {
  const type = follow && info.type === 'symlink' && info.symlinkResolved ? info.symlinkResolved.type : info.type;
  const perm = follow && info.type === 'symlink' && info.symlinkResolved ? info.symlinkResolved.mode : info.mode;
  const mtime = Math.floor(new Date(info.mtime).getTime() / 1000);
  return { mode: TYPE_BITS[type] | (perm & 0o7777), uid: info.uid, gid: info.gid, size: info.size, atime: mtime, mtime };
}

function longname(info: FileInfo): string {
  const a = attrsOf(info, false);
  const kind = info.type === 'dir' ? 'd' : info.type === 'symlink' ? 'l' : '-';
  const bits = 'rwxrwxrwx'.split('').map((c, i) => ((a.mode & (0o400 >> i)) !== 0 ? c : '-')).join('');
  const date = new Date(info.mtime).toISOString().slice(0, 16).replace('T', ' ');
  return `${kind}${bits} 1 ${info.owner} ${info.group} ${info.size} ${date} ${info.name}`;
}

/** A download stream read at a position; `read` waits for the bytes or the end. */
class Reader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private ended = false;
  private failure: Error | undefined;
  private wake: (() => void) | undefined;
  constructor(
    private readonly body: Readable,
    public position: number,
  ) {
    body.on('data', (c: Buffer) => {
      this.chunks.push(c);
      this.buffered += c.length;
      if (this.buffered > 4 * MAX_READ) body.pause();
      this.wake?.();
    });
    body.once('end', () => {
      this.ended = true;
      this.wake?.();
    });
    body.once('error', (err) => {
      this.failure = err;
      this.wake?.();
    });
  }
  async read(length: number): Promise<Buffer | undefined> {
    while (this.buffered < length && !this.ended && !this.failure) {
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
    if (this.failure && this.buffered === 0) throw this.failure;
    if (this.buffered === 0) return undefined;
    const all = Buffer.concat(this.chunks);
    const out = all.subarray(0, length);
    const rest = all.subarray(length);
    this.chunks = rest.length ? [rest] : [];
    this.buffered = rest.length;
    this.position += out.length;
    if (this.buffered <= 4 * MAX_READ) this.body.resume();
    return out;
  }
  close(): void {
    this.body.destroy();
  }
}

type Handle =
  | { kind: 'read'; path: string; reader?: Reader; queue: Promise<void> }
  | { kind: 'write'; path: string; body: PassThrough; position: number; done: Promise<unknown>; failed?: Error }
  | { kind: 'dir'; path: string; entries?: FileInfo[] };

export function serveSftp(toolbox: Toolbox, principal: Principal, sandboxId: string, sftp: SFTPWrapper, log: Logger): void {
  const handles = new Map<string, Handle>();
  let counter = 0;
  const resolve = (p: string) => posix.resolve(HOME, p || '.');
  const fail = (reqid: number, err: unknown) => {
    const e = toNestboxError(err);
    const code = e.code === 'not_found' ? STATUS_CODE.NO_SUCH_FILE : e.code === 'forbidden' ? STATUS_CODE.PERMISSION_DENIED : STATUS_CODE.FAILURE;
    sftp.status(reqid, code, e.message);
  };
  const newHandle = (h: Handle): Buffer | undefined => {
    if (handles.size >= MAX_HANDLES) return undefined;
    const id = Buffer.alloc(4);
    id.writeUInt32BE(++counter);
    handles.set(id.toString('hex'), h);
    return id;
  };
  const handleOf = (id: Buffer) => handles.get(id.toString('hex'));
  const stat = (path: string) => toolbox.statFile(principal, sandboxId, path);

  sftp.on('REALPATH', (reqid, path) => {
    const abs = resolve(path);
    sftp.name(reqid, [{ filename: abs, longname: abs, attrs: {} as Attributes }]);
  });
  const onStat = (follow: boolean) => (reqid: number, path: string) => {
    stat(resolve(path)).then(
      (info) => sftp.attrs(reqid, attrsOf(info, follow)),
      (err: unknown) => fail(reqid, err),
    );
  };
  sftp.on('STAT', onStat(true));
  sftp.on('LSTAT', onStat(false));

  sftp.on('OPEN', (reqid, filename, flags, attrs) => {
    const path = resolve(filename);
    if (flags & OPEN_MODE.WRITE) {
      if (flags & OPEN_MODE.APPEND) return sftp.status(reqid, STATUS_CODE.OP_UNSUPPORTED, 'appending is not supported; write the whole file');
      const body = new PassThrough({ highWaterMark: 1024 * 1024 });
      const mode = typeof attrs?.mode === 'number' ? (attrs.mode & 0o7777).toString(8).padStart(3, '0') : undefined;
      const h: Handle = { kind: 'write', path, body, position: 0, done: Promise.resolve() };
      h.done = toolbox.writeFile(principal, sandboxId, path, body, mode ? { mode } : {}).catch((err: unknown) => {
        h.failed = err instanceof Error ? err : new Error(String(err));
      });
      const id = newHandle(h);
      if (!id) {
        body.destroy();
        return sftp.status(reqid, STATUS_CODE.FAILURE, `at most ${MAX_HANDLES} open files`);
      }
      return sftp.handle(reqid, id);
    }
    // Reading: the file must exist and be one (a directory is opened with OPENDIR).
    stat(path).then(
      (info) => {
        if (info.type === 'dir') return sftp.status(reqid, STATUS_CODE.FAILURE, `${path} is a directory`);
        const id = newHandle({ kind: 'read', path, queue: Promise.resolve() });
        if (!id) return sftp.status(reqid, STATUS_CODE.FAILURE, `at most ${MAX_HANDLES} open files`);
        sftp.handle(reqid, id);
      },
      (err: unknown) => fail(reqid, err),
    );
  });

  sftp.on('WRITE', (reqid, id, offset, data) => {
    const h = handleOf(id);
    if (!h || h.kind !== 'write') return sftp.status(reqid, STATUS_CODE.FAILURE, 'not a file opened for writing');
    if (h.failed) return fail(reqid, h.failed);
    if (offset !== h.position) return sftp.status(reqid, STATUS_CODE.OP_UNSUPPORTED, `writes must be sequential (expected offset ${h.position}, got ${offset})`);
    h.position += data.length;
    if (h.body.write(data)) sftp.status(reqid, STATUS_CODE.OK);
    else h.body.once('drain', () => sftp.status(reqid, STATUS_CODE.OK));
  });

  sftp.on('READ', (reqid, id, offset, length) => {
    const h = handleOf(id);
    if (!h || h.kind !== 'read') return sftp.status(reqid, STATUS_CODE.FAILURE, 'not a file opened for reading');
    // Reads are answered in the order they came, from one stream while they follow each other.
    h.queue = h.queue.then(async () => {
      try {
        if (!h.reader || h.reader.position !== offset) {
          h.reader?.close();
          const stream = await toolbox.readFile(principal, sandboxId, h.path, offset > 0 ? { range: `bytes=${offset}-` } : {});
          h.reader = new Reader(stream.body, offset);
        }
        const data = await h.reader.read(Math.min(length, MAX_READ));
        if (!data) sftp.status(reqid, STATUS_CODE.EOF);
        else sftp.data(reqid, data);
      } catch (err) {
        // A range past the end is the end of the file.
        const e = toNestboxError(err);
        if (e.code === 'range_not_satisfiable' || /range/i.test(e.message)) sftp.status(reqid, STATUS_CODE.EOF);
        else fail(reqid, err);
      }
    });
  });

  sftp.on('FSTAT', (reqid, id) => {
    const h = handleOf(id);
    if (!h) return sftp.status(reqid, STATUS_CODE.FAILURE, 'unknown handle');
    if (h.kind === 'write') return sftp.attrs(reqid, { mode: TYPE_BITS.file | 0o644, uid: 0, gid: 0, size: h.position, atime: 0, mtime: Math.floor(Date.now() / 1000) });
    stat(h.path).then(
      (info) => sftp.attrs(reqid, attrsOf(info, true)),
      (err: unknown) => fail(reqid, err),
    );
  });

  const setStat = (reqid: number, path: string, attrs: Attributes) => {
    // Permissions are applied; times and owners are accepted and left as they are.
    if (typeof attrs.mode !== 'number') return sftp.status(reqid, STATUS_CODE.OK);
    toolbox.changeMode(principal, sandboxId, { path, mode: (attrs.mode & 0o7777).toString(8).padStart(3, '0') }).then(
      () => sftp.status(reqid, STATUS_CODE.OK),
      (err: unknown) => fail(reqid, err),
    );
  };
  sftp.on('SETSTAT', (reqid, path, attrs) => setStat(reqid, resolve(path), attrs));
  sftp.on('FSETSTAT', (reqid, id, attrs) => {
    const h = handleOf(id);
    if (!h) return sftp.status(reqid, STATUS_CODE.FAILURE, 'unknown handle');
    // A file being written does not exist yet: its mode was given at open.
    if (h.kind === 'write') return sftp.status(reqid, STATUS_CODE.OK);
    setStat(reqid, h.path, attrs);
  });

  sftp.on('CLOSE', (reqid, id) => {
    const h = handleOf(id);
    if (!h) return sftp.status(reqid, STATUS_CODE.FAILURE, 'unknown handle');
    handles.delete(id.toString('hex'));
    if (h.kind === 'write') {
      h.body.end();
      void h.done.then(() => (h.failed ? fail(reqid, h.failed) : sftp.status(reqid, STATUS_CODE.OK)));
      return;
    }
    if (h.kind === 'read') void h.queue.then(() => h.reader?.close());
    sftp.status(reqid, STATUS_CODE.OK);
  });

  sftp.on('OPENDIR', (reqid, path) => {
    const abs = resolve(path);
    stat(abs).then(
      (info) => {
        if (info.type !== 'dir' && !(info.type === 'symlink' && info.symlinkResolved?.type === 'dir')) return sftp.status(reqid, STATUS_CODE.FAILURE, `${abs} is not a directory`);
        const id = newHandle({ kind: 'dir', path: abs });
        if (!id) return sftp.status(reqid, STATUS_CODE.FAILURE, `at most ${MAX_HANDLES} open handles`);
        sftp.handle(reqid, id);
      },
      (err: unknown) => fail(reqid, err),
    );
  });
  sftp.on('READDIR', (reqid, id) => {
    const h = handleOf(id);
    if (!h || h.kind !== 'dir') return sftp.status(reqid, STATUS_CODE.FAILURE, 'not a directory handle');
    if (h.entries) return sftp.status(reqid, STATUS_CODE.EOF);
    toolbox.listFiles(principal, sandboxId, { path: h.path, depth: 1 }).then(
      (list) => {
        h.entries = list.entries;
        const names: FileEntry[] = list.entries.map((e) => ({ filename: e.name, longname: longname(e), attrs: attrsOf(e, false) }));
        if (names.length === 0) return sftp.status(reqid, STATUS_CODE.EOF);
        sftp.name(reqid, names);
      },
      (err: unknown) => fail(reqid, err),
    );
  });

  const done = (reqid: number, p: Promise<unknown>) =>
    p.then(
      () => sftp.status(reqid, STATUS_CODE.OK),
      (err: unknown) => fail(reqid, err),
    );
  sftp.on('MKDIR', (reqid, path, attrs) => {
    const mode = typeof attrs?.mode === 'number' ? (attrs.mode & 0o7777).toString(8).padStart(3, '0') : undefined;
    done(reqid, toolbox.makeDirectory(principal, sandboxId, { path: resolve(path), ...(mode ? { mode } : {}) }));
  });
  sftp.on('REMOVE', (reqid, path) => done(reqid, toolbox.deleteFile(principal, sandboxId, { path: resolve(path) })));
  sftp.on('RMDIR', (reqid, path) => done(reqid, toolbox.deleteFile(principal, sandboxId, { path: resolve(path), recursive: false })));
  sftp.on('RENAME', (reqid, from, to) => done(reqid, toolbox.moveFile(principal, sandboxId, { from: resolve(from), to: resolve(to) })));
  sftp.on('READLINK', (reqid, path) => {
    stat(resolve(path)).then(
      (info) => (info.symlinkTarget ? sftp.name(reqid, [{ filename: info.symlinkTarget, longname: info.symlinkTarget, attrs: {} as Attributes }]) : sftp.status(reqid, STATUS_CODE.FAILURE, 'not a symbolic link')),
      (err: unknown) => fail(reqid, err),
    );
  });
  sftp.on('SYMLINK', (reqid) => sftp.status(reqid, STATUS_CODE.OP_UNSUPPORTED, 'symbolic links cannot be made over SFTP here'));

  // The client's EOF ends the session: our side closes too (the client waits for it), after an
  // exit-status 0, which `scp` requires (ssh2's SFTP object has no exit(); its channel does).
  sftp.once('end', () => {
    const raw = sftp as unknown as { outgoing?: { id: number; state: string }; _protocol?: { exitStatus(id: number, status: number): void } };
    if (raw.outgoing?.state === 'open') raw._protocol?.exitStatus(raw.outgoing.id, 0);
    sftp.end();
  });
  sftp.once('close', () => {
    for (const h of handles.values()) {
      if (h.kind === 'write') h.body.destroy(new Error('the SFTP session ended before the file was closed'));
      if (h.kind === 'read') h.reader?.close();
    }
    handles.clear();
  });
  sftp.on('error', (err: Error) => log.debug({ sandboxId, err: err.message }, 'SFTP session error'));
}
