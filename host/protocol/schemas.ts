// The host-agent ⇄ control-plane protocol. Both sides validate with these schemas, so a
// version skew shows up as a clear 400 instead of a half-understood request.
import { z } from 'zod';

export const SandboxIdParam = z.string().regex(/^[a-z0-9]{1,32}$/, 'must be 1-32 lowercase letters or digits');

export const HostSandboxSpec = z
  .object({
    id: SandboxIdParam,
    image: z.string().min(1),
    cpu: z.number().int().min(1),
    memoryMiB: z.number().int().min(64),
    env: z.record(z.string(), z.string()),
  })
  .strict();
export type HostSandboxSpec = z.infer<typeof HostSandboxSpec>;

export const HostSandboxRuntime = z.object({
  id: z.string(),
  status: z.enum(['running', 'stopped']),
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
