import type { DbOrTx } from '../db.js';
import type { Scope } from '../../types.js';
import { deleteCounted } from './rows-deleted.js';
import { GRANT_COLUMNS } from './sandbox-credentials.js';

/** A token row as the SSH gateway checks it: the token, its key, its sandbox and organisation, in one read. */
export interface SshTokenGrant {
  id: string;
  sandboxId: string;
  organizationId: string;
  apiKeyId: string;
  expiresAt: Date;
  revoked: boolean;
  keyPreset: string;
  keyScopes: Scope[];
  keySandboxIds: string[] | null;
  keyRevoked: boolean;
  /** null when the sandbox row is gone. */
  sandboxState: string | null;
  organizationSuspended: boolean;
}

export interface NewSshToken {
  id: string;
  tokenHash: string;
  sandboxId: string;
  organizationId: string;
  apiKeyId: string;
  expiresAt: Date;
  createdAt: Date;
}

export interface SshPublicKeyRecord {
  id: string;
  organizationId: string;
  fingerprint: string;
  keyType: string;
  publicKey: string;
  comment: string;
  createdAt: Date;
}

interface GrantRow {
  id: string;
  sandbox_id: string;
  organization_id: string;
  api_key_id: string;
  expires_at: Date | string;
  revoked_at: Date | string | null;
  key_preset: string;
  key_scopes: Scope[] | string;
  key_sandbox_ids: string[] | string | null;
  key_revoked_at: Date | string | null;
  sandbox_state: string | null;
  organization_suspended_at: Date | string | null;
}

interface KeyRow {
  id: string;
  organization_id: string;
  fingerprint: string;
  key_type: string;
  public_key: string;
  comment: string;
  created_at: Date | string;
}

const json = <T>(v: unknown): T => (typeof v === 'string' ? (JSON.parse(v) as T) : (v as T));

const keyFromRow = (r: KeyRow): SshPublicKeyRecord => ({
  id: r.id,
  organizationId: r.organization_id,
  fingerprint: r.fingerprint,
  keyType: r.key_type,
  publicKey: r.public_key,
  comment: r.comment,
  createdAt: new Date(r.created_at),
});

/** SSH access tokens (stored only as their SHA-256). */
export function sshTokenRepository(db: DbOrTx) {
  const live = (sandboxId: string, now: Date) => db('ssh_access_tokens').where({ sandbox_id: sandboxId }).whereNull('revoked_at').where('expires_at', '>', now);
  return {
    /** The sandbox's row, locked until the transaction ends: one sandbox's token writes take turns, so its limit holds under concurrency. */
    async lockSandbox(sandboxId: string): Promise<void> {
      await db('sandboxes').where({ id: sandboxId }).forUpdate().first('id');
    },
    async countLive(sandboxId: string, now: Date): Promise<number> {
      return Number(((await live(sandboxId, now).count({ n: '*' }).first()) as { n: string | number } | undefined)?.n ?? 0);
    },
    async revokeLive(sandboxId: string, now: Date): Promise<void> {
      await live(sandboxId, now).update({ revoked_at: now, updated_at: now });
    },
    async insert(t: NewSshToken): Promise<void> {
      await db('ssh_access_tokens').insert({
        id: t.id,
        token_hash: t.tokenHash,
        sandbox_id: t.sandboxId,
        organization_id: t.organizationId,
        api_key_id: t.apiKeyId,
        expires_at: t.expiresAt,
        created_at: t.createdAt,
        updated_at: t.createdAt,
      });
    },
    /** Housekeeping: rows expired before `cutoff` can never authenticate again. */
    async deleteExpiredBefore(cutoff: Date): Promise<void> {
      await db('ssh_access_tokens').where('expires_at', '<', cutoff).delete();
    },
    /** Revokes the sandbox's unrevoked tokens (only the one with `tokenHash` if given); how many. */
    async revoke(organizationId: string, sandboxId: string, now: Date, tokenHash?: string): Promise<number> {
      const q = db('ssh_access_tokens').where({ sandbox_id: sandboxId, organization_id: organizationId }).whereNull('revoked_at');
      if (tokenHash !== undefined) q.where({ token_hash: tokenHash });
      return q.update({ revoked_at: now, updated_at: now });
    },
    async findGrant(tokenHash: string): Promise<SshTokenGrant | undefined> {
      const r = (await db('ssh_access_tokens as t')
        .join('api_keys as k', 'k.id', 't.api_key_id')
        .leftJoin('sandboxes as s', 's.id', 't.sandbox_id')
        .join('organizations as o', 'o.id', 't.organization_id')
        .where('t.token_hash', tokenHash)
        .first(
          't.id',
          't.sandbox_id',
          't.organization_id',
          't.api_key_id',
          't.expires_at',
          't.revoked_at',
          ...GRANT_COLUMNS,
        )) as GrantRow | undefined;
      if (!r) return undefined;
      return {
        id: r.id,
        sandboxId: r.sandbox_id,
        organizationId: r.organization_id,
        apiKeyId: r.api_key_id,
        expiresAt: new Date(r.expires_at),
        revoked: r.revoked_at !== null,
        keyPreset: r.key_preset,
        keyScopes: json(r.key_scopes),
        keySandboxIds: json(r.key_sandbox_ids),
        keyRevoked: r.key_revoked_at !== null,
        sandboxState: r.sandbox_state,
        organizationSuspended: r.organization_suspended_at !== null,
      };
    },
  };
}

/** Public keys an organisation registers for SSH. */
export function sshKeyRepository(db: DbOrTx) {
  return {
    async list(organizationId: string): Promise<SshPublicKeyRecord[]> {
      const rows = (await db('ssh_public_keys').where({ organization_id: organizationId }).orderBy('created_at', 'asc').orderBy('id', 'asc')) as KeyRow[];
      return rows.map(keyFromRow);
    },
    async fingerprints(organizationId: string): Promise<string[]> {
      return ((await db('ssh_public_keys').where({ organization_id: organizationId }).select('fingerprint')) as { fingerprint: string }[]).map((k) => k.fingerprint);
    },
    async insert(k: SshPublicKeyRecord): Promise<void> {
      await db('ssh_public_keys').insert({ id: k.id, organization_id: k.organizationId, fingerprint: k.fingerprint, key_type: k.keyType, public_key: k.publicKey, comment: k.comment, created_at: k.createdAt });
    },
    async remove(organizationId: string, id: string): Promise<boolean> {
      return (await deleteCounted(db('ssh_public_keys').where({ id, organization_id: organizationId }))) > 0;
    },
    async findByFingerprint(organizationId: string, fingerprint: string): Promise<SshPublicKeyRecord | undefined> {
      const row = (await db('ssh_public_keys').where({ organization_id: organizationId, fingerprint }).first()) as KeyRow | undefined;
      return row ? keyFromRow(row) : undefined;
    },
    /** The organisation owning a sandbox that is not deleted, and whether it is suspended. */
    async ownerOfSandbox(sandboxId: string): Promise<{ organizationId: string; suspended: boolean } | undefined> {
      const row = (await db('sandboxes as s').join('organizations as o', 'o.id', 's.organization_id').where('s.id', sandboxId).whereNot('s.state', 'deleted').first('s.organization_id', 'o.suspended_at')) as
        | { organization_id: string; suspended_at: Date | string | null }
        | undefined;
      return row ? { organizationId: row.organization_id, suspended: row.suspended_at !== null } : undefined;
    },
  };
}
