// The embedded default: the same server on PGlite, no PostgreSQL involved.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { startTestServer, type TestServer } from './harness.js';

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer({ database: 'pglite' });
});
afterAll(async () => {
  await t?.close();
});

describe('server on PGlite', () => {
  it('creates, runs a command in and deletes a sandbox', async () => {
    expect(t.server.services.config.database.kind).toBe('pglite');
    expect(existsSync(`${t.dataDir}/pglite`)).toBe(true);
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ labels: { db: 'pglite' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const out = await t.http.post(`/api/v1/sandboxes/${created.body.id}/commands`).set(t.auth).send({ cmd: 'uname -s; cat /etc/debian_version | cut -d. -f1' });
    expect(out.body).toMatchObject({ exitCode: 0, stdout: 'Linux\n12\n' });
    const listed = await t.http.get('/api/v1/sandboxes').query({ label: 'db=pglite' }).set(t.auth);
    expect(listed.body.items.map((s: { id: string }) => s.id)).toEqual([created.body.id]);
    expect((await t.http.delete(`/api/v1/sandboxes/${created.body.id}`).set(t.auth)).status).toBe(204);
  });
});
