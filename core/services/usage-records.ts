// Hourly usage per organisation (table usage_records): what a billing system reads.
//
// A row is (organisation, hour start) with
// - sandbox-seconds, in total and per size (vCPUs, memory MiB): each usage sample a host sent for
//   a sandbox (core/services/usage.ts; running and paused sandboxes are sampled every
//   NESTBOX_USAGE_SAMPLE_SECONDS) stands for that many seconds of it;
// - CPU-seconds actually used: each sample's share of its CPU limit × its vCPUs × those seconds;
// - storage GiB-hours: the GiB the organisation holds (sandbox disks of every sandbox that is not
//   deleted, at their size; snapshots and images at their known size) integrated over the hour:
//   each pass adds the level it sees times the time since the row was last accounted.
//
// The rollup is a background pass on every replica and safe to run any number of times, on any
// number of replicas, and after a crash: each row is updated in one transaction holding its row
// lock (FOR UPDATE SKIP LOCKED: a row another replica is updating is left to it); the sample
// figures are recomputed from the samples and never decrease (a late heartbeat only adds
// samples, retention only removes them), and storage is integrated from the row's own
// `storage_accounted_until`, so a second pass adds only the time since the first. An hour is
// closed (never changed again) once it is over by a grace for late heartbeats.
import type { Db, DbOrTx } from '../store/db.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { errors } from '../errors.js';
import { silentLogger, type Logger } from '../logger.js';

const HOUR_MS = 3600_000;
const GIB = 1024 ** 3;
/** An hour is closed this long after its end (heartbeats carry samples a few seconds late). */
export const USAGE_CLOSE_GRACE_MS = 5 * 60_000;
/** Longest range one query may ask for. */
export const MAX_USAGE_RANGE_DAYS = 366;
/** Past hours still open that one pass finishes at most (the rest the next passes). */
const OPEN_HOURS_PER_PASS = 48;

export interface UsageBySize {
  cpu: number;
  memoryMiB: number;
  sandboxSeconds: number;
  cpuSeconds: number;
}

export interface UsageRecordView {
  organizationId: string;
  hourStart: Date;
  sandboxSeconds: number;
  bySize: UsageBySize[];
  cpuSeconds: number;
  storageGiBHours: number;
  /** False while the hour is still being accounted (the current hour, or within the grace). */
  closed: boolean;
  updatedAt: Date;
}

interface Row {
  organization_id: string;
  hour_start: Date | string;
  sandbox_seconds: number | string;
  by_size: UsageBySize[] | string;
  cpu_seconds: number | string;
  storage_gib_hours: number | string;
  storage_accounted_until: Date | string;
  closed_at: Date | string | null;
  updated_at: Date | string;
}

const fromRow = (r: Row): UsageRecordView => ({
  organizationId: r.organization_id,
  hourStart: new Date(r.hour_start),
  sandboxSeconds: Number(r.sandbox_seconds),
  bySize: typeof r.by_size === 'string' ? (JSON.parse(r.by_size) as UsageBySize[]) : r.by_size,
  cpuSeconds: Number(r.cpu_seconds),
  storageGiBHours: Number(r.storage_gib_hours),
  closed: r.closed_at !== null,
  updatedAt: new Date(r.updated_at),
});

export function hourStartOf(at: Date): Date {
  return new Date(Math.floor(at.getTime() / HOUR_MS) * HOUR_MS);
}

export interface UsageRecordOptions {
  /** What one sample stands for (NESTBOX_USAGE_SAMPLE_SECONDS). */
  sampleSeconds: number;
  logger?: Logger;
}

export class UsageRecordService {
  private readonly log: Logger;

  constructor(
    private readonly db: Db,
    private readonly options: UsageRecordOptions,
  ) {
    this.log = options.logger ?? silentLogger;
  }

  /** One pass: the current hour of every organisation, and past hours not closed yet. */
  async rollup(now = new Date()): Promise<{ rows: number; closed: number }> {
    const current = hourStartOf(now);
    let rows = 0;
    let closed = 0;
    const open = (await this.db('usage_records')
      .select('organization_id', 'hour_start')
      .whereNull('closed_at')
      .where('hour_start', '<', current)
      .orderBy('hour_start')
      .limit(OPEN_HOURS_PER_PASS * 100)) as { organization_id: string; hour_start: Date | string }[];
    const work = open.map((r) => ({ organizationId: r.organization_id, hour: new Date(r.hour_start) }));
    for (const organizationId of await organizationRepository(this.db).listIds()) work.push({ organizationId, hour: current });
    for (const { organizationId, hour } of work) {
      const result = await this.rollupOne(organizationId, hour, now);
      if (result !== 'skipped') rows++;
      if (result === 'closed') closed++;
    }
    if (closed) this.log.debug({ closed }, `usage rollup closed ${closed} hourly records`);
    return { rows, closed };
  }

  private async rollupOne(organizationId: string, hour: Date, now: Date): Promise<'updated' | 'closed' | 'skipped'> {
    const end = new Date(hour.getTime() + HOUR_MS);
    return this.db.transaction(async (tx) => {
      // The row exists from the hour's first pass; storage is accounted from the hour's start
      // (the previous hour's row was accounted up to its end by the same passes).
      await tx('usage_records').insert({ organization_id: organizationId, hour_start: hour, storage_accounted_until: hour }).onConflict(['organization_id', 'hour_start']).ignore();
      const row = (await tx('usage_records').where({ organization_id: organizationId, hour_start: hour }).forUpdate().skipLocked().first()) as Row | undefined;
      // Locked: another replica is on it now. Closed: final.
      if (!row || row.closed_at !== null) return 'skipped';
      const samples = await this.sampleFigures(tx, organizationId, hour, end);
      const previous = fromRow(row);
      // Never below what an earlier pass saw: samples only arrive late, retention only removes them.
      const keepSamples = samples.sandboxSeconds < previous.sandboxSeconds;
      const accountedUntil = new Date(row.storage_accounted_until);
      const until = new Date(Math.min(now.getTime(), end.getTime()));
      let storage = previous.storageGiBHours;
      if (until.getTime() > accountedUntil.getTime()) storage += ((await this.storageGiB(tx, organizationId)) * (until.getTime() - accountedUntil.getTime())) / HOUR_MS;
      const close = now.getTime() >= end.getTime() + USAGE_CLOSE_GRACE_MS;
      await tx('usage_records')
        .where({ organization_id: organizationId, hour_start: hour })
        .update({
          sandbox_seconds: keepSamples ? previous.sandboxSeconds : samples.sandboxSeconds,
          by_size: JSON.stringify(keepSamples ? previous.bySize : samples.bySize),
          cpu_seconds: Math.max(previous.cpuSeconds, samples.cpuSeconds),
          storage_gib_hours: storage,
          storage_accounted_until: until.getTime() > accountedUntil.getTime() ? until : accountedUntil,
          closed_at: close ? now : null,
          updated_at: now,
        });
      return close ? 'closed' : 'updated';
    });
  }

  /** Sandbox-seconds and CPU-seconds of the hour from the samples, by the sandboxes' size. */
  private async sampleFigures(tx: DbOrTx, organizationId: string, from: Date, to: Date): Promise<{ sandboxSeconds: number; cpuSeconds: number; bySize: UsageBySize[] }> {
    const rows = (await tx('sandbox_usage as u')
      .join('sandboxes as s', 's.id', 'u.sandbox_id')
      .where('u.organization_id', organizationId)
      .where('u.sampled_at', '>=', from)
      .where('u.sampled_at', '<', to)
      .groupBy('s.cpu', 's.memory_mib')
      .orderBy(['s.cpu', 's.memory_mib'])
      .select('s.cpu', 's.memory_mib', tx.raw('count(*) as samples'), tx.raw('coalesce(sum(u.cpu_used_pct / 100.0 * u.cpu_count), 0) as cpu_share'))) as { cpu: number; memory_mib: number; samples: string | number; cpu_share: string | number }[];
    const seconds = this.options.sampleSeconds;
    const bySize = rows.map((r) => ({
      cpu: Number(r.cpu),
      memoryMiB: Number(r.memory_mib),
      sandboxSeconds: Number(r.samples) * seconds,
      cpuSeconds: Math.round(Number(r.cpu_share) * seconds * 1000) / 1000,
    }));
    return {
      sandboxSeconds: bySize.reduce((n, s) => n + s.sandboxSeconds, 0),
      cpuSeconds: Math.round(bySize.reduce((n, s) => n + s.cpuSeconds, 0) * 1000) / 1000,
      bySize,
    };
  }

  /** GiB held now: sandbox disks (not deleted), named snapshots and images of known size. */
  async storageGiB(db: DbOrTx, organizationId: string): Promise<number> {
    const [disks] = (await db('sandboxes').where({ organization_id: organizationId }).whereNot({ state: 'deleted' }).select(db.raw('coalesce(sum(disk_gib), 0) as gib'))) as { gib: string | number }[];
    const [snapshots] = (await db('snapshots').where({ organization_id: organizationId, kind: 'snapshot' }).whereNull('deleted_at').select(db.raw('coalesce(sum(size_bytes), 0) as bytes'))) as { bytes: string | number }[];
    const [images] = (await db('images').where({ organization_id: organizationId }).whereNull('deleted_at').select(db.raw('coalesce(sum(size_bytes), 0) as bytes'))) as { bytes: string | number }[];
    return Number(disks.gib) + (Number(snapshots.bytes) + Number(images.bytes)) / GIB;
  }

  /** Hourly records of one organisation whose hour starts in [from, to), oldest first. */
  async range(organizationId: string, query: { from?: string; to?: string }): Promise<{ from: Date; to: Date; items: UsageRecordView[] }> {
    const from = parseTime('from', query.from);
    const to = parseTime('to', query.to);
    if (from.getTime() >= to.getTime()) throw errors.validation('to', 'must be after from');
    if (to.getTime() - from.getTime() > MAX_USAGE_RANGE_DAYS * 24 * HOUR_MS) throw errors.validation('to', `the range may span at most ${MAX_USAGE_RANGE_DAYS} days`);
    const rows = (await this.db('usage_records')
      .where({ organization_id: organizationId })
      .where('hour_start', '>=', hourStartOf(from))
      .where('hour_start', '<', to)
      .orderBy('hour_start')) as Row[];
    return { from, to, items: rows.map(fromRow) };
  }
}

function parseTime(field: string, value: string | undefined): Date {
  if (value === undefined || value === '') throw errors.validation(field, 'is required (an ISO 8601 date-time, e.g. 2026-12-04T10:00:00Z)');
  // Date.parse accepts more than ISO 8601 ("Dec 4 2026"); only the ISO forms are the contract.
  if (!/^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})?)?$/.test(value)) throw errors.validation(field, 'must be an ISO 8601 date-time, e.g. 2026-12-04T10:00:00Z');
  const at = new Date(value);
  if (Number.isNaN(at.getTime()) || at.getUTCFullYear() < 2000 || at.getUTCFullYear() > 9999) throw errors.validation(field, 'must be an ISO 8601 date-time between the years 2000 and 9999');
  return at;
}
