import type { DbOrTx } from '../db.js';
import type { HostAdminState, HostRecord, HostResources } from '../../types.js';

interface HostRow {
  id: string;
  url: string;
  driver: string;
  capabilities: Record<string, unknown> | string;
  registered_at: Date | string;
  last_heartbeat_at: Date | string;
  capacity: HostResources | string | null;
  labels: Record<string, string> | string | null;
  version: string | null;
  allocated: (HostResources & { sandboxes: number }) | string | null;
  admin_state: HostAdminState;
  lost_at: Date | string | null;
}

const json = <T>(v: T | string | null): T | null => (typeof v === 'string' ? (JSON.parse(v) as T) : v);

const fromRow = (r: HostRow): HostRecord => ({
  id: r.id,
  url: r.url,
  driver: r.driver,
  capabilities: json(r.capabilities) ?? {},
  registeredAt: new Date(r.registered_at),
  lastHeartbeatAt: new Date(r.last_heartbeat_at),
  capacity: json(r.capacity),
  labels: json(r.labels) ?? {},
  version: r.version,
  allocated: json(r.allocated),
  adminState: r.admin_state,
  lostAt: r.lost_at === null ? null : new Date(r.lost_at),
});

/** What a heartbeat writes (everything but the operator's state and the lost mark). */
export interface HostHeartbeatRow {
  id: string;
  url: string;
  driver: string;
  capabilities: Record<string, unknown>;
  capacity?: HostResources;
  labels?: Record<string, string>;
  version?: string;
  allocated?: HostResources & { sandboxes: number };
}

/** Heartbeats older than `ms` on the database's clock (every replica judges by the same clock). */
const olderThan = (db: DbOrTx, ms: number) => db.raw(`now() - (? * interval '1 millisecond')`, [ms]);

export function hostRepository(db: DbOrTx) {
  return {
    /** Times are the database's (`now()`), like the lost check that reads them; `at` (tests) sets one instead. */
    async upsertHeartbeat(h: HostHeartbeatRow, at?: Date): Promise<HostRecord> {
      const now = at ?? db.fn.now();
      const reported = {
        url: h.url,
        driver: h.driver,
        capabilities: JSON.stringify(h.capabilities),
        capacity: h.capacity ? JSON.stringify(h.capacity) : null,
        labels: JSON.stringify(h.labels ?? {}),
        version: h.version ?? null,
        allocated: h.allocated ? JSON.stringify(h.allocated) : null,
      };
      const [row] = await db('hosts')
        .insert({ id: h.id, ...reported, registered_at: now, last_heartbeat_at: now })
        .onConflict('id')
        .merge({ ...reported, last_heartbeat_at: now })
        .returning('*');
      return fromRow(row as HostRow);
    },
    async findById(id: string): Promise<HostRecord | undefined> {
      const row = await db<HostRow>('hosts').where({ id }).first();
      return row ? fromRow(row as HostRow) : undefined;
    },
    async findByIds(ids: string[]): Promise<HostRecord[]> {
      if (!ids.length) return [];
      return ((await db<HostRow>('hosts').whereIn('id', ids)) as HostRow[]).map(fromRow);
    },
    async list(): Promise<HostRecord[]> {
      return ((await db<HostRow>('hosts').orderBy('id')) as HostRow[]).map(fromRow);
    },
    /** Hosts that heartbeated within `withinMs` and are not marked lost. */
    async listAlive(withinMs: number): Promise<HostRecord[]> {
      const rows = await db<HostRow>('hosts').where('last_heartbeat_at', '>=', olderThan(db, withinMs)).whereNull('lost_at').orderBy('id');
      return (rows as HostRow[]).map(fromRow);
    },
    /**
     * The live hosts among `ids` (all when undefined), locked FOR UPDATE in id order: every
     * placement locks its organisation first and then hosts in this one order, so two creates
     * never wait on each other in a cycle, and a second create waits until the first one's
     * sandbox row is committed (and counted) before it looks at the room left.
     */
    async lockAlive(withinMs: number, ids?: readonly string[]): Promise<HostRecord[]> {
      const q = db<HostRow>('hosts').where('last_heartbeat_at', '>=', olderThan(db, withinMs)).whereNull('lost_at').orderBy('id').forUpdate();
      if (ids) q.whereIn('id', ids as string[]);
      return ((await q) as HostRow[]).map(fromRow);
    },
    async setAdminState(id: string, state: HostAdminState): Promise<HostRecord | undefined> {
      const [row] = await db('hosts').where({ id }).update({ admin_state: state }).returning('*');
      return row ? fromRow(row as HostRow) : undefined;
    },
    /**
     * Marks lost, and locks, the hosts silent for longer than `afterMs` that are not marked yet.
     * Several replicas may run this at once: the row lock and `lost_at is null` let exactly one
     * of them mark each host (the other's UPDATE re-checks the condition and skips it).
     */
    async markLost(afterMs: number): Promise<HostRecord[]> {
      const rows = await db('hosts').where('last_heartbeat_at', '<', olderThan(db, afterMs)).whereNull('lost_at').update({ lost_at: db.fn.now() }).returning('*');
      return (rows as HostRow[]).map(fromRow);
    },
    /** Clears the lost mark (the host heartbeats again); undefined when it was not marked. */
    async clearLost(id: string): Promise<HostRecord | undefined> {
      const [row] = await db('hosts').where({ id }).whereNotNull('lost_at').update({ lost_at: null }).returning('*');
      return row ? fromRow(row as HostRow) : undefined;
    },
  };
}
