// The full file API through the native API, on the real local driver.
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { readEvents, startTestServer, waitFor, type TestServer } from './harness.js';

let t: TestServer;
let id: string;

beforeAll(async () => {
  // A small upload limit so the 413 paths can be tested without moving gigabytes.
  t = await startTestServer({ env: { NESTBOX_MAX_UPLOAD_BYTES: String(4 * 1024 * 1024) } });
  const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0 });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  id = created.body.id;
});
afterAll(async () => {
  await t?.close();
});

const api = () => `/api/v1/sandboxes/${id}`;
const sh = async (cmd: string) => (await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd })).body as { stdout: string; exitCode: number };
const put = (path: string, data: string | Buffer) =>
  t.http.put(`${api()}/files`).query({ path }).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from(data));

/** A minimal multipart/form-data reader for test assertions (parts are small here). */
function parseMultipart(body: Buffer, contentType: string): { name: string; filename: string; headers: string; data: Buffer }[] {
  const boundary = /boundary=(?:"([^"]+)"|([^;]+))/.exec(contentType)!;
  const delimiter = Buffer.from(`--${boundary[1] ?? boundary[2]}`);
  const parts: { name: string; filename: string; headers: string; data: Buffer }[] = [];
  let at = body.indexOf(delimiter);
  while (at !== -1) {
    const start = at + delimiter.length;
    if (body.subarray(start, start + 2).toString() === '--') break;
    const headerEnd = body.indexOf('\r\n\r\n', start);
    const next = body.indexOf(delimiter, headerEnd);
    const headers = body.subarray(start + 2, headerEnd).toString('latin1');
    const data = body.subarray(headerEnd + 4, next - 2);
    const name = /name="([^"]*)"/.exec(headers)?.[1] ?? '';
    const star = /filename\*=utf-8''([^;\r\n]+)/i.exec(headers);
    const filename = star ? decodeURIComponent(star[1]) : (/filename="([^"]*)"/.exec(headers)?.[1] ?? '');
    parts.push({ name, filename, headers, data });
    at = next;
  }
  return parts;
}

function multipartBody(files: { path: string; data: Buffer }[]): { body: Buffer; contentType: string } {
  const boundary = `nbx${randomBytes(8).toString('hex')}`;
  const chunks: Buffer[] = [];
  files.forEach((f, i) => {
    chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[${i}].path"\r\n\r\n${f.path}\r\n`));
    chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[${i}].file"; filename="x"\r\nContent-Type: application/octet-stream\r\n\r\n`));
    chunks.push(f.data, Buffer.from('\r\n'));
  });
  chunks.push(Buffer.from(`--${boundary}--\r\n`));
  return { body: Buffer.concat(chunks), contentType: `multipart/form-data; boundary=${boundary}` };
}

describe('file operations', () => {
  it('mkdir -p, stat with owner and group, move, chmod, chown, delete', async () => {
    const mk = await t.http.post(`${api()}/files/mkdir`).set(t.auth).send({ path: '/work/a/b/c', mode: '750' });
    expect(mk.status).toBe(201);
    expect(mk.body).toMatchObject({ path: '/work/a/b/c', type: 'dir', owner: 'root', group: 'root' });
    expect((await t.http.post(`${api()}/files/mkdir`).set(t.auth).send({ path: '/work/a/b/c' })).status).toBe(200);
    await put('/work/a/file.txt', 'content');
    expect((await t.http.post(`${api()}/files/mkdir`).set(t.auth).send({ path: '/work/a/file.txt' })).status).toBe(409);

    const moved = await t.http.post(`${api()}/files/move`).set(t.auth).send({ from: '/work/a/file.txt', to: '/work/moved/renamed.txt' });
    expect(moved.status).toBe(200);
    await put('/work/a/other.txt', 'other');
    expect((await t.http.post(`${api()}/files/move`).set(t.auth).send({ from: '/work/a/other.txt', to: '/work/moved/renamed.txt' })).status).toBe(409);
    expect((await t.http.post(`${api()}/files/move`).set(t.auth).send({ from: '/work/a/other.txt', to: '/work/moved/renamed.txt', overwrite: true })).status).toBe(200);
    expect((await sh('cat /work/moved/renamed.txt')).stdout).toBe('other');

    const chmod = await t.http.post(`${api()}/files/chmod`).set(t.auth).send({ path: '/work/moved/renamed.txt', mode: '600' });
    expect(chmod.body.mode).toBe(0o600);
    const chown = await t.http.post(`${api()}/files/chown`).set(t.auth).send({ path: '/work/moved/renamed.txt', owner: 'nobody', group: 65534 });
    expect(chown.status, JSON.stringify(chown.body)).toBe(200);
    expect(chown.body).toMatchObject({ owner: 'nobody', uid: 65534, gid: 65534 });
    expect((await sh('stat -c "%U %a" /work/moved/renamed.txt')).stdout).toBe('nobody 600\n');
    const unknown = await t.http.post(`${api()}/files/chown`).set(t.auth).send({ path: '/work/moved/renamed.txt', owner: 'no-such-user' });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error.message).toMatch(/^owner/);

    const stat = await t.http.get(`${api()}/files/stat`).query({ path: '/work/moved/renamed.txt' }).set(t.auth);
    expect(stat.body).toMatchObject({ name: 'renamed.txt', type: 'file', size: 5, owner: 'nobody' });

    expect((await t.http.delete(`${api()}/files`).query({ path: '/work/a' }).set(t.auth)).status).toBe(400);
    expect((await t.http.delete(`${api()}/files`).query({ path: '/work/a', recursive: true }).set(t.auth)).status).toBe(204);
    expect((await sh('test -e /work/a && echo yes || echo no')).stdout).toBe('no\n');
    expect((await t.http.delete(`${api()}/files`).query({ path: '/work/a' }).set(t.auth)).status).toBe(404);
  });

  it('lists with depth, finds by glob, searches contents and replaces text', async () => {
    await sh('mkdir -p /proj/src/lib /proj/docs && echo "const a = 1; // TODO" > /proj/src/main.ts && echo "todo later" > /proj/src/lib/util.ts && echo "# TODO docs" > /proj/docs/readme.md && printf "bin\\0TODO" > /proj/src/blob.bin');
    const depth1 = await t.http.get(`${api()}/files/list`).query({ path: '/proj' }).set(t.auth);
    expect(depth1.body.entries.map((e: { path: string }) => e.path)).toEqual(['/proj/docs', '/proj/src']);
    const depth3 = await t.http.get(`${api()}/files/list`).query({ path: '/proj', depth: 3 }).set(t.auth);
    expect(depth3.body.entries.map((e: { path: string }) => e.path)).toContain('/proj/src/lib/util.ts');

    const byName = await t.http.get(`${api()}/files/find`).query({ path: '/proj', pattern: '*.ts' }).set(t.auth);
    expect(byName.body.paths.sort()).toEqual(['/proj/src/lib/util.ts', '/proj/src/main.ts']);
    const byPath = await t.http.get(`${api()}/files/find`).query({ path: '/proj', pattern: 'src/**/*.ts' }).set(t.auth);
    expect(byPath.body.paths.sort()).toEqual(['/proj/src/lib/util.ts', '/proj/src/main.ts']);

    const search = await t.http.get(`${api()}/files/search`).query({ path: '/proj', query: 'TODO' }).set(t.auth);
    expect(search.body.matches.map((m: { path: string; line: number }) => `${m.path}:${m.line}`).sort()).toEqual(['/proj/docs/readme.md:1', '/proj/src/main.ts:1']);
    const ci = await t.http.get(`${api()}/files/search`).query({ path: '/proj', query: 'todo', caseSensitive: false, glob: '*.ts' }).set(t.auth);
    expect(ci.body.matches.map((m: { path: string }) => m.path).sort()).toEqual(['/proj/src/lib/util.ts', '/proj/src/main.ts']);
    const re = await t.http.get(`${api()}/files/search`).query({ path: '/proj', query: 'const [a-z] =', regex: true }).set(t.auth);
    expect(re.body.matches).toEqual([expect.objectContaining({ path: '/proj/src/main.ts', line: 1, column: 1 })]);

    const replaced = await t.http.post(`${api()}/files/replace`).set(t.auth).send({ paths: ['/proj/src/main.ts', '/proj/docs/readme.md', '/proj/missing.txt'], find: 'TODO', replace: 'DONE' });
    expect(replaced.status).toBe(200);
    const byFile = Object.fromEntries(replaced.body.results.map((r: { path: string }) => [r.path, r]));
    expect(byFile['/proj/src/main.ts'].replacements).toBe(1);
    expect(byFile['/proj/missing.txt'].error.code).toBe('not_found');
    expect((await sh('cat /proj/src/main.ts /proj/docs/readme.md')).stdout).toBe('const a = 1; // DONE\n# DONE docs\n');
  });

  it('reads a symlink to /etc/shadow as the sandbox’s own file, never the host’s', async () => {
    await sh('ln -sf /etc/shadow /tmp/shadow-link');
    const res = await t.http.get(`${api()}/files`).query({ path: '/tmp/shadow-link' }).set(t.auth).buffer(true).parse((r, cb) => {
      const chunks: Buffer[] = [];
      r.on('data', (c: Buffer) => chunks.push(c));
      r.on('end', () => cb(null, Buffer.concat(chunks)));
    });
    expect(res.status).toBe(200);
    const inside = (await sh('cat /etc/shadow')).stdout;
    expect((res.body as Buffer).toString()).toBe(inside);
    expect((res.body as Buffer).toString()).not.toBe(readFileSync('/etc/shadow', 'utf8'));
  });
});

describe('many files in one request', () => {
  it('uploads 1,000 files in one multipart request, with a non-ASCII path', async () => {
    const files = Array.from({ length: 1000 }, (_, i) => ({ path: `/bulk/dir${i % 10}/file${i}.txt`, data: Buffer.from(`content ${i}\n`) }));
    files.push({ path: '/bulk/ünïcødé файл.txt', data: Buffer.from('utf8 name\n') });
    const { body, contentType } = multipartBody(files);
    const res = await t.http.post(`${api()}/files/upload`).set(t.auth).set('content-type', contentType).send(body);
    expect(res.status, JSON.stringify(res.body).slice(0, 300)).toBe(200);
    expect(res.body.results).toHaveLength(1001);
    expect(res.body.results.every((r: { ok: boolean }) => r.ok)).toBe(true);
    expect((await sh('find /bulk -type f | wc -l; cat /bulk/dir7/file987.txt; cat "/bulk/ünïcødé файл.txt"')).stdout).toBe('1001\ncontent 987\nutf8 name\n');
  });

  it('downloads several paths as multipart with an error part for the missing one', async () => {
    const res = await t.http
      .post(`${api()}/files/download`)
      .set(t.auth)
      .send({ paths: ['/bulk/dir1/file1.txt', '/nope/missing', '/bulk/ünïcødé файл.txt'] })
      .buffer(true)
      .parse((r, cb) => {
        const chunks: Buffer[] = [];
        r.on('data', (c: Buffer) => chunks.push(c));
        r.on('end', () => cb(null, Buffer.concat(chunks)));
      });
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toMatch(/^multipart\/form-data; boundary=/);
    const parts = parseMultipart(res.body as Buffer, res.headers['content-type']);
    expect(parts.map((p) => [p.name, p.filename])).toEqual([
      ['file', '/bulk/dir1/file1.txt'],
      ['error', '/nope/missing'],
      ['file', '/bulk/ünïcødé файл.txt'],
    ]);
    expect(parts[0].data.toString()).toBe('content 1\n');
    expect(JSON.parse(parts[1].data.toString()).error.code).toBe('not_found');
    expect(parts[2].data.toString()).toBe('utf8 name\n');
  });

  it('refuses bodies above the configured limit with 413, declared or streamed', async () => {
    const big = Buffer.alloc(5 * 1024 * 1024, 1);
    const declared = await put('/tmp/too-big', big);
    expect(declared.status).toBe(413);
    expect(declared.body.error.code).toBe('payload_too_large');
    const { body, contentType } = multipartBody([{ path: '/tmp/too-big-multi', data: big }]);
    const multi = await t.http.post(`${api()}/files/upload`).set(t.auth).set('content-type', contentType).send(body);
    expect(multi.status).toBe(413);
    expect((await sh('ls /tmp/too-big /tmp/too-big-multi 2>&1 | grep -c "No such"')).stdout).toBe('2\n');
  });
});

describe('watch', () => {
  it('streams create, write, rename, chmod and remove events over SSE', async () => {
    await sh('mkdir -p /watched');
    const url = `${t.url}${api()}/files/watch?path=/watched&recursive=true`;
    const seen = readEvents<{ type: string; path?: string }>(url, t.auth, (_e, all) => all.some((e) => e.type === 'remove' && e.path === '/watched/renamed.txt'), 30_000);
    // Act only once the watch is in place.
    await waitFor('ready', async () => {
      const probe = await readEvents<{ type: string }>(url, t.auth, (e) => e.type === 'ready', 5_000).catch(() => []);
      return probe.length ? true : undefined;
    }, 15_000);
    await new Promise((r) => setTimeout(r, 300));
    await sh('echo one > /watched/new.txt && sleep 0.2 && echo two >> /watched/new.txt && sleep 0.2 && mv /watched/new.txt /watched/renamed.txt && sleep 0.2 && chmod 600 /watched/renamed.txt && sleep 0.2 && rm /watched/renamed.txt');
    const events = await seen;
    const kinds = events.filter((e) => e.type !== 'ready' && e.type !== 'keepalive').map((e) => e.type);
    for (const kind of ['create', 'write', 'rename', 'chmod', 'remove']) expect(kinds, JSON.stringify(events)).toContain(kind);
  });

  it('delivers events over a WebSocket and through a polling watcher', async () => {
    await sh('mkdir -p /watched2');
    const ws = new WebSocket(`${t.url.replace('http', 'ws')}${api()}/files/watch?path=/watched2`, { headers: t.auth });
    const messages: { type: string; path?: string }[] = [];
    ws.on('message', (m) => messages.push(JSON.parse(String(m))));
    await waitFor('ready over WebSocket', async () => (messages.some((m) => m.type === 'ready') ? true : undefined), 15_000, 50);
    const watcher = await t.http.post(`${api()}/files/watchers`).set(t.auth).send({ path: '/watched2' });
    expect(watcher.status).toBe(201);
    await sh('echo x > /watched2/f.txt');
    await waitFor('create over WebSocket', async () => (messages.some((m) => m.type === 'create' && m.path === '/watched2/f.txt') ? true : undefined), 15_000, 50);
    ws.close();
    const polled = await waitFor('polled events', async () => {
      const r = await t.http.get(`${api()}/files/watchers/${watcher.body.watcherId}/events`).set(t.auth);
      return r.body.events?.some((e: { type: string; path: string }) => e.type === 'create' && e.path === '/watched2/f.txt') ? r.body : undefined;
    }, 15_000, 200);
    expect(polled.events.length).toBeGreaterThan(0);
    expect((await t.http.delete(`${api()}/files/watchers/${watcher.body.watcherId}`).set(t.auth)).status).toBe(204);
  });
});

describe('large files', () => {
  it('keeps a checksum across a chunked multipart upload and bulk download', async () => {
    const data = randomBytes(3 * 1024 * 1024);
    const { body, contentType } = multipartBody([{ path: '/large/three-mib.bin', data }]);
    const up = await t.http.post(`${api()}/files/upload`).set(t.auth).set('content-type', contentType).send(body);
    expect(up.status).toBe(200);
    const inside = (await sh('sha256sum /large/three-mib.bin | cut -d" " -f1')).stdout.trim();
    expect(inside).toBe(createHash('sha256').update(data).digest('hex'));
  });
});

describe('metadata', () => {
  it('sets, replaces and reads a file’s user extended attributes, and reads procfs files whole', async () => {
    expect((await put('/tmp/meta-native.txt', 'x')).status).toBe(200);
    const set = await t.http.patch(`${api()}/files/metadata`).query({ path: '/tmp/meta-native.txt' }).set(t.auth).send({ set: { 'app.owner': 'me', 'app.stage': 'one', other: 'kept' } });
    expect(set.status, JSON.stringify(set.body)).toBe(200);
    expect(set.body).toEqual({ path: '/tmp/meta-native.txt', metadata: { 'app.owner': 'me', 'app.stage': 'one', other: 'kept' } });
    const replaced = await t.http.patch(`${api()}/files/metadata`).query({ path: '/tmp/meta-native.txt' }).set(t.auth).send({ set: { 'app.owner': 'you' }, replacePrefix: 'app.' });
    expect(replaced.body.metadata).toEqual({ 'app.owner': 'you', other: 'kept' });
    const read = await t.http.get(`${api()}/files/metadata`).query({ path: '/tmp/meta-native.txt' }).set(t.auth);
    expect(read.status).toBe(200);
    expect(read.body.metadata).toEqual({ 'app.owner': 'you', other: 'kept' });
    // Real attributes, as a program in the sandbox sees them.
    expect((await sh(`python3 -c "import os; print(os.getxattr('/tmp/meta-native.txt', 'user.app.owner').decode())"`)).stdout.trim()).toBe('you');

    const missing = await t.http.patch(`${api()}/files/metadata`).query({ path: '/tmp/no-such-file' }).set(t.auth).send({ set: { a: 'b' } });
    expect(missing.status).toBe(404);
    const badBody = await t.http.patch(`${api()}/files/metadata`).query({ path: '/tmp/meta-native.txt' }).set(t.auth).send({ set: { a: 1 } });
    expect(badBody.status).toBe(400);

    const status = await t.http.get(`${api()}/files`).query({ path: '/proc/self/status' }).set(t.auth).buffer(true).parse((res, cb) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => cb(null, Buffer.concat(chunks)));
    });
    expect(status.status).toBe(200);
    expect(status.headers['content-length']).toBeUndefined();
    expect((status.body as Buffer).toString()).toMatch(/^Pid:\s+\d+/m);
  });
});
