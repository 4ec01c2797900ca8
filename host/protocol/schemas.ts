// The host-agent ⇄ control-plane protocol. Both sides validate with these schemas, so a
// version skew shows up as a clear 400 instead of a half-understood request.
import { z } from 'zod';

export const SandboxIdParam = z.string().regex(/^[a-z0-9]{1,32}$/, 'must be 1-32 lowercase letters or digits');

/** Snapshot ids become directory names and overlay mount options: no ':' or ','. */
export const SnapshotIdParam = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit");

/** An IPv4 address or CIDR, or a DNS name (resolved to IPv4 addresses by the host agent). */
export const EGRESS_ENTRY = /^(?:\d{1,3}(?:\.\d{1,3}){3}(?:\/\d{1,2})?|(?=.{1,253}$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)$/;
export const MAX_EGRESS_ENTRIES = 256;

export const EgressPolicy = z
  .object({
    mode: z.enum(['allow-all', 'deny-all', 'allow-list']),
    allow: z.array(z.string().regex(EGRESS_ENTRY, 'must be an IPv4 address, an IPv4 CIDR or a domain name')).max(MAX_EGRESS_ENTRIES).optional(),
    /** Never reachable, even where `allow` names them (deny wins). */
    deny: z.array(z.string().regex(EGRESS_ENTRY, 'must be an IPv4 address, an IPv4 CIDR or a domain name')).max(MAX_EGRESS_ENTRIES).optional(),
  })
  .strict();
export type EgressPolicy = z.infer<typeof EgressPolicy>;

export const HostEgressResult = z.object({
  egress: EgressPolicy,
  /** Addresses the allow list resolved to and that are in force now. */
  addresses: z.array(z.string()),
  /** Addresses the deny list resolved to and that are in force now. */
  denied: z.array(z.string()).optional(),
  /** Domains that resolved to nothing (retried at every refresh). */
  unresolved: z.array(z.string()),
  applied: z.boolean(),
});

// ---- volumes (issue 19) -------------------------------------------------------------------------
export const VolumeIdParam = z.string().regex(/^[a-z0-9][a-z0-9-]{0,63}$/, 'must be 1-64 lowercase letters, digits or -');
export const HostVolumeMount = z
  .object({
    volumeId: VolumeIdParam,
    mountPath: z.string().min(2).max(1024),
    readOnly: z.boolean(),
    subpath: z.string().min(1).max(1024).optional(),
  })
  .strict();
/** `PUT /v1/volumes/{id}`: creates the volume's file system (idempotent). */
export const HostVolumeCreate = z.object({ sizeBytes: z.number().int().min(64 * 2 ** 20).max(2 ** 50) }).strict();
export const HostVolumeInfo = z.object({ id: z.string(), sizeBytes: z.number().int().nonnegative(), usedBytes: z.number().int().nonnegative() });
export type HostVolumeInfo = z.infer<typeof HostVolumeInfo>;

/** POST /v1/sandboxes/:id/resize: new sizes (absent = unchanged). */
export const HostResizeSpec = z
  .object({
    cpu: z.number().positive().max(1024).optional(),
    memoryMiB: z.number().int().min(64).optional(),
    diskGiB: z.number().int().min(1).max(16_384).optional(),
  })
  .strict();
export type HostResizeSpec = z.infer<typeof HostResizeSpec>;

export const HostResizeResult = z.object({ cpu: z.number(), memoryMiB: z.number(), diskGiB: z.number().nullable(), live: z.boolean() });
export type HostResizeResult = z.infer<typeof HostResizeResult>;

export const HostSandboxSpec = z
  .object({
    id: SandboxIdParam,
    image: z.string().min(1),
    cpu: z.number().int().min(1),
    memoryMiB: z.number().int().min(64),
    env: z.record(z.string(), z.string()),
    snapshot: SnapshotIdParam.optional(),
    egress: EgressPolicy.optional(),
    diskGiB: z.number().int().min(1).max(16_384).optional(),
    diskInodes: z.number().int().min(1024).max(2 ** 32 - 1).optional(),
    volumes: z.array(HostVolumeMount).max(16).optional(),
    // A warm-pool member, started for no one until POST /v1/sandboxes/{id}/claim (issue 20).
    warm: z.boolean().optional(),
  })
  .strict();
export type HostSandboxSpec = z.infer<typeof HostSandboxSpec>;

export const HostSandboxRuntime = z.object({
  id: z.string(),
  status: z.enum(['running', 'paused', 'stopped']),
  /** An unclaimed warm-pool member (issue 20). */
  warm: z.boolean().optional(),
});

/** Whether the stop kept the sandbox's memory (a snapshot to resume from). */
export const HostStopResult = z.object({ memorySaved: z.boolean() });

export const HostForkRequest = z
  .object({
    children: z.array(HostSandboxSpec).min(1).max(64),
  })
  .strict();

export const HostForkResult = z.object({
  children: z.array(HostSandboxRuntime),
  memoryCopied: z.boolean(),
  diskCopy: z.enum(['reflink', 'copy']),
});

export const HostSnapshotRequest = z.object({ snapshotId: SnapshotIdParam }).strict();

export const HostSnapshotResult = z.object({
  snapshotId: z.string(),
  sizeBytes: z.number().int().min(0),
  diskCopy: z.enum(['reflink', 'copy']),
  layers: z.array(z.string()),
});

export const HostSnapshotInfo = HostSnapshotResult.extend({
  sourceId: z.string(),
  image: z.string(),
  createdAt: z.string(),
});

export const HostStartResult = HostSandboxRuntime.extend({
  memoryRestored: z.boolean(),
  resumeReason: z.string().optional(),
});

// ---- images (the host's OCI store) --------------------------------------------------------------

/** An image in a host's store is named by its linux/amd64 manifest digest. */
export const ImageIdParam = z.string().regex(/^sha256:[a-f0-9]{64}$/, 'must be sha256: followed by 64 lowercase hex digits');

/** `POST /v1/images/pull`. The credentials are for this pull only (never stored or logged). */
export const HostPullRequest = z
  .object({
    reference: z.string().min(1).max(1024),
    credentials: z
      .object({
        username: z.string().min(1).max(1024),
        password: z.string().max(16_384),
      })
      .strict()
      .optional(),
  })
  .strict();
export type HostPullRequest = z.infer<typeof HostPullRequest>;

export const HostImageConfig = z.object({
  env: z.array(z.string()),
  cmd: z.array(z.string()).nullable(),
  entrypoint: z.array(z.string()).nullable(),
  workingDir: z.string(),
  user: z.string(),
  exposedPorts: z.array(z.string()),
  labels: z.record(z.string(), z.string()),
});

export const HostImage = z.object({
  id: ImageIdParam,
  reference: z.string(),
  sizeBytes: z.number().int().nonnegative(),
  compressedBytes: z.number().int().nonnegative(),
  layers: z.array(z.object({ digest: z.string(), size: z.number().int().nonnegative(), mediaType: z.string() })),
  created: z.string().optional(),
  pulledAt: z.string(),
  config: HostImageConfig,
});

export const HostImageList = z.object({ images: z.array(HostImage) });

/**
 * One line of a pull's answer (`Content-Type: application/x-ndjson`, one JSON object per
 * `\n`-terminated line, chunked). Failures found before anything was sent (a bad reference,
 * no such tag, refused credentials) are plain error answers with their own status instead;
 * once the 200 went out, the last line is `image` or `error`. `keepalive` lines come while
 * nothing else does, so proxies and idle timeouts never cut a long layer copy.
 */
export const HostPullLine = z.union([
  z.object({ progress: z.string() }).strict(),
  z.object({ keepalive: z.literal(true) }).strict(),
  z.object({ image: HostImage }).strict(),
  z.object({ error: z.object({ code: z.string(), message: z.string() }) }).strict(),
]);
export type HostPullLine = z.infer<typeof HostPullLine>;
export const PULL_CONTENT_TYPE = 'application/x-ndjson';

const byteCount = z.number().int().nonnegative().optional();
/**
 * One usage sample of one sandbox, taken by the host agent's sampler (host/agent/usage-sampler.ts).
 * A field the driver cannot know is absent. `cpuUsedPct` is the share of the sandbox's own CPU
 * limit used since the previous sample (0 while paused; absent on the first sample).
 */
export const UsageSample = z
  .object({
    sandboxId: z.string().regex(/^[a-z0-9]{1,32}$/),
    at: z.string().datetime(),
    cpuUsedPct: z.number().min(0).max(100).optional(),
    cpuCount: z.number().positive(),
    memUsed: byteCount,
    memCache: byteCount,
    memTotal: byteCount,
    diskUsed: byteCount,
    diskTotal: byteCount,
    netRx: byteCount,
    netTx: byteCount,
  })
  .strict();
export type UsageSample = z.infer<typeof UsageSample>;
/** Samples one heartbeat carries at most (the host agent keeps older ones for the next beat). */
export const MAX_HEARTBEAT_USAGE_SAMPLES = 2_000;

export const HostCapacity = z
  .object({ cpu: z.number().int().positive(), memoryMiB: z.number().int().positive(), diskGiB: z.number().int().nonnegative() })
  .strict();
export type HostCapacity = z.infer<typeof HostCapacity>;
/** The same rules as NESTBOX_HOST_LABELS (src/config.ts). */
export const HostLabels = z
  .record(z.string().regex(/^[a-z0-9][a-z0-9._/-]{0,62}$/), z.string().regex(/^[A-Za-z0-9._-]{0,63}$/))
  .refine((labels) => Object.keys(labels).length <= 64, 'at most 64 labels');
/** Sums over the sandboxes the driver runs or keeps paused (vCPU and memory limits, disk sizes), and how many it knows. */
export const HostAllocation = z
  .object({ cpu: z.number().nonnegative(), memoryMiB: z.number().nonnegative(), diskGiB: z.number().nonnegative(), sandboxes: z.number().int().nonnegative() })
  .strict();
export type HostAllocation = z.infer<typeof HostAllocation>;

export const Heartbeat = z
  .object({
    hostId: z.string().min(1),
    url: z.string().url(),
    driver: z.string().min(1),
    capabilities: z.record(z.string(), z.unknown()),
    sandboxes: z.array(HostSandboxRuntime),
    /** Usage samples taken since the last heartbeat that was answered. */
    usage: z.array(UsageSample).max(MAX_HEARTBEAT_USAGE_SAMPLES).optional(),
    /**
     * What the host offers (measured, or the operator's NESTBOX_HOST_CAPACITY_*), its labels
     * (NESTBOX_HOST_LABELS), its release, and what its live sandboxes hold now. Optional so an
     * older host agent still registers (it is then placed on as if it had no room).
     */
    capacity: HostCapacity.optional(),
    labels: HostLabels.optional(),
    version: z.string().min(1).max(64).optional(),
    allocated: HostAllocation.optional(),
  })
  .strict();
export type Heartbeat = z.infer<typeof Heartbeat>;

export const HOST_AGENT_API_PREFIX = '/v1';
/**
 * Hosted-port traffic carries the user's own Authorization header to the sandbox, so the host
 * secret travels in this header on `/v1/sandboxes/{id}/ports/{port}/…` instead.
 */
export const PORT_PROXY_AUTH_HEADER = 'x-nestbox-host-authorization';
/** Set by the host agent on answers it made itself (not the sandbox's server): `not_listening`, `not_running`, `not_found`. */
export const PORT_PROXY_ERROR_HEADER = 'x-nestbox-port-error';
/** Control-plane route a host agent heartbeats to (authenticated with its derived secret). */
export const HEARTBEAT_PATH = '/internal/v1/hosts/heartbeat';

/**
 * Host-to-host transfers: the control plane asks the RECEIVING host agent to pull from the
 * source agent at `sourceUrl` (its registered URL) with a short-lived token (core/transfer-token.ts).
 */
export const HostSnapshotImportRequest = z.object({ sourceUrl: z.string().url(), token: z.string().min(1).max(4096) }).strict();
export type HostSnapshotImportRequest = z.infer<typeof HostSnapshotImportRequest>;
export const HostSandboxImportRequest = z.object({ sourceUrl: z.string().url(), token: z.string().min(1).max(4096), spec: HostSandboxSpec }).strict();
export type HostSandboxImportRequest = z.infer<typeof HostSandboxImportRequest>;
/** What a sandbox export's `x-nestbox-disk-info` header carries (drivers/types.ts SandboxDiskInfo). */
export const SandboxDiskInfoHeader = z.object({ layers: z.array(SnapshotIdParam), disk: z.object({ sizeBytes: z.number().int().min(1), inodes: z.number().int().min(1) }).nullable() }).strict();
export const HostSnapshotImportResult = z.object({ snapshotIds: z.array(z.string()) });
export const DISK_INFO_HEADER = 'x-nestbox-disk-info';
export const SNAPSHOT_PARENTS_HEADER = 'x-nestbox-snapshot-parents';
