import { mkdir, readFile, readdir, stat, writeFile } from 'node:fs/promises';
import { request } from 'node:http';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { UploadResponse } from '../agent-protocol/files.js';
import { daytonaDownloadParts } from '../../compat/daytona/download-parts.js';
import { filenameParameters } from './files-download.js';
import { call, daytonaUploadBody, multipartBody, parseMultipart, q } from './files-testing.js';
import { startTestAgent, type TestAgent } from './testing.js';

describe('multipart upload and download', () => {
  let agent: TestAgent;
  let client: AgentClient;

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  const upload = async (form: { body: Buffer; contentType: string }, query = '') => {
    // Chunked, like Daytona's SDK: no Content-Length, the body arrives as a stream.
    const response = await call(client, 'POST', `/files/upload${query}`, Readable.from(chunksOf(form.body, 7_000)), { 'content-type': form.contentType });
    return response;
  };

  describe('POST /files/upload', () => {
    it('writes 1,000 files from one Daytona-style request, all present with the right content', async () => {
      const files = Array.from({ length: 1000 }, (_, index) => ({ path: `bulk/dir${index % 10}/file${index}.txt`, data: `content of ${index}\n` }));
      const response = await upload(daytonaUploadBody(files));
      expect(response.status, response.raw.toString().slice(0, 300)).toBe(200);
      const { results } = UploadResponse.parse(response.json());
      expect(results).toHaveLength(1000);
      expect(results.every((result) => result.ok)).toBe(true);
      expect(results[987]).toEqual({ path: join(agent.home, 'bulk/dir7/file987.txt'), size: 'content of 987\n'.length, ok: true });
      for (let index = 0; index < 1000; index += 1) {
        expect(await readFile(join(agent.home, `bulk/dir${index % 10}/file${index}.txt`), 'utf8')).toBe(`content of ${index}\n`);
      }
      for (let dir = 0; dir < 10; dir++) {
        const names = await readdir(join(agent.home, `bulk/dir${dir}`));
        expect(names).toHaveLength(100);
        expect(names.filter((name) => name.endsWith('.tmp'))).toEqual([]);
      }
    });

    it('takes a non-ASCII destination path and an absolute one', async () => {
      const unicode = join(agent.home, 'ünïcødé/файл 文件.txt');
      const response = await upload(daytonaUploadBody([{ path: unicode, data: 'utf8 name\n' }, { path: 'relative/ok.bin', data: Buffer.from([0, 1, 2, 255]) }]));
      expect(response.status).toBe(200);
      expect(response.json().results[0]).toEqual({ path: unicode, size: 10, ok: true });
      expect(await readFile(unicode, 'utf8')).toBe('utf8 name\n');
      expect(await readFile(join(agent.home, 'relative/ok.bin'))).toEqual(Buffer.from([0, 1, 2, 255]));
    });

    // E2B's full-path filenames are compat/e2b's to translate (test/e2b-upload-form.test.ts):
    // the agent reads only the native forms, so a filename alone names no destination.
    it('takes the simple path + file form and ?path=, and never a filename as the path', async () => {
      const simple = await upload(multipartBody([{ field: 'path', value: 'simple/one.txt' }, { field: 'file', value: 'one', filename: 'whatever' }]));
      expect(simple.status).toBe(200);
      expect(await readFile(join(agent.home, 'simple/one.txt'), 'utf8')).toBe('one');

      const e2bPath = join(agent.home, 'e2b/a/b.txt');
      const filenameOnly = await upload(multipartBody([{ field: 'file', value: 'B', filename: e2bPath }]));
      expect(filenameOnly.status).toBe(207);
      expect(filenameOnly.json().results).toEqual([{ path: 'path', ok: false, error: { code: 'validation_failed', message: 'path: required before the file part' } }]);
      await expect(stat(e2bPath)).rejects.toThrow(/ENOENT/);

      const withQuery = await upload(multipartBody([{ field: 'file', value: 'Q', filename: 'b.txt' }]), `?${q({ path: 'e2b/from-query.txt' })}`);
      expect(withQuery.json().results).toEqual([{ path: join(agent.home, 'e2b/from-query.txt'), size: 1, ok: true }]);
    });

    it('keeps the mode of a replaced file and writes new files 0644', async () => {
      const path = join(agent.home, 'modes/script.sh');
      await mkdir(join(agent.home, 'modes'), { recursive: true });
      await writeFile(path, 'old', { mode: 0o755 });
      await upload(daytonaUploadBody([{ path, data: 'new' }, { path: 'modes/new.txt', data: 'n' }]));
      expect((await stat(path)).mode & 0o777).toBe(0o755);
      expect((await stat(join(agent.home, 'modes/new.txt'))).mode & 0o777).toBe(0o644);
      expect(await readFile(path, 'utf8')).toBe('new');
    });

    it('answers 207 with per-file errors when some files fail, and writes the rest', async () => {
      await writeFile(join(agent.home, 'a-file'), 'x');
      await mkdir(join(agent.home, 'a-directory'), { recursive: true });
      const form = multipartBody([
        { field: 'files[0].path', value: 'partial/good.txt' },
        { field: 'files[0].file', value: 'good', filename: 'x' },
        { field: 'files[1].path', value: 'a-file/below.txt' },
        { field: 'files[1].file', value: 'parent is a file', filename: 'x' },
        { field: 'files[2].file', value: 'no path field', filename: 'x' },
        { field: 'files[3].path', value: 'a-directory' },
        { field: 'files[3].file', value: 'onto a directory', filename: 'x' },
        { field: 'files[4].path', value: 'bad\0path' },
        { field: 'files[4].file', value: 'nul', filename: 'x' },
        { field: 'files[5].path', value: 'partial/also-good.txt' },
        { field: 'files[5].file', value: 'also good', filename: 'x' },
      ]);
      const response = await upload(form);
      expect(response.status).toBe(207);
      const { results } = UploadResponse.parse(response.json());
      expect(results.map((result) => result.ok)).toEqual([true, false, false, false, false, true]);
      const errors = results.map((result) => (result.ok ? undefined : result.error));
      expect(errors[1]?.message).toMatch(/^path: /);
      expect(errors[2]).toMatchObject({ code: 'validation_failed', message: expect.stringMatching(/^files\[2\]\.path: required/) });
      expect(errors[3]?.message).toMatch(/directory/);
      expect(errors[4]?.message).toMatch(/^files\[4\]\.path: .*NUL/);
      expect(await readFile(join(agent.home, 'partial/also-good.txt'), 'utf8')).toBe('also good');
      expect((await stat(join(agent.home, 'a-directory'))).isDirectory()).toBe(true);
    });

    it('rejects a body that is not multipart/form-data, malformed forms and empty forms', async () => {
      const json = await call(client, 'POST', '/files/upload', { files: [] });
      expect(json.status).toBe(400);
      expect(json.json().error.message).toMatch(/^content-type: /);
      const truncated = await call(client, 'POST', '/files/upload', Buffer.from('--b\r\nContent-Disposition: form-data; name="path"\r\n\r\nx'), {
        'content-type': 'multipart/form-data; boundary=b',
      });
      expect(truncated.status).toBe(400);
      expect(truncated.json().error.message).toMatch(/^body: malformed/);
      const empty = await upload(multipartBody([{ field: 'path', value: 'nothing' }]));
      expect(empty.status).toBe(400);
      expect(empty.json().error.message).toMatch(/^body: no file parts/);
    });

    it('answers 413 above the configured limit, declared or streamed, and keeps no partial file', async () => {
      const limited = await startTestAgent({ maxUploadBytes: 64 * 1024 });
      const limitedClient = new AgentClient(limited.socketPath);
      try {
        const small = daytonaUploadBody([{ path: 'fits.txt', data: 'x'.repeat(1000) }]);
        expect((await call(limitedClient, 'POST', '/files/upload', small.body, { 'content-type': small.contentType })).status).toBe(200);

        const big = daytonaUploadBody([{ path: 'too-big.bin', data: Buffer.alloc(1024 * 1024, 7) }]);
        // Declared: Content-Length is known up front.
        const declared = await call(limitedClient, 'POST', '/files/upload', big.body, { 'content-type': big.contentType });
        expect(declared.status).toBe(413);
        expect(declared.json().error).toMatchObject({ code: 'payload_too_large', message: expect.stringMatching(/^body: .*65536 bytes/) });

        // Streamed: chunked, so the limit is only noticed while reading.
        const streamed = await postChunked(limited.socketPath, '/files/upload', big.contentType, chunksOf(big.body, 16 * 1024));
        expect(streamed.status).toBe(413);
        expect(JSON.parse(streamed.body).error.code).toBe('payload_too_large');
        const names = await readdir(limited.home);
        expect(names.sort()).toEqual(['fits.txt']);
        expect((await limitedClient.health()).status).toBe('ok');
      } finally {
        limitedClient.close();
        await limited.stop();
      }
    });
  });

  describe('POST /files/download', () => {
    beforeAll(async () => {
      await mkdir(join(agent.home, 'dl'), { recursive: true });
      await writeFile(join(agent.home, 'dl/one.txt'), 'first file');
      await writeFile(join(agent.home, 'dl/empty.txt'), '');
      await writeFile(join(agent.home, 'dl/ünï файл.txt'), 'unicode body');
      await writeFile(join(agent.home, 'dl/binary.bin'), Buffer.from([0, 13, 10, 45, 45, 255]));
    });

    it('streams one part per path in order, with an error part for a missing file and a directory', async () => {
      const requested = [join(agent.home, 'dl/one.txt'), 'dl/missing.txt', join(agent.home, 'dl/ünï файл.txt'), 'dl/empty.txt', 'dl', 'dl/binary.bin'];
      const response = await call(client, 'POST', '/files/download', { paths: requested });
      expect(response.status).toBe(200);
      expect(response.headers['content-type']).toMatch(/^multipart\/form-data; boundary=nestbox-[0-9a-f]{32}$/);
      expect(response.headers['content-length']).toBeUndefined();
      const parts = await parseMultipart(response.raw, response.headers['content-type']!);
      expect(parts.map((part) => [part.name, part.filename])).toEqual([
        ['file', requested[0]],
        ['error', 'dl/missing.txt'],
        ['file', requested[2]],
        ['file', 'dl/empty.txt'],
        ['error', 'dl'],
        ['file', 'dl/binary.bin'],
      ]);
      expect(parts[0].data.toString()).toBe('first file');
      expect(parts[0].contentType).toBe('application/octet-stream');
      expect(parts[1].contentType).toBe('application/json');
      expect(JSON.parse(parts[1].data.toString())).toEqual({
        error: { code: 'not_found', message: expect.stringContaining('dl/missing.txt'), status: 404 },
      });
      expect(parts[2].data.toString()).toBe('unicode body');
      expect(parts[3].data.length).toBe(0);
      expect(JSON.parse(parts[4].data.toString()).error).toMatchObject({ code: 'validation_failed', status: 400 });
      expect(parts[5].data).toEqual(Buffer.from([0, 13, 10, 45, 45, 255]));

      // The raw framing: Content-Length per file part, filename* for the non-ASCII path.
      const text = response.raw.toString('latin1');
      expect(text).toContain(`Content-Disposition: form-data; name="file"; filename="${requested[0]}"\r\nContent-Type: application/octet-stream\r\nContent-Length: 10\r\n`);
      expect(text).toContain(`filename*=utf-8''${encodeURIComponent(requested[2])}`);
    });

    // Daytona's daemon shape is compat/daytona's translation of these parts now (the guest
    // speaks only the native contract): the same answer through that rewrite.
    it('writes error parts that compat/daytona turns into Daytona’s daemon shape', async () => {
      const response = await call(client, 'POST', '/files/download', { paths: ['dl/missing.txt', 'dl', 'dl/one.txt'] });
      const chunks: Buffer[] = [];
      for await (const chunk of Readable.from([response.raw]).pipe(daytonaDownloadParts(response.headers['content-type']))) chunks.push(chunk as Buffer);
      const parts = await parseMultipart(Buffer.concat(chunks), response.headers['content-type']!);
      expect(parts.map((part) => part.name)).toEqual(['error', 'error', 'file']);
      expect(JSON.parse(parts[0].data.toString())).toEqual({
        message: expect.stringContaining('dl/missing.txt'),
        statusCode: 404,
        code: 'FILE_NOT_FOUND',
        source: 'DAYTONA_DAEMON',
      });
      expect(JSON.parse(parts[1].data.toString())).toMatchObject({ statusCode: 400, code: 'INVALID_FILE_PATH' });
      const bad = await call(client, 'POST', '/files/download', { paths: ['x'], errorStyle: 'daytona' });
      expect(bad.status).toBe(400);
      expect(bad.json().error.message).toMatch(/errorStyle/);
    });

    it('builds filename parameters: plain ASCII as is, anything else with a fallback and filename*', () => {
      expect(filenameParameters('/tmp/a b.txt')).toBe('filename="/tmp/a b.txt"');
      expect(filenameParameters('/tmp/ü.txt')).toBe(`filename="/tmp/_.txt"; filename*=utf-8''%2Ftmp%2F%C3%BC.txt`);
      expect(filenameParameters('/tmp/"q".txt')).toBe(`filename="/tmp/_q_.txt"; filename*=utf-8''%2Ftmp%2F%22q%22.txt`);
      expect(filenameParameters("it's(1).txt")).toBe(`filename="it's(1).txt"`);
      expect(filenameParameters('new\nline')).toBe(`filename="new_line"; filename*=utf-8''new%0Aline`);
    });

    it('validates the request', async () => {
      const empty = await call(client, 'POST', '/files/download', { paths: [] });
      expect(empty.status).toBe(400);
      expect(empty.json().error.message).toMatch(/^paths: /);
      const nul = await call(client, 'POST', '/files/download', { paths: ['a\0b'] });
      const parts = await parseMultipart(nul.raw, nul.headers['content-type']!);
      expect(JSON.parse(parts[0].data.toString()).error.message).toMatch(/^paths\[0\]: .*NUL/);
    });
  });
});

function chunksOf(buffer: Buffer, size: number): Buffer[] {
  const chunks: Buffer[] = [];
  for (let offset = 0; offset < buffer.length; offset += size) chunks.push(buffer.subarray(offset, offset + size));
  return chunks;
}

/** Posts a chunked body, tolerating the server closing early (as it does after a 413). */
function postChunked(socketPath: string, path: string, contentType: string, chunks: Buffer[]): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, method: 'POST', path, headers: { 'content-type': contentType, 'transfer-encoding': 'chunked' } });
    req.on('response', (response) => {
      const parts: Buffer[] = [];
      response.on('data', (chunk: Buffer) => parts.push(chunk));
      response.on('end', () => resolve({ status: response.statusCode ?? 0, body: Buffer.concat(parts).toString() }));
      response.on('error', reject);
    });
    req.on('error', reject);
    let index = 0;
    const writeNext = (): void => {
      while (index < chunks.length) {
        if (req.destroyed) return;
        if (!req.write(chunks[index++])) {
          req.once('drain', writeNext);
          return;
        }
      }
      req.end();
    };
    writeNext();
  });
}
