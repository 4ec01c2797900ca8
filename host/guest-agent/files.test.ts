import { mkdir, readdir, readFile, stat, symlink, writeFile } from 'node:fs/promises';
import { request, type IncomingMessage } from 'node:http';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, AgentRequestError } from '../agent-protocol/client.js';
import { startTestAgent, type TestAgent } from './testing.js';

async function bodyOf(response: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

async function rejection(promise: Promise<unknown>): Promise<AgentRequestError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof AgentRequestError) return error;
    throw error;
  }
  throw new Error('expected the call to fail');
}

describe('file routes', () => {
  let agent: TestAgent;
  let client: AgentClient;

  async function call(method: string, path: string, headers: Record<string, string> = {}, body?: string) {
    const response = await client.request({ method, path, headers, body });
    const raw = await bodyOf(response);
    return { status: response.statusCode ?? 0, headers: response.headers, raw, json: () => JSON.parse(raw.toString('utf8')) };
  }

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  describe('PUT /files/content', () => {
    it('creates parents, applies the mode and answers FileInfo', async () => {
      const target = join(agent.home, 'deep/er/script.sh');
      const info = await client.writeFile(target, Readable.from([Buffer.from('#!/bin/sh\n'), Buffer.from('echo hi\n')]), { mode: '0755' });
      expect(info).toMatchObject({ name: 'script.sh', path: target, type: 'file', size: 18, mode: 0o755 });
      expect(Date.parse(info.mtime)).not.toBeNaN();
      expect(await readFile(target, 'utf8')).toBe('#!/bin/sh\necho hi\n');
      expect((await stat(target)).mode & 0o777).toBe(0o755);
    });

    it('resolves a relative path against home', async () => {
      const info = await client.writeFile('relative.txt', Readable.from([Buffer.from('r')]));
      expect(info.path).toBe(join(agent.home, 'relative.txt'));
      expect(await readFile(join(agent.home, 'relative.txt'), 'utf8')).toBe('r');
    });

    it('defaults to 0644 for new files and keeps the mode of a replaced file', async () => {
      const target = join(agent.home, 'modes.txt');
      expect((await client.writeFile(target, Readable.from([Buffer.from('1')]))).mode).toBe(0o644);
      await client.writeFile(target, Readable.from([Buffer.from('2')]), { mode: 0o600 });
      const replaced = await client.writeFile(target, Readable.from([Buffer.from('3')]));
      expect(replaced.mode).toBe(0o600);
      expect(await readFile(target, 'utf8')).toBe('3');
    });

    it('writes an empty body as an empty file', async () => {
      const info = await client.writeFile('empty.txt', Readable.from([]));
      expect(info.size).toBe(0);
    });

    it('writes through a symlink to its target', async () => {
      await writeFile(join(agent.home, 'real.txt'), 'old');
      await symlink('real.txt', join(agent.home, 'link-to-real'));
      await client.writeFile('link-to-real', Readable.from([Buffer.from('new')]));
      expect(await readFile(join(agent.home, 'real.txt'), 'utf8')).toBe('new');
      expect((await client.stat('link-to-real')).type).toBe('symlink');
    });

    it('rejects a bad mode naming mode, and writes nothing', async () => {
      const { status, json } = await call('PUT', `/files/content?path=badmode.txt&mode=999`, {}, 'x');
      expect(status).toBe(400);
      expect(json().error).toMatchObject({ code: 'validation_failed', message: expect.stringMatching(/^mode: /) });
      await expect(stat(join(agent.home, 'badmode.txt'))).rejects.toThrow();
    });

    it('rejects writing onto a directory', async () => {
      await mkdir(join(agent.home, 'a-dir'), { recursive: true });
      const error = await rejection(client.writeFile('a-dir', Readable.from([Buffer.from('x')])));
      expect(error.status).toBe(400);
      expect(error.code).toBe('validation_failed');
      expect(error.message).toMatch(/^path: path is a directory/);
      expect((await stat(join(agent.home, 'a-dir'))).isDirectory()).toBe(true);
    });

    it('rejects a parent that is a file with 400, not 500', async () => {
      await writeFile(join(agent.home, 'plain-file'), 'x');
      const error = await rejection(client.writeFile('plain-file/child.txt', Readable.from([Buffer.from('x')])));
      expect(error.status).toBe(400);
      expect(error.message).toMatch(/^path: /);
    });

    it('leaves the target untouched and no temp file when the upload is aborted', async () => {
      const target = join(agent.home, 'uploads/precious.bin');
      await mkdir(join(agent.home, 'uploads'), { recursive: true });
      await writeFile(target, 'original content');
      const req = request({
        socketPath: agent.socketPath,
        method: 'PUT',
        path: `/files/content?path=${encodeURIComponent(target)}`,
        headers: { 'content-length': String(10 * 1024 * 1024) },
      });
      req.on('error', () => {});
      req.write(Buffer.alloc(256 * 1024, 1));
      const tempName = async () => (await readdir(join(agent.home, 'uploads'))).find((name) => name.endsWith('.tmp'));
      for (let attempt = 0; attempt < 200 && !(await tempName()); attempt++) await sleep(10);
      expect(await tempName()).toBeDefined();
      req.destroy();
      for (let attempt = 0; attempt < 200 && (await tempName()); attempt++) await sleep(10);
      expect(await readdir(join(agent.home, 'uploads'))).toEqual(['precious.bin']);
      expect(await readFile(target, 'utf8')).toBe('original content');
      // The agent is still serving.
      expect((await client.health()).status).toBe('ok');
    });
  });

  describe('GET /files/content', () => {
    const alphabet = 'abcdefghijklmnopqrstuvwxyz';

    beforeAll(async () => {
      await writeFile(join(agent.home, 'alphabet.txt'), alphabet);
    });

    it('streams the whole file with Content-Length and octet-stream', async () => {
      const { status, headers, raw } = await call('GET', '/files/content?path=alphabet.txt');
      expect(status).toBe(200);
      expect(headers['content-type']).toBe('application/octet-stream');
      expect(headers['content-length']).toBe('26');
      expect(raw.toString()).toBe(alphabet);
    });

    it('serves an empty file', async () => {
      await writeFile(join(agent.home, 'zero.txt'), '');
      const { status, headers, raw } = await call('GET', '/files/content?path=zero.txt');
      expect(status).toBe(200);
      expect(headers['content-length']).toBe('0');
      expect(raw.length).toBe(0);
    });

    it('streams a file whose size is not known in advance (procfs) until EOF, without Content-Length', async () => {
      // st_size is 0 for /proc files, 4096 for sysfs attributes: neither says what a read gives.
      const { status, headers, raw } = await call('GET', '/files/content?path=/proc/self/status');
      expect(status).toBe(200);
      expect(headers['content-length']).toBeUndefined();
      expect(headers['transfer-encoding']).toBe('chunked');
      expect(raw.toString()).toMatch(/^Name:/m);
      expect(raw.toString()).toMatch(/^Pid:\s+\d+/m);
      const cpuinfo = await call('GET', '/files/content?path=/proc/cpuinfo', { range: 'bytes=0-3' });
      // A Range has no size to resolve against: the whole file.
      expect(cpuinfo.status).toBe(200);
      expect(cpuinfo.raw.toString()).toMatch(/^processor/m);
    });

    it('puts a file of unknown size into a multipart download with its real length', async () => {
      const response = await client.request({ method: 'POST', path: '/files/download', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ paths: ['/proc/self/status', 'alphabet.txt'] }) });
      const text = (await bodyOf(response)).toString();
      const parts = text.split(/--nestbox-[0-9a-f]+/).filter((p) => p.includes('Content-Disposition'));
      expect(parts).toHaveLength(2);
      const [statusHead, statusBody] = parts[0].split('\r\n\r\n');
      const declared = Number(/Content-Length: (\d+)/.exec(statusHead)?.[1]);
      expect(declared).toBeGreaterThan(0);
      expect(statusBody.slice(0, declared)).toMatch(/^Name:/);
      expect(parts[1]).toContain(alphabet);
    });

    it.each([
      ['bytes=2-5', 'cdef', 'bytes 2-5/26'],
      ['bytes=20-', 'uvwxyz', 'bytes 20-25/26'],
      ['bytes=-3', 'xyz', 'bytes 23-25/26'],
      ['bytes=24-100', 'yz', 'bytes 24-25/26'],
    ])('answers Range %s with 206 and the right slice', async (range, expected, contentRange) => {
      const { status, headers, raw } = await call('GET', '/files/content?path=alphabet.txt', { range });
      expect(status).toBe(206);
      expect(headers['content-range']).toBe(contentRange);
      expect(headers['content-length']).toBe(String(expected.length));
      expect(raw.toString()).toBe(expected);
    });

    it('reads a range through the client helper', async () => {
      const response = await client.readFile('alphabet.txt', { range: { start: 1, end: 2 } });
      expect(response.statusCode).toBe(206);
      expect((await bodyOf(response)).toString()).toBe('bc');
    });

    it('answers an unsatisfiable range with 416 and the size', async () => {
      const { status, headers, json } = await call('GET', '/files/content?path=alphabet.txt', { range: 'bytes=26-30' });
      expect(status).toBe(416);
      expect(headers['content-range']).toBe('bytes */26');
      expect(json().error.message).toMatch(/26 bytes/);
    });

    it('ignores a multi-range header and answers the whole file', async () => {
      const { status, raw } = await call('GET', '/files/content?path=alphabet.txt', { range: 'bytes=0-1,3-4' });
      expect(status).toBe(200);
      expect(raw.toString()).toBe(alphabet);
    });

    it('answers 404 not_found for a missing file', async () => {
      const error = await rejection(client.readFile('missing.txt'));
      expect(error).toMatchObject({ status: 404, code: 'not_found' });
      expect(error.message).toContain(join(agent.home, 'missing.txt'));
    });

    it('answers 400 for a directory', async () => {
      const error = await rejection(client.readFile(agent.home));
      expect(error).toMatchObject({ status: 400, code: 'validation_failed' });
      expect(error.message).toBe(`path: path is a directory: ${agent.home}`);
    });

    it('answers 400 instead of blocking on a FIFO', async () => {
      await client.exec({ argv: ['mkfifo', join(agent.home, 'a-fifo')] });
      const error = await rejection(client.readFile('a-fifo'));
      expect(error).toMatchObject({ status: 400, code: 'validation_failed' });
      expect(error.message).toMatch(/not a regular file/);
    });
  });

  describe('GET /files/list', () => {
    beforeAll(async () => {
      const dir = join(agent.home, 'listing');
      await mkdir(join(dir, 'b-dir'), { recursive: true });
      await writeFile(join(dir, 'c.txt'), 'ccc');
      await writeFile(join(dir, 'A.txt'), 'a');
      await symlink('c.txt', join(dir, 'a-link'));
      await symlink('/nowhere/at/all', join(dir, 'dangling'));
    });

    it('lists entries sorted by name with lstat information', async () => {
      const { entries } = await client.list('listing');
      expect(entries.map((entry) => entry.name)).toEqual(['A.txt', 'a-link', 'b-dir', 'c.txt', 'dangling']);
      const byName = Object.fromEntries(entries.map((entry) => [entry.name, entry]));
      expect(byName['c.txt']).toMatchObject({ type: 'file', size: 3, path: join(agent.home, 'listing/c.txt') });
      expect(byName['b-dir'].type).toBe('dir');
      expect(byName['a-link']).toMatchObject({ type: 'symlink', symlinkTarget: 'c.txt' });
      // Where it leads: the absolute path after every link, and what is there.
      expect(byName['a-link'].symlinkResolved).toEqual({ path: join(agent.home, 'listing/c.txt'), type: 'file', mode: byName['c.txt'].mode });
      expect(byName.dangling).toMatchObject({ type: 'symlink', symlinkTarget: '/nowhere/at/all' });
      expect(byName.dangling.symlinkResolved).toBeUndefined();
      expect(byName['c.txt'].symlinkTarget).toBeUndefined();
      expect(byName['c.txt'].symlinkResolved).toBeUndefined();
    });

    it('lists home when no path is given', async () => {
      const { entries } = await client.list();
      expect(entries.map((entry) => entry.name)).toContain('listing');
    });

    it('answers 400 for a file and 404 for a missing directory', async () => {
      expect(await rejection(client.list('listing/c.txt'))).toMatchObject({ status: 400, code: 'validation_failed' });
      expect(await rejection(client.list('no-such-dir'))).toMatchObject({ status: 404, code: 'not_found' });
    });
  });

  describe('GET /files/stat', () => {
    it('describes a file', async () => {
      await writeFile(join(agent.home, 'stat-me.txt'), 'hello');
      const info = await client.stat('stat-me.txt');
      expect(info).toMatchObject({ name: 'stat-me.txt', path: join(agent.home, 'stat-me.txt'), type: 'file', size: 5 });
    });

    it('describes a symlink itself rather than its target', async () => {
      await symlink('stat-me.txt', join(agent.home, 'stat-link'));
      await symlink('stat-link', join(agent.home, 'stat-link-2'));
      await symlink('.', join(agent.home, 'stat-dir-link'));
      expect(await client.stat('stat-link')).toMatchObject({ type: 'symlink', symlinkTarget: 'stat-me.txt' });
      // A chain of links resolves to its end; a link to a directory says so.
      expect(await client.stat('stat-link-2')).toMatchObject({ symlinkTarget: 'stat-link', symlinkResolved: { path: join(agent.home, 'stat-me.txt'), type: 'file' } });
      expect((await client.stat('stat-dir-link')).symlinkResolved).toMatchObject({ path: agent.home, type: 'dir' });
    });

    it('describes the root as "/"', async () => {
      expect(await client.stat('/')).toMatchObject({ name: '/', path: '/', type: 'dir' });
    });

    it('answers 404 for a missing path', async () => {
      expect(await rejection(client.stat('nope'))).toMatchObject({ status: 404, code: 'not_found' });
    });
  });

  describe('path validation', () => {
    it.each([
      ['GET', '/files/content'],
      ['PUT', '/files/content'],
      ['GET', '/files/stat'],
      ['GET', '/files/content?path='],
    ])('%s %s without a path is 400 naming path', async (method, path) => {
      const { status, json } = await call(method, path);
      expect(status).toBe(400);
      expect(json().error).toMatchObject({ code: 'validation_failed', message: 'path: required' });
    });

    it.each([
      ['GET', '/files/content?path=a%00b'],
      ['PUT', '/files/content?path=a%00b'],
      ['GET', '/files/list?path=a%00b'],
      ['GET', '/files/stat?path=a%00b'],
    ])('%s %s with a NUL byte is 400 naming path', async (method, path) => {
      const { status, json } = await call(method, path);
      expect(status).toBe(400);
      expect(json().error.message).toMatch(/^path: .*NUL/);
    });
  });
});
