// Per-sandbox usage in the control plane: the samples host agents send with their heartbeats
// (host/agent/usage-sampler.ts → src/http/app.ts) are stored in sandbox_usage, read back as the
// latest sample or a time range (downsampled to a number of points), and removed after
// NESTBOX_USAGE_RETENTION_HOURS by a background pass (bounded per pass, and per sandbox).
import type { Db } from '../store/db.js';
import { sandboxUsageRepository, type UsageRecord } from '../store/repositories/sandbox-usage.js';
import type { UsageSample } from '../../host/protocol/schemas.js';
import { errors } from '../errors.js';
import { canSeeSandbox, requireScope } from './auth.js';
import { silentLogger, type Logger } from '../logger.js';
import type { Principal, Sandbox } from '../types.js';
import type { SandboxService } from './sandboxes.js';

/** A sample as every front door reads it (null = not known on this sandbox's host). */
export type UsagePoint = Omit<UsageRecord, 'sandboxId'>;

export interface UsageRangeQuery {
  /** Default: when the sandbox last started (else when it was created). */
  start?: Date;
  /** Default: now. */
  end?: Date;
  /** More samples than this in the range are averaged into this many points. */
  maxPoints: number;
}

export interface UsageOptions {
  retentionHours: number;
  /** Samples kept per sandbox at most, whatever the retention (the oldest go first). */
  maxSamplesPerSandbox?: number;
  logger?: Logger;
}

/** 24 hours at the default 5 s interval, with room to spare. */
export const DEFAULT_MAX_SAMPLES_PER_SANDBOX = 20_000;
/** Rows one prune statement removes; a pass runs a few, so a backlog drains over several passes. */
const PRUNE_BATCH = 5_000;
const PRUNE_BATCHES_PER_PASS = 10;
export const MAX_RANGE_POINTS = 10_000;

export class UsageService {
  private readonly maxSamplesPerSandbox: number;
  private readonly log: Logger;

  constructor(
    private readonly db: Db,
    private readonly sandboxes: Pick<SandboxService, 'get'>,
    private readonly options: UsageOptions,
  ) {
    this.maxSamplesPerSandbox = options.maxSamplesPerSandbox ?? DEFAULT_MAX_SAMPLES_PER_SANDBOX;
    this.log = options.logger ?? silentLogger;
  }

  /**
   * Stores a heartbeat's samples. Only samples of sandboxes the database places on that host are
   * kept: a host cannot write usage for another host's (or organisation's) sandboxes.
   */
  async record(hostId: string, samples: UsageSample[]): Promise<number> {
    if (samples.length === 0) return 0;
    const repo = sandboxUsageRepository(this.db);
    const owners = await repo.organizationsOnHost(hostId, [...new Set(samples.map((s) => s.sandboxId))]);
    const records = samples.flatMap((s) => {
      const organizationId = owners.get(s.sandboxId);
      if (!organizationId) return [];
      return [{
        sandboxId: s.sandboxId,
        organizationId,
        hostId,
        at: new Date(s.at),
        cpuUsedPct: s.cpuUsedPct ?? null,
        cpuCount: s.cpuCount,
        memUsed: s.memUsed ?? null,
        memCache: s.memCache ?? null,
        memTotal: s.memTotal ?? null,
        diskUsed: s.diskUsed ?? null,
        diskTotal: s.diskTotal ?? null,
        netRx: s.netRx ?? null,
        netTx: s.netTx ?? null,
      }];
    });
    await repo.insert(records);
    return records.length;
  }

  /** The sandbox's newest sample, or null when none was taken (yet, or within retention). */
  async latest(principal: Principal, sandboxId: string): Promise<{ sandbox: Sandbox; point: UsagePoint | null }> {
    requireScope(principal, 'sandboxes:read');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    const point = (await sandboxUsageRepository(this.db).latest(principal.organizationId, [sandbox.id])).get(sandbox.id);
    return { sandbox, point: point ? pointOf(point) : null };
  }

  /** Newest samples of several sandboxes; ids the caller cannot see, or without samples, are left out. */
  async latestMany(principal: Principal, sandboxIds: string[]): Promise<Map<string, UsagePoint>> {
    requireScope(principal, 'sandboxes:read');
    const visible = sandboxIds.filter((id) => canSeeSandbox(principal, id));
    const found = await sandboxUsageRepository(this.db).latest(principal.organizationId, visible);
    return new Map([...found].map(([id, record]) => [id, pointOf(record)]));
  }

  /** Samples of one sandbox in a time range, oldest first, downsampled to `maxPoints`. */
  async range(principal: Principal, sandboxId: string, query: UsageRangeQuery): Promise<{ sandbox: Sandbox; start: Date; end: Date; points: UsagePoint[] }> {
    requireScope(principal, 'sandboxes:read');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    const end = query.end ?? new Date();
    const start = query.start ?? sandbox.startedAt ?? sandbox.createdAt;
    if (start.getTime() > end.getTime()) throw errors.validation('start', 'must not be after end');
    if (!Number.isInteger(query.maxPoints) || query.maxPoints < 1 || query.maxPoints > MAX_RANGE_POINTS) throw errors.validation('maxPoints', `must be an integer from 1 to ${MAX_RANGE_POINTS}`);
    const records = await sandboxUsageRepository(this.db).range(principal.organizationId, sandbox.id, start, end, this.maxSamplesPerSandbox);
    return { sandbox, start, end, points: downsample(records.map(pointOf), query.maxPoints) };
  }

  /** The retention pass: samples older than the retention, then each sandbox's beyond its cap. */
  async prune(now = new Date()): Promise<number> {
    const repo = sandboxUsageRepository(this.db);
    const cutoff = new Date(now.getTime() - this.options.retentionHours * 3600_000);
    let removed = 0;
    for (let batch = 0; batch < PRUNE_BATCHES_PER_PASS; batch++) {
      const n = await repo.deleteOlderThan(cutoff, PRUNE_BATCH);
      removed += n;
      if (n < PRUNE_BATCH) break;
    }
    removed += await repo.trimPerSandbox(this.maxSamplesPerSandbox, 100, PRUNE_BATCH);
    if (removed) this.log.debug({ removed }, `usage retention removed ${removed} samples`);
    return removed;
  }
}

function pointOf(record: UsageRecord): UsagePoint {
  const { sandboxId: _sandboxId, ...point } = record;
  return point;
}

/**
 * At most `maxPoints` points: consecutive samples are grouped into equal-count buckets; a bucket
 * keeps its last sample's time, limits and counters (net bytes are cumulative) and the average
 * of what varies (CPU %, memory and disk in use).
 */
export function downsample(points: UsagePoint[], maxPoints: number): UsagePoint[] {
  if (points.length <= maxPoints) return points;
  const out: UsagePoint[] = [];
  for (let b = 0; b < maxPoints; b++) {
    const bucket = points.slice(Math.floor((b * points.length) / maxPoints), Math.floor(((b + 1) * points.length) / maxPoints));
    if (bucket.length === 0) continue;
    const last = bucket[bucket.length - 1];
    const mean = (key: 'cpuUsedPct' | 'memUsed' | 'memCache' | 'diskUsed', round: boolean): number | null => {
      const known = bucket.map((p) => p[key]).filter((v): v is number => v !== null);
      if (known.length === 0) return null;
      const value = known.reduce((a, v) => a + v, 0) / known.length;
      return round ? Math.round(value) : Math.round(value * 100) / 100;
    };
    out.push({ ...last, cpuUsedPct: mean('cpuUsedPct', false), memUsed: mean('memUsed', true), memCache: mean('memCache', true), diskUsed: mean('diskUsed', true) });
  }
  return out;
}
