// Daytona's Sandbox DTO and state names over core's sandbox (daytona.md (b) "The Sandbox DTO").
import type { EgressPolicy, Sandbox, Snapshot } from '../../core/types.js';
import { isIpv4Entry } from '../../core/egress.js';
import type { SandboxState } from '../../core/state-machine.js';
import type { Principal } from '../../core/types.js';
import type { ToolboxPort } from '../../core/compat-port.js';
import { sandboxAccounts, type SandboxAccount } from '../sandbox-accounts.js';

/**
 * Core state → Daytona state. The SDK's waits (daytona.md (b) "Waiting rules") need `started`
 * after create/start/fork, `stopped` (or a 404) after stop, anything but `pausing` after pause,
 * and fail fast on `error`. Archive is a stop in Nestbox, so an archived sandbox shows `stopped`.
 */
export const DAYTONA_STATE: Record<SandboxState, string> = {
  creating: 'creating',
  running: 'started',
  stopping: 'stopping',
  stopped: 'stopped',
  starting: 'starting',
  pausing: 'pausing',
  paused: 'paused',
  resuming: 'resuming',
  deleting: 'destroying',
  deleted: 'destroyed',
  error: 'error',
};

const DESIRED_STATE: Record<SandboxState, string> = {
  creating: 'started',
  running: 'started',
  starting: 'started',
  resuming: 'started',
  stopping: 'stopped',
  stopped: 'stopped',
  pausing: 'paused',
  paused: 'paused',
  deleting: 'destroyed',
  deleted: 'destroyed',
  error: 'started',
};

/** The state Daytona's server would be driving a sandbox in `state` towards. */
export function daytonaDesiredState(state: SandboxState): string {
  return DESIRED_STATE[state];
}

/** Daytona list `states` filter → core states (states Nestbox never has match nothing). */
export const CORE_STATES_OF: Record<string, SandboxState[]> = {
  creating: ['creating'],
  started: ['running'],
  stopping: ['stopping'],
  stopped: ['stopped'],
  starting: ['starting'],
  pausing: ['pausing'],
  paused: ['paused'],
  resuming: ['resuming'],
  destroying: ['deleting'],
  error: ['error'],
};

const iso = (d: Date | null): string | null => (d ? d.toISOString() : null);

/**
 * Daytona's default user: its toolbox runs commands, sessions, terminals and file operations as
 * `daytona` (home /home/daytona, passwordless sudo), which Nestbox's default image has
 * (host/images/base-image.ts); in an image without it, root (compat/sandbox-accounts.ts).
 */
export const SANDBOX_USER = 'daytona';

/** The account Daytona's toolbox acts as in this sandbox. */
export function daytonaAccount(toolbox: Pick<ToolboxPort, 'readFile'>, principal: Principal, sandboxId: string): Promise<SandboxAccount> {
  return sandboxAccounts(toolbox).resolve(principal, sandboxId, undefined, SANDBOX_USER);
}

/** Minutes, as Daytona counts intervals; core counts seconds. */
const minutes = (seconds: number): number => Math.round(seconds / 60);

export function renderDaytonaSandbox(s: Sandbox, toolboxUrl: string, opts: { full: boolean; region: string; public?: boolean }): Record<string, unknown> {
  const ttlDelete = s.autoDeleteSeconds === 0 && s.timeoutSeconds > 0;
  const dto: Record<string, unknown> = {
    id: s.id,
    organizationId: s.organizationId,
    // Daytona names every sandbox; one created without a name is known by its id.
    name: s.name ?? s.id,
    user: SANDBOX_USER,
    labels: s.labels,
    // Every preview link open to anyone (create's `public`, updatePublicStatus).
    public: opts.public ?? false,
    // What is in force (core's egress policy); spec-required on list items too.
    networkBlockAll: s.egress.mode === 'deny-all',
    // Required by the Python SDK's Sandbox model (a strict bool): guests never get /dev/kvm here.
    kvm: false,
    // The region its host is in (the host's `region` label, else NESTBOX_REGION): what `target` names at create.
    target: opts.region,
    cpu: s.cpu,
    gpu: 0,
    memory: s.memoryMiB / 1024,
    // GiB; 0 for a sandbox created before disk quotas (its disk has no limit of its own).
    disk: s.diskGiB ?? 0,
    state: DAYTONA_STATE[s.state],
    desiredState: DESIRED_STATE[s.state],
    errorReason: s.errorMessage ?? undefined,
    recoverable: s.state === 'error',
    backupState: 'None',
    // The snapshot it started from: an image's snapshot name (`n` for `n:latest`), else the
    // Nestbox snapshot's id; none for the built-in image.
    snapshot: s.imageId ? s.image.replace(/:latest$/, '') : (s.sourceSnapshotId ?? undefined),
    // Built on demand by create({image}): the image is Daytona's dedupe key (compat/daytona/images.ts).
    ...(s.image.startsWith('daytona-') && s.image.endsWith(':daytona') ? { buildInfo: { snapshotRef: s.image, createdAt: s.createdAt.toISOString(), updatedAt: s.createdAt.toISOString() } } : {}),
    autoStopInterval: s.idleAction === 'stop' ? minutes(s.idleTimeoutSeconds) : 0,
    autoPauseInterval: s.idleAction === 'pause' ? minutes(s.idleTimeoutSeconds) : 0,
    // Archive is a stop in Nestbox (stopped sandboxes keep their disk), so nothing is ever archived later.
    autoArchiveInterval: 0,
    autoDeleteInterval: s.autoDeleteSeconds === null ? -1 : minutes(s.autoDeleteSeconds),
    autoDestroyAt: ttlDelete ? iso(s.expiresAt) ?? undefined : undefined,
    createdAt: s.createdAt.toISOString(),
    updatedAt: s.updatedAt.toISOString(),
    lastActivityAt: iso(s.lastActivityAt) ?? undefined,
    toolboxProxyUrl: toolboxUrl,
    daemonVersion: 'nestbox',
  };
  // daytona.md (b): the presence of `env` marks a full DTO; list items have none.
  if (opts.full) {
    dto.env = s.env;
    Object.assign(dto, daytonaAllowLists(s.egress));
    dto.volumes = (s.volumeMounts ?? []).map((m) => ({ volumeId: m.volumeId, mountPath: m.mountPath, ...(m.subpath ? { subpath: m.subpath } : {}) }));
  }
  return dto;
}

/**
 * An allow list as Daytona's two fields: addresses and CIDRs in `networkAllowList`, names in
 * `domainAllowList`, comma-separated, absent when empty. A core deny list has no Daytona field
 * (only the native API and E2B set one) and is not shown here.
 */
export function daytonaAllowLists(egress: EgressPolicy): { networkAllowList?: string; domainAllowList?: string } {
  if (egress.mode !== 'allow-list') return {};
  const allow = egress.allow ?? [];
  const cidrs = allow.filter(isIpv4Entry);
  const domains = allow.filter((entry) => !isIpv4Entry(entry));
  return { ...(cidrs.length ? { networkAllowList: cidrs.join(',') } : {}), ...(domains.length ? { domainAllowList: domains.join(',') } : {}) };
}

const SNAPSHOT_STATE: Record<Snapshot['state'], string> = {
  creating: 'snapshotting',
  ready: 'active',
  deleting: 'removing',
  error: 'error',
};

/** SnapshotDto (daytona.md (b), spec-required fields). */
export function renderDaytonaSnapshot(s: Snapshot): Record<string, unknown> {
  return {
    id: s.id,
    general: false,
    name: s.name,
    imageName: null,
    state: SNAPSHOT_STATE[s.state],
    size: s.sizeBytes === null ? null : s.sizeBytes / 1024 ** 3,
    entrypoint: null,
    cpu: 0,
    gpu: 0,
    mem: 0,
    disk: 0,
    errorReason: s.errorMessage,
    createdAt: s.createdAt.toISOString(),
    updatedAt: s.createdAt.toISOString(),
    lastUsedAt: null,
    sourceSandboxId: s.sourceSandboxId,
  };
}
