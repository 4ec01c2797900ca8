import type { PendingSandboxService } from '../core/services/pending-sandboxes.js';
import type { Logger } from '../core/logger.js';
import type { Config } from './config.js';
import type { CompatPort } from '../core/compat-port.js';
import type { Db } from '../core/store/db.js';
import type { AuthService } from '../core/services/auth.js';
import type { HostService } from '../core/services/hosts.js';
import type { SandboxService } from '../core/services/sandboxes.js';
import type { WarmPoolService } from '../core/services/warm-pool.js';
import type { SnapshotService } from '../core/services/snapshots.js';
import type { Toolbox } from '../core/services/toolbox.js';
import type { IdempotencyService } from '../core/services/idempotency.js';
import type { PortService } from '../core/services/ports.js';
import type { SandboxTokenService } from '../core/services/sandbox-tokens.js';
import type { SandboxStateEvents } from '../core/sandbox-events.js';
import type { StreamLimits } from './http/stream-limits.js';
import type { ImageService } from '../core/services/images.js';
import type { ImageBuildService } from '../core/services/image-builds.js';
import type { ObjectStore } from '../core/object-store.js';
import type { CodeInterpreterService } from '../core/services/code-interpreter.js';
import type { ControlPlaneMetrics } from '../core/metrics.js';
import type { UsageService } from '../core/services/usage.js';
import type { UsageRecordService } from '../core/services/usage-records.js';
import type { OrganizationService } from '../core/services/organizations.js';
import type { EventService } from '../core/services/events.js';
import type { WebhookService } from '../core/services/webhooks.js';
import type { SecretService } from '../core/services/secrets.js';
import type { SandboxEnvService } from '../core/services/sandbox-env.js';
import type { RequestRateLimiter } from '../core/services/rate-limits.js';
import type { HostTransferService } from '../core/services/host-transfer.js';
import type { SshAccessService } from '../core/services/ssh-access.js';
import type { VolumeService } from '../core/services/volumes.js';
import type { VolumeTokenService } from '../core/services/volume-tokens.js';

/**
 * Everything the native front door may call, built once by the server. It extends CompatPort
 * (core/compat-port.ts), the narrower view compat layers are meant to receive.
 */
export interface Services extends CompatPort {
  config: Config;
  db: Db;
  auth: AuthService;
  /** Organisations (the operator's admin API), their limits, suspension and own view. */
  organizations: OrganizationService;
  /** Hourly usage per organisation (usage_records) and its rollup pass. */
  usageRecords: UsageRecordService;
  hosts: HostService;
  /** Snapshot copies and sandbox moves between hosts (operators). */
  transfers: HostTransferService;
  sandboxes: SandboxService;
  /** Ready sandboxes per (image, size) creates are answered from (operators see its levels). */
  warmPool: WarmPoolService;
  /** Every operation inside a sandbox (commands, sessions, files, watches), typed. */
  toolbox: Toolbox;
  snapshots: SnapshotService;
  /** Persistent named volumes (issue 19). */
  volumes: VolumeService;
  volumeTokens: VolumeTokenService;
  /** Images (named, tagged) and their builds. */
  images: ImageService;
  builds: ImageBuildService;
  /** Build contexts and other uploads, per organisation. */
  objects: ObjectStore;
  /** Sandboxes promised before their image is built (Daytona's buildInfo creates), in the database for every replica. */
  pendingSandboxes: PendingSandboxService;
  /** Code contexts and cells over the guest agent's Jupyter kernels. */
  codeInterpreter: CodeInterpreterService;
  idempotency: IdempotencyService;
  /** Hosted ports (publish/list/unpublish and the proxy's lookups). */
  ports: PortService;
  /** Per-sandbox access tokens (E2B's envdAccessToken). */
  sandboxTokens: SandboxTokenService;
  /** Sandbox state changes as the lifecycle engine commits them (core/sandbox-events.ts). */
  sandboxEvents: SandboxStateEvents;
  /** This process's Prometheus registry and series (core/metrics.ts), served at `/metrics`. */
  metrics: ControlPlaneMetrics;
  /** Per-sandbox usage samples (core/services/usage.ts). */
  usage: UsageService;
  /** Durable lifecycle events (listing, sandbox logs) and webhooks with their deliveries. */
  events: EventService;
  webhooks: WebhookService;
  /** Organisation secrets (encrypted at rest) and the sandboxes given them; runtime env changes. */
  secrets: SecretService;
  sandboxEnv: SandboxEnvService;
  /** Request rate limits per API key and per organisation (token buckets shared through the database). */
  requestRates: RequestRateLimiter;
  /** SSH access tokens and organisations' SSH public keys (the SSH gateway's logins). */
  sshAccess: SshAccessService;
  /** Caps on concurrent long-lived streams per key and per sandbox. */
  streams: StreamLimits;
  /** Master secret from which host-agent secrets are derived. */
  hostSecret: string;
  nativeSpecText: string;
  /** The server's logger; per request, `requestLogger(req, logger)` (http/request-id.ts) adds the request id. */
  logger: Logger;
}

