// The extraction rules of POST /files/archive/extract, on the function itself in a temp dir:
// what an archive may write (plain or gzip, merge and replace, owners and modes, links kept as
// written) and what it never may (names outside the path, writes through symlinks the sandbox
// had or the archive made, hard links to files it did not write, device nodes).
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, symlinkSync, writeFileSync, linkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeEach, describe, expect, it } from 'vitest';
import { AgentHttpError } from './errors.js';
import { extractArchive, resolveArchiveOwner } from './files-archive.js';
import { rawTar, type RawEntry } from './files-archive-testing.js';

const isRoot = process.getuid?.() === 0;
const work = mkdtempSync(join(tmpdir(), 'nestbox-archive-'));
let dest: string;
let outside: string;
let count = 0;

beforeEach(() => {
  count++;
  dest = join(work, `dest${count}`);
  outside = join(work, `outside${count}`);
  mkdirSync(dest);
  mkdirSync(outside);
  writeFileSync(join(outside, 'secret'), 'untouched');
});

afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Feeds the archive in small chunks, so entries straddle writes as they do over a socket. */
function body(archive: Buffer): Readable {
  const chunks: Buffer[] = [];
  for (let offset = 0; offset < archive.length; offset += 700) chunks.push(archive.subarray(offset, offset + 700));
  return Readable.from(chunks);
}

async function extract(entries: RawEntry[] | Buffer, options: Parameters<typeof extractArchive>[2] = {}) {
  return extractArchive(body(Buffer.isBuffer(entries) ? entries : rawTar(entries)), dest, options);
}

async function refusal(entries: RawEntry[] | Buffer): Promise<AgentHttpError> {
  const error = await extract(entries).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(AgentHttpError);
  return error as AgentHttpError;
}

describe('extractArchive', () => {
  it('unpacks plain and gzip tar: directories, files, symlinks kept as written, hard links; counts entries and bytes', async () => {
    const entries: RawEntry[] = [
      { path: 'app/', type: 'Directory', mode: 0o750 },
      { path: 'app/run.sh', content: '#!/bin/sh\necho hi\n', mode: 0o755 },
      { path: 'app/abs-link', type: 'SymbolicLink', linkpath: '/usr/bin/env' },
      { path: 'app/up-link', type: 'SymbolicLink', linkpath: '../../../etc/passwd' },
      { path: 'app/again.sh', type: 'Link', linkpath: 'app/run.sh' },
      { path: './deep/er/file.txt', content: 'x'.repeat(3000) },
    ];
    for (const gzip of [false, true]) {
      rmSync(dest, { recursive: true, force: true });
      const result = await extractArchive(body(rawTar(entries, { gzip })), dest);
      expect(result).toEqual({ entries: 6, bytes: 18 + 3000 });
      expect(statSync(join(dest, 'app')).mode & 0o7777).toBe(0o750);
      expect(readFileSync(join(dest, 'app/run.sh'), 'utf8')).toBe('#!/bin/sh\necho hi\n');
      expect(statSync(join(dest, 'app/run.sh')).mode & 0o7777).toBe(0o755);
      // Targets stay as the archive wrote them (node-tar's unpacker would strip the "/").
      expect(readlinkSync(join(dest, 'app/abs-link'))).toBe('/usr/bin/env');
      expect(readlinkSync(join(dest, 'app/up-link'))).toBe('../../../etc/passwd');
      expect(statSync(join(dest, 'app/again.sh')).ino).toBe(statSync(join(dest, 'app/run.sh')).ino);
      expect(readFileSync(join(dest, 'deep/er/file.txt'), 'utf8')).toHaveLength(3000);
      expect(statSync(join(dest, 'app/run.sh')).mtime.toISOString()).toBe('2024-01-02T03:04:05.000Z');
    }
  });

  it('makes the extraction path when missing', async () => {
    dest = join(dest, 'not', 'yet');
    expect(await extract([{ path: 'f', content: 'hi' }])).toEqual({ entries: 1, bytes: 2 });
    expect(readFileSync(join(dest, 'f'), 'utf8')).toBe('hi');
  });

  it('merges directories and replaces files, links and hard-linked files without writing through them', async () => {
    mkdirSync(join(dest, 'keep'));
    writeFileSync(join(dest, 'keep', 'old'), 'old');
    writeFileSync(join(dest, 'replaced'), 'before');
    symlinkSync(join(outside, 'secret'), join(dest, 'was-link'));
    linkSync(join(outside, 'secret'), join(dest, 'was-hardlink'));
    await extract([
      { path: 'keep/', type: 'Directory' },
      { path: 'keep/new', content: 'new' },
      { path: 'replaced', content: 'after' },
      { path: 'was-link', content: 'a file now' },
      { path: 'was-hardlink', content: 'a new inode' },
    ]);
    expect(readFileSync(join(dest, 'keep/old'), 'utf8')).toBe('old');
    expect(readFileSync(join(dest, 'keep/new'), 'utf8')).toBe('new');
    expect(readFileSync(join(dest, 'replaced'), 'utf8')).toBe('after');
    expect(lstatSync(join(dest, 'was-link')).isFile()).toBe(true);
    expect(readFileSync(join(dest, 'was-hardlink'), 'utf8')).toBe('a new inode');
    expect(readFileSync(join(outside, 'secret'), 'utf8')).toBe('untouched');
  });

  it('never replaces a directory with a file (409), and names no temp files afterwards', async () => {
    mkdirSync(join(dest, 'dir'));
    const error = await refusal([{ path: 'dir', content: 'x' }]);
    expect(error.status).toBe(409);
    expect(error.code).toBe('conflict');
    expect(lstatSync(join(dest, 'dir')).isDirectory()).toBe(true);
    expect(execFileSync('ls', ['-A', dest], { encoding: 'utf8' })).toBe('dir\n');
  });

  it.each([
    ['a parent directory name', '../x'],
    ['a parent directory name deeper down', 'a/../../x'],
    ['an absolute name', '/etc/x'],
  ])('refuses %s (400) and writes nothing outside', async (_what, name) => {
    const error = await refusal([{ path: name, content: 'escaped' }]);
    expect(error.status).toBe(400);
    expect(error.message).toMatch(/^body: entry/);
    expect(existsSync(join(work, 'x'))).toBe(false);
    expect(existsSync(join(dest, 'x'))).toBe(false);
  });

  it('never writes through a symlink the archive just made', async () => {
    const error = await refusal([
      { path: 'link', type: 'SymbolicLink', linkpath: outside },
      { path: 'link/secret', content: 'overwritten' },
    ]);
    expect(error.status).toBe(400);
    expect(error.message).toContain('symbolic link');
    expect(readFileSync(join(outside, 'secret'), 'utf8')).toBe('untouched');
    // Nor for a directory entry, nor deeper down.
    await refusal([
      { path: 'link2', type: 'SymbolicLink', linkpath: outside },
      { path: 'link2/sub/', type: 'Directory' },
    ]);
    expect(existsSync(join(outside, 'sub'))).toBe(false);
  });

  it("follows a link the sandbox already had to a directory, as Docker's COPY does (merged /usr: bin -> usr/bin)", async () => {
    mkdirSync(join(dest, 'usr', 'bin'), { recursive: true });
    symlinkSync('usr/bin', join(dest, 'bin'));
    await extract([{ path: 'bin/tool', content: 'tool' }]);
    expect(readFileSync(join(dest, 'usr', 'bin', 'tool'), 'utf8')).toBe('tool');
    expect(lstatSync(join(dest, 'bin')).isSymbolicLink()).toBe(true);
    // A link to a file is no directory to write into.
    writeFileSync(join(dest, 'file'), 'x');
    symlinkSync('file', join(dest, 'filelink'));
    const error = await refusal([{ path: 'filelink/secret', content: 'no' }]);
    expect(error.status).toBe(400);
  });

  it('refuses hard links outside the path, or to files the archive did not write', async () => {
    writeFileSync(join(dest, 'existing'), 'was here');
    for (const linkpath of [`../outside${count}/secret`, join(outside, 'secret'), 'existing', 'not-there']) {
      const error = await refusal([{ path: 'hard', type: 'Link', linkpath }]);
      expect(error.status).toBe(400);
      expect(existsSync(join(dest, 'hard'))).toBe(false);
    }
    // A file the archive wrote, then replaced by a symlink to outside: no longer a target either.
    await refusal([
      { path: 'f', content: 'mine' },
      { path: 'f', type: 'SymbolicLink', linkpath: join(outside, 'secret') },
      { path: 'hard', type: 'Link', linkpath: 'f' },
    ]);
    expect(statSync(join(outside, 'secret')).nlink).toBe(1);
  });

  it.skipIf(!isRoot)('drops device nodes and fifos', async () => {
    const result = await extract([
      { path: 'null', type: 'CharacterDevice', devmaj: 1, devmin: 3, mode: 0o666 },
      { path: 'disk', type: 'BlockDevice', devmaj: 8, devmin: 0 },
      { path: 'pipe', type: 'FIFO' },
      { path: 'ok', content: 'ok' },
    ]);
    expect(result).toEqual({ entries: 1, bytes: 2 });
    expect(execFileSync('ls', ['-A', dest], { encoding: 'utf8' })).toBe('ok\n');
  });

  it.skipIf(!isRoot)('leaves directories that were there as they were (a COPY --chown into /usr/local/bin never re-owns /usr)', async () => {
    mkdirSync(join(dest, 'usr', 'local'), { recursive: true, mode: 0o755 });
    execFileSync('chown', ['77:77', join(dest, 'usr')]);
    await extract(
      [
        { path: 'usr/', type: 'Directory', mode: 0o700 },
        { path: 'usr/local/', type: 'Directory', mode: 0o700 },
        { path: 'usr/local/bin/', type: 'Directory', mode: 0o755 },
        { path: 'usr/local/bin/tool', content: 'x', mode: 0o755 },
      ],
      { owner: { uid: 1000, gid: 1000 } },
    );
    expect([statSync(join(dest, 'usr')).uid, statSync(join(dest, 'usr')).mode & 0o777]).toEqual([77, 0o755]);
    expect(statSync(join(dest, 'usr/local')).mode & 0o777).toBe(0o755);
    expect(statSync(join(dest, 'usr/local/bin')).uid).toBe(1000);
    expect(statSync(join(dest, 'usr/local/bin/tool')).uid).toBe(1000);
  });

  it.skipIf(!isRoot)("keeps the archive's owners, or gives every entry the one asked for, and the mode asked for", async () => {
    await extract([
      { path: 'd/', type: 'Directory', uid: 1234, gid: 2345 },
      { path: 'd/f', content: 'x', uid: 1234, gid: 2345, mode: 0o4755 },
      { path: 'd/l', type: 'SymbolicLink', linkpath: '/nowhere', uid: 1234, gid: 2345 },
    ]);
    for (const name of ['d', 'd/f']) expect([statSync(join(dest, name)).uid, statSync(join(dest, name)).gid]).toEqual([1234, 2345]);
    expect(lstatSync(join(dest, 'd/l')).uid).toBe(1234);
    // Set-id bits survive the chown (it is done first).
    expect(statSync(join(dest, 'd/f')).mode & 0o7777).toBe(0o4755);

    rmSync(dest, { recursive: true });
    dest = join(dest, 'made', 'for', 'path');
    await extract(
      [
        { path: 'made/by/parents/f', content: 'x', uid: 5, gid: 5, mode: 0o600 },
        { path: 'l', type: 'SymbolicLink', linkpath: join(outside, 'secret') },
      ],
      { owner: { uid: 4321, gid: 8765 }, mode: 0o640 },
    );
    // destN was removed: destN, destN/made, destN/made/for and the path itself are made for it.
    for (const name of ['made', 'made/by', 'made/by/parents', 'made/by/parents/f', '.', '..', '../..', '../../..']) {
      expect([statSync(join(dest, name)).uid, statSync(join(dest, name)).gid], name).toEqual([4321, 8765]);
    }
    // The directory above the first one made for the path is left as it was.
    expect(statSync(join(dest, '../../../..')).uid).toBe(0);
    expect(statSync(join(dest, 'made/by/parents/f')).mode & 0o7777).toBe(0o640);
    expect(lstatSync(join(dest, 'l')).uid).toBe(4321);
    // The link's target is neither chowned nor chmodded.
    expect(statSync(join(outside, 'secret')).uid).toBe(0);
    expect(statSync(join(outside, 'secret')).mode & 0o777).toBe(0o644);
  });

  it('stops when the body breaks in the middle of a file, leaving no temp file behind', async () => {
    const whole = rawTar([
      { path: 'done', content: 'complete' },
      { path: 'cut', content: Buffer.alloc(200_000, 1) },
    ]);
    async function* broken(): AsyncGenerator<Buffer> {
      yield whole.subarray(0, 1024 + 512 + 50_000);
      // Broken once the file is being written (its temp file exists; bounded wait).
      for (let i = 0; i < 200 && !readdirSync(dest).some((name) => name.startsWith('.cut.')); i++) await new Promise((r) => setTimeout(r, 10));
      throw Object.assign(new Error('the client went away'), { code: 'ECONNRESET' });
    }
    const error = await extractArchive(Readable.from(broken()), dest).catch((e: unknown) => e);
    expect((error as Error).message).toBe('the client went away');
    // The file in flight is discarded once its write stops (bounded wait).
    for (let i = 0; i < 100 && execFileSync('ls', ['-A', dest], { encoding: 'utf8' }) !== 'done\n'; i++) await new Promise((r) => setTimeout(r, 20));
    expect(execFileSync('ls', ['-A', dest], { encoding: 'utf8' })).toBe('done\n');
  });

  it('answers a body that is not tar with a 400 naming body', async () => {
    const error = await refusal(Buffer.from('this is not a tar archive at all, just text\n'.repeat(40)));
    expect(error.status).toBe(400);
    expect(error.message).toMatch(/^body: not a valid tar archive/);
  });

  it.skipIf(!isRoot)('answers a full disk with 507 insufficient_storage', async () => {
    const small = join(work, 'small');
    mkdirSync(small);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=256k', 'tmpfs', small]);
    try {
      const error = await extractArchive(body(rawTar([{ path: 'big', content: Buffer.alloc(1024 * 1024, 7) }])), small).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(AgentHttpError);
      expect((error as AgentHttpError).status).toBe(507);
      expect((error as AgentHttpError).code).toBe('insufficient_storage');
      // The temp file of the entry in flight is gone.
      expect(execFileSync('ls', ['-A', small], { encoding: 'utf8' })).toBe('');
    } finally {
      execFileSync('umount', [small]);
    }
  });
});

describe('resolveArchiveOwner', () => {
  it('reads user[:group] names from the passwd and group files, or numeric ids', async () => {
    const passwd = join(work, 'passwd');
    writeFileSync(passwd, 'root:x:0:0:root:/root:/bin/sh\nalice:x:1500:1600:Alice:/home/alice:/bin/sh\n');
    expect(await resolveArchiveOwner('alice', passwd)).toEqual({ uid: 1500, gid: 1600 });
    expect(await resolveArchiveOwner('1500', passwd)).toEqual({ uid: 1500, gid: 1600 });
    expect(await resolveArchiveOwner('77', passwd)).toEqual({ uid: 77, gid: 77 });
    expect(await resolveArchiveOwner('alice:0', passwd)).toEqual({ uid: 1500, gid: 0 });
    expect(await resolveArchiveOwner(undefined, passwd)).toBeUndefined();
    const unknown = await resolveArchiveOwner('mallory', passwd).catch((e: unknown) => e);
    expect((unknown as AgentHttpError).message).toMatch(/^owner: no such user/);
    const bad = await resolveArchiveOwner('a:b:c', passwd).catch((e: unknown) => e);
    expect((bad as AgentHttpError).status).toBe(400);
  });
});
