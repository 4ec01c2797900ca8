import type { DbOrTx } from '../db.js';
import { deleteCounted } from './rows-deleted.js';

export interface IdempotencyRecord {
  organizationId: string;
  key: string;
  operation: string;
  requestHash: string;
  status: 'pending' | 'done';
  result: unknown;
  createdAt: Date;
  expiresAt: Date;
}

interface Row {
  organization_id: string;
  key: string;
  operation: string;
  request_hash: string;
  status: string;
  result: unknown;
  created_at: Date | string;
  expires_at: Date | string;
}

const fromRow = (r: Row): IdempotencyRecord => ({
  organizationId: r.organization_id,
  key: r.key,
  operation: r.operation,
  requestHash: r.request_hash,
  status: r.status as 'pending' | 'done',
  result: typeof r.result === 'string' ? JSON.parse(r.result) : r.result,
  createdAt: new Date(r.created_at),
  expiresAt: new Date(r.expires_at),
});

export function idempotencyKeyRepository(db: DbOrTx) {
  return {
    /** Insert a pending record; false when the key already exists (the caller reads it). */
    async tryInsert(r: { organizationId: string; key: string; operation: string; requestHash: string; expiresAt: Date }): Promise<boolean> {
      const rows = await db('idempotency_keys')
        .insert({ organization_id: r.organizationId, key: r.key, operation: r.operation, request_hash: r.requestHash, status: 'pending', expires_at: r.expiresAt })
        .onConflict(['organization_id', 'key'])
        .ignore()
        .returning('key');
      return rows.length > 0;
    },
    async find(organizationId: string, key: string): Promise<IdempotencyRecord | undefined> {
      const row = await db<Row>('idempotency_keys').where({ organization_id: organizationId, key }).first();
      return row ? fromRow(row as Row) : undefined;
    },
    async complete(organizationId: string, key: string, result: unknown): Promise<void> {
      await db('idempotency_keys').where({ organization_id: organizationId, key }).update({ status: 'done', result: JSON.stringify(result) });
    },
    /** Remove a key (a failed attempt, or an expired or abandoned record being replaced). */
    async remove(organizationId: string, key: string, createdAt?: Date): Promise<void> {
      const q = db('idempotency_keys').where({ organization_id: organizationId, key });
      if (createdAt) q.andWhere({ created_at: createdAt });
      await q.delete();
    },
    async removeExpired(now: Date): Promise<number> {
      return deleteCounted(db('idempotency_keys').where('expires_at', '<', now), 'key');
    },
  };
}
