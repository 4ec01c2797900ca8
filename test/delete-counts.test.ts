// A DELETE's count on both databases (issue 19 review). knex-pglite answers `delete()` with a
// result object where knex's pg client answers a number, so "was anything deleted" read from it
// was always yes (`!n`), or always no (`n > 0`): another organisation's webhook or SSH key
// "deleted" with 204, an unpublish always 404 on PGlite. Counts now come from RETURNING
// (core/store/repositories/rows-deleted.ts); these run against PostgreSQL and PGlite alike.
import { generateKeyPairSync } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, type Db } from '../core/store/db.js';
import { DB_BACKENDS } from '../core/store/test-support.js';
import { deleteCounted } from '../core/store/repositories/rows-deleted.js';
import { imageRepository } from '../core/store/repositories/images.js';
import { portRepository } from '../core/store/repositories/ports.js';
import { organizationRepository } from '../core/store/repositories/organizations.js';
import { hostRepository } from '../core/store/repositories/hosts.js';
import { sandboxRepository } from '../core/store/repositories/sandboxes.js';
import { startTestServer, type TestServer } from './harness.js';

/** An OpenSSH `ssh-ed25519` public key line, made without ssh-keygen. */
function ed25519PublicKeyLine(comment: string): string {
  const raw = Buffer.from(generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' }).x!, 'base64url');
  // The SSH wire encoding: each field a 32-bit big-endian length, then its bytes.
  const str = (b: Buffer) => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(b.length);
    return Buffer.concat([length, b]);
  };
  return `ssh-ed25519 ${Buffer.concat([str(Buffer.from('ssh-ed25519')), str(raw)]).toString('base64')} ${comment}`;
}

describe.each(DB_BACKENDS)('deleteCounted on %s', (_name, open) => {
  let db: Db;
  let cleanup: () => Promise<void>;
  beforeAll(async () => {
    ({ db, cleanup } = await open());
    await migrateToLatest(db);
    await db.schema.createTable('delete_count_probe', (t) => {
      t.text('id').primary();
      t.text('kind');
    });
    await db('delete_count_probe').insert([{ id: 'a', kind: 'x' }, { id: 'b', kind: 'y' }, { id: 'c', kind: 'y' }]);
  });
  afterAll(async () => cleanup());

  it('answers the number of rows removed: none, one, several', async () => {
    expect(await deleteCounted(db('delete_count_probe').where({ id: 'missing' }))).toBe(0);
    expect(await deleteCounted(db('delete_count_probe').where({ id: 'a' }))).toBe(1);
    expect(await deleteCounted(db('delete_count_probe').where({ kind: 'y' }), 'kind')).toBe(2);
    expect(Number(((await db('delete_count_probe').count({ n: '*' }).first()) as { n: string | number }).n)).toBe(0);
  });

  it('repositories say true for a row removed and false for one that is not there', async () => {
    // A published port (an unpublish was 404 on PGlite for every port) on a sandbox of its own.
    await organizationRepository(db).insert({ id: 'orgdc', name: 'delete-counts' });
    await hostRepository(db).upsertHeartbeat({ id: 'hdc', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
    await sandboxRepository(db).insertCreating({ id: 'sdc', organizationId: 'orgdc', hostId: 'hdc', image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, operationId: 'opdc', operationOwner: 'cp1', diskGiB: 1 });
    await portRepository(db).upsert({ sandboxId: 'sdc', port: 8080, organizationId: 'orgdc', public: false, tokenHash: null, tokenApiKeyId: null });
    expect(await portRepository(db).remove('sdc', 8081)).toBe(false);
    expect(await portRepository(db).remove('sdc', 8080)).toBe(true);
    expect(await portRepository(db).remove('sdc', 8080)).toBe(false);
    expect(await imageRepository(db).removeTag('orgdc', 'img', 'latest')).toBe(false);
  });
});

describe.each(['postgres', 'pglite'] as const)('deleting what is not yours, on %s', (database) => {
  let t: TestServer;
  let other: { Authorization: string };
  beforeAll(async () => {
    t = await startTestServer({ database, env: { NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true' } });
    const org = (await t.http.post('/api/v1/organizations').set(t.auth).send({ name: `delete-counts-${database}` })).body as { id: string };
    const key = (await t.http.post(`/api/v1/organizations/${org.id}/api-keys`).set(t.auth).send({})).body.key as string;
    other = { Authorization: `Bearer ${key}` };
  }, 180_000);
  afterAll(async () => {
    await t?.close();
  });

  it("a webhook: another organisation's or a missing one is 404, and it stays", async () => {
    // Loopback and never sent to: no sandbox runs on this server, so no event is delivered.
    const created = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: 'http://127.0.0.1:9/hook', eventTypes: ['sandbox.deleted'] });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    const foreign = await t.http.delete(`/api/v1/webhooks/${id}`).set(other);
    expect(foreign.status, JSON.stringify(foreign.body)).toBe(404);
    expect((await t.http.get(`/api/v1/webhooks/${id}`).set(t.auth)).status).toBe(200);
    expect((await t.http.delete('/api/v1/webhooks/whk00000000000000000000').set(t.auth)).status).toBe(404);
    expect((await t.http.delete(`/api/v1/webhooks/${id}`).set(t.auth)).status).toBe(204);
    expect((await t.http.delete(`/api/v1/webhooks/${id}`).set(t.auth)).status).toBe(404);
  });

  it("an SSH key: another organisation's or a missing one is 404, and it stays", async () => {
    const added = await t.http.post('/api/v1/ssh-keys').set(t.auth).send({ publicKey: ed25519PublicKeyLine(`delete-counts@${database}`) });
    expect(added.status, JSON.stringify(added.body)).toBe(201);
    const id = added.body.id as string;
    expect((await t.http.delete(`/api/v1/ssh-keys/${id}`).set(other)).status).toBe(404);
    expect(((await t.http.get('/api/v1/ssh-keys').set(t.auth)).body.items as { id: string }[]).map((k) => k.id)).toContain(id);
    expect((await t.http.delete('/api/v1/ssh-keys/sshk00000000000000000000').set(t.auth)).status).toBe(404);
    expect((await t.http.delete(`/api/v1/ssh-keys/${id}`).set(t.auth)).status).toBe(204);
    expect((await t.http.delete(`/api/v1/ssh-keys/${id}`).set(t.auth)).status).toBe(404);
  });
});
