import type { SandboxState } from './state-machine.js';

export interface Organization {
  id: string;
  name: string;
  createdAt: Date;
  /** Set while the platform operator has suspended it (every key and credential refused). */
  suspendedAt: Date | null;
  /** Its own limits; null = the server's default (NESTBOX_ORG_MAX_*). */
  limits: OrganizationLimitOverrides;
}

/** The limits an organisation may carry (core/services/organizations.ts); null = the server's default. */
export interface OrganizationLimitOverrides {
  maxSandboxes: number | null;
  maxCpu: number | null;
  maxMemoryMiB: number | null;
  maxDiskGiB: number | null;
  maxSnapshots: number | null;
  maxImages: number | null;
  /**
   * Request rates (core/services/rate-limits.ts): the organisation's bucket and each of its
   * keys' buckets, in requests per second (0: not limited) and burst.
   */
  requestsPerSecond: number | null;
  requestBurst: number | null;
  keyRequestsPerSecond: number | null;
  keyRequestBurst: number | null;
  /**
   * Volumes (core/services/volumes.ts): live volumes, the GiB of their sizes in all, and the
   * largest one may be, in GiB.
   */
  maxVolumes: number | null;
  maxVolumeTotalGiB: number | null;
  maxVolumeSizeGiB: number | null;
}

export interface Sandbox {
  id: string;
  organizationId: string;
  hostId: string | null;
  state: SandboxState;
  image: string;
  cpu: number;
  memoryMiB: number;
  env: Record<string, string>;
  labels: Record<string, string>;
  /** 0 = never stopped by the server on its own. */
  timeoutSeconds: number;
  expiresAt: Date | null;
  operation: string | null;
  operationId: string | null;
  operationOwner: string | null;
  operationStartedAt: Date | null;
  errorMessage: string | null;
  memoryRestored: boolean | null;
  resumeReason: string | null;
  createdAt: Date;
  updatedAt: Date;
  startedAt: Date | null;
  stoppedAt: Date | null;
  deletedAt: Date | null;
  /** Why it was last stopped: user, timeout, idle, auto-delete… (idle stops are woken by use). */
  stopReason: string | null;
  /** Why it is paused: user or idle. */
  pauseReason: string | null;
  pausedAt: Date | null;
  lastActivityAt: Date | null;
  /** 0 = never; otherwise pause (or stop) after this long without activity. */
  idleTimeoutSeconds: number;
  idleAction: 'pause' | 'stop';
  /** null = never; delete this long after a stop. */
  autoDeleteSeconds: number | null;
  sourceSnapshotId: string | null;
  forkedFrom: string | null;
  /** Outbound network policy (allow all unless set). */
  egress: EgressPolicy;
  /** Optional, unique per organisation among live sandboxes (Daytona gets sandboxes by id or name). */
  name: string | null;
  /** Size of the sandbox's own disk; null for sandboxes created before disk quotas. */
  diskGiB: number | null;
  /** `user`, or `build`: an image build's sandbox (kept out of every sandbox list). */
  kind: SandboxKind;
  /** The image (core/services/images.ts) it was created from; null for `default` and older rows. */
  imageId: string | null;
  /** What its host starts it from when that is not `image` (an image's base: `default` or `sha256:…`). */
  hostImage: string | null;
  /** Volumes mounted at every start (issue 19); absent or empty = none. */
  volumeMounts?: SandboxVolumeMount[];
}

/** A volume mounted into a sandbox (core/services/volumes.ts). */
export interface SandboxVolumeMount {
  volumeId: string;
  /** The volume's name when the sandbox was created (names never change). */
  name: string;
  mountPath: string;
  readOnly: boolean;
  subpath?: string;
}

/** A persistent named volume of an organisation; its data lives on one host. */
export interface Volume {
  id: string;
  organizationId: string;
  name: string;
  hostId: string;
  sizeBytes: number;
  state: 'creating' | 'ready' | 'deleting' | 'error';
  errorMessage: string | null;
  createdAt: Date;
  updatedAt: Date;
  lastUsedAt: Date | null;
  deletedAt: Date | null;
}

export type SandboxKind = 'user' | 'build';

/**
 * What a sandbox may reach outside (allow all by default). Isolation always applies on top:
 * never the host, other sandboxes, private, loopback or link-local ranges, whatever it says.
 * Deny wins over allow (core/egress.ts checks a policy).
 */
export interface EgressPolicy {
  mode: 'allow-all' | 'deny-all' | 'allow-list';
  /** allow-list: IPv4 addresses, IPv4 CIDRs and domain names (resolved by the host agent, refreshed periodically). */
  allow?: string[];
  /** allow-all and allow-list: entries never reachable, even where `allow` names them (same kinds as `allow`). */
  deny?: string[];
}

export interface Snapshot {
  id: string;
  organizationId: string;
  name: string;
  hostId: string;
  sourceSandboxId: string | null;
  parentSnapshotId: string | null;
  state: 'creating' | 'ready' | 'deleting' | 'error';
  sizeBytes: number | null;
  errorMessage: string | null;
  createdAt: Date;
  deletedAt: Date | null;
  /** `snapshot`: a user's; `layer`: an image build's layer (never listed, never taken by name). */
  kind: 'snapshot' | 'layer';
}

export const SCOPES = [
  'sandboxes:read',
  'sandboxes:create',
  'sandboxes:operate',
  'sandboxes:delete',
  'sandboxes:exec',
  'files:read',
  'files:write',
  'snapshots:read',
  'snapshots:write',
  'images:read',
  'images:write',
  'keys:manage',
  'webhooks:manage',
  // Organisation secrets (issue 19): create, list, change, delete, and give them to sandboxes.
  'secrets:manage',
  // Persistent named volumes (issue 19): list and read them; create and delete them.
  'volumes:read',
  'volumes:write',
  // The platform's operator, above every organisation: organisations, their limits and usage;
  // hosts, placement, cordon and drain. Only the `operator` preset carries them.
  'platform:organizations',
  'platform:hosts',
] as const;
export type Scope = (typeof SCOPES)[number];

export interface ApiKeyRecord {
  id: string;
  organizationId: string;
  name: string;
  keyPrefix: string;
  preset: string;
  scopes: Scope[];
  /** When set, the key acts only on these sandboxes (and cannot create new ones). */
  sandboxIds: string[] | null;
  createdAt: Date;
  lastUsedAt: Date | null;
  revokedAt: Date | null;
}

/** Who is calling: resolved once per request by the auth service. */
export interface Principal {
  organizationId: string;
  keyId: string;
  scopes: ReadonlySet<Scope>;
  sandboxIds: ReadonlySet<string> | null;
  /**
   * Set when the caller presented a credential minted from the key (an E2B envd token, a Daytona
   * signed URL) rather than the key itself; such a principal can never mint further credentials.
   */
  credentialId?: string;
}

export interface HostRecord {
  id: string;
  url: string;
  driver: string;
  capabilities: Record<string, unknown>;
  registeredAt: Date;
  lastHeartbeatAt: Date;
  /** What it offers (its heartbeat); null from a host agent that does not report it (never placed on). */
  capacity: HostResources | null;
  labels: Record<string, string>;
  version: string | null;
  /** What its live sandboxes hold by its own count (informational; placement counts the database's rows). */
  allocated: (HostResources & { sandboxes: number }) | null;
  /** The operator's say: `ready`, `cordoned` (no new sandboxes), `draining` (cordoned, being emptied). */
  adminState: HostAdminState;
  /** When the control plane declared it lost (missed heartbeats); null while it heartbeats. */
  lostAt: Date | null;
}

export type HostAdminState = 'ready' | 'cordoned' | 'draining';

export interface HostResources {
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
}
