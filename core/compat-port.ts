// The port a compatibility layer (compat/daytona, compat/e2b) receives from core: exactly the
// calls a foreign API needs to translate onto Nestbox, and nothing else — no database, no host
// secret, no host clients, no raw guest channel. Each entry is a `Pick<>` of a core service, so
// the type says which methods a front door may call and the compiler refuses any other.
//
// Guest operations (commands, sessions, terminals, files, watches) all come through `toolbox`:
// typed values and typed streams, each method checking its own scope (core/services/toolbox.ts).
// Lifecycle comes through `sandboxes`; credentials through `auth` and `sandboxTokens`.
//
// HTTP-level things a front door also needs (stream caps, upload limit, the logger) are not
// core's: they come from the shared HTTP kit beside this port, not from here.
import type { SshAccessService } from './services/ssh-access.js';
import type { AuthService } from './services/auth.js';
import type { HostService } from './services/hosts.js';
import type { IdempotencyService } from './services/idempotency.js';
import type { PortService } from './services/ports.js';
import type { SandboxService } from './services/sandboxes.js';
import type { SandboxTokenService } from './services/sandbox-tokens.js';
import type { SnapshotService } from './services/snapshots.js';
import type { VolumeService } from './services/volumes.js';
import type { VolumeTokenService } from './services/volume-tokens.js';
import type { Toolbox } from './services/toolbox.js';
import type { ImageService } from './services/images.js';
import type { ImageBuildService } from './services/image-builds.js';
import type { ObjectStore } from './object-store.js';
import type { SandboxStateEvents } from './sandbox-events.js';
import type { CodeInterpreterPort } from './code-interpreter/types.js';
import type { UsageService } from './services/usage.js';
import type { EventService } from './services/events.js';
import type { WebhookService } from './services/webhooks.js';
import type { RequestRateLimiter } from './services/rate-limits.js';
import type { PendingSandboxService } from './services/pending-sandboxes.js';
import type { SecretService } from './services/secrets.js';
import type { SandboxEnvService } from './services/sandbox-env.js';
import type { OrganizationWarmPoolService } from './services/organization-warm-pools.js';

/** Every toolbox method (the class has no other public members). */
export type ToolboxPort = Pick<Toolbox, keyof Toolbox>;

/** Lifecycle and lookups of sandboxes; the guest never through here. */
export type SandboxesPort = Pick<
  SandboxService,
  'create' | 'get' | 'getByIdOrName' | 'getMany' | 'list' | 'update' | 'delete' | 'stop' | 'resume' | 'pause' | 'unpause' | 'keepAlive' | 'expireNow' | 'fork' | 'resize'
>;

export type SnapshotsPort = Pick<SnapshotService, 'create' | 'list' | 'get' | 'delete'>;

/** Persistent named volumes (issue 19) and their files. */
export type VolumesPort = Pick<VolumeService, 'create' | 'list' | 'get' | 'getByName' | 'getByIdOrName' | 'delete' | 'usage' | 'files'>;
/** Credentials for one volume's contents (E2B's volume token). */
export type VolumeTokensPort = Pick<VolumeTokenService, 'mint' | 'authenticate'>;

export type AuthPort = Pick<AuthService, 'authenticate'>;

export type SandboxTokensPort = Pick<
  SandboxTokenService,
  'authenticate' | 'envdCredential' | 'daytonaSigningKey' | 'rotateDaytonaSigningKeys' | 'signatureCandidates' | 'signedUrlMaxSeconds'
>;

export type HostedPortsPort = Pick<PortService, 'publish' | 'list' | 'unpublish' | 'signedUrl' | 'openEveryPort' | 'closeEveryPort' | 'everyPortAccess' | 'everyPortPublic'>;

export type IdempotencyPort = Pick<IdempotencyService, 'run'>;

/** Sandbox state changes as they are committed, to push rather than poll (sandbox-events.ts). */
export type SandboxEventsPort = Pick<SandboxStateEvents, 'subscribe'>;

/** Images: lookups, tags and deletion (the built-in `default` included). */
export type ImagesPort = Pick<ImageService, 'get' | 'find' | 'list' | 'tagsOf' | 'addTags' | 'delete' | 'ofSandbox'>;

/** Image builds: start (a BuildSpec from core/images), status, logs, wait, cancel. */
export type BuildsPort = Pick<ImageBuildService, 'create' | 'get' | 'list' | 'logs' | 'follow' | 'waitFor' | 'cancel'>;

/** Per-sandbox usage samples: the latest and time ranges (services/usage.ts). */
export type UsagePort = Pick<UsageService, 'latest' | 'latestMany' | 'range'>;
/** Durable lifecycle events: the organisation's feed and a sandbox's log (services/events.ts). */
export type EventsPort = Pick<EventService, 'list' | 'sandboxLogs'>;

/** Webhooks and their delivery records (services/webhooks.ts). */
export type WebhooksPort = Pick<WebhookService, 'list' | 'create' | 'get' | 'update' | 'remove' | 'registerScheme' | 'deliveriesOfMessage' | 'replayDelivery'>;

/** Which region each host is in (Daytona's `target` of a sandbox). */
export type HostRegionsPort = Pick<HostService, 'regionsOf'>;
export type SshAccessPort = Pick<SshAccessService, 'createAccess' | 'revokeAccess' | 'validate'>;
/** Request rate limits: every front door counts each authenticated request here before doing anything for it. */
export type RequestRatesPort = Pick<RequestRateLimiter, 'admit'>;
/** Sandboxes promised before their image is built, shared by every replica (services/pending-sandboxes.ts). */
export type PendingSandboxesPort = Pick<PendingSandboxService, 'insert' | 'get' | 'holds' | 'update' | 'prune'>;

/** Organisation secrets (never their values) and what a sandbox is given (services/secrets.ts). */
export type SecretsPort = Pick<SecretService, 'create' | 'get' | 'getByIdOrName' | 'list' | 'update' | 'remove' | 'replaceRefs' | 'refsOf'>;
/** An organisation's warm pools: list, read, create, resize, delete. */
export type OrganizationWarmPoolsPort = Pick<OrganizationWarmPoolService, 'list' | 'get' | 'create' | 'update' | 'delete'>;
/** A sandbox's default environment changed at run time (services/sandbox-env.ts). */
export type SandboxEnvPort = Pick<SandboxEnvService, 'update'>;

export interface CompatPort {
  toolbox: ToolboxPort;
  sandboxes: SandboxesPort;
  snapshots: SnapshotsPort;
  volumes: VolumesPort;
  volumeTokens: VolumeTokensPort;
  auth: AuthPort;
  sandboxTokens: SandboxTokensPort;
  ports: HostedPortsPort;
  idempotency: IdempotencyPort;
  sandboxEvents: SandboxEventsPort;
  images: ImagesPort;
  builds: BuildsPort;
  /** Build contexts and other uploads, per organisation (core/object-store.ts). */
  objects: ObjectStore;
  /** Sandboxes a front door promised while their image is built (Daytona's buildInfo creates). */
  pendingSandboxes: PendingSandboxesPort;
  /** Code contexts (Jupyter kernels) and cells; one-shot code runs (core/services/code-interpreter.ts). */
  codeInterpreter: CodeInterpreterPort;
  usage: UsagePort;
  events: EventsPort;
  webhooks: WebhooksPort;
  requestRates: RequestRatesPort;
  hostRegions: HostRegionsPort;
  /** SSH access tokens (Daytona's createSshAccess / validateSshAccess / revokeSshAccess). */
  sshAccess: SshAccessPort;
  secrets: SecretsPort;
  sandboxEnv: SandboxEnvPort;
  /** An organisation's own warm pools (Daytona's warmPool; services/organization-warm-pools.ts). */
  organizationWarmPools: OrganizationWarmPoolsPort;
}
