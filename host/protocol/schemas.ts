// The host-agent ⇄ control-plane protocol. Both sides validate with these schemas, so a
// version skew shows up as a clear 400 instead of a half-understood request.
import { z } from 'zod';

export const SandboxIdParam = z.string().regex(/^[a-z0-9]{1,32}$/, 'must be 1-32 lowercase letters or digits');

/** Snapshot ids become directory names and overlay mount options: no ':' or ','. */
export const SnapshotIdParam = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit");

export const HostSandboxSpec = z
  .object({
    id: SandboxIdParam,
    image: z.string().min(1),
    cpu: z.number().int().min(1),
    memoryMiB: z.number().int().min(64),
    env: z.record(z.string(), z.string()),
    snapshot: SnapshotIdParam.optional(),
  })
  .strict();
export type HostSandboxSpec = z.infer<typeof HostSandboxSpec>;

export const HostSandboxRuntime = z.object({
  id: z.string(),
  status: z.enum(['running', 'paused', 'stopped']),
});

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

export const Heartbeat = z
  .object({
    hostId: z.string().min(1),
    url: z.string().url(),
    driver: z.string().min(1),
    capabilities: z.record(z.string(), z.unknown()),
    sandboxes: z.array(HostSandboxRuntime),
  })
  .strict();
export type Heartbeat = z.infer<typeof Heartbeat>;

export const HOST_AGENT_API_PREFIX = '/v1';
/** Control-plane route a host agent heartbeats to (authenticated with its derived secret). */
export const HEARTBEAT_PATH = '/internal/v1/hosts/heartbeat';
