// Organisations and their usage records as the native API answers them (openapi/native.yaml).
import type { OrganizationView } from '../../../core/services/organizations.js';
import type { OrganizationUsage } from '../../../core/services/org-limits.js';
import type { UsageRecordView } from '../../../core/services/usage-records.js';

export function renderOrganization(v: OrganizationView) {
  const o = v.organization;
  return {
    id: o.id,
    name: o.name,
    createdAt: o.createdAt.toISOString(),
    suspended: o.suspendedAt !== null,
    suspendedAt: o.suspendedAt ? o.suspendedAt.toISOString() : null,
    limits: v.limits,
    customLimits: o.limits,
  };
}

export function renderOwnOrganization(v: OrganizationView & { usage: OrganizationUsage }) {
  return { ...renderOrganization(v), usage: v.usage };
}

export function renderUsageRecords(r: { from: Date; to: Date; items: UsageRecordView[] }) {
  return {
    from: r.from.toISOString(),
    to: r.to.toISOString(),
    items: r.items.map((u) => ({
      organizationId: u.organizationId,
      hourStart: u.hourStart.toISOString(),
      sandboxSeconds: u.sandboxSeconds,
      bySize: u.bySize,
      cpuSeconds: u.cpuSeconds,
      storageGiBHours: Math.round(u.storageGiBHours * 1e6) / 1e6,
      closed: u.closed,
      updatedAt: u.updatedAt.toISOString(),
    })),
  };
}
