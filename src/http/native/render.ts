import type { ApiKeyRecord, Sandbox, Snapshot } from '../../../core/types.js';
import type { PublishedPort } from '../../../core/services/ports.js';

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

/** The public shape of a sandbox. Env values are not echoed: they often hold secrets. */
export function renderSandbox(s: Sandbox) {
  return {
    id: s.id,
    state: s.state,
    image: s.image,
    cpu: s.cpu,
    memoryMiB: s.memoryMiB,
    diskGiB: s.diskGiB,
    labels: s.labels,
    timeoutSeconds: s.timeoutSeconds,
    expiresAt: iso(s.expiresAt),
    createdAt: s.createdAt.toISOString(),
    updatedAt: s.updatedAt.toISOString(),
    startedAt: iso(s.startedAt),
    stoppedAt: iso(s.stoppedAt),
    memoryRestored: s.memoryRestored,
    resumeReason: s.resumeReason,
    errorMessage: s.errorMessage,
    pausedAt: iso(s.pausedAt),
    pauseReason: s.pauseReason,
    stopReason: s.stopReason,
    lastActivityAt: iso(s.lastActivityAt),
    idleTimeoutSeconds: s.idleTimeoutSeconds,
    idleAction: s.idleAction,
    autoDeleteSeconds: s.autoDeleteSeconds,
    snapshotId: s.sourceSnapshotId,
    forkedFrom: s.forkedFrom,
    egress: s.egress,
  };
}

export function renderSnapshot(s: Snapshot) {
  return {
    id: s.id,
    name: s.name,
    state: s.state,
    sourceSandboxId: s.sourceSandboxId,
    parentSnapshotId: s.parentSnapshotId,
    sizeBytes: s.sizeBytes,
    createdAt: s.createdAt.toISOString(),
  };
}

export function renderApiKey(k: ApiKeyRecord) {
  return {
    id: k.id,
    name: k.name,
    preset: k.preset,
    scopes: k.scopes,
    keyPrefix: k.keyPrefix,
    sandboxIds: k.sandboxIds,
    createdAt: k.createdAt.toISOString(),
    lastUsedAt: iso(k.lastUsedAt),
  };
}

export function renderPort(p: PublishedPort) {
  return {
    port: p.port,
    url: p.url,
    pathUrl: p.pathUrl,
    public: p.public,
    ...(p.token ? { token: p.token } : {}),
    createdAt: p.createdAt.toISOString(),
    updatedAt: p.updatedAt.toISOString(),
  };
}
