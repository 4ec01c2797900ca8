import type { DbOrTx } from '../db.js';

export type SandboxCredentialKind = 'envd' | 'daytona-signing';

/** A credential row with what deciding about it needs: its key (scopes, revocation) and its sandbox's state. */
export interface SandboxCredentialRecord {
  id: string;
  kind: SandboxCredentialKind;
  sandboxId: string;
  organizationId: string;
  apiKeyId: string;
  expiresAt: Date;
  keyPreset: string;
  keyScopes: string[];
  keySandboxIds: string[] | null;
  keyRevoked: boolean;
  sandboxState: string;
  /** Its organisation is suspended (core/services/organizations.ts): the credential is refused. */
  organizationSuspended: boolean;
}

interface Row {
  id: string;
  kind: SandboxCredentialKind;
  sandbox_id: string;
  organization_id: string;
  api_key_id: string;
  expires_at: Date | string;
  key_preset: string;
  key_scopes: string[] | string;
  key_sandbox_ids: string[] | string | null;
  key_revoked_at: Date | string | null;
  sandbox_state: string;
  organization_suspended_at: Date | string | null;
}

const json = <T>(v: unknown): T => (typeof v === 'string' ? (JSON.parse(v) as T) : (v as T));

function fromRow(r: Row): SandboxCredentialRecord {
  return {
    id: r.id,
    kind: r.kind,
    sandboxId: r.sandbox_id,
    organizationId: r.organization_id,
    apiKeyId: r.api_key_id,
    expiresAt: new Date(r.expires_at),
    keyPreset: r.key_preset,
    keyScopes: json(r.key_scopes),
    keySandboxIds: json(r.key_sandbox_ids),
    keyRevoked: r.key_revoked_at !== null,
    sandboxState: r.sandbox_state,
    organizationSuspended: r.organization_suspended_at !== null && r.organization_suspended_at !== undefined,
  };
}

/**
 * What a credential derived from an API key is checked against at use, joined as `k` (its key),
 * `s` (its sandbox) and `o` (its organisation): here and for SSH access tokens (ssh-access.ts).
 */
export const GRANT_COLUMNS = [
  'k.preset as key_preset',
  'k.scopes as key_scopes',
  'k.sandbox_ids as key_sandbox_ids',
  'k.revoked_at as key_revoked_at',
  's.state as sandbox_state',
  'o.suspended_at as organization_suspended_at',
] as const;

/** Rows of sandbox_credentials; the secrets themselves are derived, never stored. */
export function sandboxCredentialRepository(db: DbOrTx) {
  const joined = () =>
    db('sandbox_credentials as c')
      .join('api_keys as k', 'k.id', 'c.api_key_id')
      .join('sandboxes as s', 's.id', 'c.sandbox_id')
      .join('organizations as o', 'o.id', 'c.organization_id')
      .select(
        'c.id',
        'c.kind',
        'c.sandbox_id',
        'c.organization_id',
        'c.api_key_id',
        'c.expires_at',
        ...GRANT_COLUMNS,
      );

  return {
    async insert(c: { id: string; kind: SandboxCredentialKind; sandboxId: string; organizationId: string; apiKeyId: string; expiresAt: Date }): Promise<void> {
      await db('sandbox_credentials').insert({
        id: c.id,
        kind: c.kind,
        sandbox_id: c.sandboxId,
        organization_id: c.organizationId,
        api_key_id: c.apiKeyId,
        expires_at: c.expiresAt,
      });
    },

    async find(id: string): Promise<SandboxCredentialRecord | undefined> {
      const row = (await joined().where('c.id', id).first()) as Row | undefined;
      return row ? fromRow(row) : undefined;
    },

    /** The key's newest credential of this kind for the sandbox that is still valid after `validAfter`. */
    async findReusable(sandboxId: string, apiKeyId: string, kind: SandboxCredentialKind, validAfter: Date): Promise<{ id: string; expiresAt: Date } | undefined> {
      const row = (await db('sandbox_credentials')
        .select('id', 'expires_at')
        .where({ sandbox_id: sandboxId, api_key_id: apiKeyId, kind })
        .where('expires_at', '>', validAfter)
        .orderBy('expires_at', 'desc')
        .first()) as { id: string; expires_at: Date | string } | undefined;
      return row ? { id: row.id, expiresAt: new Date(row.expires_at) } : undefined;
    },

    /**
     * Unexpired credentials of unrevoked keys on sandboxes that exist (optionally one sandbox,
     * optionally only sandboxes in the given states), for checking a signature against.
     */
    async listUsable(kind: SandboxCredentialKind, now: Date, opts: { sandboxId?: string; sandboxStates?: string[]; limit: number }): Promise<SandboxCredentialRecord[]> {
      let q = joined().where('c.kind', kind).where('c.expires_at', '>', now).whereNull('k.revoked_at').whereNot('s.state', 'deleted');
      if (opts.sandboxId !== undefined) q = q.where('c.sandbox_id', opts.sandboxId);
      if (opts.sandboxStates) q = q.whereIn('s.state', opts.sandboxStates);
      return ((await q.orderBy('c.expires_at', 'desc').limit(opts.limit)) as Row[]).map(fromRow);
    },

    /** End every credential of this kind on the sandbox now (Daytona's signing-key rotation). */
    async expireForSandbox(sandboxId: string, kind: SandboxCredentialKind, now: Date): Promise<void> {
      await db('sandbox_credentials').where({ sandbox_id: sandboxId, kind }).where('expires_at', '>', now).update({ expires_at: now });
    },

    /** Housekeeping: rows past their expiry can never authenticate again. */
    async deleteExpired(before: Date): Promise<void> {
      await db('sandbox_credentials').where('expires_at', '<', before).delete();
    },
  };
}
