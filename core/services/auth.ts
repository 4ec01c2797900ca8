import { createHash, randomBytes } from 'node:crypto';
import type { Db } from '../store/db.js';
import { apiKeyRepository } from '../store/repositories/api-keys.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { errors, NestboxError } from '../errors.js';
import { newApiKeyId, newOrganizationId } from '../ids.js';
import type { ApiKeyRecord, Organization, Principal, Scope } from '../types.js';

export const API_KEY_PREFIX = 'nbx_';
const KEY_BODY_LENGTH = 40;
const API_KEY_PATTERN = /^nbx_[a-zA-Z0-9]{40}$/;

/**
 * Preset bundles of scopes. `sandbox` is for a key handed to one agent: it may use and
 * stop/resume sandboxes but not create or delete them; `ci` adds the full lifecycle; `admin`
 * adds key management. `operator` is the platform's own key (the bootstrap key): an `admin` of
 * its organisation that also manages organisations and hosts; only an operator can mint one.
 */
export const KEY_PRESETS = {
  'read-only': ['sandboxes:read', 'files:read', 'snapshots:read', 'images:read', 'volumes:read'],
  sandbox: ['sandboxes:read', 'sandboxes:operate', 'sandboxes:exec', 'files:read', 'files:write', 'snapshots:read', 'volumes:read'],
  ci: ['sandboxes:read', 'sandboxes:create', 'sandboxes:operate', 'sandboxes:delete', 'sandboxes:exec', 'files:read', 'files:write', 'snapshots:read', 'snapshots:write', 'images:read', 'images:write', 'volumes:read', 'volumes:write'],
  admin: ['sandboxes:read', 'sandboxes:create', 'sandboxes:operate', 'sandboxes:delete', 'sandboxes:exec', 'files:read', 'files:write', 'snapshots:read', 'snapshots:write', 'images:read', 'images:write', 'keys:manage', 'webhooks:manage', 'secrets:manage', 'volumes:read', 'volumes:write'],
  operator: ['sandboxes:read', 'sandboxes:create', 'sandboxes:operate', 'sandboxes:delete', 'sandboxes:exec', 'files:read', 'files:write', 'snapshots:read', 'snapshots:write', 'images:read', 'images:write', 'keys:manage', 'webhooks:manage', 'secrets:manage', 'volumes:read', 'volumes:write', 'platform:organizations', 'platform:hosts'],
} as const satisfies Record<string, readonly Scope[]>;
export type KeyPreset = keyof typeof KEY_PRESETS;

export const DEFAULT_ORGANIZATION_NAME = 'default';

export function hashApiKey(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

export function generateApiKey(): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
  let body = '';
  while (body.length < KEY_BODY_LENGTH) {
    for (const byte of randomBytes(KEY_BODY_LENGTH * 2)) {
      // 248 = 4 × 62: rejection keeps every character equally likely.
      if (byte < 248 && body.length < KEY_BODY_LENGTH) body += alphabet[byte % 62];
    }
  }
  return API_KEY_PREFIX + body;
}

export function isWellFormedApiKey(key: string): boolean {
  return API_KEY_PATTERN.test(key);
}

export interface CreatedApiKey {
  /** The key itself: shown once, never stored. */
  key: string;
  record: ApiKeyRecord;
}

/**
 * How often one process records that a key was used (`lastUsedAt`): at most once per key per
 * minute, since a write per request would cost more than the request (a replica under load
 * spends its time in database round trips). `lastUsedAt` is accurate to about a minute.
 */
export const KEY_USE_RECORD_INTERVAL_MS = 60_000;
const MAX_KEYS_REMEMBERED = 10_000;

export class AuthService {
  /** Key id → when this process last wrote its lastUsedAt (ms on this process's clock). */
  private readonly keyUseRecorded = new Map<string, number>();

  constructor(
    private readonly db: Db,
    private readonly now: () => number = () => performance.now(),
  ) {}

  async createOrganization(name: string): Promise<Organization> {
    return organizationRepository(this.db).insert({ id: newOrganizationId(), name });
  }

  /**
   * A key minted by a caller (the API): `operator` keys act above every organisation, so only a
   * caller that is an operator itself may mint one, in any organisation.
   */
  async mintApiKey(principal: Principal, organizationId: string, input: { name: string; preset: KeyPreset; sandboxIds?: string[] | null }): Promise<CreatedApiKey> {
    if (!Object.prototype.hasOwnProperty.call(KEY_PRESETS, input.preset)) throw errors.validation('preset', `must be one of ${Object.keys(KEY_PRESETS).join(', ')}`);
    if (input.preset === 'operator' && !isOperator(principal)) throw errors.forbidden('only an operator key can create an operator key');
    if (principal.credentialId !== undefined) throw errors.forbidden('a sandbox credential cannot create API keys');
    return this.createApiKey(organizationId, input);
  }

  async createApiKey(organizationId: string, input: { name: string; preset: KeyPreset; sandboxIds?: string[] | null }, plaintext?: string): Promise<CreatedApiKey> {
    const key = plaintext ?? generateApiKey();
    const record = await apiKeyRepository(this.db).insert({
      id: newApiKeyId(),
      organizationId,
      name: input.name,
      keyPrefix: key.slice(0, API_KEY_PREFIX.length + 6),
      keyHash: hashApiKey(key),
      preset: input.preset,
      scopes: [...KEY_PRESETS[input.preset]],
      sandboxIds: input.sandboxIds ?? null,
    });
    return { key, record };
  }

  async listApiKeys(organizationId: string): Promise<ApiKeyRecord[]> {
    return apiKeyRepository(this.db).listByOrganization(organizationId);
  }

  async revokeApiKey(organizationId: string, keyId: string): Promise<void> {
    if (!(await apiKeyRepository(this.db).revoke(keyId, organizationId))) throw errors.notFound('api key', keyId);
  }

  /** Resolve a bearer token to a principal; every failure is the same 401 so keys cannot be probed. */
  async authenticate(token: string | undefined): Promise<Principal> {
    if (!token || !isWellFormedApiKey(token)) throw errors.unauthorized();
    // Looking up by the SHA-256 of the key means the database never compares secrets, so
    // there is no timing signal about how much of a guessed key matched.
    const found = await apiKeyRepository(this.db).findActiveByHashWithOrganization(hashApiKey(token));
    if (!found) throw errors.unauthorized();
    const { record } = found;
    // A genuine key of a suspended organisation is told so (403), on every route of every API:
    // they all authenticate here or through SandboxTokenService, which checks the same.
    if (found.organizationSuspended) throw errors.organizationSuspended(record.organizationId);
    this.recordUse(record.id);
    return {
      organizationId: record.organizationId,
      keyId: record.id,
      scopes: new Set(scopesOfKey(record.preset, record.scopes)),
      sandboxIds: record.sandboxIds ? new Set(record.sandboxIds) : null,
    };
  }

  private recordUse(keyId: string): void {
    const now = this.now();
    const last = this.keyUseRecorded.get(keyId);
    if (last !== undefined && now - last < KEY_USE_RECORD_INTERVAL_MS) return;
    if (this.keyUseRecorded.size >= MAX_KEYS_REMEMBERED) this.keyUseRecorded.clear();
    this.keyUseRecorded.set(keyId, now);
    void apiKeyRepository(this.db).touch(keyId, new Date()).catch(() => undefined);
  }

  /**
   * Make sure someone can log in after the first start. With a configured key, that key
   * exists (operator, default organisation). Without one, a key is generated only when the
   * database has no key at all, and returned so the caller can store and print it once.
   */
  async ensureBootstrapKey(configuredKey: string | undefined): Promise<{ generatedKey?: string; organizationId: string }> {
    const orgs = organizationRepository(this.db);
    const org = (await orgs.findByName(DEFAULT_ORGANIZATION_NAME)) ?? (await this.createOrganization(DEFAULT_ORGANIZATION_NAME));
    const keys = apiKeyRepository(this.db);
    if (configuredKey !== undefined) {
      if (!isWellFormedApiKey(configuredKey)) {
        throw new NestboxError('validation_failed', `NESTBOX_BOOTSTRAP_API_KEY: must be "nbx_" followed by 40 letters or digits`);
      }
      if (!(await keys.existsByHash(hashApiKey(configuredKey)))) {
        await this.createApiKey(org.id, { name: 'bootstrap', preset: 'operator' }, configuredKey);
      }
      return { organizationId: org.id };
    }
    if ((await keys.countAll()) > 0) return { organizationId: org.id };
    const created = await this.createApiKey(org.id, { name: 'bootstrap', preset: 'operator' });
    return { generatedKey: created.key, organizationId: org.id };
  }
}

/**
 * Scopes follow the preset as it is defined now, so a preset that gains a scope (a new feature)
 * extends existing keys too; the stored list is the fallback for unknown presets. Credentials
 * minted from a key (core/services/sandbox-tokens.ts) are limited by this same set.
 */
export function scopesOfKey(preset: string, storedScopes: readonly Scope[]): readonly Scope[] {
  return KEY_PRESETS[preset as KeyPreset] ?? storedScopes;
}

/** The platform's operator: a key of the `operator` preset (both platform scopes). */
export function isOperator(principal: Principal): boolean {
  return principal.scopes.has('platform:organizations');
}

export function requireScope(principal: Principal, scope: Scope): void {
  if (!principal.scopes.has(scope)) throw errors.forbidden(`this API key lacks the ${scope} scope`);
}

/** A key limited to given sandboxes sees the others as absent (404), exactly like another organisation's. */
export function canSeeSandbox(principal: Principal, sandboxId: string): boolean {
  return principal.sandboxIds === null || principal.sandboxIds.has(sandboxId);
}

