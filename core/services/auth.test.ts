import { mkdtempSync, rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, openDatabase, type Db } from '../store/db.js';
import { AuthService, generateApiKey, hashApiKey, isWellFormedApiKey, KEY_PRESETS, KEY_USE_RECORD_INTERVAL_MS } from './auth.js';
import { NestboxError } from '../errors.js';

describe('API keys', () => {
  let db: Db;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync('/tmp/nbx-auth-');
    db = openDatabase({ kind: 'pglite', directory: dir });
    await migrateToLatest(db);
  });
  afterAll(async () => {
    await db.destroy();
    rmSync(dir, { recursive: true, force: true });
  });

  it('are nbx_ + 40 random letters and digits', () => {
    const keys = new Set(Array.from({ length: 200 }, generateApiKey));
    expect(keys.size).toBe(200);
    for (const k of keys) expect(k).toMatch(/^nbx_[A-Za-z0-9]{40}$/);
    expect(isWellFormedApiKey('nbx_' + 'a'.repeat(39))).toBe(false);
  });

  it('stores only a hash and authenticates with the key', async () => {
    const auth = new AuthService(db);
    const org = await auth.createOrganization('acme');
    const { key, record } = await auth.createApiKey(org.id, { name: 'ci', preset: 'ci' });
    const rows = await db('api_keys').where({ id: record.id });
    expect(JSON.stringify(rows)).not.toContain(key);
    expect(rows[0].key_hash).toBe(hashApiKey(key));
    const p = await auth.authenticate(key);
    expect(p.organizationId).toBe(org.id);
    expect([...p.scopes].sort()).toEqual([...KEY_PRESETS.ci].sort());
  });

  it('rejects unknown, malformed and revoked keys with the same 401', async () => {
    const auth = new AuthService(db);
    const org = await auth.createOrganization('revokers');
    const { key, record } = await auth.createApiKey(org.id, { name: 'tmp', preset: 'read-only' });
    await auth.revokeApiKey(org.id, record.id);
    for (const bad of [undefined, 'nope', generateApiKey(), key]) {
      await expect(auth.authenticate(bad)).rejects.toMatchObject({ code: 'unauthorized', status: 401 });
    }
    await expect(auth.revokeApiKey('someoneelse', record.id)).rejects.toBeInstanceOf(NestboxError);
  });

  it('records a key\'s use at most once a minute per process: the first use, then none until the interval has passed', async () => {
    let clock = 1_000_000;
    const auth = new AuthService(db, () => clock);
    const org = await auth.createOrganization('busy');
    const { key, record } = await auth.createApiKey(org.id, { name: 'hot', preset: 'admin' });
    const lastUsed = async () => ((await db('api_keys').where({ id: record.id }).first()) as { last_used_at: Date | string | null }).last_used_at;
    expect(await lastUsed()).toBeNull();
    await auth.authenticate(key);
    // The write is not awaited by authenticate: wait for it (bounded).
    for (let i = 0; i < 50 && (await lastUsed()) === null; i++) await new Promise((r) => setTimeout(r, 20));
    const first = await lastUsed();
    expect(first).not.toBeNull();
    await db('api_keys').where({ id: record.id }).update({ last_used_at: null });
    for (let i = 0; i < 20; i++) await auth.authenticate(key);
    clock += KEY_USE_RECORD_INTERVAL_MS - 1;
    await auth.authenticate(key);
    await new Promise((r) => setTimeout(r, 100));
    expect(await lastUsed()).toBeNull();
    clock += 1;
    await auth.authenticate(key);
    for (let i = 0; i < 50 && (await lastUsed()) === null; i++) await new Promise((r) => setTimeout(r, 20));
    expect(await lastUsed()).not.toBeNull();
  });

  it('bootstraps one admin key on first start only, or the configured one', async () => {
    const auth = new AuthService(db);
    // Keys exist already (from the tests above), so nothing is generated.
    expect((await auth.ensureBootstrapKey(undefined)).generatedKey).toBeUndefined();
    const configured = generateApiKey();
    await auth.ensureBootstrapKey(configured);
    await auth.ensureBootstrapKey(configured); // idempotent
    expect((await auth.authenticate(configured)).scopes.has('keys:manage')).toBe(true);
    await expect(auth.ensureBootstrapKey('nbx_bad')).rejects.toThrow(/NESTBOX_BOOTSTRAP_API_KEY/);
  });
});
