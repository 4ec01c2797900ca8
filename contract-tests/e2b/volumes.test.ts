// Volumes through the real e2b SDK (e2b-wave2 §2): Volume.create/connect/getInfo/list/destroy,
// the volume-content API (its file operations, with no sandbox running, E2B_VOLUME_API_URL
// pointing at this server's /e2b), and `volumeMounts` on Sandbox.create. Two sandboxes share a
// volume and see each other's writes, it outlives both, deleting a mounted one is refused, a
// full volume is a clear error (ENOSPC inside, 507 from the content API), a volume token opens
// only its own volume and stops working with its key, and a symlink a sandbox plants in a volume
// never lets a content call touch a host file.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

describe('E2B: volumes', () => {
  let t: E2bTestServer;
  const hostDir = mkdtempSync('/tmp/nbx-e2b-vol-host-');
  const hostFile = join(hostDir, 'secret.txt');
  beforeAll(async () => {
    t = await startE2bTestServer({ NESTBOX_VOLUME_DEFAULT_MIB: '64', NESTBOX_DEFAULT_DISK_GIB: '1' });
    process.env.E2B_VOLUME_API_URL = `${t.url}/e2b`;
    writeFileSync(hostFile, 'host only\n');
  }, 180_000);
  afterAll(async () => {
    delete process.env.E2B_VOLUME_API_URL;
    if (t) {
      for (const s of await Sandbox.list({ ...t.opts }).nextItems().catch(() => [])) await Sandbox.kill(s.sandboxId, t.opts).catch(() => {});
      for (const v of await Volume.list(t.opts).catch(() => [])) await Volume.destroy(v.volumeId, t.opts).catch(() => {});
      await t.close();
    }
    rmSync(hostDir, { recursive: true, force: true });
  }, 180_000);

  it('create, connect, getInfo, list and destroy; file operations with no sandbox running', async () => {
    const vol = await Volume.create('e2b-files', t.opts);
    expect(vol.volumeId).toMatch(/^vol/);
    expect(vol.name).toBe('e2b-files');
    expect((await Volume.list(t.opts)).map((v) => v.name)).toContain('e2b-files');
    const info = await Volume.getInfo(vol.volumeId, t.opts);
    expect(info).toMatchObject({ volumeId: vol.volumeId, name: 'e2b-files' });
    await expect(Volume.getInfo('volnosuchvolume00000', t.opts)).rejects.toBeInstanceOf(VolumeNotFoundError);
    await expect(Volume.create('e2b-files', t.opts)).rejects.toBeInstanceOf(VolumeError);

    const connected = await Volume.connect(vol.volumeId, t.opts);
    const dir = await connected.makeDir('/a/b/c', { force: true, mode: 0o750 });
    expect(dir).toMatchObject({ name: 'c', path: '/a/b/c', type: 'directory', mode: 0o750 });
    expect(dir.mtime).toBeInstanceOf(Date);
    expect(Number.isNaN(dir.mtime.getTime())).toBe(false);
    await expect(connected.makeDir('/x/y')).rejects.toBeInstanceOf(VolumePathNotFoundError);
    const written = await connected.writeFile('/a/b/c/hello.txt', 'hello volume\n', { mode: 0o640, uid: 1000, gid: 1000 });
    expect(written).toMatchObject({ name: 'hello.txt', type: 'file', size: 13, mode: 0o640, uid: 1000, gid: 1000 });
    expect(await connected.readFile('/a/b/c/hello.txt')).toBe('hello volume\n');
    expect(Buffer.from(await connected.readFile('/a/b/c/hello.txt', { format: 'bytes' })).toString()).toBe('hello volume\n');
    await connected.writeFile('/a/b/c/hello.txt', 'overwritten\n');
    expect(await connected.readFile('/a/b/c/hello.txt')).toBe('overwritten\n');
    await connected.writeFile('/new/dir/file.bin', new Uint8Array([1, 2, 3]).buffer, { force: true });
    expect(await connected.exists('/new/dir/file.bin')).toBe(true);
    expect(await connected.exists('/nope')).toBe(false);
    expect((await connected.getInfo('/a')).type).toBe('directory');
    const top = await connected.list('/');
    expect(top.map((e) => e.name).sort()).toEqual(['a', 'new']);
    const deep = await connected.list('/a', { depth: 3 });
    expect(deep.map((e) => e.path)).toEqual(['/a/b', '/a/b/c', '/a/b/c/hello.txt']);
    const updated = await connected.updateMetadata('/a/b/c/hello.txt', { mode: 0o600, uid: 0, gid: 0 });
    expect(updated).toMatchObject({ mode: 0o600, uid: 0, gid: 0 });
    await connected.remove('/new');
    expect(await connected.exists('/new/dir/file.bin')).toBe(false);
    await expect(connected.remove('/new')).rejects.toBeInstanceOf(VolumePathNotFoundError);
    await expect(connected.readFile('/../../etc/passwd')).rejects.toThrow(/\.\./);

    // A 64 MiB volume: a write past it is a clear 507.
    const big = new ArrayBuffer(80 * 2 ** 20);
    await expect(connected.writeFile('/big.bin', big)).rejects.toThrow(/507.*full|volume is full/);
    await connected.remove('/big.bin').catch(() => {});

    expect(await Volume.destroy(vol.volumeId, t.opts)).toBe(true);
    expect(await Volume.destroy(vol.volumeId, t.opts)).toBe(false);
  }, 180_000);

  it('volumeMounts: two sandboxes share a volume and see each other\'s writes; it outlives both; a mounted one cannot be destroyed; full is ENOSPC', async () => {
    const vol = await Volume.create('e2b-shared', t.opts);
    const a = await Sandbox.create({ ...t.opts, volumeMounts: { '/mnt/data': vol } });
    const b = await Sandbox.create({ ...t.opts, volumeMounts: { '/home/user/shared': 'e2b-shared' } });
    expect((await Sandbox.getInfo(a.sandboxId, t.opts) as unknown as { volumeMounts: unknown }).volumeMounts).toEqual([{ name: 'e2b-shared', path: '/mnt/data' }]);
    const listed = await Sandbox.getInfo(b.sandboxId, t.opts);
    expect((listed as unknown as { volumeMounts: unknown }).volumeMounts).toEqual([{ name: 'e2b-shared', path: '/home/user/shared' }]);

    await a.files.write('/mnt/data/from-a.txt', 'from a\n');
    expect(await b.files.read('/home/user/shared/from-a.txt')).toBe('from a\n');
    const wrote = await b.commands.run('echo from-b > /home/user/shared/from-b.txt && cat /home/user/shared/from-a.txt');
    expect(wrote.stdout).toBe('from a\n');
    expect(await a.files.read('/mnt/data/from-b.txt')).toBe('from-b\n');
    // The content API sees what the sandboxes wrote, while they run.
    expect(await vol.readFile('/from-b.txt')).toBe('from-b\n');

    await expect(Volume.destroy(vol.volumeId, t.opts)).rejects.toThrow(/mounted by 2 sandbox/);
    const full = await a.commands.run('dd if=/dev/zero of=/mnt/data/fill bs=1M count=100', { timeoutMs: 60_000 }).catch((e: unknown) => e as { stderr: string });
    expect((full as { stderr: string }).stderr).toMatch(/No space left on device/);
    await a.commands.run('rm -f /mnt/data/fill');

    await a.kill();
    await b.kill();
    const c = await Sandbox.create({ ...t.opts, volumeMounts: { '/v': 'e2b-shared' } });
    expect(await c.files.read('/v/from-a.txt')).toBe('from a\n');

    // A symlink planted by a sandbox never leads a content call to a host path.
    await c.commands.run(`ln -s ${hostDir} /v/escape && ln -s ${hostFile} /v/link.txt && mkfifo /v/pipe`, { user: 'root' });
    await c.kill();
    await expect(vol.readFile('/link.txt')).rejects.toThrow(/not a regular file|symlink/);
    await expect(vol.writeFile('/link.txt', 'pwned')).rejects.toThrow(/symlink|regular file/);
    await expect(vol.readFile('/escape/secret.txt')).rejects.toThrow(/symlink/);
    await expect(vol.writeFile('/escape/new.txt', 'pwned')).rejects.toThrow(/symlink/);
    await expect(vol.updateMetadata('/link.txt', { mode: 0o777 })).rejects.toThrow(/symlink/);
    // A FIFO is no file: a clear 400 (never a hang or a 500).
    await expect(vol.writeFile('/pipe', 'x')).rejects.toThrow(/400.*not a regular file/);
    await expect(vol.readFile('/pipe')).rejects.toThrow(/400.*not a regular file/);
    const link = await vol.getInfo('/link.txt');
    expect(link).toMatchObject({ type: 'symlink', target: hostFile });
    await vol.remove('/escape');
    expect(readFileSync(hostFile, 'utf8')).toBe('host only\n');
    expect(await vol.exists('/escape')).toBe(false);
    expect(readFileSync(hostFile, 'utf8')).toBe('host only\n');
    expect(await Volume.destroy(vol.volumeId, t.opts)).toBe(true);
  }, 300_000);

  it('a volume token opens only its own volume and dies with its key; another organisation sees nothing', async () => {
    const vol = await Volume.create('e2b-tokens', t.opts);
    const otherVol = await Volume.create('e2b-tokens-2', t.opts);
    await vol.writeFile('/f.txt', 'x');
    // The token of one volume on another volume: refused.
    const forged = await fetch(`${t.url}/e2b/volumecontent/${otherVol.volumeId}/path?path=/`, { headers: { authorization: `Bearer ${vol.token}` } });
    expect(forged.status).toBe(401);
    const none = await fetch(`${t.url}/e2b/volumecontent/${vol.volumeId}/path?path=/`);
    expect(none.status).toBe(401);
    const tampered = await fetch(`${t.url}/e2b/volumecontent/${vol.volumeId}/path?path=/`, { headers: { authorization: `Bearer ${vol.token.slice(0, -2)}AA` } });
    expect(tampered.status).toBe(401);

    // A key of another organisation: not found.
    const org = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'e2b-volumes-other' });
    const key = await t.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(t.auth).send({});
    const otherOpts = { ...t.opts, apiKey: key.body.key as string };
    await expect(Volume.getInfo(vol.volumeId, otherOpts)).rejects.toBeInstanceOf(VolumeNotFoundError);
    expect(await Volume.list(otherOpts)).toEqual([]);
    expect(await Volume.destroy(vol.volumeId, otherOpts)).toBe(false);
    await expect(Sandbox.create({ ...otherOpts, volumeMounts: { '/x': 'e2b-tokens' } })).rejects.toThrow(/not found/);

    // A token minted from a key stops working when the key is revoked.
    const mine = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'volume-user', preset: 'ci' });
    expect(mine.status, JSON.stringify(mine.body)).toBe(201);
    const viaKey = await Volume.connect(vol.volumeId, { ...t.opts, apiKey: mine.body.key });
    expect(await viaKey.readFile('/f.txt')).toBe('x');
    expect((await t.http.delete(`/api/v1/api-keys/${mine.body.id}`).set(t.auth)).status).toBe(204);
    await expect(viaKey.readFile('/f.txt')).rejects.toThrow(/401|revoked/);

    // A read-only key's token reads but cannot write.
    const ro = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'volume-reader', preset: 'read-only' });
    const reader = await Volume.connect(vol.volumeId, { ...t.opts, apiKey: ro.body.key });
    expect(await reader.readFile('/f.txt')).toBe('x');
    await expect(reader.writeFile('/g.txt', 'y')).rejects.toThrow(/403|volumes:write/);
    await Volume.destroy(vol.volumeId, t.opts);
    await Volume.destroy(otherVol.volumeId, t.opts);
  }, 180_000);
});
