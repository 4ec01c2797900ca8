import type { Logger } from '../core/logger.js';
import type { Config } from './config.js';
import type { Db } from '../core/store/db.js';
import type { AuthService } from '../core/services/auth.js';
import type { HostService } from '../core/services/hosts.js';
import type { SandboxService } from '../core/services/sandboxes.js';
import type { SnapshotService } from '../core/services/snapshots.js';
import type { IdempotencyService } from '../core/services/idempotency.js';
import type { PortService } from '../core/services/ports.js';
import type { SandboxTokenService } from '../core/services/sandbox-tokens.js';
import type { StreamLimits } from './http/stream-limits.js';

/** Everything a front door (native, compat) may call. Built once by the server. */
export interface Services {
  config: Config;
  db: Db;
  auth: AuthService;
  hosts: HostService;
  sandboxes: SandboxService;
  snapshots: SnapshotService;
  idempotency: IdempotencyService;
  /** Hosted ports (publish/list/unpublish and the proxy's lookups). */
  ports: PortService;
  /** Per-sandbox access tokens (E2B's envdAccessToken). */
  sandboxTokens: SandboxTokenService;
  /** Caps on concurrent long-lived streams per key and per sandbox. */
  streams: StreamLimits;
  /** Master secret from which host-agent secrets are derived. */
  hostSecret: string;
  nativeSpecText: string;
  /** The server's logger; per request, `requestLogger(req, logger)` (http/request-id.ts) adds the request id. */
  logger: Logger;
  /**
   * Error lines of the front doors that still take a function (compat, native, port proxy):
   * `logger.error` of the line. Kept until those take the Logger.
   */
  log: (message: string) => void;
}
