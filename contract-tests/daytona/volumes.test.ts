// Volumes through the real @daytonaio/sdk (daytona-wave2 §3): `daytona.volume.*` and `volumes`
// on create. Two sandboxes share a volume and see each other's writes, the volume outlives both,
// deleting a mounted volume is refused (409), a full volume is ENOSPC inside, another
// organisation's volume is not found.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Daytona, DaytonaConflictError, DaytonaNotFoundError } from '@daytonaio/sdk';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

describe('Daytona: volumes', () => {
  let env: DaytonaTestEnv;
  beforeAll(async () => {
    env = await startDaytonaEnv({ NESTBOX_VOLUME_DEFAULT_MIB: '64', NESTBOX_DEFAULT_DISK_GIB: '1' });
  }, 180_000);
  afterAll(async () => {
    if (!env) return;
    const left = await env.server.http.get('/api/v1/sandboxes?limit=100').set(env.server.auth);
    for (const sb of (left.body.items ?? []) as { id: string }[]) await env.server.http.delete(`/api/v1/sandboxes/${sb.id}`).set(env.server.auth);
    for (const v of await env.daytona.volume.list()) await env.daytona.volume.delete(v).catch(() => {});
    await env.server.close();
  }, 180_000);

  it('volume.get(name, true) creates a ready volume; list and get by name find it; a taken name is refused', async () => {
    await expect(env.daytona.volume.get('missing')).rejects.toBeInstanceOf(DaytonaNotFoundError);
    const volume = await env.daytona.volume.get('sdk-data', true);
    expect(volume).toMatchObject({ name: 'sdk-data', state: 'ready', errorReason: null });
    expect(volume.id).toMatch(/^vol/);
    expect((await env.daytona.volume.get('sdk-data')).id).toBe(volume.id);
    expect((await env.daytona.volume.list()).map((v) => v.name)).toContain('sdk-data');
    await expect(env.daytona.volume.create('sdk-data')).rejects.toThrow(/already exists/);
    const raw = await rawFetch(env, `/daytona/api/volumes/${volume.id}`);
    expect(await raw.json()).toMatchObject({ id: volume.id, name: 'sdk-data', state: 'ready' });
  }, 60_000);

  it('two sandboxes share a volume, see each other\'s writes, and it outlives both; a mounted volume cannot be deleted; full is ENOSPC', async () => {
    const volume = await env.daytona.volume.get('shared', true);
    const a = await env.daytona.create({ volumes: [{ volumeId: volume.id, mountPath: '/home/daytona/shared' }] });
    // By name, and a subpath inside it.
    const b = await env.daytona.create({ volumes: [{ volumeId: 'shared', mountPath: '/mnt/all' }, { volumeId: 'shared', mountPath: '/mnt/sub', subpath: 'team/one' }] });
    expect(a.volumes).toEqual([{ volumeId: volume.id, mountPath: '/home/daytona/shared' }]);

    await a.fs.uploadFile(Buffer.from('written by a\n'), '/home/daytona/shared/a.txt');
    expect((await b.fs.downloadFile('/mnt/all/a.txt')).toString()).toBe('written by a\n');
    const wrote = await b.process.executeCommand('echo written-by-b > /mnt/sub/b.txt && cat /mnt/all/team/one/b.txt');
    expect(wrote.exitCode).toBe(0);
    expect(wrote.result.trim()).toBe('written-by-b');
    expect((await a.process.executeCommand('cat /home/daytona/shared/team/one/b.txt')).result.trim()).toBe('written-by-b');

    const refused = env.daytona.volume.delete(volume);
    await expect(refused).rejects.toBeInstanceOf(DaytonaConflictError);
    await expect(refused).rejects.toThrow(/mounted by 2 sandbox/);

    // 64 MiB volume (NESTBOX_VOLUME_DEFAULT_MIB): writing past it is ENOSPC inside.
    const fill = await a.process.executeCommand('dd if=/dev/zero of=/home/daytona/shared/fill bs=1M count=100 2>&1; rm -f /home/daytona/shared/fill');
    expect(fill.result).toMatch(/No space left on device/);

    await a.delete();
    await b.delete();
    const c = await env.daytona.create({ volumes: [{ volumeId: volume.id, mountPath: '/data' }] });
    expect((await c.fs.downloadFile('/data/a.txt')).toString()).toBe('written by a\n');
    await c.delete();
    await env.daytona.volume.delete(volume);
    await expect(env.daytona.volume.get('shared')).rejects.toBeInstanceOf(DaytonaNotFoundError);
  }, 300_000);

  it('an unknown volume or bad mount path on create is refused; another organisation cannot see or mount a volume', async () => {
    await expect(env.daytona.create({ volumes: [{ volumeId: 'no-such-volume', mountPath: '/x' }] })).rejects.toBeInstanceOf(DaytonaNotFoundError);
    const mine = await env.daytona.volume.get('private', true);
    await expect(env.daytona.create({ volumes: [{ volumeId: mine.id, mountPath: 'relative/path' }] })).rejects.toThrow(/mountPath/);

    const org = await env.server.http.post('/api/v1/organizations').set(env.server.auth).send({ name: 'daytona-volumes-other' });
    const key = await env.server.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(env.server.auth).send({});
    const other = new Daytona({ apiUrl: env.apiUrl, apiKey: key.body.key });
    await expect(other.volume.get('private')).rejects.toBeInstanceOf(DaytonaNotFoundError);
    expect(await other.volume.list()).toEqual([]);
    await expect(other.create({ volumes: [{ volumeId: mine.id, mountPath: '/x' }] })).rejects.toBeInstanceOf(DaytonaNotFoundError);
    const del = await fetch(`${env.apiUrl}/volumes/${mine.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${key.body.key}` } });
    expect(del.status).toBe(404);
    await env.daytona.volume.delete(mine);
  }, 120_000);
});
