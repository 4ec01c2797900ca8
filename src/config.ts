// The one place that reads process.env. Everything else receives a parsed Config.
import { homedir } from 'node:os';
import { resolve } from 'node:path';
import { z } from 'zod';
import type { PlacementPolicy } from '../core/services/hosts.js';

const port = z.coerce.number().int().min(0).max(65535);
const positiveInt = z.coerce.number().int().positive();
const nonNegativeInt = z.coerce.number().int().min(0);

const REGISTRY_HOST = String.raw`[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::\d{1,5})?`;
const REGISTRY_LIST = new RegExp(`^${REGISTRY_HOST}(?:,${REGISTRY_HOST})*$`);
const MIRROR_PAIR = `${REGISTRY_HOST}=${REGISTRY_HOST}(?:/[A-Za-z0-9._/-]+)?`;
const REGISTRY_MIRRORS = new RegExp(`^${MIRROR_PAIR}(?:,${MIRROR_PAIR})*$`);

const LABEL_PAIR = '[a-z0-9][a-z0-9._/-]{0,62}=[A-Za-z0-9._-]{0,63}';
const HOST_LABELS = new RegExp(`^${LABEL_PAIR}(?:,${LABEL_PAIR})*$`);

const ConfigSchema = z.object({
  NESTBOX_PORT: port.default(7070),
  NESTBOX_HOST: z.string().min(1).default('127.0.0.1'),
  NESTBOX_DATA_DIR: z.string().min(1).default('./.nestbox'),
  NESTBOX_DATABASE_URL: z
    .string()
    .refine((v) => /^postgres(ql)?:\/\//.test(v), 'must be a postgres:// or postgresql:// URL')
    .optional(),
  NESTBOX_BOOTSTRAP_API_KEY: z
    .string()
    .regex(/^nbx_[A-Za-z0-9]{40}$/, 'must be "nbx_" followed by 40 letters or digits')
    .optional(),
  // Master secret from which every host agent's secret is derived. Unset: generated once and
  // kept in the data dir (fine for one machine; set it explicitly when host agents are remote).
  NESTBOX_HOST_SECRET: z.string().min(32, 'must be at least 32 characters').optional(),
  // Where images are cached; several data dirs (tests) can share one.
  NESTBOX_IMAGES_DIR: z.string().min(1).optional(),
  // Host agent: where OCI images pulled from registries live, unpacked (host/images/oci).
  NESTBOX_OCI_STORE_DIR: z.string().min(1).optional(),
  // Registry mirrors, tried in order before the registry itself: comma-separated
  // `registry=mirror` pairs (`docker.io=mirror.example.com/hub,docker.io=10.0.0.5:5000`).
  NESTBOX_REGISTRY_MIRRORS: z
    .string()
    .regex(REGISTRY_MIRRORS, 'must be comma-separated registry=mirror pairs (host[:port]=host[:port][/path])')
    .optional(),
  // Registries (host[:port], comma-separated) that may be reached over plain HTTP or with
  // unverified TLS. Loopback registries always may, as Docker allows.
  NESTBOX_INSECURE_REGISTRIES: z.string().regex(REGISTRY_LIST, 'must be comma-separated host[:port] names').optional(),
  // Bound on one image pull (copy and unpack).
  NESTBOX_IMAGE_PULL_TIMEOUT_SECONDS: positiveInt.default(1800),
  // Image builds (core/services/image-builds.ts): how many run at once per control plane, their
  // default and longest timeout, the build sandbox's default size, how many log lines a build
  // keeps, how long a start command may take to get ready, and how long an unused cached step
  // is kept.
  NESTBOX_MAX_CONCURRENT_BUILDS: positiveInt.default(2),
  NESTBOX_BUILD_TIMEOUT_SECONDS: positiveInt.default(3600),
  NESTBOX_BUILD_MAX_TIMEOUT_SECONDS: positiveInt.default(4 * 3600),
  NESTBOX_BUILD_CPU: positiveInt.default(2),
  NESTBOX_BUILD_MEMORY_MIB: positiveInt.default(2048),
  NESTBOX_BUILD_DISK_GIB: positiveInt.default(10),
  NESTBOX_BUILD_MAX_LOG_LINES: positiveInt.default(50_000),
  NESTBOX_IMAGE_READY_TIMEOUT_SECONDS: positiveInt.default(120),
  NESTBOX_BUILD_CACHE_TTL_HOURS: positiveInt.default(168),
  NESTBOX_BUILD_MAX_CONTEXT_BYTES: positiveInt.default(4 * 1024 ** 3),
  // The CLI's client commands (`nestbox build`): which server, with which key (default: this
  // machine's server and the bootstrap key in its data dir).
  NESTBOX_URL: z.string().url().optional(),
  NESTBOX_API_KEY: z.string().min(1).optional(),
  // The CLI's profiles (written by `nestbox login`): the file, and which profile to use.
  NESTBOX_PROFILE_FILE: z.string().min(1).optional(),
  NESTBOX_PROFILE: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/, 'letters, digits, dot, dash and underscore (at most 64)').default('default'),
  // false = the server does not start a local host agent (host agents run elsewhere).
  NESTBOX_LOCAL_HOST_AGENT: z.enum(['true', 'false']).default('true'),
  // true = `nestbox server` runs the control plane in a worker process and restarts it with
  // backoff if it dies; false = one process (when systemd or another supervisor restarts it).
  NESTBOX_SERVER_SUPERVISOR: z.enum(['true', 'false']).default('true'),

  // Host agent (nestbox host-agent).
  NESTBOX_HOST_ID: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'must be lowercase letters, digits and dashes').default('local'),
  NESTBOX_HOST_AGENT_HOST: z.string().min(1).default('127.0.0.1'),
  NESTBOX_HOST_AGENT_PORT: port.default(0),
  // URL the control plane uses to reach this host agent; default http://<host>:<bound port>.
  NESTBOX_HOST_AGENT_URL: z.string().url().optional(),
  NESTBOX_CONTROL_PLANE_URL: z.string().url().optional(),
  // The host agent's own secret (derived from NESTBOX_HOST_SECRET for its host id).
  NESTBOX_HOST_AGENT_SECRET: z.string().min(16).optional(),
  NESTBOX_HEARTBEAT_INTERVAL_MS: positiveInt.default(2000),
  // Exit when the parent process goes away (set for the server's own child host agent).
  NESTBOX_EXIT_WITH_PARENT: z.enum(['true', 'false']).default('false'),
  NESTBOX_SANDBOX_SUBNET: z.string().regex(/^10\.\d{1,3}\.0\.0\/16$/, 'must be a 10.x.0.0/16 network').default('10.200.0.0/16'),
  // Host agent: network slots kept built for the next creates (0 = build each on demand).
  NESTBOX_SLOT_POOL_SIZE: nonNegativeInt.max(1024).default(8),
  // Host agent: how often domains in egress allow lists are resolved again.
  NESTBOX_EGRESS_REFRESH_SECONDS: positiveInt.default(300),
  // Local driver: host ids of sandbox user namespaces. Root of the n-th running sandbox is host
  // uid/gid BASE + n × 65536; at most MAX at once. Must not overlap the host's own users or
  // /etc/subuid ranges, and must be the same for every host agent on the machine.
  NESTBOX_USERNS_BASE: positiveInt.min(65_536).max(4_000_000_000).default(16_777_216),
  NESTBOX_USERNS_MAX: positiveInt.max(60_000).default(4096),
  // Hosted ports: `<port>-<sandboxId>.<domain>` URLs (wildcard DNS and TLS in front of the
  // server); unset = path URLs only (`/p/<sandboxId>/<port>/`). May carry a port (`example.com:8443`).
  NESTBOX_PUBLIC_DOMAIN: z
    .string()
    .regex(/^(?=.{1,200}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:\d{1,5})?$/, 'must be a lowercase domain name, optionally with :port')
    .optional(),
  // The region this server's hosts are in: what Daytona's `target` must name (unset or this one;
  // any other is refused until several hosts carry region labels).
  NESTBOX_REGION: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'must be lowercase letters, digits and dashes').default('local'),
  // The snapshot a Daytona create without one starts from (Daytona's default snapshot has the
  // Python data stack; `code-interpreter` is Nestbox's image with it). Unset: the `default` image.
  NESTBOX_DAYTONA_DEFAULT_SNAPSHOT: z.string().min(1).max(256).regex(/^[^\s]+$/, 'must be a snapshot name without spaces').optional(),
  // Scheme of the host-form URLs (TLS usually ends in front of the server).
  NESTBOX_PUBLIC_SCHEME: z.enum(['http', 'https']).default('https'),
  // Base of the path-form URLs the API hands out; default: the URL the server listens on.
  NESTBOX_PUBLIC_URL: z.string().url().optional(),

  // Limits and defaults for sandboxes.
  NESTBOX_DEFAULT_TIMEOUT_SECONDS: nonNegativeInt.default(900),
  NESTBOX_MAX_TIMEOUT_SECONDS: positiveInt.default(86_400),
  NESTBOX_DEFAULT_CPU: positiveInt.default(1),
  NESTBOX_MAX_CPU: positiveInt.default(4),
  NESTBOX_DEFAULT_MEMORY_MIB: positiveInt.default(1024),
  NESTBOX_MAX_MEMORY_MIB: positiveInt.default(8192),
  NESTBOX_MAX_UPLOAD_BYTES: positiveInt.default(10 * 1024 ** 3),
  NESTBOX_MAX_FORK_COUNT: positiveInt.default(10),
  // Disk of each sandbox (its writable layer, a file system of this size of its own: a full disk
  // is ENOSPC inside the sandbox, never the host's). A fork gets its source's size.
  NESTBOX_DEFAULT_DISK_GIB: positiveInt.max(16_384).default(10),
  NESTBOX_MAX_DISK_GIB: positiveInt.max(16_384).default(100),
  // Inodes (files, directories, links) per GiB of sandbox disk: ext4's own default ratio.
  NESTBOX_DISK_INODES_PER_GIB: positiveInt.min(1024).max(4_194_304).default(65_536),
  // Per organisation: sandboxes that are not stopped or deleted, and the vCPUs and memory they
  // hold. Over a limit, create, fork and resume answer 429 with Retry-After.
  NESTBOX_ORG_MAX_SANDBOXES: positiveInt.default(50),
  NESTBOX_ORG_MAX_CPU: positiveInt.default(64),
  NESTBOX_ORG_MAX_MEMORY_MIB: positiveInt.default(131_072),
  // Per organisation, the defaults of the other limits an operator may set per organisation
  // (`nestbox orgs limits`): GiB of sandbox disks (every sandbox not deleted, a stopped one keeps
  // its disk), named snapshots, and images. Over one, create answers 429 quota_exceeded.
  NESTBOX_ORG_MAX_DISK_GIB: positiveInt.default(2048),
  NESTBOX_ORG_MAX_SNAPSHOTS: positiveInt.default(500),
  NESTBOX_ORG_MAX_IMAGES: positiveInt.default(200),
  // Per organisation: bytes kept in the object store (uploaded build contexts, unfinished
  // multipart uploads included); past it an upload is refused with quota_exceeded.
  NESTBOX_ORG_MAX_OBJECT_BYTES: positiveInt.default(20 * 1024 ** 3),
  // Object storage (build contexts, Daytona's S3 endpoint); default <data dir>/objects. Replicas
  // of one deployment must all point at the same directory on a shared file system (rename
  // within it atomic, e.g. NFSv4): an object stored through one is read through another.
  NESTBOX_OBJECT_STORE_DIR: z.string().min(1).optional(),
  // Retry-After of a 429 for an organisation limit (a sandbox has to stop before a retry can pass).
  NESTBOX_QUOTA_RETRY_AFTER_SECONDS: positiveInt.max(3600).default(30),
  // Volumes (issue 19): the size of a volume created without one (Daytona and E2B never give
  // one; images are sparse, so a host only gives what is written), the largest size, and per
  // organisation how many live volumes and how many GiB of volume sizes in all.
  NESTBOX_VOLUME_DEFAULT_MIB: positiveInt.min(64).default(10_240),
  NESTBOX_VOLUME_MAX_MIB: positiveInt.min(64).default(1_048_576),
  NESTBOX_ORG_MAX_VOLUMES: positiveInt.default(100),
  NESTBOX_ORG_MAX_VOLUME_GIB: positiveInt.default(4096),
  // Concurrent long-lived streams (WebSockets, SSE, Connect server streams, hosted-port
  // upgrades): per API key and per sandbox; beyond them a stream is refused with 429.
  NESTBOX_MAX_STREAMS_PER_KEY: positiveInt.default(256),
  NESTBOX_MAX_STREAMS_PER_SANDBOX: positiveInt.default(64),
  // Request rate limits (core/services/rate-limits.ts): a token bucket per API key and one per
  // organisation, shared by every replica through the database, checked right after a request is
  // authenticated (native, Daytona and E2B, control plane and toolbox/envd alike); an empty bucket
  // answers 429 with Retry-After. PER_SECOND refills (fractions allowed; 0 = that limit is off),
  // BURST is what a full bucket holds. The defaults only stop a runaway client. LEASE: the most
  // tokens a replica takes from a shared bucket at once (never more than a tenth of the burst),
  // which bounds how far replicas together can pass a limit: by at most replicas × LEASE.
  NESTBOX_RATE_LIMIT_KEY_PER_SECOND: z.coerce.number().min(0).max(1_000_000).default(1000),
  NESTBOX_RATE_LIMIT_KEY_BURST: positiveInt.max(10_000_000).default(2000),
  NESTBOX_RATE_LIMIT_ORG_PER_SECOND: z.coerce.number().min(0).max(1_000_000).default(5000),
  NESTBOX_RATE_LIMIT_ORG_BURST: positiveInt.max(10_000_000).default(10_000),
  NESTBOX_RATE_LIMIT_LEASE: positiveInt.max(1000).default(10),
  // Slow clients. Request headers must arrive within HEADERS_TIMEOUT, the whole request (body
  // included) within REQUEST_TIMEOUT (0 = no limit; big uploads over slow links need time), and a
  // body may not stall for longer than BODY_IDLE_TIMEOUT. An upgrade (WebSocket) request must be
  // answered within UPGRADE_TIMEOUT (covers waking a paused sandbox), or its socket is closed.
  NESTBOX_HEADERS_TIMEOUT_MS: positiveInt.default(60_000),
  NESTBOX_REQUEST_TIMEOUT_MS: nonNegativeInt.default(3_600_000),
  NESTBOX_BODY_IDLE_TIMEOUT_MS: positiveInt.default(30_000),
  NESTBOX_UPGRADE_TIMEOUT_MS: positiveInt.default(90_000),
  // Host agent: where sandbox disks live. "auto" = use the data dir when it supports reflink,
  // otherwise create a loop-mounted sparse XFS file of NESTBOX_REFLINK_STORE_GIB there, so forks
  // and snapshots share blocks instead of copying them; "off" = plain copies (a fork writes a
  // full copy of its source's disk; a warning says so at start).
  NESTBOX_REFLINK_STORE: z.enum(['auto', 'off']).default('auto'),
  // Host agent (local driver): the built-in `code-interpreter` image (host/images/code-interpreter-image.ts).
  // background = built after the default image when the agent starts, while it already serves;
  // on-demand = built by the first sandbox that asks for it (that create waits for the build).
  NESTBOX_CODE_INTERPRETER_IMAGE: z.enum(['background', 'on-demand']).default('background'),
  NESTBOX_REFLINK_STORE_GIB: positiveInt.default(64),
  // Host agent: what runs sandboxes. "cloud-hypervisor" = microVMs; needs /dev/kvm, a pinned
  // cloud-hypervisor binary and the VM image (`nestbox image build --vm`).
  NESTBOX_DRIVER: z.enum(['local', 'cloud-hypervisor']).default('local'),
  NESTBOX_CH_BIN: z.string().min(1).default('/usr/local/bin/cloud-hypervisor'),
  // Guest memory on resume/fork: OnDemand (userfaultfd, pages on first touch) or Copy; auto = probe.
  NESTBOX_CH_MEMORY_RESTORE: z.enum(['auto', 'Copy', 'OnDemand']).default('auto'),
  // Ceilings of a live resize (vm.resize): every VM is created with room to hotplug up to these
  // vCPUs and this much memory. Unset = the host's CPU count and total memory.
  NESTBOX_CH_MAX_VCPUS: positiveInt.optional(),
  NESTBOX_CH_MAX_MEMORY_MIB: positiveInt.optional(),
  // virtiofsd for volumes in VMs; unset = /usr/libexec/virtiofsd, else QEMU's /usr/lib/qemu/virtiofsd.
  NESTBOX_CH_VIRTIOFSD: z.string().min(1).optional(),
  // Credentials minted from an API key for one sandbox (E2B envd tokens, Daytona signing keys)
  // live this long; connecting again (or the SDK's refetch) hands out a fresh one.
  NESTBOX_SANDBOX_TOKEN_TTL_SECONDS: positiveInt.min(120).default(86_400),
  // Longest lifetime a signed URL may ask for (Daytona file URLs, E2B signature_expiration,
  // signed preview URLs); "never expires" is refused. Must be below the token lifetime.
  NESTBOX_SIGNED_URL_MAX_SECONDS: positiveInt.default(43_200),
  NESTBOX_BACKGROUND_INTERVAL_MS: positiveInt.default(2000),
  // Warm pool (ARCHITECTURE.md "Warm pool"): ready sandboxes each host keeps per (image, size),
  // so a create of that image and size is answered by one already running. SIZE: members per
  // host of the default image at the default size (0 = no pool); TARGETS replaces that with a
  // list `image:cpu:memoryMiB:diskGiB=size,...` (images: default, code-interpreter). A key's
  // target grows with its creates in the last minute up to MAX, drops to IDLE_SIZE after
  // IDLE_SECONDS without one; members older than MAX_AGE_SECONDS are replaced (0 = never);
  // a refill pass starts at most BATCH members at once.
  NESTBOX_WARM_POOL_SIZE: nonNegativeInt.max(64).default(2),
  NESTBOX_WARM_POOL_TARGETS: z.string().max(2000).regex(/^(?:[a-z0-9-]+:\d+:\d+:\d+=\d+)(?:,[a-z0-9-]+:\d+:\d+:\d+=\d+)*$/, 'must be image:cpu:memoryMiB:diskGiB=size, comma-separated').optional(),
  NESTBOX_WARM_POOL_MAX: nonNegativeInt.max(256).default(8),
  NESTBOX_WARM_POOL_IDLE_SECONDS: nonNegativeInt.default(600),
  NESTBOX_WARM_POOL_IDLE_SIZE: nonNegativeInt.max(64).default(1),
  NESTBOX_WARM_POOL_MAX_AGE_SECONDS: nonNegativeInt.default(3600),
  NESTBOX_WARM_POOL_BATCH: positiveInt.max(64).default(2),
  // Organisation warm pools (Daytona's `daytona.warmPool`, core/services/organization-warm-pools.ts):
  // the most warm sandboxes one organisation may ask for over all its pools (0 = none). Members
  // count against no quota until claimed, so this is what bounds what an organisation keeps warm.
  NESTBOX_ORG_WARM_POOL_MAX: nonNegativeInt.max(256).default(10),
  // Replicas: a control-plane instance whose heartbeat (one per background interval) is older
  // than this, by the database's clock, is dead and another replica takes over its operations.
  // Default: 5 intervals, at least 15 s. Must be at least 2 intervals (one late heartbeat is not death).
  NESTBOX_INSTANCE_TIMEOUT_MS: positiveInt.optional(),

  // Observability (README "Observability"). Prometheus metrics: `/metrics` on the control plane
  // and on every host agent answers only `Authorization: Bearer <token>` with this token; unset =
  // no /metrics at all (404), since series name hosts and operations an outsider should not see.
  NESTBOX_METRICS_TOKEN: z.string().min(16, 'must be at least 16 characters').optional(),
  // Traces: OpenTelemetry spans exported over OTLP/HTTP to this base URL (`<url>/v1/traces`);
  // unset = no tracing at all (no SDK started). The host agents get the same endpoint.
  NESTBOX_OTLP_ENDPOINT: z.string().url().optional(),
  // Fraction of root traces kept (parent-based below the root).
  NESTBOX_TRACE_SAMPLE_RATIO: z.coerce.number().min(0).max(1).default(1),
  // Per-sandbox usage (CPU, memory, disk, network): how often each host agent samples its
  // sandboxes, and how long the samples are kept in the database.
  NESTBOX_USAGE_SAMPLE_SECONDS: positiveInt.max(3600).default(5),
  NESTBOX_USAGE_RETENTION_HOURS: positiveInt.max(24 * 366).default(24),
  // Lifecycle events: how long they are kept (the listing, sandbox logs, webhook replays).
  NESTBOX_EVENT_RETENTION_DAYS: positiveInt.max(3660).default(30),
  // Webhooks: how long a delivery is retried (with backoff) before it is given up, how long one
  // attempt may take, how many webhooks an organisation may have, and whether a webhook may
  // target loopback, private or link-local addresses (off: the control plane would otherwise be
  // a way into the networks it sits in).
  NESTBOX_WEBHOOK_RETRY_SECONDS: positiveInt.max(7 * 86_400).default(86_400),
  NESTBOX_WEBHOOK_TIMEOUT_MS: positiveInt.max(120_000).default(10_000),
  NESTBOX_WEBHOOK_MAX_PER_ORG: positiveInt.max(1000).default(25),
  NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: z.enum(['true', 'false']).default('false'),

  // SSH gateway (src/ssh/gateway.ts): the port the worker listens on for SSH (0 = no gateway),
  // on NESTBOX_SSH_LISTEN_HOST (default NESTBOX_HOST). The host key is NESTBOX_SSH_HOST_KEY (an
  // OpenSSH private key file) or, by default, an Ed25519 key derived from the host secret, so
  // every replica and every restart shows the same one. `sshCommand` advertises
  // NESTBOX_SSH_PUBLIC_HOST (default: the host the API request named) and NESTBOX_SSH_PUBLIC_PORT
  // (default NESTBOX_SSH_PORT). Tokens live NESTBOX_SSH_TOKEN_DEFAULT_MINUTES unless asked (at
  // most NESTBOX_SSH_TOKEN_MAX_MINUTES); limits on live tokens per sandbox, keys per
  // organisation, failed logins per client address and minute, concurrent connections.
  NESTBOX_SSH_PORT: port.default(2222),
  NESTBOX_SSH_LISTEN_HOST: z.string().min(1).optional(),
  NESTBOX_SSH_HOST_KEY: z.string().min(1).optional(),
  NESTBOX_SSH_PUBLIC_HOST: z.string().regex(/^[A-Za-z0-9.:-]{1,253}$/, 'must be a host name or address').optional(),
  NESTBOX_SSH_PUBLIC_PORT: port.min(1).optional(),
  NESTBOX_SSH_TOKEN_DEFAULT_MINUTES: positiveInt.max(525_600).default(60),
  NESTBOX_SSH_TOKEN_MAX_MINUTES: positiveInt.max(525_600).default(1440),
  NESTBOX_SSH_MAX_TOKENS_PER_SANDBOX: positiveInt.max(10_000).default(10),
  NESTBOX_SSH_MAX_KEYS_PER_ORG: positiveInt.max(10_000).default(100),
  NESTBOX_SSH_MAX_AUTH_FAILURES_PER_MINUTE: positiveInt.default(20),
  NESTBOX_SSH_MAX_CONNECTIONS: positiveInt.default(1000),
  // Organisation secrets (issue 19): how many an organisation may store, the size of one value,
  // and how many one sandbox may be given.
  NESTBOX_SECRET_MAX_PER_ORG: positiveInt.max(10_000).default(100),
  NESTBOX_SECRET_MAX_VALUE_BYTES: positiveInt.max(1024 * 1024).default(64 * 1024),
  NESTBOX_SECRET_MAX_PER_SANDBOX: positiveInt.max(1000).default(50),
  NESTBOX_LOG_LEVEL: z.enum(['debug', 'info', 'warn', 'error']).default('info'),

  // Hosts and placement (core/services/hosts.ts). Host agent: labels it reports (`k=v,k=v`; a
  // `region` label is what Daytona's `target` and the native `placement.region` match; a host
  // without one is in NESTBOX_REGION), and capacity it offers instead of what it measures (unset:
  // the machine's vCPUs, memory and its data dir's file system), e.g. when it runs other things.
  NESTBOX_HOST_LABELS: z
    .string()
    .regex(HOST_LABELS, 'must be comma-separated key=value pairs (keys: lowercase letters, digits, ".", "-", "_", "/"; values: letters, digits, ".", "-", "_")')
    .optional(),
  NESTBOX_HOST_CAPACITY_CPU: positiveInt.optional(),
  NESTBOX_HOST_CAPACITY_MEMORY_MIB: positiveInt.optional(),
  NESTBOX_HOST_CAPACITY_DISK_GIB: positiveInt.optional(),
  // Control plane: what a host may hold is capacity × overcommit − reserve (vCPUs and memory;
  // disk is sparse, so it has a ratio too), counted from the sandboxes placed on it.
  NESTBOX_CPU_OVERCOMMIT: z.coerce.number().positive().max(1000).default(16),
  NESTBOX_MEMORY_OVERCOMMIT: z.coerce.number().positive().max(100).default(1.5),
  NESTBOX_DISK_OVERCOMMIT: z.coerce.number().positive().max(1000).default(4),
  NESTBOX_HOST_RESERVE_MEMORY_MIB: nonNegativeInt.default(512),
  NESTBOX_HOST_RESERVE_CPU: z.coerce.number().min(0).default(0),
  // A host whose last heartbeat is older than this is lost: its sandboxes become `error`
  // (`host_lost`) in one step; it is reconciled when it heartbeats again.
  NESTBOX_HOST_LOST_AFTER_MS: positiveInt.min(1000).default(30_000),
  // Retry-After of a 503 capacity_exhausted (no host has room for the request).
  NESTBOX_CAPACITY_RETRY_AFTER_SECONDS: positiveInt.max(3600).default(15),
})
  // A misspelt NESTBOX_ variable is an error rather than a silently ignored setting.
  .strict();

export interface Config {
  /** Volumes (issue 19): default and largest size, per-organisation count and total size. */
  volumes: { defaultSizeBytes: number; maxSizeBytes: number; maxVolumesPerOrganization: number; maxTotalBytesPerOrganization: number };
  port: number;
  host: string;
  dataDir: string;
  imagesDir: string;
  database: { kind: 'postgres'; url: string } | { kind: 'pglite'; directory: string };
  /** OCI images (host/images/oci): the store, registry mirrors and plain-HTTP registries. */
  images: { ociStoreDir: string; mirrors: Record<string, string[]>; insecureRegistries: string[]; pullTimeoutMs: number };
  /** What the CLI's client commands talk to. */
  client: { url?: string; apiKey?: string; profileFile: string; profile: string };
  builds: {
    maxConcurrent: number;
    defaultTimeoutSeconds: number;
    maxTimeoutSeconds: number;
    cpu: number;
    memoryMiB: number;
    diskGiB: number;
    maxLogLines: number;
    readyTimeoutSeconds: number;
    cacheTtlHours: number;
    /** Largest build context one upload may be. */
    maxContextBytes: number;
  };
  bootstrapApiKey?: string;
  hostSecret?: string;
  localHostAgent: boolean;
  /** `nestbox server` supervises a worker process (src/supervisor.ts). */
  serverSupervisor: boolean;
  hostAgent: {
    hostId: string;
    listenHost: string;
    listenPort: number;
    advertisedUrl?: string;
    controlPlaneUrl?: string;
    secret?: string;
    heartbeatIntervalMs: number;
    exitWithParent: boolean;
    subnet: string;
    reflinkStore: 'auto' | 'off';
    reflinkStoreGiB: number;
    codeInterpreterImage: 'background' | 'on-demand';
    driver: 'local' | 'cloud-hypervisor';
    chBinary: string;
    chMemoryRestore: 'auto' | 'Copy' | 'OnDemand';
    chMaxVcpus?: number;
    chMaxMemoryMiB?: number;
    chVirtiofsd?: string;
    slotPoolSize: number;
    egressRefreshSeconds: number;
    userNamespaceBase: number;
    maxUserNamespaces: number;
    /** What the heartbeat reports besides what it measures (NESTBOX_HOST_LABELS, NESTBOX_HOST_CAPACITY_*). */
    labels: Record<string, string>;
    capacityOverride: { cpu?: number; memoryMiB?: number; diskGiB?: number };
  };
  /** Placement over hosts (control plane): overcommit ratios, the reserve per host, when a host is lost. */
  placement: Omit<PlacementPolicy, 'defaultRegion' | 'defaultDiskGiB'>;
  limits: {
    defaultTimeoutSeconds: number;
    maxTimeoutSeconds: number;
    defaultCpu: number;
    maxCpu: number;
    defaultMemoryMiB: number;
    maxMemoryMiB: number;
    maxUploadBytes: number;
    maxForkCount: number;
    defaultDiskGiB: number;
    maxDiskGiB: number;
    diskInodesPerGiB: number;
    maxStreamsPerKey: number;
    maxStreamsPerSandbox: number;
  };
  /** Object storage (build contexts): NESTBOX_OBJECT_STORE_DIR (shared by replicas) or `<data dir>/objects`, and each organisation's byte quota. */
  objectStore: { root: string; maxBytesPerOrganization: number };
  /** Per-organisation limits (429 with Retry-After when exceeded). */
  orgLimits: { maxSandboxes: number; maxCpu: number; maxMemoryMiB: number; maxDiskGiB: number; maxSnapshots: number; maxImages: number; retryAfterSeconds: number };
  /** Request rate limits per API key and per organisation; an absent bucket is off. */
  rateLimits: { key?: { perSecond: number; burst: number }; organization?: { perSecond: number; burst: number }; leaseTokens: number };
  /** Credentials minted from API keys, and signed URLs. */
  tokens: { sandboxTokenTtlSeconds: number; signedUrlMaxSeconds: number };
  /** Timeouts for slow or stalled clients (src/http/slow-clients.ts). */
  http: { headersTimeoutMs: number; requestTimeoutMs: number; bodyIdleTimeoutMs: number; upgradeTimeoutMs: number };
  /** Hosted ports. */
  ports: { publicDomain?: string; publicScheme: 'http' | 'https'; publicUrl?: string };
  /** The region name of this server's hosts (Daytona's `target`). */
  region: string;
  /** What a Daytona create without `snapshot` starts from; undefined = the `default` image. */
  daytonaDefaultSnapshot?: string;
  backgroundIntervalMs: number;
  /** An instance silent this long (database clock) is dead; its operations are taken over (NESTBOX_INSTANCE_TIMEOUT_MS). */
  instanceTimeoutMs: number;
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  /** Prometheus `/metrics` (control plane and host agents); no token = not served. */
  metrics: { token?: string };
  /** The SSH gateway (port 0 = off) and SSH access tokens and keys. */
  ssh: {
    port: number;
    listenHost: string;
    hostKeyFile?: string;
    publicHost?: string;
    publicPort?: number;
    defaultExpiryMinutes: number;
    maxExpiryMinutes: number;
    maxTokensPerSandbox: number;
    maxKeysPerOrganization: number;
    maxAuthFailuresPerMinute: number;
    maxConnections: number;
  };
  /** OpenTelemetry traces; no endpoint = off. */
  tracing: { otlpEndpoint?: string; sampleRatio: number };
  /** Per-sandbox usage samples. */
  usage: { sampleSeconds: number; retentionHours: number };
  /** Lifecycle events. */
  events: { retentionDays: number };
  webhooks: { retrySeconds: number; timeoutMs: number; maxPerOrganization: number; allowPrivateTargets: boolean };
  secrets: { maxPerOrganization: number; maxValueBytes: number; maxPerSandbox: number };
  /** The warm pool (core/services/warm-pool.ts); targets empty = no pool. */
  warmPool: { targets: { image: string; cpu: number; memoryMiB: number; diskGiB: number; size: number }[]; max: number; idleSeconds: number; idleSize: number; maxAgeSeconds: number; batch: number; organizationMax: number };
}

export class ConfigError extends Error {}

/** `docker.io=a,docker.io=b,ghcr.io=c` → { 'docker.io': ['a', 'b'], 'ghcr.io': ['c'] } (order kept). */
function registryMirrors(text: string | undefined): Record<string, string[]> {
  const mirrors: Record<string, string[]> = {};
  for (const pair of text ? text.split(',') : []) {
    const [registry, mirror] = pair.split('=');
    (mirrors[registry] ??= []).push(mirror);
  }
  return mirrors;
}

/** `region=eu,disk=ssd` → { region: 'eu', disk: 'ssd' }; a key given twice is an error (which would win is a guess). */
function hostLabels(text: string | undefined): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const pair of text ? text.split(',') : []) {
    const at = pair.indexOf('=');
    const key = pair.slice(0, at);
    if (key in labels) throw new ConfigError(`invalid configuration:\n  NESTBOX_HOST_LABELS: label ${key} is given twice`);
    labels[key] = pair.slice(at + 1);
  }
  return labels;
}

/** The warm pool's keys: NESTBOX_WARM_POOL_TARGETS, else SIZE members of the default image at the default size. */
function warmPoolTargets(text: string | undefined, size: number, defaults: { cpu: number; memoryMiB: number; diskGiB: number }, max: { cpu: number; memoryMiB: number; diskGiB: number }): Config['warmPool']['targets'] {
  if (text === undefined) return size > 0 ? [{ image: 'default', ...defaults, size }] : [];
  const seen = new Set<string>();
  return text.split(',').map((entry) => {
    const [key, n] = entry.split('=');
    const [image, cpu, memoryMiB, diskGiB] = key.split(':');
    const fail = (why: string) => new ConfigError(`invalid configuration:\n  NESTBOX_WARM_POOL_TARGETS: ${entry}: ${why}`);
    if (image !== 'default' && image !== 'code-interpreter') throw fail('the image must be default or code-interpreter (built-in images; an organisation\'s images are not pooled)');
    const t = { image, cpu: Number(cpu), memoryMiB: Number(memoryMiB), diskGiB: Number(diskGiB), size: Number(n) };
    if (t.cpu < 1 || t.cpu > max.cpu || t.memoryMiB < 64 || t.memoryMiB > max.memoryMiB || t.diskGiB < 1 || t.diskGiB > max.diskGiB) throw fail('the size is outside the NESTBOX_MAX_* limits');
    if (seen.has(key)) throw fail('this key is given twice');
    seen.add(key);
    return t;
  });
}

/** Parse once at start-up; an invalid value stops the start with a message naming the variable. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  // NESTBOX_TEST_* belong to the test suite, not to the program.
  const relevant = Object.fromEntries(
    Object.entries(env).filter(([k, v]) => k.startsWith('NESTBOX_') && !k.startsWith('NESTBOX_TEST_') && v !== ''),
  );
  const parsed = ConfigSchema.safeParse(relevant);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) =>
      i.code === 'unrecognized_keys' ? `${i.keys.join(', ')}: unknown setting` : `${i.path.join('.')}: ${i.message}`,
    );
    throw new ConfigError(`invalid configuration:\n  ${lines.join('\n  ')}`);
  }
  const e = parsed.data;
  if (e.NESTBOX_DEFAULT_TIMEOUT_SECONDS > e.NESTBOX_MAX_TIMEOUT_SECONDS) {
    throw new ConfigError('invalid configuration:\n  NESTBOX_DEFAULT_TIMEOUT_SECONDS: must not exceed NESTBOX_MAX_TIMEOUT_SECONDS');
  }
  if (e.NESTBOX_DEFAULT_DISK_GIB > e.NESTBOX_MAX_DISK_GIB) {
    throw new ConfigError('invalid configuration:\n  NESTBOX_DEFAULT_DISK_GIB: must not exceed NESTBOX_MAX_DISK_GIB');
  }
  if (e.NESTBOX_SIGNED_URL_MAX_SECONDS >= e.NESTBOX_SANDBOX_TOKEN_TTL_SECONDS) {
    // A signed URL can live no longer than the credential that signed it.
    throw new ConfigError('invalid configuration:\n  NESTBOX_SIGNED_URL_MAX_SECONDS: must be less than NESTBOX_SANDBOX_TOKEN_TTL_SECONDS');
  }
  if (e.NESTBOX_REQUEST_TIMEOUT_MS > 0 && e.NESTBOX_HEADERS_TIMEOUT_MS > e.NESTBOX_REQUEST_TIMEOUT_MS) {
    throw new ConfigError('invalid configuration:\n  NESTBOX_HEADERS_TIMEOUT_MS: must not exceed NESTBOX_REQUEST_TIMEOUT_MS');
  }
  if (e.NESTBOX_INSTANCE_TIMEOUT_MS !== undefined && e.NESTBOX_INSTANCE_TIMEOUT_MS < 2 * e.NESTBOX_BACKGROUND_INTERVAL_MS) {
    // A live instance heartbeats once per interval: a shorter timeout would take over its work.
    throw new ConfigError('invalid configuration:\n  NESTBOX_INSTANCE_TIMEOUT_MS: must be at least twice NESTBOX_BACKGROUND_INTERVAL_MS');
  }
  const dataDir = resolve(e.NESTBOX_DATA_DIR);
  return {
    port: e.NESTBOX_PORT,
    host: e.NESTBOX_HOST,
    dataDir,
    imagesDir: resolve(e.NESTBOX_IMAGES_DIR ?? `${dataDir}/images`),
    database: e.NESTBOX_DATABASE_URL ? { kind: 'postgres', url: e.NESTBOX_DATABASE_URL } : { kind: 'pglite', directory: `${dataDir}/pglite` },
    images: {
      ociStoreDir: resolve(e.NESTBOX_OCI_STORE_DIR ?? `${resolve(e.NESTBOX_IMAGES_DIR ?? `${dataDir}/images`)}/oci`),
      mirrors: registryMirrors(e.NESTBOX_REGISTRY_MIRRORS),
      insecureRegistries: e.NESTBOX_INSECURE_REGISTRIES ? e.NESTBOX_INSECURE_REGISTRIES.split(',') : [],
      pullTimeoutMs: e.NESTBOX_IMAGE_PULL_TIMEOUT_SECONDS * 1000,
    },
    client: {
      url: e.NESTBOX_URL?.replace(/\/+$/, ''),
      apiKey: e.NESTBOX_API_KEY,
      // XDG's config home when set (it is not a NESTBOX_ setting, so it is read here by name).
      profileFile: resolve(e.NESTBOX_PROFILE_FILE ?? `${env.XDG_CONFIG_HOME || `${env.HOME || homedir()}/.config`}/nestbox/profiles.json`),
      profile: e.NESTBOX_PROFILE,
    },
    builds: {
      maxConcurrent: e.NESTBOX_MAX_CONCURRENT_BUILDS,
      defaultTimeoutSeconds: Math.min(e.NESTBOX_BUILD_TIMEOUT_SECONDS, e.NESTBOX_BUILD_MAX_TIMEOUT_SECONDS),
      maxTimeoutSeconds: e.NESTBOX_BUILD_MAX_TIMEOUT_SECONDS,
      // A build sandbox is a sandbox: never larger than one may be.
      cpu: Math.min(e.NESTBOX_BUILD_CPU, e.NESTBOX_MAX_CPU),
      memoryMiB: Math.min(e.NESTBOX_BUILD_MEMORY_MIB, e.NESTBOX_MAX_MEMORY_MIB),
      diskGiB: Math.min(e.NESTBOX_BUILD_DISK_GIB, e.NESTBOX_MAX_DISK_GIB),
      maxLogLines: e.NESTBOX_BUILD_MAX_LOG_LINES,
      readyTimeoutSeconds: e.NESTBOX_IMAGE_READY_TIMEOUT_SECONDS,
      cacheTtlHours: e.NESTBOX_BUILD_CACHE_TTL_HOURS,
      maxContextBytes: e.NESTBOX_BUILD_MAX_CONTEXT_BYTES,
    },
    bootstrapApiKey: e.NESTBOX_BOOTSTRAP_API_KEY,
    hostSecret: e.NESTBOX_HOST_SECRET,
    localHostAgent: e.NESTBOX_LOCAL_HOST_AGENT === 'true',
    serverSupervisor: e.NESTBOX_SERVER_SUPERVISOR === 'true',
    hostAgent: {
      hostId: e.NESTBOX_HOST_ID,
      listenHost: e.NESTBOX_HOST_AGENT_HOST,
      listenPort: e.NESTBOX_HOST_AGENT_PORT,
      advertisedUrl: e.NESTBOX_HOST_AGENT_URL,
      controlPlaneUrl: e.NESTBOX_CONTROL_PLANE_URL,
      secret: e.NESTBOX_HOST_AGENT_SECRET,
      heartbeatIntervalMs: e.NESTBOX_HEARTBEAT_INTERVAL_MS,
      exitWithParent: e.NESTBOX_EXIT_WITH_PARENT === 'true',
      subnet: e.NESTBOX_SANDBOX_SUBNET,
      reflinkStore: e.NESTBOX_REFLINK_STORE,
      codeInterpreterImage: e.NESTBOX_CODE_INTERPRETER_IMAGE,
      reflinkStoreGiB: e.NESTBOX_REFLINK_STORE_GIB,
      driver: e.NESTBOX_DRIVER,
      chBinary: e.NESTBOX_CH_BIN,
      chMemoryRestore: e.NESTBOX_CH_MEMORY_RESTORE,
      chMaxVcpus: e.NESTBOX_CH_MAX_VCPUS,
      chMaxMemoryMiB: e.NESTBOX_CH_MAX_MEMORY_MIB,
      chVirtiofsd: e.NESTBOX_CH_VIRTIOFSD,
      slotPoolSize: e.NESTBOX_SLOT_POOL_SIZE,
      egressRefreshSeconds: e.NESTBOX_EGRESS_REFRESH_SECONDS,
      userNamespaceBase: e.NESTBOX_USERNS_BASE,
      maxUserNamespaces: e.NESTBOX_USERNS_MAX,
      labels: hostLabels(e.NESTBOX_HOST_LABELS),
      capacityOverride: { cpu: e.NESTBOX_HOST_CAPACITY_CPU, memoryMiB: e.NESTBOX_HOST_CAPACITY_MEMORY_MIB, diskGiB: e.NESTBOX_HOST_CAPACITY_DISK_GIB },
    },
    volumes: {
      defaultSizeBytes: e.NESTBOX_VOLUME_DEFAULT_MIB * 2 ** 20,
      maxSizeBytes: e.NESTBOX_VOLUME_MAX_MIB * 2 ** 20,
      maxVolumesPerOrganization: e.NESTBOX_ORG_MAX_VOLUMES,
      maxTotalBytesPerOrganization: e.NESTBOX_ORG_MAX_VOLUME_GIB * 2 ** 30,
    },
    placement: {
      cpuOvercommit: e.NESTBOX_CPU_OVERCOMMIT,
      memoryOvercommit: e.NESTBOX_MEMORY_OVERCOMMIT,
      diskOvercommit: e.NESTBOX_DISK_OVERCOMMIT,
      reserveCpu: e.NESTBOX_HOST_RESERVE_CPU,
      reserveMemoryMiB: e.NESTBOX_HOST_RESERVE_MEMORY_MIB,
      hostLostAfterMs: e.NESTBOX_HOST_LOST_AFTER_MS,
      retryAfterSeconds: e.NESTBOX_CAPACITY_RETRY_AFTER_SECONDS,
    },
    limits: {
      defaultTimeoutSeconds: e.NESTBOX_DEFAULT_TIMEOUT_SECONDS,
      maxTimeoutSeconds: e.NESTBOX_MAX_TIMEOUT_SECONDS,
      defaultCpu: e.NESTBOX_DEFAULT_CPU,
      maxCpu: e.NESTBOX_MAX_CPU,
      defaultMemoryMiB: e.NESTBOX_DEFAULT_MEMORY_MIB,
      maxMemoryMiB: e.NESTBOX_MAX_MEMORY_MIB,
      maxUploadBytes: e.NESTBOX_MAX_UPLOAD_BYTES,
      maxForkCount: e.NESTBOX_MAX_FORK_COUNT,
      defaultDiskGiB: e.NESTBOX_DEFAULT_DISK_GIB,
      maxDiskGiB: e.NESTBOX_MAX_DISK_GIB,
      diskInodesPerGiB: e.NESTBOX_DISK_INODES_PER_GIB,
      maxStreamsPerKey: e.NESTBOX_MAX_STREAMS_PER_KEY,
      maxStreamsPerSandbox: e.NESTBOX_MAX_STREAMS_PER_SANDBOX,
    },
    http: {
      headersTimeoutMs: e.NESTBOX_HEADERS_TIMEOUT_MS,
      requestTimeoutMs: e.NESTBOX_REQUEST_TIMEOUT_MS,
      bodyIdleTimeoutMs: e.NESTBOX_BODY_IDLE_TIMEOUT_MS,
      upgradeTimeoutMs: e.NESTBOX_UPGRADE_TIMEOUT_MS,
    },
    objectStore: { root: resolve(e.NESTBOX_OBJECT_STORE_DIR ?? `${dataDir}/objects`), maxBytesPerOrganization: e.NESTBOX_ORG_MAX_OBJECT_BYTES },
    orgLimits: {
      maxSandboxes: e.NESTBOX_ORG_MAX_SANDBOXES,
      maxCpu: e.NESTBOX_ORG_MAX_CPU,
      maxMemoryMiB: e.NESTBOX_ORG_MAX_MEMORY_MIB,
      maxDiskGiB: e.NESTBOX_ORG_MAX_DISK_GIB,
      maxSnapshots: e.NESTBOX_ORG_MAX_SNAPSHOTS,
      maxImages: e.NESTBOX_ORG_MAX_IMAGES,
      retryAfterSeconds: e.NESTBOX_QUOTA_RETRY_AFTER_SECONDS,
    },
    rateLimits: {
      key: e.NESTBOX_RATE_LIMIT_KEY_PER_SECOND > 0 ? { perSecond: e.NESTBOX_RATE_LIMIT_KEY_PER_SECOND, burst: e.NESTBOX_RATE_LIMIT_KEY_BURST } : undefined,
      organization: e.NESTBOX_RATE_LIMIT_ORG_PER_SECOND > 0 ? { perSecond: e.NESTBOX_RATE_LIMIT_ORG_PER_SECOND, burst: e.NESTBOX_RATE_LIMIT_ORG_BURST } : undefined,
      leaseTokens: e.NESTBOX_RATE_LIMIT_LEASE,
    },
    tokens: { sandboxTokenTtlSeconds: e.NESTBOX_SANDBOX_TOKEN_TTL_SECONDS, signedUrlMaxSeconds: e.NESTBOX_SIGNED_URL_MAX_SECONDS },
    ports: { publicDomain: e.NESTBOX_PUBLIC_DOMAIN, publicScheme: e.NESTBOX_PUBLIC_SCHEME, publicUrl: e.NESTBOX_PUBLIC_URL?.replace(/\/+$/, '') },
    region: e.NESTBOX_REGION,
    daytonaDefaultSnapshot: e.NESTBOX_DAYTONA_DEFAULT_SNAPSHOT,
    backgroundIntervalMs: e.NESTBOX_BACKGROUND_INTERVAL_MS,
    instanceTimeoutMs: e.NESTBOX_INSTANCE_TIMEOUT_MS ?? Math.max(15_000, e.NESTBOX_BACKGROUND_INTERVAL_MS * 5),
    logLevel: e.NESTBOX_LOG_LEVEL,
    metrics: { token: e.NESTBOX_METRICS_TOKEN },
    ssh: {
      port: e.NESTBOX_SSH_PORT,
      listenHost: e.NESTBOX_SSH_LISTEN_HOST ?? e.NESTBOX_HOST,
      hostKeyFile: e.NESTBOX_SSH_HOST_KEY,
      publicHost: e.NESTBOX_SSH_PUBLIC_HOST,
      publicPort: e.NESTBOX_SSH_PUBLIC_PORT,
      defaultExpiryMinutes: e.NESTBOX_SSH_TOKEN_DEFAULT_MINUTES,
      maxExpiryMinutes: Math.max(e.NESTBOX_SSH_TOKEN_MAX_MINUTES, e.NESTBOX_SSH_TOKEN_DEFAULT_MINUTES),
      maxTokensPerSandbox: e.NESTBOX_SSH_MAX_TOKENS_PER_SANDBOX,
      maxKeysPerOrganization: e.NESTBOX_SSH_MAX_KEYS_PER_ORG,
      maxAuthFailuresPerMinute: e.NESTBOX_SSH_MAX_AUTH_FAILURES_PER_MINUTE,
      maxConnections: e.NESTBOX_SSH_MAX_CONNECTIONS,
    },
    tracing: { otlpEndpoint: e.NESTBOX_OTLP_ENDPOINT?.replace(/\/+$/, ''), sampleRatio: e.NESTBOX_TRACE_SAMPLE_RATIO },
    usage: { sampleSeconds: e.NESTBOX_USAGE_SAMPLE_SECONDS, retentionHours: e.NESTBOX_USAGE_RETENTION_HOURS },
    events: { retentionDays: e.NESTBOX_EVENT_RETENTION_DAYS },
    webhooks: {
      retrySeconds: e.NESTBOX_WEBHOOK_RETRY_SECONDS,
      timeoutMs: e.NESTBOX_WEBHOOK_TIMEOUT_MS,
      maxPerOrganization: e.NESTBOX_WEBHOOK_MAX_PER_ORG,
      allowPrivateTargets: e.NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS === 'true',
    },
    secrets: { maxPerOrganization: e.NESTBOX_SECRET_MAX_PER_ORG, maxValueBytes: e.NESTBOX_SECRET_MAX_VALUE_BYTES, maxPerSandbox: e.NESTBOX_SECRET_MAX_PER_SANDBOX },
    warmPool: {
      targets: warmPoolTargets(e.NESTBOX_WARM_POOL_TARGETS, e.NESTBOX_WARM_POOL_SIZE, { cpu: e.NESTBOX_DEFAULT_CPU, memoryMiB: e.NESTBOX_DEFAULT_MEMORY_MIB, diskGiB: e.NESTBOX_DEFAULT_DISK_GIB }, { cpu: e.NESTBOX_MAX_CPU, memoryMiB: e.NESTBOX_MAX_MEMORY_MIB, diskGiB: e.NESTBOX_MAX_DISK_GIB }),
      max: Math.max(e.NESTBOX_WARM_POOL_MAX, e.NESTBOX_WARM_POOL_SIZE),
      idleSeconds: e.NESTBOX_WARM_POOL_IDLE_SECONDS,
      idleSize: e.NESTBOX_WARM_POOL_IDLE_SIZE,
      maxAgeSeconds: e.NESTBOX_WARM_POOL_MAX_AGE_SECONDS,
      batch: e.NESTBOX_WARM_POOL_BATCH,
      organizationMax: e.NESTBOX_ORG_WARM_POOL_MAX,
    },
  };
}
