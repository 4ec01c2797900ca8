// Persistent named volumes through the native API, end to end (real server, PostgreSQL, the
// local driver): two sandboxes share a volume and see each other's writes, it outlives both, a
// read-only mount refuses writes, deleting a mounted volume is refused (409), the size limit is
// ENOSPC inside, limits per organisation (429), bad input (400 naming the field), another
// organisation's volume is not found (404), and a sandbox with volumes survives stop/start.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';

let t: TestServer;
let other: { Authorization: string };

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_ORG_MAX_VOLUMES: '3', NESTBOX_VOLUME_DEFAULT_MIB: '256', NESTBOX_VOLUME_MAX_MIB: '2048', NESTBOX_DEFAULT_DISK_GIB: '1' } });
  const org = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'volumes-other' });
  const key = await t.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(t.auth).send({});
  other = { Authorization: `Bearer ${key.body.key}` };
}, 180_000);

afterAll(async () => {
  if (!t) return;
  for (const auth of [t.auth, other]) {
    const sandboxes = await t.http.get('/api/v1/sandboxes?limit=100').set(auth);
    for (const s of (sandboxes.body.items ?? []) as { id: string }[]) await t.http.delete(`/api/v1/sandboxes/${s.id}`).set(auth);
    const volumes = await t.http.get('/api/v1/volumes').set(auth);
    for (const v of (volumes.body.items ?? []) as { id: string }[]) await t.http.delete(`/api/v1/volumes/${v.id}`).set(auth);
  }
  await t.close();
}, 180_000);

const create = (body: Record<string, unknown>) => t.http.post('/api/v1/sandboxes').set(t.auth).send({ memoryMiB: 256, egress: { mode: 'deny-all' }, ...body });
async function run(id: string, cmd: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const res = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

describe('volumes (native API)', () => {
  it('two sandboxes share a volume and see each other\'s writes; it outlives both; read-only refuses writes; a mounted volume cannot be deleted', async () => {
    const made = await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'shared', sizeBytes: 512 * 2 ** 20 });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    expect(made.body).toMatchObject({ name: 'shared', state: 'ready', sizeBytes: 512 * 2 ** 20 });
    const volumeId = made.body.id as string;
    expect((await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'shared' })).status).toBe(409);

    const a = await create({ volumes: [{ volumeId, mountPath: '/mnt/shared' }] });
    expect(a.status, JSON.stringify(a.body)).toBe(201);
    expect(a.body.volumes).toEqual([{ volumeId, name: 'shared', mountPath: '/mnt/shared', readOnly: false }]);
    const b = await create({ volumes: [{ name: 'shared', mountPath: '/data' }, { volumeId: 'shared', mountPath: '/ro', readOnly: true }] });
    expect(b.status, JSON.stringify(b.body)).toBe(201);

    expect((await run(a.body.id, 'echo hello-from-a > /mnt/shared/a.txt')).exitCode).toBe(0);
    expect((await run(b.body.id, 'cat /data/a.txt')).stdout).toBe('hello-from-a\n');
    expect((await run(b.body.id, 'echo hello-from-b > /data/b.txt')).exitCode).toBe(0);
    expect((await run(a.body.id, 'cat /mnt/shared/b.txt')).stdout).toBe('hello-from-b\n');
    const ro = await run(b.body.id, 'echo x > /ro/c.txt');
    expect(ro.exitCode).not.toBe(0);
    expect(ro.stderr).toMatch(/Read-only file system/);

    const refused = await t.http.delete(`/api/v1/volumes/${volumeId}`).set(t.auth);
    expect(refused.status, JSON.stringify(refused.body)).toBe(409);
    expect(refused.body.error.code).toBe('conflict');
    expect(refused.body.error.message).toMatch(/mounted by 2 sandbox/);

    // Across a stop and a start the mounts come back.
    expect((await t.http.post(`/api/v1/sandboxes/${a.body.id}/stop`).set(t.auth)).status).toBe(200);
    expect((await t.http.post(`/api/v1/sandboxes/${a.body.id}/resume`).set(t.auth)).status).toBe(200);
    expect((await run(a.body.id, 'cat /mnt/shared/b.txt')).stdout).toBe('hello-from-b\n');
    // Fork of a sandbox with volumes is refused clearly.
    const fork = await t.http.post(`/api/v1/sandboxes/${a.body.id}/fork`).set(t.auth).send({});
    expect(fork.status).toBe(409);
    expect(fork.body.error.message).toMatch(/mounts volumes/);

    expect((await t.http.delete(`/api/v1/sandboxes/${a.body.id}`).set(t.auth)).status).toBe(204);
    expect((await t.http.delete(`/api/v1/volumes/${volumeId}`).set(t.auth)).status).toBe(409);
    expect((await t.http.delete(`/api/v1/sandboxes/${b.body.id}`).set(t.auth)).status).toBe(204);

    // The volume outlives both: a new sandbox reads what they wrote.
    const got = await t.http.get(`/api/v1/volumes/shared`).set(t.auth);
    expect(got.status).toBe(200);
    expect(got.body.usedBytes).toBeGreaterThan(0);
    const c = await create({ volumes: [{ volumeId, mountPath: '/v' }] });
    expect((await run(c.body.id, 'cat /v/a.txt /v/b.txt')).stdout).toBe('hello-from-a\nhello-from-b\n');
    expect((await t.http.delete(`/api/v1/sandboxes/${c.body.id}`).set(t.auth)).status).toBe(204);
    expect((await t.http.delete(`/api/v1/volumes/${volumeId}`).set(t.auth)).status).toBe(204);
    expect((await t.http.get(`/api/v1/volumes/${volumeId}`).set(t.auth)).status).toBe(404);
    // The name is free again.
    const again = await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'shared' });
    expect(again.status).toBe(201);
    expect((await t.http.delete(`/api/v1/volumes/${again.body.id}`).set(t.auth)).status).toBe(204);
  }, 300_000);

  it('a full volume is ENOSPC inside the sandbox; its usage shows it', async () => {
    const made = await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'small', sizeBytes: 64 * 2 ** 20 });
    expect(made.status).toBe(201);
    const s = await create({ volumes: [{ volumeId: made.body.id, mountPath: '/small' }] });
    expect(s.status, JSON.stringify(s.body)).toBe(201);
    const out = await run(s.body.id, 'dd if=/dev/zero of=/small/fill bs=1M count=100');
    expect(out.exitCode).not.toBe(0);
    expect(out.stderr).toMatch(/No space left on device/);
    const got = await t.http.get(`/api/v1/volumes/${made.body.id}`).set(t.auth);
    expect(got.body.usedBytes).toBeGreaterThan(40 * 2 ** 20);
    await t.http.delete(`/api/v1/sandboxes/${s.body.id}`).set(t.auth);
    expect((await t.http.delete(`/api/v1/volumes/${made.body.id}`).set(t.auth)).status).toBe(204);
  }, 300_000);

  it('bad input is a 400 naming the field; another organisation sees nothing; the count limit is a 429', async () => {
    const v = await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'mine' });
    expect(v.status).toBe(201);
    expect(v.body.sizeBytes).toBe(256 * 2 ** 20);
    for (const [body, field] of [
      [{ name: '-bad' }, 'name'],
      [{ name: 'x', sizeBytes: 1024 }, 'sizeBytes'],
      [{ name: 'x', sizeBytes: 4096 * 2 ** 20 }, 'sizeBytes'],
    ] as const) {
      const res = await t.http.post('/api/v1/volumes').set(t.auth).send(body);
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(JSON.stringify(res.body)).toContain(field);
    }
    for (const [mount, field] of [
      [{ volumeId: v.body.id, mountPath: 'relative' }, 'mountPath'],
      [{ volumeId: v.body.id, mountPath: '/proc/x' }, 'mountPath'],
      [{ volumeId: v.body.id, mountPath: '/a/../b' }, 'mountPath'],
      [{ volumeId: v.body.id, mountPath: '/a', subpath: '../../etc' }, 'subpath'],
    ] as const) {
      const res = await create({ volumes: [mount] });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.error.message).toContain(field);
    }
    const twice = await create({ volumes: [{ volumeId: v.body.id, mountPath: '/a' }, { volumeId: v.body.id, mountPath: '/a/' }] });
    expect(twice.status).toBe(400);
    const unknown = await create({ volumes: [{ volumeId: 'nosuch', mountPath: '/a' }] });
    expect(unknown.status).toBe(404);

    // Another organisation: not found by id or name, not listed, cannot mount or delete it.
    expect((await t.http.get(`/api/v1/volumes/${v.body.id}`).set(other)).status).toBe(404);
    expect((await t.http.get('/api/v1/volumes/mine').set(other)).status).toBe(404);
    expect((await t.http.get('/api/v1/volumes').set(other)).body.items).toEqual([]);
    expect((await t.http.delete(`/api/v1/volumes/${v.body.id}`).set(other)).status).toBe(404);
    const foreign = await t.http.post('/api/v1/sandboxes').set(other).send({ memoryMiB: 256, volumes: [{ volumeId: v.body.id, mountPath: '/x' }] });
    expect(foreign.status).toBe(404);
    // The other organisation may use the same name for a volume of its own.
    expect((await t.http.post('/api/v1/volumes').set(other).send({ name: 'mine' })).status).toBe(201);

    // Count limit 3: two more fit, the fourth is refused.
    expect((await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'two' })).status).toBe(201);
    expect((await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'three' })).status).toBe(201);
    const over = await t.http.post('/api/v1/volumes').set(t.auth).send({ name: 'four' });
    expect(over.status).toBe(429);
    expect(over.body.error).toMatchObject({ code: 'quota_exceeded' });
    expect(over.body.error.message).toMatch(/3 of 3 volumes/);
  }, 300_000);
});
