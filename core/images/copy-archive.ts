// The tar stream one COPY/ADD step unpacks into the build sandbox (the guest agent extracts it
// at `/`, core/guest.ts `extractArchive`). Docker's COPY semantics are decided here, on the
// host, from the input trees (build contexts, or a stage's root as `createArchive` gives it):
// a directory source copies its contents, a file goes to `dest` or into it, globs, .dockerignore
// patterns with `!` exceptions, ADD's local archive extraction.
//
// Inputs are untrusted tars from users. Nothing of them is written to disk by name: a first
// pass reads only headers into an in-memory tree (merging inputs in order, later wins; an entry
// under a non-directory replaces it, so no entry is ever placed through a symlink); the plan is
// made on that tree; a second pass re-reads the inputs and streams the chosen entries' content
// into a fresh tar whose headers are written here (owners 0:0, names normalised, devices and
// FIFOs dropped). The only files written are hard-link targets that must be materialised,
// under `tmpDir` with generated names. Both passes are bounded in entries and bytes.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, createReadStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import path from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { once } from 'node:events';
import { createGunzip } from 'node:zlib';
import picomatch from 'picomatch';
import { Header, Parser, Pax, type ReadEntry } from 'tar';
import { BuildSpecError } from './build-spec.js';
import { NestboxError } from '../errors.js';

export const COPY_MAX_BYTES_DEFAULT = 10 * 1024 ** 3;
export const COPY_MAX_ENTRIES_DEFAULT = 1_000_000;

export interface ComposeCopyArchiveInput {
  /**
   * Openers of the input tars (plain or gzip), names relative to their root, merged in order
   * (later wins). Each is opened at most three times (headers, archive sniffing for ADD,
   * content), and must give the same bytes each time.
   */
  inputs: Array<() => Promise<Readable>>;
  /** Expanded source words: paths or globs relative to the input root (a leading `/` is the root). */
  sources: string[];
  /** Absolute destination (the engine resolves it against WORKDIR); a trailing `/` makes it a directory. */
  dest: string;
  /** .dockerignore patterns (`!` exceptions): applied to the inputs (pass them for context copies only). */
  ignore?: string[];
  /**
   * `dest` is an existing directory in the stage (the engine stats it first): a single file
   * then goes inside it, as Docker does for `COPY a.txt /app` when /app is a directory.
   */
  destIsDirectory?: boolean;
  /** ADD: a source file that is a tar (plain, gzip, bzip2, xz, zstd) is unpacked at `dest`. */
  extractArchives?: boolean;
  /**
   * COPY --chmod: the permission bits of every copied file and directory. The directories made
   * above `dest` keep 0755, as Docker makes them (so `/etc/new/f` at 0640 leaves `/etc/new`
   * searchable).
   */
  chmod?: number;
  limits?: { maxBytes?: number; maxEntries?: number };
  /** A directory of the caller's where materialised hard-link targets are kept until cleanup. */
  tmpDir: string;
  signal?: AbortSignal;
  /** Named by the errors (default field `copy`): the step's field and line. */
  at?: { field?: string; line?: number };
}

export interface ComposedCopyArchive {
  /** The tar to extract at `/` (names relative to `/`, parents of `dest` included, 0755). */
  stream: Readable;
  /** Entries in `stream` (directories, files, links). */
  entries: number;
  /** Bytes of file content in `stream`. */
  bytes: number;
  /** Removes what was staged under tmpDir and stops any reader still open. Idempotent. */
  cleanup(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Paths and patterns

const MAGIC = /[*?[\\]/;

/**
 * The leading part of a pattern without glob characters: `/usr/lib/*.so` → `/usr/lib`,
 * `src/**` → `src`, `*.js` → `` (`/` for an absolute pattern), a plain path → itself (cleaned).
 * The engine archives only this part of a stage for `COPY --from`.
 */
export function globBase(pattern: string): string {
  const absolute = pattern.startsWith('/');
  const segments = path.posix.normalize(pattern).split('/').filter((s) => s !== '' && s !== '.');
  const base: string[] = [];
  for (const s of segments) {
    if (MAGIC.test(s)) break;
    base.push(s);
  }
  const joined = base.join('/');
  return absolute ? `/${joined}` : joined;
}

/**
 * A COPY/ADD destination made absolute against the stage's WORKDIR, as BuildKit does: a
 * relative dest joins the WORKDIR, and a dest ending with `/` or being / ending with `.` stays a
 * directory (`COPY a.txt .` puts a.txt inside WORKDIR). `..` stops at `/`.
 */
export function resolveCopyDest(dest: string, workdir = '/'): string {
  const joined = path.posix.join('/', dest.startsWith('/') ? '' : workdir, dest);
  const keepsDirectory = dest.endsWith('/') || dest === '.' || dest.endsWith('/.');
  return keepsDirectory && !joined.endsWith('/') ? `${joined}/` : joined;
}

/** `a/./b/../c` → `a/c`, relative to the root; undefined when it climbs out (`../x`). */
function cleanRelative(p: string): string | undefined {
  const out: string[] = [];
  for (const seg of p.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..') {
      if (out.length === 0) return undefined;
      out.pop();
    } else out.push(seg);
  }
  return out.join('/');
}

/** Parses a .dockerignore file into patterns (comments and blank lines dropped). */
export function parseDockerignore(text: string): string[] {
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
}

const PICOMATCH_OPTIONS = { dot: true, nobrace: true, noextglob: true, nonegate: true } as const;

interface IgnoreRule {
  exception: boolean;
  match: (p: string) => boolean;
}

function compileIgnore(patterns: string[]): IgnoreRule[] {
  const rules: IgnoreRule[] = [];
  for (const raw of patterns) {
    let p = raw.trim();
    const exception = p.startsWith('!');
    if (exception) p = p.slice(1).trim();
    // Docker cleans each pattern and makes it relative to the context root.
    const cleaned = path.posix.normalize(p).replace(/^\/+/, '').replace(/\/+$/, '');
    if (cleaned === '' || cleaned === '.') continue;
    rules.push({ exception, match: picomatch(cleaned, PICOMATCH_OPTIONS) });
  }
  return rules;
}

/** Docker's rule: the last pattern matching the path or one of its parent directories decides. */
function isIgnored(rules: IgnoreRule[], p: string): boolean {
  if (rules.length === 0) return false;
  const prefixes: string[] = [];
  const segs = p.split('/');
  for (let i = 1; i < segs.length; i++) prefixes.push(segs.slice(0, i).join('/'));
  let ignored = false;
  for (const rule of rules) {
    if (rule.match(p) || prefixes.some((d) => rule.match(d))) ignored = !rule.exception;
  }
  return ignored;
}

// ---------------------------------------------------------------------------------------------
// Trees

type Kind = 'file' | 'dir' | 'symlink' | 'hardlink';

/** Where an entry's bytes are: entry `seq` of input `input` (in archive `nested` of it for ADD). */
type Ref = string;
const refOf = (input: number, seq: number, nested?: number): Ref => (nested === undefined ? `${input}:${seq}` : `${input}:${seq}:${nested}`);

interface Node {
  kind: Kind;
  mode: number;
  size: number;
  mtime?: Date;
  /** Symlink target as written; for hard links, the target's name in the same archive. */
  linkpath?: string;
  /** The entry this node came from (absent for directories made implicitly). */
  ref?: Ref;
  /** Hard links: the entry holding the content. */
  target?: Ref;
  children?: Map<string, Node>;
}

const implicitDir = (mtime?: Date): Node => ({ kind: 'dir', mode: 0o755, size: 0, mtime, children: new Map() });

class Tree {
  readonly root: Node = implicitDir();
  size = 0;

  constructor(private readonly onGrow: (size: number) => void = () => {}) {}

  private static count(node: Node): number {
    let n = 1;
    for (const c of node.children?.values() ?? []) n += Tree.count(c);
    return n;
  }

  /** The node at a cleaned relative path, literally (no symlink is followed). */
  get(p: string): Node | undefined {
    if (p === '') return this.root;
    let node: Node | undefined = this.root;
    for (const seg of p.split('/')) {
      node = node?.children?.get(seg);
      if (!node) return undefined;
    }
    return node;
  }

  /**
   * Places a node, later wins: a directory over a directory keeps the children; anything else
   * replaces what was there (and its subtree); a non-directory on the way is replaced by a
   * directory, so nothing is ever placed beneath a symlink or a file.
   */
  set(p: string, node: Node): void {
    const segs = p.split('/');
    let dir = this.root;
    for (const seg of segs.slice(0, -1)) {
      let next = dir.children!.get(seg);
      if (!next || next.kind !== 'dir') {
        if (next) this.size -= Tree.count(next);
        next = implicitDir(node.mtime);
        dir.children!.set(seg, next);
        this.size++;
      }
      dir = next;
    }
    const name = segs[segs.length - 1]!;
    const existing = dir.children!.get(name);
    if (existing && existing.kind === 'dir' && node.kind === 'dir') {
      const { children: _c, ...attrs } = node;
      Object.assign(existing, attrs);
    } else {
      if (existing) this.size -= Tree.count(existing);
      // A directory gets its own (empty) children: nodes are shared between trees, child maps never.
      dir.children!.set(name, node.kind === 'dir' ? { ...node, children: new Map() } : node);
      this.size++;
    }
    this.onGrow(this.size);
  }

  /** Every node under `node` with its path relative to it. */
  *descendants(node: Node, prefix = ''): Generator<[string, Node]> {
    for (const [name, child] of node.children ?? []) {
      const rel = prefix === '' ? name : `${prefix}/${name}`;
      yield [rel, child];
      if (child.kind === 'dir') yield* this.descendants(child, rel);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Reading tars

/** Names as Docker's extraction reads them: no leading `/` or `./`; undefined for the root. */
function entryName(raw: string, fail: (m: string) => never): string | undefined {
  const cleaned = cleanRelative(raw);
  if (cleaned === undefined) fail(`archive entry ${JSON.stringify(raw)} is outside the archive's root`);
  return cleaned === '' ? undefined : cleaned;
}

function kindOf(entry: ReadEntry): Kind | undefined {
  switch (entry.type) {
    case 'File':
    case 'OldFile':
    case 'ContiguousFile':
      return 'file';
    case 'Directory':
      return 'dir';
    case 'SymbolicLink':
      return 'symlink';
    case 'Link':
      return 'hardlink';
    default:
      // Devices, FIFOs and anything else a sandbox's image has no use for are dropped.
      return undefined;
  }
}

type Source = Readable | NodeJS.ReadableStream;

/**
 * The entries of a tar stream, one at a time (node-tar's Parser waits for each entry's body to
 * be read before the next). A body the consumer left unread is drained.
 */
async function* tarEntries(source: Source, signal: AbortSignal | undefined, what: string): AsyncGenerator<ReadEntry> {
  const parser = new Parser({ strict: true });
  // A queue: the Parser waits for an entry with a body to be read, but emits entries without
  // one (directories, links, empty files) back to back.
  const queue: ReadEntry[] = [];
  let done = false;
  let error: Error | undefined;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  parser.on('entry', (e: ReadEntry) => {
    queue.push(e);
    notify();
  });
  parser.on('end', () => {
    done = true;
    notify();
  });
  const onError = (err: Error) => {
    error ??= err;
    notify();
  };
  // A stream with no bytes at all is an empty tree (a build without a context), not a bad tar.
  let seen = 0;
  source.on('data', (c: Buffer) => (seen += c.length));
  parser.on('error', (err: Error) => {
    if (seen === 0 && /Unrecognized archive format/.test(err.message)) {
      done = true;
      notify();
    } else onError(err);
  });
  source.on('error', onError);
  const onAbort = () => onError(signal?.reason instanceof Error ? signal.reason : new Error('the copy was cancelled'));
  signal?.addEventListener('abort', onAbort);
  (source as Readable).pipe(parser as unknown as NodeJS.WritableStream);
  try {
    for (;;) {
      if (signal?.aborted) onAbort();
      if (error) throw error;
      const e = queue.shift();
      if (e) {
        yield e;
        if (!e.emittedEnd) e.resume();
        continue;
      }
      if (done) return;
      await new Promise<void>((resolve) => (wake = resolve));
    }
  } catch (err) {
    if (err instanceof NestboxError || err instanceof BuildSpecError || signal?.aborted) throw err;
    throw new BuildSpecError('context', undefined, `${what} is not a valid tar archive: ${(err as Error).message}`);
  } finally {
    signal?.removeEventListener('abort', onAbort);
    if (!done) {
      (source as Readable).unpipe?.(parser as unknown as NodeJS.WritableStream);
      (source as Readable).destroy?.();
      parser.abort?.(new Error('stopped'));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Archives (ADD)

type Compression = 'none' | 'gzip' | 'bzip2' | 'xz' | 'zstd';

function compressionOf(head: Buffer): Compression {
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.length >= 3 && head.subarray(0, 3).toString('latin1') === 'BZh') return 'bzip2';
  if (head.length >= 6 && head.subarray(0, 6).equals(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))) return 'xz';
  if (head.length >= 4 && head.subarray(0, 4).equals(Buffer.from([0x28, 0xb5, 0x2f, 0xfd]))) return 'zstd';
  return 'none';
}

/** `stream` decompressed: zlib for gzip, the host's bzip2 / xz / zstd (`-dc`) for the others. */
function decompress(stream: Readable, compression: Compression, children: Set<ChildProcess>): Readable {
  if (compression === 'none') return stream;
  if (compression === 'gzip') {
    const gunzip = createGunzip();
    stream.on('error', (err) => gunzip.destroy(err));
    return stream.pipe(gunzip);
  }
  const tool = compression;
  const child = spawn(tool, ['-dc'], { stdio: ['pipe', 'pipe', 'ignore'] });
  children.add(child);
  child.on('exit', () => children.delete(child));
  const out = new PassThrough();
  const fail = (err: Error) => out.destroy(new BuildSpecError('context', undefined, `${tool} cannot decompress the archive: ${err.message}`));
  child.on('error', (err) => fail((err as NodeJS.ErrnoException).code === 'ENOENT' ? new Error(`${tool} is not installed on this host`) : err));
  child.on('exit', (code, sig) => {
    if (code !== 0) fail(new Error(sig ? `killed by ${sig}` : `exit code ${code}`));
  });
  child.stdin!.on('error', () => {}); // an early exit is reported by 'exit'
  stream.on('error', (err) => out.destroy(err));
  stream.pipe(child.stdin!);
  child.stdout!.pipe(out, { end: false });
  child.stdout!.on('end', () => {
    // End only once the exit code says the data is whole.
    if (child.exitCode === 0) out.end();
    else child.once('exit', (code) => code === 0 && out.end());
  });
  return out;
}

/** Reads until `n` bytes (or the end); returns them and a stream of everything (them included). */
async function peek(stream: AsyncIterable<Buffer>, n: number): Promise<{ head: Buffer; all: Readable }> {
  const it = stream[Symbol.asyncIterator]();
  const chunks: Buffer[] = [];
  let len = 0;
  let ended = false;
  while (len < n) {
    const r = await it.next();
    if (r.done) {
      ended = true;
      break;
    }
    const c = Buffer.from(r.value);
    chunks.push(c);
    len += c.length;
  }
  const head = Buffer.concat(chunks);
  async function* rest() {
    yield head;
    if (ended) return;
    for (;;) {
      const r = await it.next();
      if (r.done) return;
      yield Buffer.from(r.value);
    }
  }
  return { head, all: Readable.from(rest(), { objectMode: false }) };
}

/** Whether decompressed bytes start with a valid tar header (Docker's test of "an archive"). */
function isTarHeader(block: Buffer): boolean {
  if (block.length < 512 || block.subarray(0, 512).every((b) => b === 0)) return false;
  try {
    return new Header(block.subarray(0, 512)).cksumValid;
  } catch {
    return false;
  }
}

/** The entry's body as a tar stream, or undefined when it is not an archive (then copied as is). */
async function openAsArchive(entry: ReadEntry, children: Set<ChildProcess>): Promise<Readable | undefined> {
  const raw = await peek(entry as unknown as AsyncIterable<Buffer>, 6);
  const compression = compressionOf(raw.head);
  const decompressed = decompress(raw.all, compression, children);
  // Not an archive after all (or not a valid one): nothing may throw later from the abandoned
  // pipeline, and the entry's body is drained by the reader.
  const abandon = () => {
    for (const s of [decompressed, raw.all]) {
      s.on('error', () => {});
      s.destroy();
    }
  };
  let plain: { head: Buffer; all: Readable };
  try {
    plain = await peek(decompressed, 512);
  } catch {
    abandon();
    return undefined;
  }
  if (isTarHeader(plain.head)) return plain.all;
  plain.all.on('error', () => {});
  plain.all.destroy();
  abandon();
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// The tar writer

function headerBlocks(name: string, node: { kind: Kind; mode: number; size: number; mtime?: Date; linkpath?: string }): Buffer {
  const type = { file: 'File', dir: 'Directory', symlink: 'SymbolicLink', hardlink: 'Link' }[node.kind] as 'File';
  const fields = {
    path: node.kind === 'dir' ? `${name}/` : name,
    mode: node.mode & 0o7777,
    uid: 0,
    gid: 0,
    size: node.kind === 'file' ? node.size : 0,
    mtime: node.mtime ?? new Date(0),
    type,
    linkpath: node.linkpath ?? '',
    uname: '',
    gname: '',
  };
  const header = new Header(fields);
  const block = Buffer.alloc(512);
  header.encode(block);
  if (!header.needPax) return block;
  const pax = new Pax({ path: fields.path, linkpath: node.linkpath, size: fields.size, mtime: fields.mtime }).encode();
  return Buffer.concat([pax, block]);
}

const padding = (size: number): Buffer => Buffer.alloc((512 - (size % 512)) % 512);

// ---------------------------------------------------------------------------------------------
// The composition

interface EmitPlan {
  /** Out names taking this entry as itself (the first gets the content, the others link to it). */
  names: string[];
  /** Out names of a hard link: link to the target's first name, or a copy of the staged target. */
  links: { name: string; to?: string }[];
  /** Keep a copy of the content for materialised hard links. */
  stage: boolean;
  /** ADD: an archive whose entries are emitted (their own plans are keyed by nested ref). */
  archive: boolean;
}

/**
 * Builds the tar stream of one COPY/ADD step. Throws a BuildSpecError naming the source (not
 * found, outside the root), a NestboxError `payload_too_large` over the limits.
 */
export async function composeCopyArchive(input: ComposeCopyArchiveInput): Promise<ComposedCopyArchive> {
  const field = input.at?.field ?? 'copy';
  const line = input.at?.line;
  function fail(message: string): never {
    throw new BuildSpecError(field, line, message);
  }
  const maxBytes = input.limits?.maxBytes ?? COPY_MAX_BYTES_DEFAULT;
  const maxEntries = input.limits?.maxEntries ?? COPY_MAX_ENTRIES_DEFAULT;
  function tooLarge(what: string): never {
    throw new NestboxError('payload_too_large', what, { field });
  }
  const signal = input.signal;
  const children = new Set<ChildProcess>();
  function archiveFail(m: string): never {
    throw new BuildSpecError('context', undefined, m);
  }

  if (!input.dest.startsWith('/')) fail(`destination ${JSON.stringify(input.dest)} must be absolute`);
  if (input.sources.length === 0) fail('no source given');

  // Pass 1: the merged tree of the inputs, headers only.
  const tree = new Tree((n) => n > maxEntries && tooLarge(`the copy's inputs have more than ${maxEntries} entries`));
  const rules = compileIgnore(input.ignore ?? []);
  let treeBytes = 0;
  for (let i = 0; i < input.inputs.length; i++) {
    let seq = -1;
    const fileSeq = new Map<string, { seq: number; size: number }>();
    for await (const entry of tarEntries(await input.inputs[i]!(), signal, `input ${i + 1}`)) {
      seq++;
      const kind = kindOf(entry);
      const name = entryName(entry.path, archiveFail);
      if (!kind || name === undefined) continue;
      if (kind === 'file') fileSeq.set(name, { seq, size: entry.size ?? 0 });
      if (isIgnored(rules, name)) continue;
      const node: Node = { kind, mode: entry.mode ?? (kind === 'dir' ? 0o755 : 0o644), size: kind === 'file' ? (entry.size ?? 0) : 0, mtime: entry.mtime, ref: refOf(i, seq) };
      if (kind === 'symlink') node.linkpath = entry.linkpath ?? '';
      if (kind === 'hardlink') {
        const target = entryName(entry.linkpath ?? '', archiveFail);
        const t = target === undefined ? undefined : fileSeq.get(target);
        if (!t) archiveFail(`hard link ${JSON.stringify(entry.path)} points to ${JSON.stringify(entry.linkpath)}, which is not an earlier file of the archive`);
        node.target = refOf(i, t.seq);
        node.size = t.size;
      }
      if (kind === 'file') {
        treeBytes += node.size;
        if (treeBytes > maxBytes) tooLarge(`the copy's inputs hold more than ${maxBytes} bytes`);
      }
      tree.set(name, node);
    }
  }

  // Sources → nodes. A symlink named by a source (or on its path) is followed inside the tree.
  const resolve = (p: string, depth = 0): Node | undefined => {
    if (depth > 40) return undefined;
    const segs = p === '' ? [] : p.split('/');
    let node: Node = tree.root;
    const walked: string[] = [];
    for (let k = 0; k < segs.length; k++) {
      const child = node.children?.get(segs[k]!);
      if (!child) return undefined;
      walked.push(segs[k]!);
      if (child.kind === 'symlink') {
        const link = child.linkpath ?? '';
        // Links resolve inside the root: an absolute target is relative to it, `..` stops at it.
        const base = link.startsWith('/') ? '' : walked.slice(0, -1).join('/');
        const joined = path.posix.normalize(`/${base}/${link}/${segs.slice(k + 1).join('/')}`);
        return resolve(joined.replace(/^\/+/, '').replace(/\/+$/, ''), depth + 1);
      }
      if (child.kind === 'hardlink' || child.kind === 'file') {
        if (k < segs.length - 1) return undefined;
      }
      node = child;
    }
    return node;
  };

  interface Match {
    source: string;
    name: string;
    node: Node;
  }
  const matches: Match[] = [];
  let sawGlob = false;
  for (const source of input.sources) {
    const rel = cleanRelative(source.replace(/^\/+/, ''));
    if (rel === undefined) fail(`source ${JSON.stringify(source)} is outside the build context`);
    if (MAGIC.test(rel)) {
      sawGlob = true;
      const isMatch = picomatch(rel, PICOMATCH_OPTIONS);
      const found: Match[] = [];
      for (const [p, node] of tree.descendants(tree.root)) if (isMatch(p)) found.push({ source, name: p, node });
      if (found.length === 0) fail(`source ${JSON.stringify(source)} matches no file`);
      matches.push(...found);
      continue;
    }
    const node = resolve(rel);
    if (!node) fail(`source ${JSON.stringify(source)} not found${rules.length ? ' (or excluded by .dockerignore)' : ''}`);
    matches.push({ source, name: rel, node });
  }

  const destIsDir = input.dest.endsWith('/') || input.destIsDirectory === true;
  const destRel = cleanRelative(input.dest);
  if (destRel === undefined) fail(`destination ${JSON.stringify(input.dest)} is outside the root`);
  if (matches.length > 1 && !input.dest.endsWith('/')) {
    fail(`with several sources${sawGlob ? ' (or a glob matching several)' : ''} the destination must be a directory ending with /: ${input.dest}`);
  }
  const under = (p: string) => (destRel === '' ? p : p === '' ? destRel : `${destRel}/${p}`);
  const now = new Date();

  // Sniff ADD sources: which file matches are archives.
  const archives = new Map<Ref, Tree>();
  if (input.extractArchives) {
    const candidates = new Map<number, Set<Ref>>();
    for (const m of matches) {
      if ((m.node.kind === 'file' || m.node.kind === 'hardlink') && m.node.ref) {
        const ref = m.node.kind === 'hardlink' ? m.node.target! : m.node.ref;
        const i = Number(ref.split(':')[0]);
        if (!candidates.has(i)) candidates.set(i, new Set());
        candidates.get(i)!.add(ref);
      }
    }
    let nestedEntries = 0;
    let nestedBytes = 0;
    for (const [i, refs] of [...candidates].sort((a, b) => a[0] - b[0])) {
      let seq = -1;
      for await (const entry of tarEntries(await input.inputs[i]!(), signal, `input ${i + 1}`)) {
        seq++;
        const ref = refOf(i, seq);
        if (!refs.has(ref)) continue;
        const tarStream = await openAsArchive(entry, children);
        if (!tarStream) continue;
        const nested = new Tree((n) => n > maxEntries && tooLarge(`archive ${entry.path} has more than ${maxEntries} entries`));
        let n = -1;
        const fileSeq = new Map<string, { seq: number; size: number }>();
        for await (const e of tarEntries(tarStream, signal, `archive ${entry.path}`)) {
          n++;
          const kind = kindOf(e);
          const name = entryName(e.path, (m) => fail(`ADD ${entry.path}: ${m}`));
          if (!kind || name === undefined) continue;
          if (++nestedEntries > maxEntries) tooLarge(`the archives hold more than ${maxEntries} entries`);
          const node: Node = { kind, mode: e.mode ?? 0o644, size: kind === 'file' ? (e.size ?? 0) : 0, mtime: e.mtime, ref: refOf(i, seq, n) };
          if (kind === 'file') {
            fileSeq.set(name, { seq: n, size: node.size });
            nestedBytes += node.size;
            if (nestedBytes > maxBytes) tooLarge(`the archives hold more than ${maxBytes} bytes`);
          }
          if (kind === 'symlink') node.linkpath = e.linkpath ?? '';
          if (kind === 'hardlink') {
            const target = entryName(e.linkpath ?? '', (m) => fail(`ADD ${entry.path}: ${m}`));
            const t = target === undefined ? undefined : fileSeq.get(target);
            if (!t) fail(`ADD ${entry.path}: hard link ${JSON.stringify(e.path)} points to a file that is not earlier in the archive`);
            node.target = refOf(i, seq, t.seq);
            node.size = t.size;
          }
          nested.set(name, node);
        }
        archives.set(ref, nested);
      }
    }
  }

  // The output tree, names relative to `/`.
  const out = new Tree((n) => n > maxEntries && tooLarge(`the copy has more than ${maxEntries} entries`));
  // Parents of dest (and dest itself when it is a directory) are made, 0755.
  const destSegs = destRel === '' ? [] : destRel.split('/');
  for (let k = 1; k <= destSegs.length; k++) {
    const p = destSegs.slice(0, k).join('/');
    const isLast = k === destSegs.length;
    const dirNeeded = !isLast || destIsDir || matches.some((m) => m.node.kind === 'dir' || archives.has(m.node.kind === 'hardlink' ? m.node.target! : (m.node.ref ?? '')));
    if (dirNeeded) out.set(p, implicitDir(now));
  }
  const extracted = new Set<Ref>();
  const copyTree = (src: Node, to: string) => {
    for (const [rel, node] of tree.descendants(src)) out.set(under(to === '' ? rel : `${to}/${rel}`), node);
  };
  for (const m of matches) {
    const base = m.name.split('/').pop()!;
    if (m.node.kind === 'dir') {
      copyTree(m.node, '');
      continue;
    }
    const contentRef = m.node.kind === 'hardlink' ? m.node.target! : m.node.ref;
    const nested = contentRef ? archives.get(contentRef) : undefined;
    if (nested) {
      for (const [rel, node] of nested.descendants(nested.root)) out.set(under(rel), node);
      extracted.add(contentRef!);
      continue;
    }
    const name = destIsDir ? under(base) : destRel;
    if (name === '') fail(`cannot copy the file ${m.source} onto /`);
    // A followed symlink source is copied as what it points to, under the source's name.
    out.set(name, { ...m.node });
  }

  // The emission plan: directories first (parents before children), then the other entries in
  // the order their bytes come in the inputs.
  const dirs: [string, Node][] = [];
  const plans = new Map<Ref, EmitPlan>();
  const plan = (ref: Ref): EmitPlan => {
    let p = plans.get(ref);
    if (!p) plans.set(ref, (p = { names: [], links: [], stage: false, archive: false }));
    return p;
  };
  const hardlinks: [string, Node][] = [];
  let entries = 0;
  let bytes = 0;
  for (const [name, node] of out.descendants(out.root)) {
    entries++;
    if (node.kind === 'dir') dirs.push([name, node]);
    else if (node.kind === 'hardlink') hardlinks.push([name, node]);
    else {
      const p = plan(node.ref!);
      p.names.push(name);
      if (node.kind === 'file' && p.names.length === 1) bytes += node.size;
    }
  }
  for (const [name, node] of hardlinks) {
    const targetPlan = plans.get(node.target!);
    if (targetPlan && targetPlan.names.length > 0) {
      plan(node.ref!).links.push({ name, to: targetPlan.names[0] });
    } else {
      // The content is not in the copy under another name: materialise it from a staged copy.
      plan(node.target!).stage = true;
      plan(node.ref!).links.push({ name });
      bytes += node.size;
    }
  }
  for (const ref of extracted) plan(ref).archive = true;
  if (bytes > maxBytes) tooLarge(`the copy holds more than ${maxBytes} bytes`);
  dirs.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));

  const stageDir = await mkdtemp(path.join(input.tmpDir, 'copy-'));
  const staged = new Map<Ref, string>();
  let stagedCount = 0;
  const outNodes = new Map<string, Node>();
  for (const [name, node] of out.descendants(out.root)) {
    // Copied entries carry the inputs' ref; the directories made for `dest` have none.
    if (input.chmod !== undefined && node.ref !== undefined && node.kind !== 'symlink') node.mode = input.chmod;
    outNodes.set(name, node);
  }
  const inputsNeeded = new Set<number>();
  for (const ref of plans.keys()) inputsNeeded.add(Number(ref.split(':')[0]));

  let closed = false;
  const cleanup = async () => {
    closed = true;
    for (const c of children) c.kill('SIGKILL');
    await rm(stageDir, { recursive: true, force: true });
  };

  async function* emitEntry(entry: ReadEntry, ref: Ref): AsyncGenerator<Buffer> {
    const p = plans.get(ref);
    if (!p) return;
    if (p.archive) {
      const tarStream = await openAsArchive(entry, children);
      if (!tarStream) throw new Error(`archive ${entry.path} changed between reads`);
      let n = -1;
      for await (const e of tarEntries(tarStream, signal, `archive ${entry.path}`)) {
        n++;
        yield* emitEntry(e, `${ref}:${n}`);
      }
      return;
    }
    const [first, ...aliases] = p.names;
    let stageFile: ReturnType<typeof createWriteStream> | undefined;
    if (p.stage) {
      const file = path.join(stageDir, String(stagedCount++));
      staged.set(ref, file);
      stageFile = createWriteStream(file, { flags: 'wx', mode: 0o600 });
    }
    if (first !== undefined) {
      const node = outNodes.get(first)!;
      yield headerBlocks(first, node);
      if (node.kind === 'file') {
        let written = 0;
        for await (const chunk of entry as unknown as AsyncIterable<Buffer>) {
          written += chunk.length;
          if (stageFile && !stageFile.write(chunk)) await once(stageFile, 'drain');
          yield chunk;
        }
        if (written !== node.size) throw new Error(`entry ${entry.path} changed between reads`);
        yield padding(node.size);
      }
      // The same entry under several names: one copy of the bytes, hard links for the others.
      for (const alias of aliases) yield headerBlocks(alias, node.kind === 'symlink' ? node : { kind: 'hardlink', mode: node.mode, size: 0, mtime: node.mtime, linkpath: first });
    } else if (stageFile) {
      for await (const chunk of entry as unknown as AsyncIterable<Buffer>) if (!stageFile.write(chunk)) await once(stageFile, 'drain');
    }
    if (stageFile) {
      stageFile.end();
      await once(stageFile, 'close');
    }
    for (const link of p.links) {
      const node = outNodes.get(link.name)!;
      if (link.to !== undefined) {
        yield headerBlocks(link.name, { kind: 'hardlink', mode: node.mode, size: 0, mtime: node.mtime, linkpath: link.to });
        continue;
      }
      const file = staged.get(node.target!);
      if (!file) throw new Error(`hard link target of ${link.name} was not staged`);
      yield headerBlocks(link.name, { kind: 'file', mode: node.mode, size: node.size, mtime: node.mtime });
      let written = 0;
      for await (const chunk of createReadStream(file) as AsyncIterable<Buffer>) {
        written += chunk.length;
        yield chunk;
      }
      if (written !== node.size) throw new Error(`hard link target of ${link.name} changed between reads`);
      yield padding(node.size);
    }
  }

  async function* generate(): AsyncGenerator<Buffer> {
    try {
      for (const [name, node] of dirs) yield headerBlocks(name, node);
      for (const i of [...inputsNeeded].sort((a, b) => a - b)) {
        let seq = -1;
        for await (const entry of tarEntries(await input.inputs[i]!(), signal, `input ${i + 1}`)) {
          seq++;
          if (closed) throw new Error('the copy archive was cleaned up');
          yield* emitEntry(entry, refOf(i, seq));
        }
      }
      yield Buffer.alloc(1024);
    } finally {
      for (const c of children) c.kill('SIGKILL');
    }
  }

  return { stream: Readable.from(generate(), { objectMode: false }), entries, bytes, cleanup };
}
