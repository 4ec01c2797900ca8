// What the E2B layer is given to work with: core's CompatPort (core/compat-port.ts) and a small,
// explicit set of server settings built where the E2B routers are mounted (src/http/app.ts).
// Nothing here reaches into src/: the layer translates E2B's wire formats onto these calls only.
import type { CompatPort } from '../../core/compat-port.js';
import type { Logger } from '../../core/logger.js';

/** Who a long-lived stream is counted against (the stream caps of the server). */
export interface StreamOwner {
  keyId?: string;
  sandboxId: string;
}

/**
 * The server's caps on concurrent long-lived streams (src/http/stream-limits.ts provides them):
 * a Connect server stream or an NDJSON answer holds a slot for as long as it is open, and is
 * refused with rate_limited beyond a cap.
 */
export interface StreamCounter {
  acquireUntilAborted(owner: StreamOwner, signal: AbortSignal): unknown;
  acquireUntilClosed(owner: StreamOwner, emitter: { once(event: 'close', listener: () => void): unknown }): unknown;
}

export interface E2bOptions {
  /** `<port>-<id>.<domain>` host routing and the `domain` of create responses. */
  publicDomain?: string;
  /** Largest upload body accepted on envd's POST /files (NESTBOX_MAX_UPLOAD_BYTES). */
  maxUploadBytes: number;
  /** Longest sandbox timeout a create/connect/setTimeout may ask for. */
  maxTimeoutSeconds: number;
  streams: StreamCounter;
  log: Logger;
}

/** The E2B layer's dependencies: core's port plus the settings above. */
export interface E2bDeps extends E2bOptions {
  /** Daytona's pending (build-on-demand) sandboxes are not E2B's. */
  core: Omit<CompatPort, 'pendingSandboxes' | 'hostRegions' | 'sshAccess' | 'sandboxEnv' | 'organizationWarmPools'>;
}
