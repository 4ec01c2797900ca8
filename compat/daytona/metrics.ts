// Daytona's metrics history (daytona-wave2.md §8.2) over core's usage samples:
// `GET /sandbox/{id}/telemetry/metrics?from&to&metricNames=…` answers one series per metric
// name. The SDK pivots the series back into samples by grouping points on the exact timestamp
// string and sorting the groups as strings, so every point of one sample carries the same
// fixed-precision UTC ISO string (`toISOString`: always milliseconds and `Z`). A value the host
// could not measure is left out of its series (the SDK reads it as 0).
import { errors } from '../../core/errors.js';
import type { UsagePoint } from '../../core/services/usage.js';

/** Samples one answer has at most (more in the range are averaged down). */
export const DAYTONA_METRICS_MAX_POINTS = 1_000;

const METRICS: Record<string, (p: UsagePoint) => number | null> = {
  'daytona.sandbox.cpu.utilization': (p) => p.cpuUsedPct,
  'daytona.sandbox.cpu.limit': (p) => p.cpuCount,
  'daytona.sandbox.memory.usage': (p) => p.memUsed,
  'daytona.sandbox.memory.limit': (p) => p.memTotal,
  'daytona.sandbox.memory.cache': (p) => p.memCache,
  'daytona.sandbox.filesystem.usage': (p) => p.diskUsed,
  'daytona.sandbox.filesystem.total': (p) => p.diskTotal,
};

export interface DaytonaMetricSeries {
  metricName: string;
  dataPoints: { timestamp: string; value: number }[];
}

/** The names asked for (repeated keys or comma-joined), in their order; none = every metric. */
export function metricNamesOf(value: unknown): string[] {
  const names = (Array.isArray(value) ? value : value === undefined ? [] : [value]).flatMap((v) => (typeof v === 'string' ? v.split(',') : []));
  const wanted = [...new Set(names.map((n) => n.trim()).filter(Boolean))];
  const unknown = wanted.find((name) => !(name in METRICS));
  if (unknown) throw errors.validation('metricNames', `unknown metric "${unknown}" (known: ${Object.keys(METRICS).join(', ')})`);
  return wanted.length ? wanted : Object.keys(METRICS);
}

/** `from`/`to`: ISO 8601 date-times (what the SDK sends). */
export function instantOf(value: unknown, field: string): Date | undefined {
  if (value === undefined || value === '') return undefined;
  const at = typeof value === 'string' ? new Date(value) : new Date(Number.NaN);
  if (Number.isNaN(at.getTime())) throw errors.validation(field, 'must be an ISO 8601 date-time');
  return at;
}

export function metricSeries(points: UsagePoint[], names: string[]): DaytonaMetricSeries[] {
  return names.map((metricName) => ({
    metricName,
    dataPoints: points.flatMap((p) => {
      const value = METRICS[metricName](p);
      return value === null ? [] : [{ timestamp: p.at.toISOString(), value }];
    }),
  }));
}
