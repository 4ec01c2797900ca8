// envd's own file semantics that E2B's test suites pin (issue 13, items 4–8, 12, 13), through
// the real `e2b` SDK: symlinks described by their resolved target, remove of a missing path,
// the signature refusals' exact texts, text-field uploads, watch events and their timing,
// files of unknown size (procfs), and file metadata (X-Metadata-* ↔ EntryInfo.metadata).
// Every path is absolute under /tmp, so nothing depends on the default user or its home.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient } from '@connectrpc/connect';
import { createConnectTransport } from '@connectrpc/connect-node';
import { FilesystemEventType, Sandbox, type FilesystemEvent } from 'e2b';
import { EventType, Filesystem } from '../../compat/e2b/gen/filesystem/filesystem_pb.js';
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

const envdHeaders = (): Record<string, string> => ({ 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' });

describe('e2b files: envd semantics', () => {
  it('describes a symlink by its absolute resolved target and the type and mode of what it points at', async () => {
    await sbx.files.write('/tmp/links/real.txt', 'target');
    await sbx.commands.run('chmod 600 /tmp/links/real.txt && ln -s real.txt /tmp/links/rel-link && ln -s /tmp/links /tmp/links-dir && ln -s missing /tmp/links/dangling');

    const info = await sbx.files.getInfo('/tmp/links/rel-link');
    expect(info).toMatchObject({ name: 'rel-link', path: '/tmp/links/rel-link', type: 'file', symlinkTarget: '/tmp/links/real.txt', mode: 0o600 });
    // The link's own permissions, as Go prints a symlink's FileMode.
    expect(info.permissions).toBe('Lrwxrwxrwx');

    const dir = await sbx.files.getInfo('/tmp/links-dir');
    expect(dir).toMatchObject({ type: 'dir', symlinkTarget: '/tmp/links' });

    // Listed entries carry the same; a dangling link has no type (envd: unspecified), which the
    // SDK leaves out of its list.
    const entries = await sbx.files.list('/tmp/links');
    expect(entries.map((e) => [e.name, e.type, e.symlinkTarget]).sort()).toEqual([
      ['real.txt', 'file', undefined],
      ['rel-link', 'file', '/tmp/links/real.txt'],
    ]);
    // A plain file has no symlink target.
    expect((await sbx.files.getInfo('/tmp/links/real.txt')).symlinkTarget).toBeUndefined();
  });

  it('removes a path that does not exist without an error, as envd does', async () => {
    await expect(sbx.files.remove('/tmp/never/was/here.txt')).resolves.toBeUndefined();
    await sbx.files.write('/tmp/gone/x.txt', 'x');
    await sbx.files.remove('/tmp/gone');
    await expect(sbx.files.remove('/tmp/gone')).resolves.toBeUndefined();
    expect(await sbx.files.exists('/tmp/gone')).toBe(false);
  });

  it("refuses bad signatures and credentials with envd's own status and messages", async () => {
    await sbx.files.write('/tmp/signed2/hello.txt', 'hello world');
    const expired = await sbx.downloadUrl('/tmp/signed2/hello.txt', { useSignatureExpiration: -10_000 });
    const res = await fetch(expired);
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({ code: 401, message: 'signature is already expired' });

    const expiredUpload = await sbx.uploadUrl('/tmp/signed2/hello.txt', { useSignatureExpiration: -100_000 });
    const form = new FormData();
    form.append('file', 'file content');
    const up = await fetch(expiredUpload, { method: 'POST', body: form });
    expect(up.status).toBe(401);
    expect(await up.json()).toEqual({ code: 401, message: 'signature is already expired' });

    const tampered = new URL(await sbx.downloadUrl('/tmp/signed2/hello.txt', { useSignatureExpiration: 10_000 }));
    tampered.searchParams.set('path', '/etc/passwd');
    const forged = await fetch(tampered);
    expect(forged.status).toBe(401);
    expect(await forged.json()).toEqual({ code: 401, message: 'invalid signature' });

    const bare = await fetch(`${t.url}/files?path=/tmp/signed2/hello.txt`, { headers: envdHeaders() });
    expect(bare.status).toBe(401);
    expect(await bare.json()).toEqual({ code: 401, message: 'missing signature query parameter' });

    const wrongToken = await fetch(`${t.url}/files?path=/tmp/signed2/hello.txt`, { headers: { ...envdHeaders(), 'X-Access-Token': 'wrong' } });
    expect(wrongToken.status).toBe(401);
    expect(await wrongToken.json()).toEqual({ code: 401, message: 'access token present in header but does not match' });

    const notANumber = new URL(expired);
    notANumber.searchParams.set('signature_expiration', 'soon');
    const bad = await fetch(notANumber);
    expect(bad.status).toBe(400);
    expect((await bad.json()).message).toContain('signature_expiration');
  });

  it('accepts a signed upload whose file part is a text field without a filename', async () => {
    const url = await sbx.uploadUrl('/tmp/signed3/hello.txt', { useSignatureExpiration: 10_000 });
    const form = new FormData();
    form.append('file', 'file content');
    const res = await fetch(url, { method: 'POST', body: form });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual([{ name: 'hello.txt', path: '/tmp/signed3/hello.txt', type: 'file' }]);
    expect(await sbx.files.read('/tmp/signed3/hello.txt')).toBe('file content');

    // Without ?path= such a part has no destination: a 400 naming it, not a silent success.
    const noPath = await fetch(`${t.url}/files`, { method: 'POST', body: form, headers: { ...envdHeaders(), 'X-Access-Token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken } });
    expect(noPath.status).toBe(400);
    expect((await noPath.json()).message).toMatch(/^file: /);
  });

  it('reads procfs files, whose size is not known in advance, to their end', async () => {
    expect(await sbx.files.read('/proc/cpuinfo')).toMatch(/^processor\s*:/m);
    expect(await sbx.files.read('/proc/self/status')).toMatch(/^Pid:\s+\d+/m);
    expect((await sbx.files.read('/proc/sys/kernel/random/boot_id')).trim()).toMatch(/^[0-9a-f-]{36}$/);
    const bytes = await sbx.files.read('/proc/self/status', { format: 'bytes' });
    expect(bytes.length).toBeGreaterThan(0);
    // A really empty file still reads as ''.
    await sbx.files.write('/tmp/proc-empty.txt', '');
    expect(await sbx.files.read('/tmp/proc-empty.txt')).toBe('');
  });

  it('watchDir reports a written file as envd does: create, chmod, write for a new one, write for an overwrite', async () => {
    await sbx.files.makeDir('/tmp/watch-fid');
    await sbx.files.write('/tmp/watch-fid/existing.txt', 'first');
    const events: FilesystemEvent[] = [];
    const handle = await sbx.files.watchDir('/tmp/watch-fid', (e) => void events.push(e));
    const seen = (type: FilesystemEventType, name: string) => events.some((e) => e.type === type && e.name === name);
    try {
      await sbx.files.write('/tmp/watch-fid/existing.txt', 'second');
      await sbx.files.write('/tmp/watch-fid/new.txt', 'content');
      for (let i = 0; i < 100 && !(seen(FilesystemEventType.WRITE, 'existing.txt') && seen(FilesystemEventType.WRITE, 'new.txt')); i++) await sleep(50);
      // Let anything else that would come arrive before the exact comparison.
      await sleep(300);
    } finally {
      await handle.stop();
    }
    expect(events.map((e) => [e.type, e.name])).toEqual([
      [FilesystemEventType.WRITE, 'existing.txt'],
      [FilesystemEventType.CREATE, 'new.txt'],
      [FilesystemEventType.CHMOD, 'new.txt'],
      [FilesystemEventType.WRITE, 'new.txt'],
    ]);
  });

  it('CreateWatcher / GetWatcherEvents (the Python sync SDK\'s polling) has the events as soon as the write returns', async () => {
    // The JS SDK does not poll; this is the same Connect call the Python SDK makes.
    const filesystem = createClient(Filesystem, createConnectTransport({ baseUrl: t.url, httpVersion: '1.1' }));
    const headers = { ...envdHeaders(), 'X-Access-Token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken };
    await sbx.files.makeDir('/tmp/poll-fid/nested-parent');
    const { watcherId } = await filesystem.createWatcher({ path: '/tmp/poll-fid', recursive: true }, { headers });
    const drain = async () => (await filesystem.getWatcherEvents({ watcherId }, { headers })).events.map((e) => [e.type, e.name]);
    try {
      await sbx.files.write('/tmp/poll-fid/test_watch.txt', 'This file will be watched.');
      // No waiting: envd has them queued by the time the write is answered.
      expect(await drain()).toEqual([
        [EventType.CREATE, 'test_watch.txt'],
        [EventType.CHMOD, 'test_watch.txt'],
        [EventType.WRITE, 'test_watch.txt'],
      ]);
      await sbx.files.write('/tmp/poll-fid/test_watch.txt', 'This file has been modified.');
      expect(await drain()).toEqual([[EventType.WRITE, 'test_watch.txt']]);
      // A directory made and a file written into it at once: the file's write is there too.
      await sbx.files.makeDir('/tmp/poll-fid/nested');
      await sbx.files.write('/tmp/poll-fid/nested/inner.txt', 'inner');
      expect(await drain()).toContainEqual([EventType.WRITE, 'nested/inner.txt']);
    } finally {
      await filesystem.removeWatcher({ watcherId }, { headers });
    }
  });

  it('keeps file metadata (X-Metadata-*) in user.e2b.* attributes and shows it on write, getInfo, list and rename', async () => {
    const metadata = { author: 'mish', purpose: 'upload' };
    const info = await sbx.files.write('/tmp/meta/a.txt', 'with metadata', { metadata });
    expect(Array.isArray(info)).toBe(false);
    expect((info as { metadata?: Record<string, string> }).metadata).toEqual(metadata);
    expect((await sbx.files.getInfo('/tmp/meta/a.txt')).metadata).toEqual(metadata);

    const octet = await sbx.files.write('/tmp/meta/octet.txt', 'raw', { metadata, useOctetStream: true } as never);
    expect((octet as { metadata?: Record<string, string> }).metadata).toEqual(metadata);
    expect((await sbx.files.getInfo('/tmp/meta/octet.txt')).metadata).toEqual(metadata);

    // The same metadata on every file of a multi-file write.
    const many = await sbx.files.writeFiles([{ path: '/tmp/meta/m1.txt', data: '1' }, { path: '/tmp/meta/m2.txt', data: '2' }], { metadata: { source: 'test-suite' } });
    expect(many.map((w) => w.metadata)).toEqual([{ source: 'test-suite' }, { source: 'test-suite' }]);

    const listed = await sbx.files.list('/tmp/meta');
    expect(listed.find((e) => e.name === 'm2.txt')?.metadata).toEqual({ source: 'test-suite' });
    const renamed = await sbx.files.rename('/tmp/meta/m2.txt', '/tmp/meta/m2-renamed.txt');
    expect(renamed.metadata).toEqual({ source: 'test-suite' });

    // Without metadata there is none; overwriting without it clears what was there.
    const plain = await sbx.files.write('/tmp/meta/plain.txt', 'no metadata here');
    expect((plain as { metadata?: unknown }).metadata).toBeUndefined();
    expect((await sbx.files.getInfo('/tmp/meta/plain.txt')).metadata).toBeUndefined();
    const over = await sbx.files.write('/tmp/meta/a.txt', 'second');
    expect((over as { metadata?: unknown }).metadata).toBeUndefined();
    expect((await sbx.files.getInfo('/tmp/meta/a.txt')).metadata).toBeUndefined();

    // They are real extended attributes: set inside the sandbox, they show; others do not.
    await sbx.commands.run(`python3 -c "import os; os.setxattr('/tmp/meta/plain.txt', 'user.e2b.author', b'mish'); os.setxattr('/tmp/meta/plain.txt', 'user.other', b'x')"`);
    expect((await sbx.files.getInfo('/tmp/meta/plain.txt')).metadata).toEqual({ author: 'mish' });
    const attrs = await sbx.commands.run(`python3 -c "import os; print(os.getxattr('/tmp/meta/octet.txt', 'user.e2b.purpose').decode())"`);
    expect(attrs.stdout.trim()).toBe('upload');

    // A header value the SDK would not send (not printable ASCII) is refused, naming metadata.
    const bad = await fetch(`${t.url}/files?path=/tmp/meta/bad.txt`, {
      method: 'POST',
      body: 'x',
      headers: { ...envdHeaders(), 'X-Access-Token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken, 'Content-Type': 'application/octet-stream', 'X-Metadata-Big': 'v'.repeat(5000) },
    });
    expect(bad.status).toBe(400);
    expect((await bad.json()).message).toMatch(/^metadata: /);
  });
});

