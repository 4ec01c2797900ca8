import type { DbOrTx } from '../db.js';
import { deleteCounted } from './rows-deleted.js';

interface PortRow {
  sandbox_id: string;
  port: number;
  organization_id: string;
  public: boolean;
  token_hash: string | null;
  token_api_key_id: string | null;
  token_key_revoked_at?: Date | string | null;
  created_at: Date | string;
  updated_at: Date | string;
}

/**
 * The port number of the record that stands for every port of a sandbox. E2B makes every port
 * a sandbox listens on reachable at `<port>-<id>.<domain>` (public unless the sandbox was created
 * with allowPublicTraffic false, then with its traffic token), and a public Daytona sandbox
 * opens all its preview links to anyone. No port 0 can be published, so the two never collide.
 */
export const EVERY_PORT = 0;

/** A published port of a sandbox. The token of a private port is kept only as its SHA-256. */
export interface PortRecord {
  sandboxId: string;
  port: number;
  organizationId: string;
  public: boolean;
  tokenHash: string | null;
  /** The API key that minted the private token; the token dies with it. */
  tokenApiKeyId: string | null;
  /** Whether that key has been revoked (as of this read). */
  tokenKeyRevoked: boolean;
  createdAt: Date;
  updatedAt: Date;
}

const date = (v: Date | string): Date => (v instanceof Date ? v : new Date(v));

function fromRow(r: PortRow): PortRecord {
  return {
    sandboxId: r.sandbox_id,
    port: r.port,
    organizationId: r.organization_id,
    public: r.public,
    tokenHash: r.token_hash,
    tokenApiKeyId: r.token_api_key_id,
    tokenKeyRevoked: r.token_key_revoked_at !== null && r.token_key_revoked_at !== undefined,
    createdAt: date(r.created_at),
    updatedAt: date(r.updated_at),
  };
}

export function portRepository(db: DbOrTx) {
  return {
    /** Insert or replace (visibility and token) in one statement, so racing publishes cannot both insert. */
    async upsert(p: { sandboxId: string; port: number; organizationId: string; public: boolean; tokenHash: string | null; tokenApiKeyId: string | null }): Promise<PortRecord> {
      const now = new Date();
      const [row] = await db<PortRow>('ports')
        .insert({ sandbox_id: p.sandboxId, port: p.port, organization_id: p.organizationId, public: p.public, token_hash: p.tokenHash, token_api_key_id: p.tokenApiKeyId, created_at: now, updated_at: now })
        .onConflict(['sandbox_id', 'port'])
        .merge({ public: p.public, token_hash: p.tokenHash, token_api_key_id: p.tokenApiKeyId, updated_at: now })
        .returning('*');
      // Just minted by a key that authenticated this request: not revoked.
      return fromRow({ ...(row as PortRow), token_key_revoked_at: null });
    },

    /** With the revocation state of the key that minted its token (one read for the proxy). */
    async find(sandboxId: string, port: number): Promise<PortRecord | undefined> {
      const row = await db('ports as p')
        .leftJoin('api_keys as k', 'k.id', 'p.token_api_key_id')
        .select('p.*', 'k.revoked_at as token_key_revoked_at')
        .where({ 'p.sandbox_id': sandboxId, 'p.port': port })
        .first();
      return row ? fromRow(row as PortRow) : undefined;
    },

    async list(sandboxId: string): Promise<PortRecord[]> {
      const rows = await db<PortRow>('ports').where({ sandbox_id: sandboxId }).orderBy('port');
      return (rows as PortRow[]).map(fromRow);
    },

    /** Which of these sandboxes of the organisation have every port open to anyone (one query for a page). */
    async everyPortPublic(organizationId: string, sandboxIds: string[]): Promise<Set<string>> {
      if (sandboxIds.length === 0) return new Set();
      const rows = (await db<PortRow>('ports').select('sandbox_id').where({ port: EVERY_PORT, public: true, organization_id: organizationId }).whereIn('sandbox_id', sandboxIds)) as Pick<PortRow, 'sandbox_id'>[];
      return new Set(rows.map((r) => r.sandbox_id));
    },

    async remove(sandboxId: string, port: number): Promise<boolean> {
      return (await deleteCounted(db('ports').where({ sandbox_id: sandboxId, port }), 'port')) > 0;
    },
  };
}
