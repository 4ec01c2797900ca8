import type { DbOrTx } from '../db.js';
import type { ApiKeyRecord, Scope } from '../../types.js';

interface ApiKeyRow {
  id: string;
  organization_id: string;
  name: string;
  key_prefix: string;
  key_hash: string;
  scopes: Scope[] | string;
  preset: string;
  sandbox_ids: string[] | string | null;
  created_at: Date | string;
  last_used_at: Date | string | null;
  revoked_at: Date | string | null;
}

const json = <T>(v: unknown): T => (typeof v === 'string' ? (JSON.parse(v) as T) : (v as T));
const date = (v: Date | string | null): Date | null => (v === null ? null : new Date(v));

const fromRow = (r: ApiKeyRow): ApiKeyRecord => ({
  id: r.id,
  organizationId: r.organization_id,
  name: r.name,
  keyPrefix: r.key_prefix,
  preset: r.preset,
  scopes: json(r.scopes),
  sandboxIds: json(r.sandbox_ids),
  createdAt: new Date(r.created_at),
  lastUsedAt: date(r.last_used_at),
  revokedAt: date(r.revoked_at),
});

export interface NewApiKey {
  id: string;
  organizationId: string;
  name: string;
  keyPrefix: string;
  keyHash: string;
  preset: string;
  scopes: Scope[];
  sandboxIds: string[] | null;
}

export function apiKeyRepository(db: DbOrTx) {
  return {
    async insert(k: NewApiKey): Promise<ApiKeyRecord> {
      const [row] = await db<ApiKeyRow>('api_keys')
        .insert({
          id: k.id,
          organization_id: k.organizationId,
          name: k.name,
          key_prefix: k.keyPrefix,
          key_hash: k.keyHash,
          preset: k.preset,
          scopes: JSON.stringify(k.scopes),
          sandbox_ids: k.sandboxIds ? JSON.stringify(k.sandboxIds) : null,
        })
        .returning('*');
      return fromRow(row as ApiKeyRow);
    },
    async findActiveByHash(keyHash: string): Promise<ApiKeyRecord | undefined> {
      const row = await db<ApiKeyRow>('api_keys').where({ key_hash: keyHash }).whereNull('revoked_at').first();
      return row ? fromRow(row as ApiKeyRow) : undefined;
    },
    /** The key and whether its organisation is suspended, in one read (every request asks). */
    async findActiveByHashWithOrganization(keyHash: string): Promise<{ record: ApiKeyRecord; organizationSuspended: boolean } | undefined> {
      const row = (await db('api_keys as k')
        .join('organizations as o', 'o.id', 'k.organization_id')
        .where('k.key_hash', keyHash)
        .whereNull('k.revoked_at')
        .first('k.*', 'o.suspended_at as organization_suspended_at')) as (ApiKeyRow & { organization_suspended_at: Date | string | null }) | undefined;
      return row ? { record: fromRow(row), organizationSuspended: row.organization_suspended_at !== null } : undefined;
    },
    async existsByHash(keyHash: string): Promise<boolean> {
      return (await db<ApiKeyRow>('api_keys').where({ key_hash: keyHash }).first()) !== undefined;
    },
    async countAll(): Promise<number> {
      const [{ count }] = (await db('api_keys').count<{ count: string | number }[]>('* as count')) as { count: string | number }[];
      return Number(count);
    },
    async listByOrganization(organizationId: string): Promise<ApiKeyRecord[]> {
      const rows = await db<ApiKeyRow>('api_keys').where({ organization_id: organizationId }).whereNull('revoked_at').orderBy('created_at');
      return (rows as ApiKeyRow[]).map(fromRow);
    },
    async revoke(id: string, organizationId: string): Promise<boolean> {
      const n = await db<ApiKeyRow>('api_keys').where({ id, organization_id: organizationId }).whereNull('revoked_at').update({ revoked_at: new Date() });
      return n > 0;
    },
    /** Best effort and coarse (once a minute per key) so authentication stays a read. */
    async touch(id: string, now: Date): Promise<void> {
      await db<ApiKeyRow>('api_keys')
        .where({ id })
        .where((w) => w.whereNull('last_used_at').orWhere('last_used_at', '<', new Date(now.getTime() - 60_000)))
        .update({ last_used_at: now });
    },
  };
}
