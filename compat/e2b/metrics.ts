// E2B's sandbox metrics (e2b-wave2.md §4.1) over core's usage samples: `SandboxMetric` items with
// `timestamp` as an ISO string (the field the SDK reads) and `timestampUnix` in seconds beside it.
// E2B's schema makes every number required (the Python SDK's generated model refuses an item
// without one), so what a host could not measure is sent as 0 here; COVERAGE.md says which.
import { errors } from '../../core/errors.js';
import type { UsagePoint } from '../../core/services/usage.js';

/** Points one range answer has at most (E2B samples every 5 s: over an hour of them). */
export const E2B_METRICS_MAX_POINTS = 1_000;
/** Sandboxes one `GET /sandboxes/metrics` may name (upstream caps the list too). */
export const E2B_METRICS_MAX_SANDBOXES = 100;

export interface E2bSandboxMetric {
  timestamp: string;
  timestampUnix: number;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memTotal: number;
  memCache: number;
  diskUsed: number;
  diskTotal: number;
}

export function e2bMetric(point: UsagePoint): E2bSandboxMetric {
  return {
    timestamp: point.at.toISOString(),
    timestampUnix: Math.floor(point.at.getTime() / 1000),
    cpuUsedPct: point.cpuUsedPct ?? 0,
    // int32 on E2B's wire; a fractional vCPU limit counts as the CPU it runs on.
    cpuCount: Math.max(1, Math.ceil(point.cpuCount)),
    memUsed: point.memUsed ?? 0,
    memTotal: point.memTotal ?? 0,
    memCache: point.memCache ?? 0,
    diskUsed: point.diskUsed ?? 0,
    diskTotal: point.diskTotal ?? 0,
  };
}

/** `start`/`end` query values: unix seconds (the SDK sends Math.round(Date / 1000)). */
export function unixSecondsOf(value: unknown, field: string): Date | undefined {
  if (value === undefined || value === '') return undefined;
  const n = typeof value === 'string' && /^-?\d+$/.test(value) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < 0) throw errors.validation(field, 'must be a unix time in seconds');
  return new Date(n * 1000);
}

/** `sandbox_ids`: a comma-separated list, or the key repeated. */
export function sandboxIdsOf(value: unknown): string[] {
  const parts = (Array.isArray(value) ? value : [value]).flatMap((v) => (typeof v === 'string' ? v.split(',') : []));
  const ids = [...new Set(parts.map((s) => s.trim()).filter(Boolean))];
  if (ids.length === 0) throw errors.validation('sandbox_ids', 'required: a comma-separated list of sandbox ids');
  if (ids.length > E2B_METRICS_MAX_SANDBOXES) throw errors.validation('sandbox_ids', `at most ${E2B_METRICS_MAX_SANDBOXES} sandboxes`);
  return ids;
}
