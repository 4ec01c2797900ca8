// The native API's view of core's usage samples (getSandboxUsage, getSandboxUsageHistory).
import { errors } from '../../../core/errors.js';
import type { UsagePoint } from '../../../core/services/usage.js';

export function renderUsageSample(p: UsagePoint) {
  return {
    at: p.at.toISOString(),
    cpuUsedPct: p.cpuUsedPct,
    cpuCount: p.cpuCount,
    memoryUsedBytes: p.memUsed,
    memoryCacheBytes: p.memCache,
    memoryLimitBytes: p.memTotal,
    diskUsedBytes: p.diskUsed,
    diskLimitBytes: p.diskTotal,
    networkRxBytes: p.netRx,
    networkTxBytes: p.netTx,
  };
}

/** A range bound: unix seconds (digits, optionally with a fraction) or an ISO 8601 date-time. */
export function instantParam(value: string | undefined, field: string): Date | undefined {
  if (value === undefined || value === '') return undefined;
  const at = /^\d+(\.\d+)?$/.test(value) ? new Date(Number(value) * 1000) : /^\d{4}-\d{2}-\d{2}/.test(value) ? new Date(value) : new Date(Number.NaN);
  if (Number.isNaN(at.getTime())) throw errors.validation(field, 'must be an ISO 8601 date-time or unix seconds');
  return at;
}
