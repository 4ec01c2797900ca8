// Keys with exactly the scopes a scope test needs. Presets cannot express "everything but X",
// so these are written with the real repository under a preset name no code defines, which makes
// authentication use the stored scope list (core/services/auth.ts scopesOfKey).
import { apiKeyRepository } from '../core/store/repositories/api-keys.js';
import { generateApiKey, hashApiKey } from '../core/services/auth.js';
import { newApiKeyId } from '../core/ids.js';
import { SCOPES, type Scope } from '../core/types.js';
import type { TestServer } from './harness.js';

export interface TestKey {
  id: string;
  key: string;
}

export async function makeKey(t: TestServer, scopes: readonly Scope[], sandboxIds: string[] | null = null, organizationId?: string): Promise<TestKey> {
  const key = generateApiKey();
  const org = organizationId ?? ((await t.server.db('api_keys').select('organization_id').first()) as { organization_id: string }).organization_id;
  const record = await apiKeyRepository(t.server.db).insert({
    id: newApiKeyId(),
    organizationId: org,
    name: `scope-test ${scopes.join(' ') || '(none)'}`,
    keyPrefix: key.slice(0, 10),
    keyHash: hashApiKey(key),
    preset: 'scope-test',
    scopes: [...scopes],
    sandboxIds,
  });
  return { id: record.id, key };
}

export const allScopesBut = (scope: Scope): Scope[] => SCOPES.filter((s) => s !== scope);

/** The test's keys: per missing scope, none at all, all but limited to another sandbox, and revoked. */
export async function scopeTestKeys(t: TestServer, otherSandboxId: string) {
  const without = new Map<Scope, TestKey>();
  for (const scope of SCOPES) without.set(scope, await makeKey(t, allScopesBut(scope)));
  const none = await makeKey(t, []);
  const limitedToOther = await makeKey(t, SCOPES, [otherSandboxId]);
  const revoked = await makeKey(t, SCOPES);
  await t.server.services.auth.revokeApiKey(((await t.server.db('api_keys').where({ id: revoked.id }).first()) as { organization_id: string }).organization_id, revoked.id);
  return { without, none, limitedToOther, revoked };
}
