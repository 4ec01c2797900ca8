// The control plane's Prometheus series, every one defined here with its help text (the list
// with labels and meanings is docs/metrics.md). Each server instance owns one Registry, never
// prom-client's global default one: two servers in one process (tests) keep apart, and nothing
// registers behind the server's back.
//
// Label values are bounded by construction: states, operations, phases, API names, route
// templates and status codes, host ids (one per machine). Never a sandbox, build or key id.
//
// What is counted as it happens (operations, requests, failures, builds) is fed by the services
// through the small hooks they expose; what is a level (sandboxes per state, host usage, queue
// depths, open streams) is read at scrape time by `collect` callbacks, so no bookkeeping can
// drift from the database.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Db } from './store/db.js';
import type { OperationNotice, SandboxStateEvents } from './sandbox-events.js';

/** Seconds: from a cheap exec (milliseconds) to a cold create or a long stop (minutes). */
const OPERATION_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
/** Seconds: API requests, most well below a second; streams end up in the last buckets. */
const HTTP_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
/** Seconds: image builds and pulls run for minutes. */
const BUILD_BUCKETS = [1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600];
/** Seconds: one background pass (a few queries, sometimes a host call). */
const PASS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** Sandbox states that hold resources on their host (the same set placement counts as load). */
const HOLDING_STATES = new Set(['creating', 'starting', 'running', 'pausing', 'paused', 'resuming', 'stopping', 'deleting']);

/** Why a sandbox (or a build) could not be placed on a host. */
export type PlacementFailureReason = 'no_host_alive' | 'source_host_unavailable' | 'capacity_exhausted' | 'constraint_unsatisfied';

/**
 * `read`, shared by the callers that come while it runs: the gauges of one scrape all collect
 * at once (prom-client starts every collect in one go), so each table is read once per scrape,
 * and the next scrape reads it afresh.
 */
function sharedRead<T>(read: () => Promise<T>): () => Promise<T> {
  let pending: Promise<T> | undefined;
  return () => {
    if (pending) return pending;
    const value = read();
    pending = value;
    const clear = () => {
      if (pending === value) pending = undefined;
    };
    value.then(clear, clear);
    return value;
  };
}

/** What the gauges read at scrape time beside the database; set by the composition root. */
export interface ScrapeSources {
  db: Db;
  /** Open long-lived streams now, by kind (src/http/stream-limits.ts). */
  streamsOpen?: () => Record<string, number>;
  /** prom-client's process metrics (CPU, memory, event-loop lag, GC): off when nobody can scrape them. */
  processMetrics?: boolean;
}

export type HttpApi = 'native' | 'e2b' | 'daytona' | 'proxy' | 'internal';

export class ControlPlaneMetrics {
  readonly registry = new Registry();
  readonly contentType = this.registry.contentType;

  readonly operations = new Counter({
    name: 'nestbox_lifecycle_operations_total',
    help: 'Lifecycle operation steps this instance ran, by operation, phase (initiated, succeeded, failed, rolled_back, taken_over) and initiator (request, sweeper, takeover).',
    labelNames: ['operation', 'phase', 'initiator'] as const,
    registers: [this.registry],
  });

  readonly operationDuration = new Histogram({
    name: 'nestbox_lifecycle_operation_duration_seconds',
    help: 'Time from an operation being initiated to its outcome on this instance, by operation and outcome (succeeded, failed, rolled_back, taken_over).',
    labelNames: ['operation', 'outcome'] as const,
    buckets: OPERATION_BUCKETS,
    registers: [this.registry],
  });

  readonly httpDuration = new Histogram({
    name: 'nestbox_http_request_duration_seconds',
    help: 'HTTP requests answered by the control plane, by API (native, e2b, daytona, proxy, internal), method, route template (never a raw path) and status code; a stream counts for as long as it stays open.',
    labelNames: ['api', 'method', 'route', 'status'] as const,
    buckets: HTTP_BUCKETS,
    registers: [this.registry],
  });

  readonly placementFailures = new Counter({
    name: 'nestbox_placement_failures_total',
    help: 'Sandboxes or builds that found no host to run on, by reason (no_host_alive: no host heartbeating; source_host_unavailable: the host holding the snapshot or image is down, cordoned or lost; capacity_exhausted: no host has room; constraint_unsatisfied: no live host matches the placement constraint).',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });

  readonly builds = new Counter({
    name: 'nestbox_image_builds_total',
    help: 'Image builds this instance finished, by outcome (succeeded, failed, cancelled).',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  readonly buildDuration = new Histogram({
    name: 'nestbox_image_build_duration_seconds',
    help: 'Time from a build starting to run to its end, by outcome (builds cancelled while queued are not observed).',
    labelNames: ['outcome'] as const,
    buckets: BUILD_BUCKETS,
    registers: [this.registry],
  });

  readonly pulls = new Counter({
    name: 'nestbox_image_pulls_total',
    help: 'OCI image pulls this instance asked a host for (FROM of a build), by outcome (succeeded, failed, cancelled).',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  readonly pullDuration = new Histogram({
    name: 'nestbox_image_pull_duration_seconds',
    help: 'Time an OCI image pull took, by outcome.',
    labelNames: ['outcome'] as const,
    buckets: BUILD_BUCKETS,
    registers: [this.registry],
  });

  readonly passDuration = new Histogram({
    name: 'nestbox_background_pass_duration_seconds',
    help: 'Time one step of the background loop took, by pass (heartbeat, reconcile, expire, idle, idempotency, and the named passes such as orphaned-builds and image-gc).',
    labelNames: ['pass'] as const,
    buckets: PASS_BUCKETS,
    registers: [this.registry],
  });

  readonly passFailures = new Counter({
    name: 'nestbox_background_pass_failures_total',
    help: 'Background passes that failed (and are tried again at the next interval), by pass.',
    labelNames: ['pass'] as const,
    registers: [this.registry],
  });

  readonly rateLimited = new Counter({
    name: 'nestbox_rate_limited_requests_total',
    help: 'Requests this instance refused with 429 because a request rate limit was reached, by the bucket that was empty (key, organization) and API (native, daytona, e2b).',
    labelNames: ['scope', 'api'] as const,
    registers: [this.registry],
  });

  readonly warmPoolClaims = new Counter({
    name: 'nestbox_warm_pool_claims_total',
    help: 'Creates of a pooled (image, size) on this instance, by result: hit (answered by a warm sandbox) or miss (none was ready; created cold).',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });

  constructor(sources: ScrapeSources) {
    if (sources.processMetrics !== false) collectDefaultMetrics({ register: this.registry, prefix: 'nestbox_' });
    const { db } = sources;

    // Each table is read once per scrape for the gauges built on it.
    const sandboxRows = sharedRead(async () => {
      const found = (await db('sandboxes')
        .whereNot({ state: 'deleted' })
        .groupBy('host_id', 'state')
        .select('host_id', 'state')
        .count<unknown[]>('* as count')
        .sum('cpu as cpu')
        .sum('memory_mib as memory_mib')) as { host_id: string | null; state: string; count: string | number; cpu: string | number | null; memory_mib: string | number | null }[];
      return found.map((r) => ({ host: r.host_id ?? 'none', state: r.state, count: Number(r.count), cpu: Number(r.cpu ?? 0), memoryMiB: Number(r.memory_mib ?? 0) }));
    });
    const hostRows = sharedRead(async () => {
      const found = (await db('hosts').select('id', 'capabilities', 'last_heartbeat_at')) as { id: string; capabilities: unknown; last_heartbeat_at: Date | string }[];
      return found.map((h) => ({
        id: h.id,
        capabilities: (typeof h.capabilities === 'string' ? JSON.parse(h.capabilities) : h.capabilities ?? {}) as Record<string, unknown>,
        lastHeartbeatAt: new Date(h.last_heartbeat_at),
      }));
    });

    new Gauge({
      name: 'nestbox_sandboxes',
      help: 'Sandboxes in the database by state and host (deleted ones are not counted; host "none" for rows not placed).',
      labelNames: ['state', 'host'] as const,
      registers: [this.registry],
      async collect() {
        const rows = await sandboxRows();
        this.reset();
        for (const r of rows) this.set({ state: r.state, host: r.host }, r.count);
      },
    });
    new Gauge({
      name: 'nestbox_host_allocated',
      help: 'What sandboxes holding resources (not stopped, error or deleted) ask of each host, by resource: cpu (vCPUs), memory_bytes, sandboxes.',
      labelNames: ['host', 'resource'] as const,
      registers: [this.registry],
      async collect() {
        const rows = await sandboxRows();
        this.reset();
        const byHost = new Map<string, { cpu: number; memory: number; sandboxes: number }>();
        for (const r of rows) {
          if (r.host === 'none' || !HOLDING_STATES.has(r.state)) continue;
          const total = byHost.get(r.host) ?? { cpu: 0, memory: 0, sandboxes: 0 };
          total.cpu += r.cpu;
          total.memory += r.memoryMiB * 1024 * 1024;
          total.sandboxes += r.count;
          byHost.set(r.host, total);
        }
        for (const [host, t] of byHost) {
          this.set({ host, resource: 'cpu' }, t.cpu);
          this.set({ host, resource: 'memory_bytes' }, t.memory);
          this.set({ host, resource: 'sandboxes' }, t.sandboxes);
        }
      },
    });
    new Gauge({
      name: 'nestbox_warm_pool_sandboxes',
      help: 'Warm-pool members (ready sandboxes no one owns yet) by host, state (warming, ready) and image.',
      labelNames: ['host', 'state', 'image'] as const,
      registers: [this.registry],
      async collect() {
        const rows = (await db('warm_pool_sandboxes').select('host_id', 'state', 'image').count<unknown[]>('* as count').groupBy('host_id', 'state', 'image')) as { host_id: string; state: string; image: string; count: string | number }[];
        this.reset();
        for (const r of rows) this.set({ host: r.host_id, state: r.state, image: r.image }, Number(r.count));
      },
    });
    new Gauge({
      name: 'nestbox_host_capacity',
      help: 'What each registered host offers, from its last heartbeat, by resource: cpu (vCPUs of the machine), memory_bytes.',
      labelNames: ['host', 'resource'] as const,
      registers: [this.registry],
      async collect() {
        const hosts = await hostRows();
        this.reset();
        for (const h of hosts) {
          if (typeof h.capabilities.maxVcpus === 'number') this.set({ host: h.id, resource: 'cpu' }, h.capabilities.maxVcpus);
          if (typeof h.capabilities.memoryBytes === 'number') this.set({ host: h.id, resource: 'memory_bytes' }, h.capabilities.memoryBytes);
        }
      },
    });
    new Gauge({
      name: 'nestbox_host_heartbeat_age_seconds',
      help: 'Seconds since each registered host last heartbeated (a host silent for a few intervals gets no new sandboxes).',
      labelNames: ['host'] as const,
      registers: [this.registry],
      async collect() {
        const hosts = await hostRows();
        this.reset();
        const now = Date.now();
        for (const h of hosts) this.set({ host: h.id }, Math.max(0, (now - h.lastHeartbeatAt.getTime()) / 1000));
      },
    });

    new Gauge({
      name: 'nestbox_image_builds_pending',
      help: 'Image builds not finished yet, in the database (all instances), by state (queued, running).',
      labelNames: ['state'] as const,
      registers: [this.registry],
      async collect() {
        const found = (await db('image_builds').whereIn('state', ['queued', 'running']).groupBy('state').select('state').count<unknown[]>('* as count')) as { state: string; count: string | number }[];
        this.set({ state: 'queued' }, 0);
        this.set({ state: 'running' }, 0);
        for (const r of found) this.set({ state: r.state }, Number(r.count));
      },
    });

    new Gauge({
      name: 'nestbox_webhook_deliveries_pending',
      help: 'Webhook deliveries not delivered or given up yet, in the database (all instances): the delivery queue depth, split into due (waiting for a sender) and retrying (waiting for their next attempt after a failure).',
      labelNames: ['state'] as const,
      registers: [this.registry],
      async collect() {
        const [row] = (await db('webhook_deliveries')
          .where({ status: 'pending' })
          .select(db.raw('count(*) filter (where next_attempt_at is null or next_attempt_at <= now()) as due'), db.raw('count(*) filter (where next_attempt_at > now()) as retrying'))) as { due: string | number; retrying: string | number }[];
        this.set({ state: 'due' }, Number(row?.due ?? 0));
        this.set({ state: 'retrying' }, Number(row?.retrying ?? 0));
      },
    });

    const streamsOpen = sources.streamsOpen;
    if (streamsOpen) {
      new Gauge({
        name: 'nestbox_streams_open',
        help: 'Long-lived streams this instance holds open now, by kind (websocket, http_stream: SSE and streamed answers, connect: E2B Connect server streams, hosted_port: proxied upgrades).',
        labelNames: ['kind'] as const,
        registers: [this.registry],
        collect() {
          for (const [kind, open] of Object.entries(streamsOpen())) this.set({ kind }, open);
        },
      });
    }
  }

  /** Counts and times every operation step the engine reports on `events`; the returned function stops that. */
  observeOperations(events: SandboxStateEvents): () => void {
    return events.onOperation((notice) => this.recordOperation(notice));
  }

  recordOperation(notice: OperationNotice): void {
    this.operations.inc({ operation: notice.operation, phase: notice.phase, initiator: notice.initiator });
    if (notice.phase !== 'initiated' && notice.durationMs !== undefined) {
      this.operationDuration.observe({ operation: notice.operation, outcome: notice.phase }, notice.durationMs / 1000);
    }
  }

  /** The exposition text of every series (for `GET /metrics`). */
  scrape(): Promise<string> {
    return this.registry.metrics();
  }
}
