import type { DbOrTx } from '../db.js';
import { deleteCounted } from './rows-deleted.js';

/** One stored usage sample (null = the host's driver could not know it). */
export interface UsageRecord {
  sandboxId: string;
  at: Date;
  cpuUsedPct: number | null;
  cpuCount: number;
  memUsed: number | null;
  memCache: number | null;
  memTotal: number | null;
  diskUsed: number | null;
  diskTotal: number | null;
  netRx: number | null;
  netTx: number | null;
}

export interface NewUsageRecord extends UsageRecord {
  organizationId: string;
  hostId: string;
}

interface Row {
  sandbox_id: string;
  organization_id: string;
  host_id: string;
  sampled_at: Date | string;
  cpu_used_pct: number | null;
  cpu_count: number;
  mem_used: number | null;
  mem_cache: number | null;
  mem_total: number | null;
  disk_used: number | null;
  disk_total: number | null;
  net_rx: number | null;
  net_tx: number | null;
}

const COLUMNS = ['sandbox_id', 'sampled_at', 'cpu_used_pct', 'cpu_count', 'mem_used', 'mem_cache', 'mem_total', 'disk_used', 'disk_total', 'net_rx', 'net_tx'];

const num = (v: number | string | null): number | null => (v === null ? null : Number(v));

function fromRow(r: Omit<Row, 'organization_id' | 'host_id'>): UsageRecord {
  return {
    sandboxId: r.sandbox_id,
    at: r.sampled_at instanceof Date ? r.sampled_at : new Date(r.sampled_at),
    cpuUsedPct: num(r.cpu_used_pct),
    cpuCount: Number(r.cpu_count),
    memUsed: num(r.mem_used),
    memCache: num(r.mem_cache),
    memTotal: num(r.mem_total),
    diskUsed: num(r.disk_used),
    diskTotal: num(r.disk_total),
    netRx: num(r.net_rx),
    netTx: num(r.net_tx),
  };
}

/** Rows of sandbox_usage; every read is scoped to an organisation. */
export function sandboxUsageRepository(db: DbOrTx) {
  return {
    /** Organisation of each of these sandboxes the database places on `hostId` (others are left out). */
    async organizationsOnHost(hostId: string, sandboxIds: string[]): Promise<Map<string, string>> {
      if (sandboxIds.length === 0) return new Map();
      const rows: { id: string; organization_id: string }[] = await db('sandboxes').select('id', 'organization_id').where({ host_id: hostId }).whereIn('id', sandboxIds);
      return new Map(rows.map((r) => [r.id, r.organization_id]));
    },

    /** Inserts the samples; one already stored (a retried heartbeat) is kept as it was. */
    async insert(records: NewUsageRecord[]): Promise<void> {
      if (records.length === 0) return;
      const rows: Row[] = records.map((r) => ({
        sandbox_id: r.sandboxId,
        organization_id: r.organizationId,
        host_id: r.hostId,
        sampled_at: r.at,
        cpu_used_pct: r.cpuUsedPct,
        cpu_count: r.cpuCount,
        mem_used: r.memUsed,
        mem_cache: r.memCache,
        mem_total: r.memTotal,
        disk_used: r.diskUsed,
        disk_total: r.diskTotal,
        net_rx: r.netRx,
        net_tx: r.netTx,
      }));
      // PostgreSQL takes at most 65535 parameters per statement: 13 columns × 1000 rows fits.
      for (let i = 0; i < rows.length; i += 1000) {
        await db('sandbox_usage').insert(rows.slice(i, i + 1000)).onConflict(['sandbox_id', 'sampled_at']).ignore();
      }
    },

    /** The newest sample of each of these sandboxes that has one. */
    async latest(organizationId: string, sandboxIds: string[]): Promise<Map<string, UsageRecord>> {
      if (sandboxIds.length === 0) return new Map();
      const rows = await db('sandbox_usage')
        .distinctOn('sandbox_id')
        .select(COLUMNS)
        .where({ organization_id: organizationId })
        .whereIn('sandbox_id', sandboxIds)
        .orderBy([{ column: 'sandbox_id' }, { column: 'sampled_at', order: 'desc' }]);
      return new Map(rows.map((r: Row) => [r.sandbox_id, fromRow(r)]));
    },

    /** Samples in [start, end], oldest first, at most `limit` (the newest ones when there are more). */
    async range(organizationId: string, sandboxId: string, start: Date, end: Date, limit: number): Promise<UsageRecord[]> {
      const rows = await db('sandbox_usage')
        .select(COLUMNS)
        .where({ organization_id: organizationId, sandbox_id: sandboxId })
        .where('sampled_at', '>=', start)
        .where('sampled_at', '<=', end)
        .orderBy('sampled_at', 'desc')
        .limit(limit);
      return rows.reverse().map((r: Row) => fromRow(r));
    },

    /** Removes up to `limit` samples taken before `cutoff` (whatever became of their sandbox); returns how many. */
    async deleteOlderThan(cutoff: Date, limit: number): Promise<number> {
      return deleteCounted(db('sandbox_usage').whereIn(['sandbox_id', 'sampled_at'], db('sandbox_usage').select('sandbox_id', 'sampled_at').where('sampled_at', '<', cutoff).limit(limit)), 'sandbox_id');
    },

    /**
     * For up to `sandboxLimit` sandboxes holding more than `maxRows` samples, removes their oldest
     * ones beyond that (up to `limit` rows in all); returns how many went.
     */
    async trimPerSandbox(maxRows: number, sandboxLimit: number, limit: number): Promise<number> {
      const over: { sandbox_id: string }[] = await db('sandbox_usage').select('sandbox_id').groupBy('sandbox_id').havingRaw('count(*) > ?', [maxRows]).limit(sandboxLimit);
      let removed = 0;
      for (const { sandbox_id } of over) {
        if (removed >= limit) break;
        const keepFrom = db('sandbox_usage').select('sampled_at').where({ sandbox_id }).orderBy('sampled_at', 'desc').offset(maxRows - 1).limit(1);
        removed += await deleteCounted(
          db('sandbox_usage').whereIn(
            ['sandbox_id', 'sampled_at'],
            db('sandbox_usage').select('sandbox_id', 'sampled_at').where({ sandbox_id }).where('sampled_at', '<', keepFrom).orderBy('sampled_at').limit(limit - removed),
          ),
          'sandbox_id',
        );
      }
      return removed;
    },
  };
}
