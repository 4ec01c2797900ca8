// The warm pool's rows (core/services/warm-pool.ts): `warm_pool_sandboxes`, one per member, and
// `organization_warm_pools`, an organisation's desired members of one image and size. Every
// removal answers the rows it removed (RETURNING), so the service destroys exactly those members
// on their hosts, and takes rows with FOR UPDATE SKIP LOCKED, so two replicas never act on one.
import type { DbOrTx } from '../db.js';

export interface WarmPoolRow {
  id: string;
  host_id: string;
  image: string;
  cpu: number;
  memory_mib: number;
  disk_gib: number;
  state: 'warming' | 'ready';
  owner_instance_id: string;
  created_at: Date | string;
  ready_at: Date | string | null;
  pool_id: string | null;
}

/** A row of `organization_warm_pools` (organization-warm-pools.ts renders it). */
export interface OrganizationPoolRow {
  id: string;
  organization_id: string;
  snapshot: string;
  region: string;
  image: string;
  host_image: string | null;
  image_id: string | null;
  layers_snapshot_id: string | null;
  host_id: string | null;
  env: Record<string, string> | string;
  cpu: number;
  memory_mib: number;
  disk_gib: number;
  pool: number;
  error_reason: string | null;
  created_at: Date | string;
  updated_at: Date | string;
}

/** The image and whole size a member is of (column names aside, the service's WarmPoolKey). */
export interface WarmPoolRowKey {
  image: string;
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
}

export interface NewWarmPoolRow extends WarmPoolRowKey {
  id: string;
  hostId: string;
  ownerInstanceId: string;
  poolId?: string;
}

export type WarmPoolLevelRow = Pick<WarmPoolRow, 'host_id' | 'image' | 'cpu' | 'memory_mib' | 'disk_gib' | 'state'> & { count: string | number };

const keyColumns = (key: WarmPoolRowKey) => ({ image: key.image, cpu: key.cpu, memory_mib: key.memoryMiB, disk_gib: key.diskGiB });

/** The member the claim took: the oldest ready one on a live, ready host, `extra` narrowing which. */
function claimSql(extra: string, onHosts: boolean): string {
  return `DELETE FROM warm_pool_sandboxes WHERE id = (
     SELECT w.id FROM warm_pool_sandboxes w JOIN hosts h ON h.id = w.host_id
     WHERE w.state = 'ready' AND ${extra}
       AND h.lost_at IS NULL AND h.admin_state = 'ready' AND h.last_heartbeat_at >= now() - make_interval(secs => ?)
       ${onHosts ? 'AND w.host_id = ANY(?)' : ''}
     ORDER BY w.ready_at, w.id LIMIT 1 FOR UPDATE OF w SKIP LOCKED)
   RETURNING *`;
}

export function warmPoolRepository(db: DbOrTx) {
  const removed = async (sql: string, bindings: unknown[] = []): Promise<WarmPoolRow[]> => ((await db.raw(sql, bindings as never[])) as { rows: WarmPoolRow[] }).rows;
  return {
    /** An operator's member of `key` (never an organisation pool's), removed from the pool. */
    async claimOperatorMember(key: WarmPoolRowKey, liveSeconds: number, onHosts?: string[]): Promise<WarmPoolRow | undefined> {
      const rows = await removed(claimSql('w.pool_id IS NULL AND w.image = ? AND w.cpu = ? AND w.memory_mib = ? AND w.disk_gib = ?', !!onHosts), [key.image, key.cpu, key.memoryMiB, key.diskGiB, liveSeconds, ...(onHosts ? [onHosts] : [])]);
      return rows[0];
    },

    /** A member of one of `poolIds` (an organisation's own pools), removed from the pool. */
    async claimPoolMember(poolIds: string[], liveSeconds: number, onHosts?: string[]): Promise<WarmPoolRow | undefined> {
      const rows = await removed(claimSql('w.pool_id = ANY(?)', !!onHosts), [poolIds, liveSeconds, ...(onHosts ? [onHosts] : [])]);
      return rows[0];
    },

    async anyOrganizationPool(): Promise<boolean> {
      return (await db('organization_warm_pools').first('id')) !== undefined;
    },

    /** The organisation's pools of `key` that want members. */
    async organizationPoolIdsFor(organizationId: string, key: WarmPoolRowKey): Promise<string[]> {
      const rows = (await db('organization_warm_pools').where({ organization_id: organizationId, ...keyColumns(key) }).where('pool', '>', 0).select('id')) as { id: string }[];
      return rows.map((r) => r.id);
    },

    async readyCountsOf(poolIds: string[]): Promise<Map<string, number>> {
      const out = new Map<string, number>();
      if (poolIds.length === 0) return out;
      const rows = (await db('warm_pool_sandboxes').whereIn('pool_id', poolIds).where({ state: 'ready' }).select('pool_id').count<unknown[]>('* as count').groupBy('pool_id')) as { pool_id: string; count: string | number }[];
      for (const r of rows) out.set(r.pool_id, Number(r.count));
      return out;
    },

    /** The operator's members counted per host, key and state. */
    async operatorLevels(hostId?: string): Promise<WarmPoolLevelRow[]> {
      const q = db('warm_pool_sandboxes').whereNull('pool_id').select('host_id', 'image', 'cpu', 'memory_mib', 'disk_gib', 'state').count<unknown[]>('* as count').groupBy('host_id', 'image', 'cpu', 'memory_mib', 'disk_gib', 'state');
      if (hostId) q.where({ host_id: hostId });
      return (await q) as WarmPoolLevelRow[];
    },

    /** Every member (or one host's), removed. */
    async removeAll(hostId?: string): Promise<WarmPoolRow[]> {
      const q = db('warm_pool_sandboxes').delete().returning('*');
      if (hostId) q.where({ host_id: hostId });
      return (await q) as WarmPoolRow[];
    },

    /** Warming members whose filler is none of `aliveInstances`. */
    removeOrphanedWarming(aliveInstances: string[]): Promise<WarmPoolRow[]> {
      return removed(
        `DELETE FROM warm_pool_sandboxes WHERE id IN (
           SELECT id FROM warm_pool_sandboxes WHERE state = 'warming' AND NOT (owner_instance_id = ANY(?)) FOR UPDATE SKIP LOCKED)
         RETURNING *`,
        [aliveInstances],
      );
    },

    removeReadyOlderThan(seconds: number): Promise<WarmPoolRow[]> {
      return removed(
        `DELETE FROM warm_pool_sandboxes WHERE id IN (
           SELECT id FROM warm_pool_sandboxes WHERE state = 'ready' AND ready_at < now() - make_interval(secs => ?) FOR UPDATE SKIP LOCKED)
         RETURNING *`,
        [seconds],
      );
    },

    /** Ready members of cordoned or draining hosts (not lost ones: their host may come back). */
    removeReadyOnFencedHosts(): Promise<WarmPoolRow[]> {
      return removed(
        `DELETE FROM warm_pool_sandboxes WHERE id IN (
           SELECT w.id FROM warm_pool_sandboxes w JOIN hosts h ON h.id = w.host_id WHERE w.state = 'ready' AND h.admin_state <> 'ready' AND h.lost_at IS NULL FOR UPDATE OF w SKIP LOCKED)
         RETURNING *`,
      );
    },

    /** The operator's ready members, newest first. */
    async readyOperatorMembers(): Promise<WarmPoolRow[]> {
      return (await db('warm_pool_sandboxes').where({ state: 'ready' }).whereNull('pool_id').orderBy('ready_at', 'desc')) as WarmPoolRow[];
    },

    /** Those of `ids` still ready (a claim may have taken some meanwhile). */
    removeReady(ids: string[]): Promise<WarmPoolRow[]> {
      return removed(`DELETE FROM warm_pool_sandboxes WHERE id IN (SELECT id FROM warm_pool_sandboxes WHERE id = ANY(?) AND state = 'ready' FOR UPDATE SKIP LOCKED) RETURNING *`, [ids]);
    },

    /** Members of deleted organisation pools, in any state. */
    removeOfDeletedPools(): Promise<WarmPoolRow[]> {
      return removed(
        `DELETE FROM warm_pool_sandboxes WHERE id IN (
           SELECT w.id FROM warm_pool_sandboxes w WHERE w.pool_id IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM organization_warm_pools p WHERE p.id = w.pool_id) FOR UPDATE OF w SKIP LOCKED)
         RETURNING *`,
      );
    },

    /** Ready members beyond their organisation pool's count, newest first. */
    removeBeyondPoolCounts(): Promise<WarmPoolRow[]> {
      return removed(
        `DELETE FROM warm_pool_sandboxes WHERE id IN (
           SELECT x.id FROM (
             SELECT w.id, p.pool, row_number() OVER (PARTITION BY w.pool_id ORDER BY w.ready_at, w.id) AS n
             FROM warm_pool_sandboxes w JOIN organization_warm_pools p ON p.id = w.pool_id WHERE w.state = 'ready') x
           WHERE x.n > x.pool)
         RETURNING *`,
      );
    },

    /** Organisation pools and how many members each lacks, least recently changed first. */
    async poolsMissingMembers(): Promise<{ id: string; missing: number }[]> {
      const result = (await db.raw(
        `SELECT p.id, p.pool - (SELECT count(*) FROM warm_pool_sandboxes w WHERE w.pool_id = p.id) AS missing
         FROM organization_warm_pools p WHERE p.pool > 0 ORDER BY p.updated_at`,
      )) as { rows: { id: string; missing: string | number }[] };
      return result.rows.map((r) => ({ id: r.id, missing: Number(r.missing) }));
    },

    /** The pool's row, locked for the transaction (its fillers serialise here). */
    async lockOrganizationPool(poolId: string): Promise<OrganizationPoolRow | undefined> {
      return (await db('organization_warm_pools').where({ id: poolId }).forUpdate().first()) as OrganizationPoolRow | undefined;
    },

    async countOfPool(poolId: string): Promise<number> {
      return Number(((await db('warm_pool_sandboxes').where({ pool_id: poolId }).count<{ count: string | number }[]>('* as count'))[0]).count);
    },

    async countOnHost(hostId: string, key: WarmPoolRowKey): Promise<number> {
      return Number(((await db('warm_pool_sandboxes').where({ host_id: hostId, ...keyColumns(key) }).count<{ count: string | number }[]>('* as count'))[0]).count);
    },

    async insertWarming(row: NewWarmPoolRow): Promise<void> {
      await db('warm_pool_sandboxes').insert({ id: row.id, host_id: row.hostId, ...keyColumns(row), state: 'warming', owner_instance_id: row.ownerInstanceId, ...(row.poolId ? { pool_id: row.poolId } : {}) });
    },

    /** Drops a member that did not start (still warming: nobody else took its row). */
    async removeWarming(id: string): Promise<void> {
      await db('warm_pool_sandboxes').where({ id, state: 'warming' }).delete();
    },

    /** Whether the warming row was still there to be made ready (a drain or a reaper may have taken it). */
    async markReady(id: string): Promise<boolean> {
      const rows = (await db('warm_pool_sandboxes').where({ id, state: 'warming' }).update({ state: 'ready', ready_at: db.fn.now() }).returning('id')) as unknown[];
      return rows.length > 0;
    },

    async setPoolError(poolId: string, reason: string): Promise<void> {
      await db('organization_warm_pools').where({ id: poolId }).whereRaw('error_reason IS DISTINCT FROM ?', [reason]).update({ error_reason: reason });
    },

    async clearPoolError(poolId: string): Promise<void> {
      await db('organization_warm_pools').where({ id: poolId }).whereNotNull('error_reason').update({ error_reason: null });
    },
  };
}

/** What a new organisation pool is (organization-warm-pools.ts resolves its image first). */
export interface NewOrganizationPoolRow {
  id: string;
  organizationId: string;
  snapshot: string;
  region: string;
  launch: Pick<OrganizationPoolRow, 'image' | 'host_image' | 'image_id' | 'layers_snapshot_id' | 'host_id'> & { env: Record<string, string> };
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
  pool: number;
}

/** An organisation's pools: every read and write is scoped to the organisation. */
export function organizationWarmPoolRepository(db: DbOrTx) {
  return {
    async list(organizationId: string): Promise<OrganizationPoolRow[]> {
      return (await db('organization_warm_pools').where({ organization_id: organizationId }).orderBy([{ column: 'created_at' }, { column: 'id' }])) as OrganizationPoolRow[];
    },
    async find(organizationId: string, id: string): Promise<OrganizationPoolRow | undefined> {
      return (await db('organization_warm_pools').where({ id, organization_id: organizationId }).first()) as OrganizationPoolRow | undefined;
    },
    async findBySnapshot(organizationId: string, snapshot: string, region: string): Promise<OrganizationPoolRow | undefined> {
      return (await db('organization_warm_pools').where({ organization_id: organizationId, snapshot, region }).first()) as OrganizationPoolRow | undefined;
    },
    async insert(row: NewOrganizationPoolRow): Promise<void> {
      await db('organization_warm_pools').insert({
        id: row.id,
        organization_id: row.organizationId,
        snapshot: row.snapshot,
        region: row.region,
        ...row.launch,
        env: JSON.stringify(row.launch.env),
        cpu: row.cpu,
        memory_mib: row.memoryMiB,
        disk_gib: row.diskGiB,
        pool: row.pool,
      });
    },
    /** A new desired count; 0 also clears the error (a drained pool has nothing to fail). */
    async setCount(organizationId: string, id: string, pool: number): Promise<void> {
      await db('organization_warm_pools').where({ id, organization_id: organizationId }).update({ pool, updated_at: db.fn.now(), ...(pool === 0 ? { error_reason: null } : {}) });
    },
    async remove(organizationId: string, id: string): Promise<void> {
      await db('organization_warm_pools').where({ id, organization_id: organizationId }).delete();
    },
    /** The members the organisation's pools ask for in all (but `excludeId`'s). */
    async desiredTotal(organizationId: string, excludeId?: string): Promise<number> {
      const q = db('organization_warm_pools').where({ organization_id: organizationId }).sum<{ sum: string | number | null }[]>('pool as sum');
      if (excludeId) q.whereNot({ id: excludeId });
      return Number((await q)[0]?.sum ?? 0);
    },
  };
}
