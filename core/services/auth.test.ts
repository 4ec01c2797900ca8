import { mkdtempSync, rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, openDatabase, type Db } from '../store/db.js';
import { AuthService, generateApiKey, hashApiKey, isWellFormedApiKey, KEY_PRESETS } from './auth.js';
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
