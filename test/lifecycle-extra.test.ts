// Pause, wake on use, idle policy, auto-delete, fork, named snapshots, reading a stopped
// sandbox's files and idempotency keys — through the native API on the real local driver.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t?.close();
});

const create = async (body: Record<string, unknown> = {}, headers: Record<string, string> = {}) => {
  const res = await t.http.post('/api/v1/sandboxes').set(t.auth).set(headers).send({ timeoutSeconds: 0, ...body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { id: string; state: string; [k: string]: unknown };
};
const sh = async (id: string, cmd: string) => (await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd })).body as { stdout: string; exitCode: number };
const get = async (id: string) => (await t.http.get(`/api/v1/sandboxes/${id}`).set(t.auth)).body;
const post = (path: string, body?: object) => t.http.post(`/api/v1${path}`).set(t.auth).send(body ?? {});

describe('pause and wake on use', () => {
  it('pauses (processes stop using CPU), unpauses with memory intact, and a call wakes a paused sandbox', async () => {
    const s = await create();
    await sh(s.id, "nohup bash -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.05; done' >/dev/null 2>&1 &");
    await new Promise((r) => setTimeout(r, 300));
    const paused = await post(`/sandboxes/${s.id}/pause`);
    expect(paused.status).toBe(200);
    expect(paused.body).toMatchObject({ state: 'paused', pauseReason: 'user' });
    expect((await post(`/sandboxes/${s.id}/pause`)).status).toBe(200); // retry-safe
    // The sandbox's disk (its own file system, mounted on the host) in the default reflink store.
    const counterFile = `${t.dataDir}/host/store/sandboxes/${s.id}/fs/upper/tmp/counter`;
    const { readFileSync } = await import('node:fs');
    const frozenAt = readFileSync(counterFile, 'utf8');
    await new Promise((r) => setTimeout(r, 500));
    expect(readFileSync(counterFile, 'utf8')).toBe(frozenAt); // nothing ran while paused

    const unpaused = await post(`/sandboxes/${s.id}/unpause`);
    expect(unpaused.body).toMatchObject({ state: 'running', memoryRestored: true });
    // The same loop continues (the file may be caught mid-rewrite, hence the retries).
    await waitFor('the loop to continue', async () => (Number(readFileSync(counterFile, 'utf8')) > Number(frozenAt) ? true : undefined), 5_000, 50);

    await post(`/sandboxes/${s.id}/pause`);
    // A command on a paused sandbox wakes it transparently.
    const out = await sh(s.id, 'echo awake');
    expect(out.stdout).toBe('awake\n');
    expect((await get(s.id)).state).toBe('running');
  });

  it('pauses an idle sandbox on its own and wakes it on the next call; stop policy too', async () => {
    const pauser = await create({ idleTimeoutSeconds: 1 });
    await waitFor('idle pause', async () => ((await get(pauser.id)).state === 'paused' ? true : undefined), 20_000, 200);
    expect((await get(pauser.id)).pauseReason).toBe('idle');
    expect((await sh(pauser.id, 'echo back')).stdout).toBe('back\n');

    const stopper = await create({ idleTimeoutSeconds: 1, idleAction: 'stop' });
    await sh(stopper.id, 'echo kept > /root/kept.txt');
    await waitFor('idle stop', async () => ((await get(stopper.id)).state === 'stopped' ? true : undefined), 20_000, 200);
    expect((await get(stopper.id)).stopReason).toBe('idle');
    // Woken by use: a cold start from the kept disk.
    expect((await sh(stopper.id, 'cat /root/kept.txt')).stdout).toBe('kept\n');
    // Turning the policy off keeps it running.
    expect((await t.http.patch(`/api/v1/sandboxes/${stopper.id}`).set(t.auth).send({ idleTimeoutSeconds: 0 })).body.idleTimeoutSeconds).toBe(0);
  });

  it('a call counts as activity when the last one noted is older than the granularity', async () => {
    const s = await create();
    // As if the sandbox had been quiet for a minute.
    const quiet = new Date(Date.now() - 60_000);
    await t.server.db('sandboxes').where({ id: s.id }).update({ last_activity_at: quiet });
    expect((await sh(s.id, 'true')).exitCode).toBe(0);
    const noted = new Date((await get(s.id)).lastActivityAt).getTime();
    expect(noted).toBeGreaterThan(quiet.getTime());
  });

  it('a user stop is not undone by a call, and auto-delete removes a stopped sandbox', async () => {
    const s = await create({ autoDeleteSeconds: 1 });
    await post(`/sandboxes/${s.id}/stop`);
    const refused = await t.http.post(`/api/v1/sandboxes/${s.id}/commands`).set(t.auth).send({ cmd: 'true' });
    expect(refused.status).toBe(409);
    await waitFor('auto-delete', async () => ((await t.http.get(`/api/v1/sandboxes/${s.id}`).set(t.auth)).status === 404 ? true : undefined), 20_000, 200);
  });

  it('keep-alive moves the deadline', async () => {
    const s = await create({ timeoutSeconds: 60 });
    const before = new Date((await get(s.id)).expiresAt).getTime();
    await new Promise((r) => setTimeout(r, 1100));
    const after = new Date((await post(`/sandboxes/${s.id}/keepalive`)).body.expiresAt).getTime();
    expect(after).toBeGreaterThan(before + 1000);
  });
});

describe('fork', () => {
  it('forks a running sandbox twice into independent children', async () => {
    const source = await create({ labels: { role: 'source' } });
    await sh(source.id, 'mkdir -p /work && echo shared > /work/base.txt && rm /etc/motd');
    const res = await post(`/sandboxes/${source.id}/fork`, { count: 2, labels: { role: 'child' } });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body.memoryCopied).toBe(false);
    const [a, b] = res.body.sandboxes as { id: string; state: string; labels: Record<string, string>; forkedFrom: string }[];
    expect(a.state).toBe('running');
    expect(a.forkedFrom).toBe(source.id);
    expect(a.labels.role).toBe('child');
    expect(new Set([a.id, b.id, source.id]).size).toBe(3);
    await sh(a.id, 'echo from-a > /work/mine.txt');
    await sh(b.id, 'echo from-b > /work/mine.txt');
    expect((await sh(a.id, 'cat /work/base.txt /work/mine.txt; test -e /etc/motd && echo motd || echo no-motd')).stdout).toBe('shared\nfrom-a\nno-motd\n');
    expect((await sh(b.id, 'cat /work/mine.txt')).stdout).toBe('from-b\n');
    expect((await sh(source.id, 'cat /work/mine.txt 2>&1 || true')).stdout).toMatch(/No such file/);
  });

  it('forks a stopped sandbox', async () => {
    const source = await create();
    await sh(source.id, 'echo cold > /root/cold.txt');
    await post(`/sandboxes/${source.id}/stop`);
    const res = await post(`/sandboxes/${source.id}/fork`);
    expect(res.status).toBe(201);
    expect((await sh(res.body.sandboxes[0].id, 'cat /root/cold.txt')).stdout).toBe('cold\n');
    expect((await get(source.id)).state).toBe('stopped');
  });
});

describe('named snapshots', () => {
  it('outlive their source, seed new sandboxes, and cannot be deleted while in use', async () => {
    const source = await create();
    await sh(source.id, 'mkdir -p /opt/app && echo v1 > /opt/app/version && apt-get --version >/dev/null && echo ok');
    const snap = await post('/snapshots', { sandboxId: source.id, name: 'app-v1' });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    expect(snap.body).toMatchObject({ name: 'app-v1', state: 'ready', sourceSandboxId: source.id });
    expect((await post('/snapshots', { sandboxId: source.id, name: 'app-v1' })).status).toBe(409);
    expect((await t.http.delete(`/api/v1/sandboxes/${source.id}`).set(t.auth)).status).toBe(204);

    const fromSnap = await create({ snapshot: 'app-v1' });
    expect(fromSnap.snapshotId).toBe(snap.body.id);
    expect((await sh(fromSnap.id, 'cat /opt/app/version')).stdout).toBe('v1\n');
    // A snapshot of a sandbox built on a snapshot chains onto it.
    await sh(fromSnap.id, 'echo v2 > /opt/app/version');
    const v2 = await post('/snapshots', { sandboxId: fromSnap.id, name: 'app-v2' });
    expect(v2.body.parentSnapshotId).toBe(snap.body.id);
    const fromV2 = await create({ snapshot: 'app-v2' });
    expect((await sh(fromV2.id, 'cat /opt/app/version')).stdout).toBe('v2\n');

    const inUse = await t.http.delete('/api/v1/snapshots/app-v1').set(t.auth);
    expect(inUse.status).toBe(409);
    expect(inUse.body.error.message).toMatch(/in use/);
    const listed = await t.http.get('/api/v1/snapshots').set(t.auth);
    expect(listed.body.items.map((s: { name: string }) => s.name)).toEqual(expect.arrayContaining(['app-v1', 'app-v2']));

    for (const id of [fromV2.id, fromSnap.id]) await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth);
    expect((await t.http.delete('/api/v1/snapshots/app-v1').set(t.auth)).status).toBe(409); // app-v2 builds on it
    expect((await t.http.delete('/api/v1/snapshots/app-v2').set(t.auth)).status).toBe(204);
    expect((await t.http.delete('/api/v1/snapshots/app-v1').set(t.auth)).status).toBe(204);
    expect((await t.http.get('/api/v1/snapshots/app-v1').set(t.auth)).status).toBe(404);
    const missing = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ snapshot: 'app-v1' });
    expect(missing.status).toBe(400);
    expect(missing.body.error.message).toMatch(/^snapshot/);
  });
});

describe('files of a stopped sandbox', () => {
  it('lists and downloads without resuming it, and refuses writes', async () => {
    const s = await create();
    await sh(s.id, 'mkdir -p /data && echo "kept on disk" > /data/report.txt');
    await post(`/sandboxes/${s.id}/stop`);
    const list = await t.http.get(`/api/v1/sandboxes/${s.id}/files/list`).query({ path: '/data' }).set(t.auth);
    expect(list.status, JSON.stringify(list.body)).toBe(200);
    expect(list.body.entries.map((e: { name: string }) => e.name)).toEqual(['report.txt']);
    const file = await t.http.get(`/api/v1/sandboxes/${s.id}/files`).query({ path: '/data/report.txt' }).set(t.auth);
    expect(file.status).toBe(200);
    expect(file.text ?? String(file.body)).toBe('kept on disk\n');
    expect((await get(s.id)).state).toBe('stopped');
    const write = await t.http.put(`/api/v1/sandboxes/${s.id}/files`).query({ path: '/data/x' }).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from('x'));
    expect(write.status).toBe(409);
  });

  it('bulk-downloads from the kept disk too (every file read does, one rule in the toolbox)', async () => {
    const s = await create();
    await sh(s.id, 'mkdir -p /data && echo "bulk from disk" > /data/bulk.txt');
    await post(`/sandboxes/${s.id}/stop`);
    const bulk = await t.http
      .post(`/api/v1/sandboxes/${s.id}/files/download`)
      .set(t.auth)
      .send({ paths: ['/data/bulk.txt'] })
      .buffer(true)
      .parse((res, done) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => done(null, Buffer.concat(chunks)));
      });
    expect(bulk.status).toBe(200);
    expect(String(bulk.headers['content-type'])).toMatch(/^multipart\/form-data; boundary=/);
    expect((bulk.body as Buffer).toString('utf8')).toContain('bulk from disk\n');
    expect((await get(s.id)).state).toBe('stopped');
  });
});

describe('idempotency keys', () => {
  it('returns the same sandbox for the same key and body, 409 for another body', async () => {
    const key = { 'Idempotency-Key': `create-${Date.now()}` };
    const first = await create({ labels: { idem: '1' } }, key);
    const again = await create({ labels: { idem: '1' } }, key);
    expect(again.id).toBe(first.id);
    const conflict = await t.http.post('/api/v1/sandboxes').set(t.auth).set(key).send({ timeoutSeconds: 0, labels: { idem: '2' } });
    expect(conflict.status).toBe(409);
    const listed = await t.http.get('/api/v1/sandboxes').query({ label: 'idem=1' }).set(t.auth);
    expect(listed.body.items).toHaveLength(1);

    const forkKey = { 'Idempotency-Key': `fork-${Date.now()}` };
    const f1 = await t.http.post(`/api/v1/sandboxes/${first.id}/fork`).set(t.auth).set(forkKey).send({ count: 2 });
    const f2 = await t.http.post(`/api/v1/sandboxes/${first.id}/fork`).set(t.auth).set(forkKey).send({ count: 2 });
    expect(f1.status).toBe(201);
    expect(f2.body.sandboxes.map((s: { id: string }) => s.id)).toEqual(f1.body.sandboxes.map((s: { id: string }) => s.id));
    expect((await t.http.post('/api/v1/sandboxes').set(t.auth).set({ 'Idempotency-Key': 'bad key with spaces' }).send({})).status).toBe(400);
  });
});
