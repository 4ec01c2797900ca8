import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync, linkSync, readlinkSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import * as tar from 'tar';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BuildSpecError } from './build-spec.js';
import { composeCopyArchive, globBase, parseDockerignore, resolveCopyDest, type ComposeCopyArchiveInput } from './copy-archive.js';
import { NestboxError } from '../errors.js';

let work: string;
beforeAll(() => {
  work = mkdtempSync(path.join(tmpdir(), 'nestbox-copy-archive-'));
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Spec {
  path: string;
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'FIFO' | 'CharacterDevice';
  body?: string | Buffer;
  linkpath?: string;
  mode?: number;
}

/** A tar built entry by entry (for names and types a real directory cannot hold, like `../x`). */
function tarOf(entries: Spec[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = e.body === undefined ? Buffer.alloc(0) : Buffer.from(e.body);
    const type = e.type ?? 'File';
    const h = new tar.Header({ path: e.path, type, size: type === 'File' ? body.length : 0, mode: e.mode ?? (type === 'Directory' ? 0o755 : 0o644), mtime: new Date(1_700_000_000_000), linkpath: e.linkpath ?? '', uid: 1000, gid: 1000 });
    const block = Buffer.alloc(512);
    h.encode(block);
    if (h.needPax) blocks.push(new tar.Pax({ path: e.path, linkpath: e.linkpath }).encode());
    blocks.push(block);
    if (type === 'File') blocks.push(body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

/** A real directory tree on disk, archived by node-tar as a build context would be. */
function dirOf(files: Record<string, string | { link: string } | { hardlink: string } | null>): string {
  const dir = mkdtempSync(path.join(work, 'ctx-'));
  for (const [name, v] of Object.entries(files)) {
    const p = path.join(dir, name);
    mkdirSync(path.dirname(p), { recursive: true });
    if (v === null) mkdirSync(p, { recursive: true });
    else if (typeof v === 'string') writeFileSync(p, v);
    else if ('link' in v) symlinkSync(v.link, p);
    else linkSync(path.join(dir, v.hardlink), p);
  }
  return dir;
}

async function tarOfDir(dir: string, gzip = false): Promise<Buffer> {
  const chunks: Buffer[] = [];
  const stream = tar.create({ cwd: dir, gzip, portable: true }, readdirSync(dir)) as unknown as AsyncIterable<Buffer>;
  for await (const c of stream) chunks.push(Buffer.from(c));
  return Buffer.concat(chunks);
}

const opener = (buf: Buffer) => async () => Readable.from([buf]);

interface OutEntry {
  path: string;
  type: string;
  mode: number;
  uid?: number;
  linkpath?: string;
  body?: string;
  size: number;
}

async function readOut(stream: Readable): Promise<OutEntry[]> {
  const out: OutEntry[] = [];
  const parser = new tar.Parser({ strict: true });
  const pending: Promise<void>[] = [];
  parser.on('entry', (e: tar.ReadEntry) => {
    const item: OutEntry = { path: e.path, type: e.type, mode: e.mode! & 0o7777, uid: e.uid, size: 0 };
    if (e.linkpath) item.linkpath = e.linkpath;
    out.push(item);
    const chunks: Buffer[] = [];
    e.on('data', (c: Buffer) => chunks.push(c));
    pending.push(new Promise((resolve) => e.on('end', () => {
      const body = Buffer.concat(chunks);
      item.size = body.length;
      if (e.type === 'File') item.body = body.toString();
      resolve();
    })));
  });
  const done = new Promise<void>((resolve, reject) => {
    parser.on('end', resolve);
    parser.on('error', reject);
  });
  for await (const chunk of stream) parser.write(chunk as Buffer);
  parser.end();
  await done;
  await Promise.all(pending);
  return out;
}

async function compose(inputs: Buffer[], rest: Omit<ComposeCopyArchiveInput, 'inputs' | 'tmpDir'>) {
  const tmpDir = mkdtempSync(path.join(work, 'tmp-'));
  const result = await composeCopyArchive({ inputs: inputs.map(opener), tmpDir, ...rest });
  const entries = await readOut(result.stream);
  await result.cleanup();
  expect(readdirSync(tmpDir)).toEqual([]);
  // What the stream holds is what the result said.
  expect(entries).toHaveLength(result.entries);
  expect(entries.reduce((n, e) => n + e.size, 0)).toBe(result.bytes);
  return entries;
}

const names = (entries: OutEntry[]) => entries.map((e) => e.path);
const bodyOf = (entries: OutEntry[], p: string) => entries.find((e) => e.path === p)?.body;

async function refusal(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (err) {
    return err as Error;
  }
  throw new Error('expected a refusal');
}

describe('composeCopyArchive: Docker COPY semantics', () => {
  let context: Buffer;
  beforeAll(async () => {
    context = await tarOfDir(
      dirOf({
        'app/a.txt': 'A',
        'app/sub/b.txt': 'B',
        'app/.hidden': 'H',
        'top.txt': 'T',
        'two.txt': '2',
        'notes.md': 'M',
        'empty/': null,
      }),
    );
  });

  it('a directory source copies its contents, not itself; parents of dest are made 0755', async () => {
    const out = await compose([context], { sources: ['app'], dest: '/srv/www/' });
    expect(names(out).sort()).toEqual(['srv/', 'srv/www/', 'srv/www/.hidden', 'srv/www/a.txt', 'srv/www/sub/', 'srv/www/sub/b.txt']);
    expect(out.find((e) => e.path === 'srv/')).toMatchObject({ type: 'Directory', mode: 0o755 });
    expect(bodyOf(out, 'srv/www/sub/b.txt')).toBe('B');
    // Directories come before what they hold; owners are dropped.
    expect(names(out).indexOf('srv/www/sub/')).toBeLessThan(names(out).indexOf('srv/www/sub/b.txt'));
    expect(out.every((e) => e.uid === 0)).toBe(true);
  });

  it('--chmod sets the copied entries\' mode and leaves the directories made above dest at 0755', async () => {
    const out = await compose([context], { sources: ['app'], dest: '/etc/new/', chmod: 0o640 });
    expect(out.find((e) => e.path === 'etc/')).toMatchObject({ mode: 0o755 });
    expect(out.find((e) => e.path === 'etc/new/sub/b.txt')).toMatchObject({ mode: 0o640 });
    expect(out.find((e) => e.path === 'etc/new/a.txt')).toMatchObject({ mode: 0o640 });
  });

  it('a directory source without a trailing slash on dest is still copied into dest', async () => {
    const out = await compose([context], { sources: ['./app/'], dest: '/srv' });
    expect(names(out)).toContain('srv/a.txt');
    expect(names(out)).not.toContain('srv/app/');
  });

  it('a file goes to dest as a file path, or into dest/ ending with a slash', async () => {
    expect(names(await compose([context], { sources: ['top.txt'], dest: '/etc/x.conf' }))).toEqual(['etc/', 'etc/x.conf']);
    const into = await compose([context], { sources: ['/top.txt'], dest: '/opt/' });
    expect(names(into)).toEqual(['opt/', 'opt/top.txt']);
    expect(bodyOf(into, 'opt/top.txt')).toBe('T');
    expect(names(await compose([context], { sources: ['top.txt'], dest: '/' }))).toEqual(['top.txt']);
    // dest an existing directory in the stage (the engine says so): inside it.
    expect(names(await compose([context], { sources: ['top.txt'], dest: '/opt', destIsDirectory: true }))).toEqual(['opt/', 'opt/top.txt']);
  });

  it('several sources need dest/ ; with it each goes inside', async () => {
    const err = await refusal(compose([context], { sources: ['top.txt', 'two.txt'], dest: '/x', at: { field: 'dockerfile', line: 4 } }));
    expect(err).toBeInstanceOf(BuildSpecError);
    expect(err).toMatchObject({ field: 'dockerfile', line: 4 });
    expect(names(await compose([context], { sources: ['top.txt', 'two.txt'], dest: '/x/' }))).toEqual(['x/', 'x/top.txt', 'x/two.txt']);
  });

  it('globs: * stays in one directory, ** crosses them, dotfiles match, a matched directory copies its contents', async () => {
    expect(names(await compose([context], { sources: ['*.txt'], dest: '/g/' })).sort()).toEqual(['g/', 'g/top.txt', 'g/two.txt']);
    expect(names(await compose([context], { sources: ['app/**/*.txt'], dest: '/g/' })).sort()).toEqual(['g/', 'g/a.txt', 'g/b.txt']);
    expect(names(await compose([context], { sources: ['app/.h*'], dest: '/g/' }))).toEqual(['g/', 'g/.hidden']);
    expect(names(await compose([context], { sources: ['ap?'], dest: '/g/' }))).toContain('g/sub/b.txt');
    expect(names(await compose([context], { sources: ['t[o]p.txt'], dest: '/one' }))).toEqual(['one']);
    // A glob matching several needs dest/.
    expect(await refusal(compose([context], { sources: ['*.txt'], dest: '/g' }))).toBeInstanceOf(BuildSpecError);
  });

  it('a source matching nothing is refused, naming it', async () => {
    const missing = await refusal(compose([context], { sources: ['nope.txt'], dest: '/x/' }));
    expect(missing).toBeInstanceOf(BuildSpecError);
    expect(missing.message).toMatch(/"nope.txt" not found/);
    expect((await refusal(compose([context], { sources: ['*.rs'], dest: '/x/' }))).message).toMatch(/"\*\.rs" matches no file/);
  });

  it('a source outside the root is refused', async () => {
    const err = await refusal(compose([context], { sources: ['app/../../etc/passwd'], dest: '/x' }));
    expect(err).toBeInstanceOf(BuildSpecError);
    expect(err.message).toMatch(/outside the build context/);
  });

  it('.dockerignore patterns exclude, ! re-includes, the last match decides', async () => {
    const ctx = await tarOfDir(
      dirOf({
        'src/main.go': 'm',
        'src/main_test.go': 't',
        'logs/a.log': 'a',
        'logs/keep.log': 'k',
        'node_modules/x/index.js': 'x',
        'deep/node_modules/y.js': 'y',
        '.git/HEAD': 'h',
        'README.md': 'r',
      }),
    );
    const ignore = parseDockerignore('# comment\n\n.git\n**/node_modules\nlogs\n!logs/keep.log\n*_test.go\n**/*_test.go\n');
    expect(ignore).toEqual(['.git', '**/node_modules', 'logs', '!logs/keep.log', '*_test.go', '**/*_test.go']);
    const out = await compose([ctx], { sources: ['.'], dest: '/app/', ignore });
    expect(names(out).filter((n) => !n.endsWith('/')).sort()).toEqual(['app/README.md', 'app/logs/keep.log', 'app/src/main.go']);
    const err = await refusal(compose([ctx], { sources: ['.git/HEAD'], dest: '/x' , ignore }));
    expect(err.message).toMatch(/not found \(or excluded by \.dockerignore\)/);
  });

  it('later inputs win; a file over a directory replaces it', async () => {
    const one = tarOf([{ path: 'a.txt', body: 'one' }, { path: 'd/', type: 'Directory' }, { path: 'd/inner', body: 'i' }, { path: 'keep', body: 'k' }]);
    const two = tarOf([{ path: 'a.txt', body: 'two' }, { path: 'd', body: 'now a file' }]);
    const out = await compose([one, two], { sources: ['.'], dest: '/m/' });
    expect(bodyOf(out, 'm/a.txt')).toBe('two');
    expect(bodyOf(out, 'm/d')).toBe('now a file');
    expect(names(out)).not.toContain('m/d/inner');
    expect(bodyOf(out, 'm/keep')).toBe('k');
  });

  it('keeps every entry of a run of entries without bodies', async () => {
    const run: Spec[] = [];
    for (let i = 0; i < 50; i++) {
      run.push({ path: `d${i}/`, type: 'Directory', mode: 0o700 });
      run.push({ path: `d${i}/empty`, body: '' });
      run.push({ path: `d${i}/link`, type: 'SymbolicLink', linkpath: 'empty' });
    }
    const out = await compose([tarOf(run)], { sources: ['.'], dest: '/r/' });
    expect(out).toHaveLength(1 + 150);
    // The directories' own modes arrived (not implicit 0755 ones).
    expect(out.filter((e) => e.type === 'Directory' && e.mode === 0o700)).toHaveLength(50);
  });

  it('reads gzip inputs', async () => {
    const out = await compose([gzipSync(tarOf([{ path: 'z.txt', body: 'zipped' }]))], { sources: ['z.txt'], dest: '/z' });
    expect(bodyOf(out, 'z')).toBe('zipped');
  });

  it('symlinks inside a copied directory are copied as links, never followed', async () => {
    const ctx = await tarOfDir(dirOf({ 'd/real.txt': 'R', 'd/rel': { link: 'real.txt' }, 'd/abs': { link: '/etc/shadow' }, 'd/up': { link: '../../../etc' } }));
    const out = await compose([ctx], { sources: ['d'], dest: '/l/' });
    expect(out.find((e) => e.path === 'l/rel')).toMatchObject({ type: 'SymbolicLink', linkpath: 'real.txt' });
    expect(out.find((e) => e.path === 'l/abs')).toMatchObject({ type: 'SymbolicLink', linkpath: '/etc/shadow' });
    expect(out.find((e) => e.path === 'l/up')).toMatchObject({ type: 'SymbolicLink', linkpath: '../../../etc' });
  });

  it('a symlink named as the source is followed inside the root only', async () => {
    const ctx = await tarOfDir(dirOf({ 'data/v1.txt': 'V1', current: { link: 'data/v1.txt' }, dirlink: { link: '/data' }, escape: { link: '../../../../etc/hostname' } }));
    const out = await compose([ctx], { sources: ['current'], dest: '/c.txt' });
    expect(out.find((e) => e.path === 'c.txt')).toMatchObject({ type: 'File', body: 'V1' });
    expect(names(await compose([ctx], { sources: ['dirlink/v1.txt'], dest: '/x' }))).toEqual(['x']);
    // `..` stops at the root: /etc/hostname of the host is never reached, the context has none.
    expect((await refusal(compose([ctx], { sources: ['escape'], dest: '/x' }))).message).toMatch(/not found/);
  });

  it('nothing is placed beneath a symlink an archive made', async () => {
    const evil = tarOf([{ path: 'l', type: 'SymbolicLink', linkpath: '/etc' }, { path: 'l/passwd', body: 'root::0:0::/:/bin/sh' }]);
    const out = await compose([evil], { sources: ['.'], dest: '/' });
    expect(out.find((e) => e.path === 'l/')).toMatchObject({ type: 'Directory' });
    expect(out.find((e) => e.path === 'l')).toBeUndefined();
    // Across inputs as well.
    const first = tarOf([{ path: 'l', type: 'SymbolicLink', linkpath: '/etc' }]);
    const second = tarOf([{ path: 'l/passwd', body: 'x' }]);
    const out2 = await compose([first, second], { sources: ['.'], dest: '/' });
    expect(out2.filter((e) => e.type === 'SymbolicLink')).toEqual([]);
  });

  it('drops devices and FIFOs, and refuses entries outside the archive root', async () => {
    const odd = tarOf([{ path: 'fifo', type: 'FIFO' }, { path: 'null', type: 'CharacterDevice' }, { path: 'ok', body: 'ok' }]);
    expect(names(await compose([odd], { sources: ['.'], dest: '/d/' }))).toEqual(['d/', 'd/ok']);
    const escaping = tarOf([{ path: '../outside', body: 'x' }]);
    const err = await refusal(compose([escaping], { sources: ['.'], dest: '/d/' }));
    expect(err).toBeInstanceOf(BuildSpecError);
    expect(err).toMatchObject({ field: 'context' });
    expect(err.message).toMatch(/outside the archive's root/);
    // Absolute names are read relative to the root, as tar does.
    expect(names(await compose([tarOf([{ path: '/abs.txt', body: 'a' }])], { sources: ['abs.txt'], dest: '/x' }))).toEqual(['x']);
  });

  it('an empty input is an empty tree; a truncated one is refused', async () => {
    expect(names(await compose([Buffer.alloc(0), tarOf([{ path: 'a', body: 'a' }])], { sources: ['a'], dest: '/a' }))).toEqual(['a']);
    const whole = tarOf([{ path: 'big', body: Buffer.alloc(2000, 1) }]);
    const err = await refusal(compose([whole.subarray(0, 1200)], { sources: ['.'], dest: '/d/' }));
    expect(err).toBeInstanceOf(BuildSpecError);
    expect(err.message).toMatch(/not a valid tar archive: .*Truncated/);
  });

  it('refuses input that is not a tar', async () => {
    const err = await refusal(compose([Buffer.from('this is not a tar archive at all'.repeat(40))], { sources: ['.'], dest: '/d/' }));
    expect(err).toBeInstanceOf(BuildSpecError);
    expect(err.message).toMatch(/not a valid tar/);
  });

  it('hard links: kept when the target is copied too, materialised when it is not', async () => {
    const ctx = await tarOfDir(dirOf({ 'a/orig.txt': 'shared', 'a/same.txt': { hardlink: 'a/orig.txt' }, 'b/other.txt': { hardlink: 'a/orig.txt' } }));
    const both = await compose([ctx], { sources: ['a'], dest: '/h/' });
    const link = both.find((e) => e.type === 'Link');
    expect(link).toBeDefined();
    const file = both.find((e) => e.type === 'File')!;
    expect(file.body).toBe('shared');
    expect(link!.linkpath).toBe(file.path);
    // Only b/: the content is not in the copy under another name.
    const alone = await compose([ctx], { sources: ['b/other.txt'], dest: '/o.txt' });
    expect(alone.find((e) => e.path === 'o.txt')).toMatchObject({ type: 'File', body: 'shared' });
  });

  it('long names survive (pax headers) and GNU tar extracts the result', async () => {
    const long = `${'d'.repeat(120)}/${'f'.repeat(150)}.txt`;
    const tmp = mkdtempSync(path.join(work, 'tmp-'));
    const result = await composeCopyArchive({ inputs: [opener(tarOf([{ path: long, body: 'deep' }, { path: 'ünïcode.txt', body: 'u' }, { path: 'ln', type: 'SymbolicLink', linkpath: 'ünïcode.txt' }]))], sources: ['.'], dest: '/root/', tmpDir: tmp });
    const file = path.join(work, `out-${Date.now()}.tar`);
    const chunks: Buffer[] = [];
    for await (const c of result.stream) chunks.push(c as Buffer);
    writeFileSync(file, Buffer.concat(chunks));
    const into = mkdtempSync(path.join(work, 'x-'));
    execFileSync('tar', ['-xf', file, '-C', into, '--no-same-owner']);
    expect(readFileSync(path.join(into, 'root', long), 'utf8')).toBe('deep');
    expect(readFileSync(path.join(into, 'root', 'ünïcode.txt'), 'utf8')).toBe('u');
    expect(readlinkSync(path.join(into, 'root', 'ln'))).toBe('ünïcode.txt');
    expect(statSync(path.join(into, 'root')).mode & 0o777).toBe(0o755);
    await result.cleanup();
  });

  it('bounds entries and bytes with a clear error', async () => {
    const many = tarOf(Array.from({ length: 20 }, (_, i) => ({ path: `f${i}`, body: 'x' })));
    const entries = await refusal(compose([many], { sources: ['.'], dest: '/d/', limits: { maxEntries: 10 } }));
    expect(entries).toBeInstanceOf(NestboxError);
    expect(entries).toMatchObject({ code: 'payload_too_large' });
    expect(entries.message).toMatch(/more than 10 entries/);
    const big = tarOf([{ path: 'big', body: Buffer.alloc(5000) }]);
    const bytes = await refusal(compose([big], { sources: ['big'], dest: '/b', limits: { maxBytes: 4096 } }));
    expect(bytes).toMatchObject({ code: 'payload_too_large' });
    expect(bytes.message).toMatch(/more than 4096 bytes/);
    expect(names(await compose([big], { sources: ['big'], dest: '/b', limits: { maxBytes: 5000, maxEntries: 2 } }))).toEqual(['b']);
  });

  it('stops when the signal aborts', async () => {
    const controller = new AbortController();
    controller.abort(new Error('build cancelled'));
    const err = await refusal(compose([context], { sources: ['.'], dest: '/d/', signal: controller.signal }));
    expect(err.message).toMatch(/build cancelled/);
  });
});

describe('composeCopyArchive: ADD extracts local archives', () => {
  const inner = () => tarOf([{ path: 'pkg/', type: 'Directory' }, { path: 'pkg/bin', body: 'binary', mode: 0o755 }, { path: 'pkg/README', body: 'readme' }]);

  async function addOf(name: string, archive: Buffer, dest = '/opt/') {
    const ctx = tarOf([{ path: name, body: archive }, { path: 'plain.txt', body: 'not an archive' }]);
    return compose([ctx], { sources: [name, 'plain.txt'], dest, extractArchives: true });
  }

  it.each([
    ['pkg.tar', () => inner()],
    ['pkg.tar.gz', () => gzipSync(inner())],
    ['pkg.tar.xz', () => execFileSync('xz', ['-c'], { input: inner() })],
    ['pkg.tar.bz2', () => execFileSync('bzip2', ['-c'], { input: inner() })],
    ['pkg.tar.zst', () => execFileSync('zstd', ['-q', '-c'], { input: inner() })],
    ['named-anything.bin', () => gzipSync(inner())], // detected by content, as Docker does
  ])('%s is unpacked at dest; a plain file beside it is copied', async (name, make) => {
    const out = await addOf(name, make());
    expect(names(out).sort()).toEqual(['opt/', 'opt/pkg/', 'opt/pkg/README', 'opt/pkg/bin', 'opt/plain.txt']);
    expect(out.find((e) => e.path === 'opt/pkg/bin')).toMatchObject({ body: 'binary', mode: 0o755 });
  });

  it('a gzip file that is not a tar is copied as it is', async () => {
    const gz = gzipSync(Buffer.from('just text'));
    const out = await addOf('notes.txt.gz', gz);
    expect(names(out).sort()).toEqual(['opt/', 'opt/notes.txt.gz', 'opt/plain.txt']);
  });

  it('COPY never extracts', async () => {
    const ctx = tarOf([{ path: 'pkg.tar.gz', body: gzipSync(inner()) }]);
    expect(names(await compose([ctx], { sources: ['pkg.tar.gz'], dest: '/opt/' }))).toEqual(['opt/', 'opt/pkg.tar.gz']);
  });

  it('an archive is unpacked into dest even without a trailing slash', async () => {
    const ctx = tarOf([{ path: 'a.tar', body: inner() }]);
    expect(names(await compose([ctx], { sources: ['a.tar'], dest: '/srv', extractArchives: true }))).toContain('srv/pkg/bin');
  });

  it('an archive entry outside its root is refused', async () => {
    const ctx = tarOf([{ path: 'evil.tar', body: tarOf([{ path: '../../etc/cron.d/x', body: 'x' }]) }]);
    const err = await refusal(compose([ctx], { sources: ['evil.tar'], dest: '/opt/', extractArchives: true }));
    expect(err).toBeInstanceOf(BuildSpecError);
    expect(err.message).toMatch(/outside the archive's root/);
  });

  it('bounds what archives unpack to', async () => {
    const bomb = tarOf([{ path: 'a.tar', body: tarOf(Array.from({ length: 30 }, (_, i) => ({ path: `f${i}`, body: 'x' }))) }]);
    const err = await refusal(compose([bomb], { sources: ['a.tar'], dest: '/opt/', extractArchives: true, limits: { maxEntries: 20 } }));
    expect(err).toMatchObject({ code: 'payload_too_large' });
  });
});

describe('globBase', () => {
  it.each([
    ['/usr/lib/*.so', '/usr/lib'],
    ['src/**/*.ts', 'src'],
    ['*.js', ''],
    ['/*', '/'],
    ['/out/bin', '/out/bin'],
    ['a/b?/c', 'a'],
    ['./a/[xy]/z', 'a'],
    ['a/./b/', 'a/b'],
  ])('%s → %s', (pattern, base) => {
    expect(globBase(pattern)).toBe(base);
  });
});

describe('resolveCopyDest', () => {
  it.each([
    ['/abs/file', '/app', '/abs/file'],
    ['/abs/dir/', '/app', '/abs/dir/'],
    ['.', '/app', '/app/'],
    ['./', '/app', '/app/'],
    ['sub/.', '/app', '/app/sub/'],
    ['rel.txt', '/app', '/app/rel.txt'],
    ['node_modules', '/app/', '/app/node_modules'],
    ['../../../x', '/app', '/x'],
    ['x', '/', '/x'],
  ])('%s in %s → %s', (dest, workdir, expected) => {
    expect(resolveCopyDest(dest, workdir)).toBe(expected);
  });
});
