// Per-sandbox usage, sampled by the host agent every NESTBOX_USAGE_SAMPLE_SECONDS: the driver
// reads counters (Driver.usage: a few cgroup, statfs and interface files per sandbox), and this
// turns cumulative CPU time into a percentage between two rounds and keeps the samples until a
// heartbeat carries them to the control plane (src/host-agent.ts). The buffer is bounded: a
// control plane that stays unreachable costs the oldest samples, never unbounded memory.
import type { Logger } from '../../core/logger.js';
import { silentLogger } from '../../core/logger.js';
import type { Driver } from '../drivers/types.js';
import type { UsageSample } from '../protocol/schemas.js';

export interface UsageSamplerOptions {
  intervalMs: number;
  /** Samples kept for the control plane at most (oldest dropped first). */
  maxBuffered?: number;
  logger?: Logger;
}

const DEFAULT_MAX_BUFFERED = 10_000;

export class UsageSampler {
  /** The previous read of each sandbox's CPU time, with a monotonic clock beside it. */
  private readonly previousCpu = new Map<string, { cpuNs: number; atNs: bigint }>();
  private buffer: UsageSample[] = [];
  private timer: NodeJS.Timeout | undefined;
  private sampling: Promise<UsageSample[]> | undefined;
  private lastFailure = '';
  private readonly maxBuffered: number;
  private readonly log: Logger;

  constructor(
    private readonly driver: Pick<Driver, 'usage'>,
    private readonly options: UsageSamplerOptions,
  ) {
    this.maxBuffered = options.maxBuffered ?? DEFAULT_MAX_BUFFERED;
    this.log = options.logger ?? silentLogger;
  }

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.sampleOnce(), this.options.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One round over every live sandbox (rounds never overlap); the samples are also buffered. */
  sampleOnce(): Promise<UsageSample[]> {
    this.sampling ??= this.round().finally(() => {
      this.sampling = undefined;
    });
    return this.sampling;
  }

  /** Up to `max` buffered samples, oldest first, removed from the buffer. */
  take(max: number): UsageSample[] {
    return this.buffer.splice(0, max);
  }

  /** Samples a failed heartbeat could not deliver go back in front (still bounded). */
  putBack(samples: UsageSample[]): void {
    this.buffer = [...samples, ...this.buffer];
    this.trim();
  }

  get buffered(): number {
    return this.buffer.length;
  }

  private async round(): Promise<UsageSample[]> {
    let counters;
    try {
      counters = await this.driver.usage();
      if (this.lastFailure) this.log.info('usage sampling works again');
      this.lastFailure = '';
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      if (message !== this.lastFailure) this.log.warn({ err: message }, `usage sampling failed: ${message}`);
      this.lastFailure = message;
      return [];
    }
    const at = new Date().toISOString();
    const nowNs = process.hrtime.bigint();
    const seen = new Set<string>();
    const samples = counters.map((c): UsageSample => {
      seen.add(c.id);
      let cpuUsedPct: number | undefined;
      const previous = this.previousCpu.get(c.id);
      if (c.cpuNs !== undefined) {
        if (c.status === 'paused') cpuUsedPct = 0;
        else if (previous && c.cpuNs >= previous.cpuNs && nowNs > previous.atNs) {
          const share = (c.cpuNs - previous.cpuNs) / (Number(nowNs - previous.atNs) * c.cpuLimit);
          cpuUsedPct = Math.round(Math.min(100, Math.max(0, share * 100)) * 100) / 100;
        }
        this.previousCpu.set(c.id, { cpuNs: c.cpuNs, atNs: nowNs });
      } else if (c.status === 'paused') {
        cpuUsedPct = 0;
      }
      return dropUndefined({
        sandboxId: c.id,
        at,
        cpuUsedPct,
        cpuCount: c.cpuLimit,
        memUsed: whole(c.memoryUsedBytes),
        memCache: whole(c.memoryCacheBytes),
        memTotal: whole(c.memoryLimitBytes),
        diskUsed: whole(c.diskUsedBytes),
        diskTotal: whole(c.diskTotalBytes),
        netRx: whole(c.netRxBytes),
        netTx: whole(c.netTxBytes),
      });
    });
    for (const id of this.previousCpu.keys()) if (!seen.has(id)) this.previousCpu.delete(id);
    this.buffer.push(...samples);
    this.trim();
    return samples;
  }

  private trim(): void {
    if (this.buffer.length > this.maxBuffered) this.buffer.splice(0, this.buffer.length - this.maxBuffered);
  }
}

function whole(value: number | undefined): number | undefined {
  return value === undefined || !Number.isFinite(value) || value < 0 ? undefined : Math.round(value);
}

function dropUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}
