import type { ApiKeyRecord, Principal, Sandbox, Snapshot, Volume } from '../../../core/types.js';
import type { HostView } from '../../../core/services/hosts.js';
import type { PublishedPort } from '../../../core/services/ports.js';
import type { BuildLogLine, Image, ImageBuild } from '../../../core/images/types.js';
import type { CodeContext } from '../../../core/code-interpreter/types.js';

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

/**
 * The public shape of a sandbox. Env values are not echoed: they often hold secrets. Which host
 * it is on is shown only to operators (`viewer` with platform:hosts): it names the platform's
 * machines, which an organisation has no business knowing.
 */
export function renderSandbox(s: Sandbox, viewer?: Principal) {
  return {
    id: s.id,
    state: s.state,
    ...(viewer?.scopes.has('platform:hosts') ? { hostId: s.hostId } : {}),
    image: s.image,
    imageId: s.imageId,
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
    volumes: (s.volumeMounts ?? []).map((m) => ({ volumeId: m.volumeId, name: m.name, mountPath: m.mountPath, readOnly: m.readOnly, ...(m.subpath ? { subpath: m.subpath } : {}) })),
  };
}

export function renderVolume(v: Volume, usage?: { usedBytes: number }) {
  return {
    id: v.id,
    name: v.name,
    state: v.state,
    sizeBytes: v.sizeBytes,
    ...(usage ? { usedBytes: usage.usedBytes } : {}),
    createdAt: v.createdAt.toISOString(),
    updatedAt: v.updatedAt.toISOString(),
    lastUsedAt: iso(v.lastUsedAt),
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

/** An image; `layers` when the caller looked them up (getImage). */
export function renderImage(i: Image, layers?: { id: string; sizeBytes: number | null; createdAt: Date }[]) {
  return {
    id: i.id,
    name: i.name,
    tags: i.tags,
    references: i.tags.map((t) => `${i.name}:${t}`),
    base: i.base,
    source: i.source,
    buildId: i.buildId,
    sizeBytes: i.sizeBytes,
    ...(layers ? { layers: layers.map((l) => ({ id: l.id, sizeBytes: l.sizeBytes, createdAt: l.createdAt.toISOString() })) } : {}),
    config: {
      env: Object.fromEntries(i.config.env),
      workdir: i.config.workdir,
      user: i.config.user,
      shell: i.config.shell,
      cmd: i.config.cmd,
      entrypoint: i.config.entrypoint,
      exposedPorts: i.config.exposedPorts,
      labels: i.config.labels,
      volumes: i.config.volumes,
      stopSignal: i.config.stopSignal,
      start: i.config.start,
    },
    createdAt: i.createdAt.toISOString(),
  };
}

export function renderBuild(b: ImageBuild) {
  return {
    id: b.id,
    name: b.name,
    tags: b.tags,
    state: b.state,
    imageId: b.imageId,
    error: b.error,
    currentStep: b.currentStep,
    totalSteps: b.totalSteps,
    logLines: b.logCount,
    noCache: b.options.noCache,
    createdAt: b.createdAt.toISOString(),
    startedAt: iso(b.startedAt),
    finishedAt: iso(b.finishedAt),
  };
}

export function renderBuildLogLine(l: BuildLogLine) {
  return { offset: l.offset, at: l.at.toISOString(), stream: l.stream, text: l.text, ...(l.step !== undefined ? { step: l.step } : {}) };
}

/** A code context (core/code-interpreter/types.ts), field by field so the wire shape stays the spec's. */
export function renderCodeContext(c: CodeContext) {
  return { id: c.id, language: c.language, cwd: c.cwd, user: c.user, isDefault: c.isDefault, createdAt: c.createdAt };
}

/** A host as operators see it (listHosts, getHost and the cordon verbs). */
export function renderHost(v: HostView) {
  const h = v.host;
  return {
    id: h.id,
    url: h.url,
    state: v.state,
    region: v.region,
    labels: h.labels,
    driver: h.driver,
    version: h.version,
    capacity: h.capacity,
    allocatable: v.allocatable,
    allocated: v.allocated,
    reported: h.allocated,
    registeredAt: h.registeredAt.toISOString(),
    lastHeartbeatAt: h.lastHeartbeatAt.toISOString(),
    lostAt: iso(h.lostAt),
  };
}
