import { createHash } from 'node:crypto';
import type { Db } from '../store/db.js';
import { idempotencyKeyRepository } from '../store/repositories/idempotency-keys.js';
import { errors, NestboxError } from '../errors.js';

const KEY_PATTERN = /^[\x21-\x7e]{1,255}$/;
/** How long a key is remembered. */
export const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
/** A pending record older than this belongs to a request that died (kill -9); it may be retried. */
const ABANDONED_AFTER_MS = 10 * 60 * 1000;

/** Stable hash of a request body: key order does not matter, values do. */
export function requestHash(operation: string, body: unknown): string {
  const canonical = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(canonical);
    if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v as object).sort().map((k) => [k, canonical((v as Record<string, unknown>)[k])]));
    return v;
  };
  return createHash('sha256').update(operation).update('\0').update(JSON.stringify(canonical(body ?? {}))).digest('hex');
}

/**
 * Runs `execute` at most once per (organisation, key): a retry with the same key and body gets
 * the first result again (for 24 h), the same key with another body is a 409, and a retry while
 * the first attempt is still running is a 409 that says so. A failed attempt forgets the key so
 * the client can retry it.
 */
export class IdempotencyService {
  constructor(private readonly db: Db) {}

  async run<T>(
    organizationId: string,
    key: string | undefined,
    operation: string,
    body: unknown,
    execute: () => Promise<T>,
    toStored: (result: T) => unknown,
    fromStored: (stored: unknown) => Promise<T>,
  ): Promise<T> {
    if (key === undefined) return execute();
    if (!KEY_PATTERN.test(key)) throw errors.validation('Idempotency-Key', 'must be 1-255 visible ASCII characters');
    const repo = idempotencyKeyRepository(this.db);
    const hash = requestHash(operation, body);
    const now = new Date();
    if (!(await repo.tryInsert({ organizationId, key, operation, requestHash: hash, expiresAt: new Date(now.getTime() + IDEMPOTENCY_TTL_MS) }))) {
      const existing = await repo.find(organizationId, key);
      const stale = existing && (existing.expiresAt <= now || (existing.status === 'pending' && now.getTime() - existing.createdAt.getTime() > ABANDONED_AFTER_MS));
      if (!existing || stale) {
        if (existing) await repo.remove(organizationId, key, existing.createdAt);
        return this.run(organizationId, key, operation, body, execute, toStored, fromStored);
      }
      if (existing.operation !== operation || existing.requestHash !== hash) {
        throw new NestboxError('conflict', 'Idempotency-Key: already used with a different request', { field: 'Idempotency-Key' });
      }
      if (existing.status === 'pending') {
        throw new NestboxError('conflict', 'Idempotency-Key: a request with this key is still in progress; retry shortly', { field: 'Idempotency-Key', inProgress: true });
      }
      return fromStored(existing.result);
    }
    let result: T;
    try {
      result = await execute();
    } catch (err) {
      await repo.remove(organizationId, key).catch(() => undefined);
      throw err;
    }
    await repo.complete(organizationId, key, toStored(result));
    return result;
  }

  async removeExpired(): Promise<number> {
    return idempotencyKeyRepository(this.db).removeExpired(new Date());
  }
}
