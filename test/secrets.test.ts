// Organisation secrets and runtime env changes through the native API (issue 19), on the real
// server, PostgreSQL and local driver: a secret is stored encrypted and never returned, is given
// to a sandbox as env and as a file, is re-resolved at every start (changed and deleted
// secrets), never appears in an API answer or a server log line; another organisation cannot
// see or use it; bad input is a 400 naming the field; limits hold. `PATCH /env` changes what
// later commands see and survives a stop/start.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';

let t: TestServer;
const VALUE = `s3cr3t-${Math.random().toString(36).slice(2)}-value`;
const ROTATED = `r0tated-${Math.random().toString(36).slice(2)}-value`;

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_LOG_LEVEL: 'debug', NESTBOX_SECRET_MAX_PER_ORG: '3', NESTBOX_SECRET_MAX_VALUE_BYTES: '1024' } });
});
afterAll(async () => {
  await t?.close();
});

const run = async (id: string, cmd: string): Promise<string> => {
  const res = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.stdout as string;
};

describe('organisation secrets', () => {
  let secretId: string;
  let sandboxId: string;
  const answers: string[] = [];
  const keep = <R extends { text: string }>(res: R): R => {
    answers.push(res.text);
    return res;
  };

  it('are stored without ever being returned, and refuse bad input naming the field', async () => {
    const created = keep(await t.http.post('/api/v1/secrets').set(t.auth).send({ name: 'api-token', value: VALUE, description: 'test', hosts: ['api.example.com'] }));
    expect(created.status, created.text).toBe(201);
    expect(created.body).toMatchObject({ name: 'api-token', description: 'test', hosts: ['api.example.com'], version: 1 });
    secretId = created.body.id;
    expect(secretId).toMatch(/^sec[a-z0-9]{20}$/);
    expect(keep(await t.http.get(`/api/v1/secrets/${secretId}`).set(t.auth)).body).toEqual(created.body);
    const list = keep(await t.http.get('/api/v1/secrets').set(t.auth));
    expect(list.body).toMatchObject({ total: 1, nextCursor: null, items: [created.body] });

    // At rest: ciphertext only.
    const row = await t.server.db('secrets').where({ id: secretId }).first();
    expect(JSON.stringify(row)).not.toContain(VALUE);
    expect(row.value_encrypted).toMatch(/^v1\./);

    const bad = async (body: object, field: string, status = 400) => {
      const res = await t.http.post('/api/v1/secrets').set(t.auth).send(body);
      expect(res.status, res.text).toBe(status);
      expect(JSON.stringify(res.body)).toContain(field);
    };
    await bad({ name: 'api-token', value: 'x' }, 'name', 409);
    await bad({ name: 'bad name!', value: 'x' }, 'name');
    await bad({ name: 'ok' }, 'value');
    await bad({ name: 'big', value: 'x'.repeat(1025) }, 'value');
    await bad({ name: 'h', value: 'x', hosts: ['not a host'] }, 'hosts');
    const rename = await t.http.patch(`/api/v1/secrets/${secretId}`).set(t.auth).send({ name: 'other' });
    expect(rename.status).toBe(400);
    // The count limit (NESTBOX_SECRET_MAX_PER_ORG=3 here).
    expect((await t.http.post('/api/v1/secrets').set(t.auth).send({ name: 'two', value: 'x' })).status).toBe(201);
    expect((await t.http.post('/api/v1/secrets').set(t.auth).send({ name: 'three', value: 'x' })).status).toBe(201);
    const over = await t.http.post('/api/v1/secrets').set(t.auth).send({ name: 'four', value: 'x' });
    expect(over.status, over.text).toBe(429);
    expect(over.body.error.code).toBe('limit_reached');
    const page = await t.http.get('/api/v1/secrets?limit=2').set(t.auth);
    expect(page.body.items.map((s: { name: string }) => s.name)).toEqual(['api-token', 'three']);
    const rest = await t.http.get(`/api/v1/secrets?limit=2&cursor=${page.body.nextCursor}`).set(t.auth);
    expect(rest.body).toMatchObject({ items: [{ name: 'two' }], nextCursor: null, total: 3 });
    for (const name of ['two', 'three']) {
      const s = page.body.items.concat(rest.body.items).find((x: { name: string }) => x.name === name);
      expect((await t.http.delete(`/api/v1/secrets/${s.id}`).set(t.auth)).status).toBe(204);
    }
  });

  it('are given to a sandbox as env and as a file, checked at create', async () => {
    const badRefs = async (secrets: unknown, field: string) => {
      const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' }, secrets });
      expect(res.status, res.text).toBe(400);
      expect(res.body.error.message).toContain(field);
    };
    await badRefs([{ name: 'missing', env: 'X' }], 'secrets[0].name');
    await badRefs([{ name: 'api-token' }], 'secrets[0]');
    await badRefs([{ name: 'api-token', env: '1X' }], 'secrets[0].env');
    await badRefs([{ name: 'api-token', file: 'relative/path' }], 'secrets[0].file');
    const clash = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ env: { API_TOKEN: 'x' }, secrets: [{ name: 'api-token', env: 'API_TOKEN' }] });
    expect(clash.status).toBe(400);

    const created = keep(await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' }, env: { PLAIN: 'p' }, secrets: [{ name: 'api-token', env: 'API_TOKEN', file: '/run/secrets/api-token' }] }));
    expect(created.status, created.text).toBe(201);
    sandboxId = created.body.id;
    expect(await run(sandboxId, 'printf %s "$API_TOKEN"')).toBe(VALUE);
    expect(await run(sandboxId, 'cat /run/secrets/api-token; echo; stat -c "%a %U" /run/secrets/api-token')).toBe(`${VALUE}\n400 root\n`);
    // Detached processes, sessions and terminals start from the same environment.
    const proc = await t.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(t.auth).send({ cmd: 'printf %s "$API_TOKEN" > /tmp/p.txt', detach: true });
    expect(proc.status, proc.text).toBeLessThan(300);
    await new Promise((r) => setTimeout(r, 500));
    expect(await run(sandboxId, 'cat /tmp/p.txt')).toBe(VALUE);
    // A fork's child gets them too (its processes start afresh; the file comes with the disk).
    const fork = keep(await t.http.post(`/api/v1/sandboxes/${sandboxId}/fork`).set(t.auth).send({}));
    expect(fork.status, fork.text).toBe(201);
    const child = fork.body.sandboxes[0].id as string;
    expect(await run(child, 'printf %s "$API_TOKEN"; echo; cat /run/secrets/api-token')).toBe(`${VALUE}\n${VALUE}`);
    expect((await t.http.delete(`/api/v1/sandboxes/${child}`).set(t.auth)).status).toBe(204);
    keep(await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set(t.auth));
    keep(await t.http.get('/api/v1/sandboxes').set(t.auth));
    // Not in the host agent's record either (values go to the guest after the start).
    const hostRecords = JSON.stringify(await t.server.db('sandboxes').where({ id: sandboxId }).first());
    expect(hostRecords).not.toContain(VALUE);
  });

  it('are re-resolved at every start: a new value, then a deleted secret', async () => {
    expect((await t.http.patch(`/api/v1/secrets/${secretId}`).set(t.auth).send({ value: ROTATED })).body.version).toBe(2);
    // Running processes and the current environment keep the old value until the next start.
    expect(await run(sandboxId, 'printf %s "$API_TOKEN"')).toBe(VALUE);
    expect((await t.http.post(`/api/v1/sandboxes/${sandboxId}/stop`).set(t.auth)).status).toBe(200);
    expect((await t.http.post(`/api/v1/sandboxes/${sandboxId}/resume`).set(t.auth)).status).toBe(200);
    expect(await run(sandboxId, 'printf %s "$API_TOKEN"; echo; cat /run/secrets/api-token')).toBe(`${ROTATED}\n${ROTATED}`);

    expect((await t.http.delete(`/api/v1/secrets/${secretId}`).set(t.auth)).status).toBe(204);
    expect((await t.http.get(`/api/v1/secrets/${secretId}`).set(t.auth)).status).toBe(404);
    expect((await t.http.post(`/api/v1/sandboxes/${sandboxId}/stop`).set(t.auth)).status).toBe(200);
    expect((await t.http.post(`/api/v1/sandboxes/${sandboxId}/resume`).set(t.auth)).status).toBe(200);
    expect(await run(sandboxId, 'printf "[%s]" "${API_TOKEN-unset}"; echo; echo "$PLAIN"; test -e /run/secrets/api-token || echo no-file')).toBe('[unset]\np\nno-file\n');
  });

  it('never appear in an API answer or a log line', async () => {
    for (const text of answers) {
      expect(text).not.toContain(VALUE);
      expect(text).not.toContain(ROTATED);
    }
    const logs = t.logs.join('\n');
    expect(logs.length).toBeGreaterThan(1000);
    expect(logs).not.toContain(VALUE);
    expect(logs).not.toContain(ROTATED);
  });

  it("are another organisation's 404, and it cannot give them to its sandboxes", async () => {
    const mine = (await t.http.post('/api/v1/secrets').set(t.auth).send({ name: 'mine', value: VALUE })).body;
    const org = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'secrets-other' });
    expect(org.status, org.text).toBe(201);
    const key = (await t.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(t.auth).send({})).body.key as string;
    const other = { Authorization: `Bearer ${key}` };
    expect((await t.http.get(`/api/v1/secrets/${mine.id}`).set(other)).status).toBe(404);
    expect((await t.http.patch(`/api/v1/secrets/${mine.id}`).set(other).send({ value: 'x' })).status).toBe(404);
    expect((await t.http.delete(`/api/v1/secrets/${mine.id}`).set(other)).status).toBe(404);
    expect((await t.http.get('/api/v1/secrets').set(other)).body).toMatchObject({ items: [], total: 0 });
    const use = await t.http.post('/api/v1/sandboxes').set(other).send({ secrets: [{ name: 'mine', env: 'X' }] });
    expect(use.status, use.text).toBe(400);
    expect(use.body.error.message).toContain('secrets[0].name');
    // The same name in its own organisation is its own secret.
    expect((await t.http.post('/api/v1/secrets').set(other).send({ name: 'mine', value: 'theirs' })).status).toBe(201);
    // A key without secrets:manage can neither read the list nor give one to a sandbox.
    const ci = (await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'ci', preset: 'ci' })).body.key as string;
    expect((await t.http.get('/api/v1/secrets').set({ Authorization: `Bearer ${ci}` })).status).toBe(403);
    expect((await t.http.post('/api/v1/sandboxes').set({ Authorization: `Bearer ${ci}` }).send({ secrets: [{ name: 'mine', env: 'X' }] })).status).toBe(403);
  });
});

describe('PATCH /sandboxes/{id}/env', () => {
  it('changes what later commands see, unset before set, and survives a stop/start', async () => {
    const id = (await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' }, env: { KEEP: 'k', DROP: 'd' } })).body.id as string;
    const changed = await t.http.patch(`/api/v1/sandboxes/${id}/env`).set(t.auth).send({ set: { ADDED: 'a b', KEEP: 'k2' }, unset: ['DROP'] });
    expect(changed.status, changed.text).toBe(200);
    expect(changed.body.env).toEqual({ KEEP: 'k2', ADDED: 'a b' });
    const show = 'printf "%s|%s|%s" "$KEEP" "$ADDED" "${DROP-none}"';
    expect(await run(id, show)).toBe('k2|a b|none');
    // A session started after the change has it too.
    const session = await t.http.post(`/api/v1/sandboxes/${id}/sessions`).set(t.auth).send({});
    expect(session.status, session.text).toBeLessThan(300);
    const inSession = await t.http.post(`/api/v1/sandboxes/${id}/sessions/${session.body.sessionId}/commands`).set(t.auth).send({ cmd: show });
    expect(inSession.body.stdout, inSession.text).toContain('k2|a b|none');

    expect((await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(t.auth)).status).toBe(200);
    // Stopped: kept for its next start.
    expect((await t.http.patch(`/api/v1/sandboxes/${id}/env`).set(t.auth).send({ set: { WHILE_STOPPED: 'w' } })).status).toBe(200);
    expect((await t.http.post(`/api/v1/sandboxes/${id}/resume`).set(t.auth)).status).toBe(200);
    expect(await run(id, `${show}; printf "|%s" "$WHILE_STOPPED"`)).toBe('k2|a b|none|w');

    const bad = async (body: object, field: string) => {
      const res = await t.http.patch(`/api/v1/sandboxes/${id}/env`).set(t.auth).send(body);
      expect(res.status, res.text).toBe(400);
      expect(res.text).toContain(field);
    };
    await bad({ set: { '1BAD': 'x' } }, 'set.1BAD');
    await bad({ set: { 'A=B': 'x' } }, 'set.A=B');
    await bad({ set: { A: 'x\u0000y' } }, 'set.A');
    await bad({ unset: ['ok', 'not ok'] }, 'unset[1]');
    await bad({ set: { A: 1 } }, 'set');
    expect((await t.http.patch('/api/v1/sandboxes/nosuchsandbox/env').set(t.auth).send({ set: { A: 'x' } })).status).toBe(404);
  });
});

describe('a start cut off after the host started the sandbox', () => {
  it('is taken over with the secrets handed over', async () => {
    const value = `takeover-${Math.random().toString(36).slice(2)}`;
    expect((await t.http.post('/api/v1/secrets').set(t.auth).send({ name: 'takeover', value })).status).toBe(201);
    const id = (await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' }, secrets: [{ name: 'takeover', env: 'TAKEOVER' }] })).body.id as string;
    expect((await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(t.auth)).status).toBe(200);
    // What a kill -9 between the host's start and the hand-over leaves: the host runs it, the row is
    // a transitional start owned by a dead control plane.
    const sandbox = await t.server.services.sandboxes.get(await t.server.services.auth.authenticate(t.apiKey), id);
    const client = await t.server.services.hosts.clientFor(sandbox.hostId!);
    await client.startSandbox(t.server.services.sandboxes.hostSpec(sandbox));
    await t.server.db('sandboxes').where({ id }).update({ state: 'starting', operation: 'start', operation_id: `op-dead-${id}`, operation_owner: 'cp-dead', operation_started_at: new Date() });
    await waitFor('the start taken over', async () => {
      const r = await t.server.db('sandboxes').where({ id }).first();
      return r && r.state === 'running' && r.operation === null ? r : undefined;
    }, 60_000);
    expect(await run(id, 'printf %s "$TAKEOVER"')).toBe(value);
  });
});

// PGlite (the single-machine database) answers some statements differently (knex-pglite's
// delete() gives a result object, not a count): the isolation and the env UPDATE hold there too.
describe('on PGlite', () => {
  it('keeps another organisation out and changes env', async () => {
    const p = await startTestServer({ database: 'pglite' });
    try {
      const mine = (await p.http.post('/api/v1/secrets').set(p.auth).send({ name: 'mine', value: VALUE })).body;
      const org = (await p.http.post('/api/v1/organizations').set(p.auth).send({ name: 'pglite-other' })).body;
      const key = (await p.http.post(`/api/v1/organizations/${org.id}/api-keys`).set(p.auth).send({})).body.key as string;
      expect((await p.http.delete(`/api/v1/secrets/${mine.id}`).set({ Authorization: `Bearer ${key}` })).status).toBe(404);
      expect((await p.http.get(`/api/v1/secrets/${mine.id}`).set(p.auth)).status).toBe(200);
      expect((await p.http.delete(`/api/v1/secrets/${mine.id}`).set(p.auth)).status).toBe(204);
      expect((await p.http.delete(`/api/v1/secrets/${mine.id}`).set(p.auth)).status).toBe(404);
      const id = (await p.http.post('/api/v1/sandboxes').set(p.auth).send({ egress: { mode: 'deny-all' }, env: { A: '1', B: '2' } })).body.id as string;
      const changed = await p.http.patch(`/api/v1/sandboxes/${id}/env`).set(p.auth).send({ set: { C: '3' }, unset: ['A'] });
      expect(changed.body.env, changed.text).toEqual({ B: '2', C: '3' });
    } finally {
      await p.close();
    }
  });
});
