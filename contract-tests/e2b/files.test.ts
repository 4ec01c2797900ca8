// files.* through the real `e2b` SDK: envd filesystem.Filesystem over Connect and the plain
// /files routes (multipart, octet-stream, gzip, signed URLs) of e2b.md (c) and (d).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FileNotFoundError, FilesystemEventType, Sandbox, type FilesystemEvent } from 'e2b';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let sbx: Sandbox;

beforeAll(async () => {
  t = await startE2bTestServer();
  sbx = await Sandbox.create(t.opts);
});

afterAll(async () => {
  await sbx?.kill().catch(() => undefined);
  await t?.close();
});

describe('e2b files', () => {
  it('writes and reads text and bytes', async () => {
    const info = await sbx.files.write('/tmp/e2b/hello.txt', 'hello world');
    expect(info).toMatchObject({ name: 'hello.txt', path: '/tmp/e2b/hello.txt', type: 'file' });
    expect(await sbx.files.read('/tmp/e2b/hello.txt')).toBe('hello world');
    const bytes = new Uint8Array([0, 1, 2, 250, 255]);
    await sbx.files.write('/tmp/e2b/bin.dat', bytes.buffer);
    expect(new Uint8Array(await sbx.files.read('/tmp/e2b/bin.dat', { format: 'bytes' }))).toEqual(bytes);
    // Empty files read as ''.
    await sbx.files.write('/tmp/e2b/empty.txt', '');
    expect(await sbx.files.read('/tmp/e2b/empty.txt')).toBe('');
    // The command side sees the same file.
    expect((await sbx.commands.run('cat /tmp/e2b/hello.txt')).stdout).toBe('hello world');
  });

  it('writes several files in one multipart request and as octet-stream with gzip', async () => {
    const written = await sbx.files.write([
      { path: '/tmp/multi/a/b.txt', data: 'B' },
      { path: '/tmp/multi/c.txt', data: 'C' },
    ]);
    expect(written.map((w) => w.path).sort()).toEqual(['/tmp/multi/a/b.txt', '/tmp/multi/c.txt']);
    expect(await sbx.files.read('/tmp/multi/a/b.txt')).toBe('B');
    expect(await sbx.files.read('/tmp/multi/c.txt')).toBe('C');
    await sbx.files.write('/tmp/multi/gz.txt', 'compressed body', { gzip: true });
    expect(await sbx.files.read('/tmp/multi/gz.txt')).toBe('compressed body');
    await sbx.files.write('/tmp/multi/raw.txt', 'raw body', { useOctetStream: true } as never);
    expect(await sbx.files.read('/tmp/multi/raw.txt')).toBe('raw body');
  });

  it('lists, stats, checks existence, makes dirs, renames and removes', async () => {
    expect(await sbx.files.makeDir('/tmp/tree/sub')).toBe(true);
    expect(await sbx.files.makeDir('/tmp/tree/sub')).toBe(false);
    await sbx.files.write('/tmp/tree/one.txt', '12345');
    await sbx.files.write('/tmp/tree/sub/two.txt', 'x');

    const top = await sbx.files.list('/tmp/tree');
    expect(top.map((e) => [e.name, e.type]).sort()).toEqual([
      ['one.txt', 'file'],
      ['sub', 'dir'],
    ]);
    const deep = await sbx.files.list('/tmp/tree', { depth: 2 });
    expect(deep.map((e) => e.path).sort()).toEqual(['/tmp/tree/one.txt', '/tmp/tree/sub', '/tmp/tree/sub/two.txt']);

    const info = await sbx.files.getInfo('/tmp/tree/one.txt');
    expect(info).toMatchObject({ name: 'one.txt', type: 'file', path: '/tmp/tree/one.txt', size: 5, permissions: '-rw-r--r--' });
    expect(info.modifiedTime!.getTime()).toBeGreaterThan(Date.now() - 60_000);
    expect(typeof info.owner).toBe('string');

    expect(await sbx.files.exists('/tmp/tree/one.txt')).toBe(true);
    expect(await sbx.files.exists('/tmp/tree/nope.txt')).toBe(false);
    await expect(sbx.files.getInfo('/tmp/tree/nope.txt')).rejects.toBeInstanceOf(FileNotFoundError);
    await expect(sbx.files.read('/tmp/tree/nope.txt')).rejects.toBeInstanceOf(FileNotFoundError);

    const moved = await sbx.files.rename('/tmp/tree/one.txt', '/tmp/tree/sub/renamed.txt');
    expect(moved).toMatchObject({ name: 'renamed.txt', path: '/tmp/tree/sub/renamed.txt' });
    expect(await sbx.files.exists('/tmp/tree/one.txt')).toBe(false);
    expect(await sbx.files.read('/tmp/tree/sub/renamed.txt')).toBe('12345');

    await sbx.files.remove('/tmp/tree');
    expect(await sbx.files.exists('/tmp/tree')).toBe(false);
  });

  it('watches a directory', async () => {
    await sbx.files.makeDir('/tmp/watched');
    const events: FilesystemEvent[] = [];
    const handle = await sbx.files.watchDir('/tmp/watched', (e) => void events.push(e), { recursive: true });
    await sbx.files.write('/tmp/watched/new.txt', 'a');
    await sbx.commands.run('rm /tmp/watched/new.txt');
    for (let i = 0; i < 50 && !events.some((e) => e.type === FilesystemEventType.REMOVE); i++) await sleep(100);
    await handle.stop();
    expect(events.find((e) => e.type === FilesystemEventType.CREATE)?.name).toBe('new.txt');
    expect(events.find((e) => e.type === FilesystemEventType.REMOVE)?.name).toBe('new.txt');
  });

  it('serves signed upload and download URLs to clients without headers', async () => {
    const uploadUrl = await sbx.uploadUrl('/tmp/signed/up.txt', { useSignatureExpiration: 60 });
    expect(uploadUrl).toContain('signature=');
    const form = new FormData();
    form.append('file', new Blob(['signed upload']), '/tmp/signed/up.txt');
    const up = await fetch(uploadUrl, { method: 'POST', body: form });
    expect(up.status).toBe(200);
    expect(await sbx.files.read('/tmp/signed/up.txt')).toBe('signed upload');

    const downloadUrl = await sbx.downloadUrl('/tmp/signed/up.txt');
    const down = await fetch(downloadUrl);
    expect(down.status).toBe(200);
    expect(await down.text()).toBe('signed upload');

    // A tampered signature, and an expired one, are refused.
    const tampered = new URL(downloadUrl);
    tampered.searchParams.set('path', '/etc/passwd');
    expect((await fetch(tampered)).status).toBe(401);
    const expired = await sbx.downloadUrl('/tmp/signed/up.txt', { useSignatureExpiration: -10 } as never);
    expect((await fetch(expired)).status).toBe(401);
  });

  it('refuses envd calls without the sandbox access token', async () => {
    const res = await fetch(`${t.url}/files?path=/etc/hostname`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' } });
    expect(res.status).toBe(401);
    const other = await fetch(`${t.url}/files?path=/etc/hostname`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': 'wrong' } });
    expect(other.status).toBe(401);
    expect(await other.json()).toMatchObject({ code: 401 });
  });
});
