// Bad input, authentication, scopes and organisation isolation on every native route.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';

let t: TestServer;
let sandboxId: string;
let otherOrg: { Authorization: string };

beforeAll(async () => {
  t = await startTestServer();
  const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ labels: { suite: 'contract' } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  sandboxId = created.body.id;
  const org = await t.server.services.auth.createOrganization('other');
  const key = await t.server.services.auth.createApiKey(org.id, { name: 'other-admin', preset: 'admin' });
  otherOrg = { Authorization: `Bearer ${key.key}` };
});
afterAll(async () => {
  await t?.close();
});

const expectError = (res: { status: number; body: { error?: { code: string; message: string } } }, status: number, code: string, field?: string) => {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  expect(res.body.error?.code).toBe(code);
  if (field) expect(res.body.error?.message).toMatch(new RegExp(`^${field.replace(/\./g, '\\.')}\\b`));
};

describe('bad input → 400 naming the field, never a 500', () => {
  it.each([
    ['unknown field', { cpus: 2 }, 'cpus'],
    ['wrong type', { memoryMiB: 'lots' }, 'memoryMiB'],
    ['negative size', { memoryMiB: -5 }, 'memoryMiB'],
    ['negative timeout', { timeoutSeconds: -1 }, 'timeoutSeconds'],
    ['too many cpus', { cpu: 999 }, 'cpu'],
    ['too little memory', { memoryMiB: 1 }, 'memoryMiB'],
    ['bad env name', { env: { 'BAD-NAME': 'x' } }, 'env.BAD-NAME'],
    ['env value not a string', { env: { A: 1 } }, 'env.A'],
    ['unknown image', { image: 'nope' }, 'image'],
    ['labels not strings', { labels: { a: 1 } }, 'labels.a'],
  ])('create with %s', async (_what, body, field) => {
    expectError(await t.http.post('/api/v1/sandboxes').set(t.auth).send(body), 400, 'validation_failed', field);
  });

  it('refuses invalid JSON and a missing body where one is required', async () => {
    expectError(await t.http.post('/api/v1/sandboxes').set(t.auth).set('content-type', 'application/json').send('{"cpu": '), 400, 'validation_failed', 'body');
    expectError(await t.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(t.auth), 400, 'validation_failed', 'body');
    expectError(await t.http.patch(`/api/v1/sandboxes/${sandboxId}`).set(t.auth).send({}), 400, 'validation_failed');
  });

  it('validates commands', async () => {
    const url = `/api/v1/sandboxes/${sandboxId}/commands`;
    expectError(await t.http.post(url).set(t.auth).send({}), 400, 'validation_failed', 'cmd');
    expectError(await t.http.post(url).set(t.auth).send({ cmd: 'true', timeoutMs: -1 }), 400, 'validation_failed', 'timeoutMs');
    expectError(await t.http.post(url).set(t.auth).send({ cmd: 'true', shell: 'zsh' }), 400, 'validation_failed', 'shell');
    expectError(await t.http.post(url).set(t.auth).send({ cmd: 'pwd', cwd: '/does/not/exist' }), 400, 'validation_failed', 'cwd');
  });

  it('validates file paths (missing, NUL, directories, bad mode)', async () => {
    const base = `/api/v1/sandboxes/${sandboxId}/files`;
    expectError(await t.http.get(base).set(t.auth), 400, 'validation_failed', 'path');
    expectError(await t.http.get(base).query({ path: 'a\u0000b' }).set(t.auth), 400, 'validation_failed', 'path');
    expectError(await t.http.get(base).query({ path: '/etc' }).set(t.auth), 400, 'validation_failed', 'path');
    expectError(await t.http.get(base).query({ path: '/nope/missing' }).set(t.auth), 404, 'not_found');
    expectError(await t.http.put(base).query({ path: '/tmp/x', mode: '999' }).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from('x')), 400, 'validation_failed', 'mode');
    expectError(await t.http.get(`${base}/list`).query({ path: '/etc/passwd' }).set(t.auth), 400, 'validation_failed', 'path');
  });

  it('validates list parameters', async () => {
    expectError(await t.http.get('/api/v1/sandboxes').query({ limit: 0 }).set(t.auth), 400, 'validation_failed', 'limit');
    expectError(await t.http.get('/api/v1/sandboxes').query({ cursor: 'garbage' }).set(t.auth), 400, 'validation_failed', 'cursor');
    expectError(await t.http.get('/api/v1/sandboxes').query({ state: 'flying' }).set(t.auth), 400, 'validation_failed', 'state');
    expectError(await t.http.get('/api/v1/sandboxes').query({ label: 'novalue' }).set(t.auth), 400, 'validation_failed', 'label');
  });

  it('answers unknown sandboxes and routes with 404, wrong methods with 405', async () => {
    expectError(await t.http.get('/api/v1/sandboxes/doesnotexist').set(t.auth), 404, 'not_found');
    expectError(await t.http.get('/api/v1/sandboxes/Not-An-Id').set(t.auth), 400, 'validation_failed', 'sandboxId');
    expectError(await t.http.get('/api/v1/nothing-here').set(t.auth), 404, 'not_found');
    expectError(await t.http.put('/api/v1/sandboxes').set(t.auth).send({}), 405, 'method_not_allowed');
  });
});

describe('authentication and scopes', () => {
  it('needs a valid key everywhere except health and the spec', async () => {
    expect((await t.http.get('/api/v1/health')).status).toBe(200);
    const spec = await t.http.get('/api/v1/openapi.yaml');
    expect(spec.status).toBe(200);
    expect(spec.text).toContain('operationId: createSandbox');
    expectError(await t.http.get('/api/v1/sandboxes'), 401, 'unauthorized');
    expectError(await t.http.get('/api/v1/sandboxes').set('Authorization', 'Bearer nbx_' + 'x'.repeat(40)), 401, 'unauthorized');
    expectError(await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set('Authorization', 'Basic abc'), 401, 'unauthorized');
  });

  it('limits a read-only key to reading', async () => {
    const created = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'reader', preset: 'read-only' });
    expect(created.status).toBe(201);
    expect(created.body.key).toMatch(/^nbx_[A-Za-z0-9]{40}$/);
    const reader = { Authorization: `Bearer ${created.body.key}` };
    expect((await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set(reader)).status).toBe(200);
    expectError(await t.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(reader).send({ cmd: 'true' }), 403, 'forbidden');
    expectError(await t.http.post('/api/v1/sandboxes').set(reader).send({}), 403, 'forbidden');
    expectError(await t.http.get('/api/v1/api-keys').set(reader), 403, 'forbidden');
    const listed = await t.http.get('/api/v1/api-keys').set(t.auth);
    expect(JSON.stringify(listed.body)).not.toContain(created.body.key);
    expect((await t.http.delete(`/api/v1/api-keys/${created.body.id}`).set(t.auth)).status).toBe(204);
    expectError(await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set(reader), 401, 'unauthorized');
  });

  it('limits a sandbox-scoped key to its sandboxes; others are simply absent', async () => {
    const second = await t.http.post('/api/v1/sandboxes').set(t.auth).send({});
    const created = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'agent', preset: 'sandbox', sandboxIds: [sandboxId] });
    const agent = { Authorization: `Bearer ${created.body.key}` };
    const ok = await t.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(agent).send({ cmd: 'echo mine' });
    expect(ok.body.stdout).toBe('mine\n');
    expectError(await t.http.get(`/api/v1/sandboxes/${second.body.id}`).set(agent), 404, 'not_found');
    const list = await t.http.get('/api/v1/sandboxes').set(agent);
    expect(list.body.items.map((s: { id: string }) => s.id)).toEqual([sandboxId]);
    expectError(await t.http.delete(`/api/v1/sandboxes/${sandboxId}`).set(agent), 403, 'forbidden');
    expect((await t.http.delete(`/api/v1/sandboxes/${second.body.id}`).set(t.auth)).status).toBe(204);
  });
});

describe('organisation isolation', () => {
  it('another organisation gets 404 on every sandbox route and never sees it listed', async () => {
    const id = sandboxId;
    const routes: [string, string, unknown?][] = [
      ['get', `/api/v1/sandboxes/${id}`],
      ['patch', `/api/v1/sandboxes/${id}`, { labels: { stolen: 'yes' } }],
      ['delete', `/api/v1/sandboxes/${id}`],
      ['post', `/api/v1/sandboxes/${id}/stop`],
      ['post', `/api/v1/sandboxes/${id}/resume`],
      ['post', `/api/v1/sandboxes/${id}/commands`, { cmd: 'true' }],
      ['get', `/api/v1/sandboxes/${id}/files?path=/etc/hostname`],
      ['get', `/api/v1/sandboxes/${id}/files/list?path=/`],
    ];
    for (const [method, url, body] of routes) {
      const req = (t.http as unknown as Record<string, (u: string) => import('supertest').Test>)[method](url).set(otherOrg);
      const res = body ? await req.send(body as object) : await req;
      expect(res.status, `${method} ${url}`).toBe(404);
      expect(res.body.error.code).toBe('not_found');
    }
    const put = await t.http.put(`/api/v1/sandboxes/${id}/files`).query({ path: '/tmp/x' }).set(otherOrg).set('content-type', 'application/octet-stream').send(Buffer.from('x'));
    expect(put.status).toBe(404);
    const list = await t.http.get('/api/v1/sandboxes').set(otherOrg);
    expect(list.body.items).toEqual([]);
    // And it is untouched.
    const mine = await t.http.get(`/api/v1/sandboxes/${id}`).set(t.auth);
    expect(mine.body).toMatchObject({ state: 'running', labels: { suite: 'contract' } });
  });
});
