import type { DbOrTx } from '../db.js';

/** The stored side of sandbox access tokens: only their SHA-256, for a token → sandbox lookup. */
export function sandboxAccessTokenRepository(db: DbOrTx) {
  return {
    /** Record the hash once (a second call for the same sandbox is a no-op). */
    async setHashIfMissing(sandboxId: string, hash: string): Promise<void> {
      await db('sandboxes').where({ id: sandboxId }).whereNull('access_token_hash').update({ access_token_hash: hash });
    },

    /** Deleted sandboxes are found too (flagged), so a stale token can be told from a wrong one. */
    async findByHash(hash: string): Promise<{ id: string; organizationId: string; deleted: boolean } | undefined> {
      const row = (await db('sandboxes').select('id', 'organization_id', 'state').where({ access_token_hash: hash }).first()) as
        | { id: string; organization_id: string; state: string }
        | undefined;
      return row ? { id: row.id, organizationId: row.organization_id, deleted: row.state === 'deleted' } : undefined;
    },

    async findOwner(sandboxId: string): Promise<{ id: string; organizationId: string; deleted: boolean } | undefined> {
      const row = (await db('sandboxes').select('id', 'organization_id').where({ id: sandboxId }).whereNot({ state: 'deleted' }).first()) as
        | { id: string; organization_id: string }
        | undefined;
      return row ? { id: row.id, organizationId: row.organization_id, deleted: false } : undefined;
    },

    /** Sandboxes whose guest may answer (for signed URLs that name no sandbox). */
    async listLive(limit: number): Promise<{ id: string; organizationId: string }[]> {
      const rows = (await db('sandboxes').select('id', 'organization_id').whereIn('state', ['running', 'paused']).limit(limit)) as { id: string; organization_id: string }[];
      return rows.map((r) => ({ id: r.id, organizationId: r.organization_id }));
    },
  };
}
