// The host agent's Prometheus series (docs/metrics.md lists them), on a Registry of its own.
// Driver calls are timed by wrapping the driver (`meterDriver`), so neither the server's routes
// nor the drivers carry metric calls; levels (sandboxes by status, the slot pool) are read from
// the driver at scrape time. Label values are bounded: call names, outcomes, statuses.
import { totalmem } from 'node:os';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Driver } from '../drivers/types.js';

/** Seconds: a pause takes milliseconds, a cold create or a fork of a large disk seconds to minutes. */
const DRIVER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
/** Seconds: guest-agent requests (an exec is a command's run time; a stream its lifetime). */
const GUEST_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** The driver calls that change or create something; reads (get, list) are not timed. */
const TIMED_CALLS = ['create', 'start', 'stop', 'pause', 'unpause', 'destroy', 'fork', 'snapshot', 'deleteSnapshot', 'fileView', 'setEgress', 'pullImage', 'deleteImage'] as const;
type TimedCall = (typeof TIMED_CALLS)[number];

/** The guest-agent route families a host agent passes through (the first path segment); others are `other`. */
const GUEST_CALLS = new Set(['exec', 'processes', 'sessions', 'files', 'kernels', 'scripts', 'lsp', 'env', 'health', 'info']);

export class HostAgentMetrics {
  readonly registry = new Registry();
  readonly contentType = this.registry.contentType;

  readonly driverCalls = new Histogram({
    name: 'nestbox_host_agent_driver_call_duration_seconds',
    help: 'Driver calls of this host agent, by call (create, start, stop, pause, unpause, destroy, fork, snapshot, deleteSnapshot, fileView, setEgress, pullImage, deleteImage) and outcome (ok, error).',
    labelNames: ['call', 'outcome'] as const,
    buckets: DRIVER_BUCKETS,
    registers: [this.registry],
  });

  readonly guestRequests = new Histogram({
    name: 'nestbox_host_agent_guest_request_duration_seconds',
    help: 'Requests passed through to guest agents, until their answer started, by call (the route family: exec, processes, sessions, files, kernels, scripts, lsp, env, health, info, other) and status code (0: no answer).',
    labelNames: ['call', 'status'] as const,
    buckets: GUEST_BUCKETS,
    registers: [this.registry],
  });

  readonly heartbeatFailures = new Counter({
    name: 'nestbox_host_agent_heartbeat_failures_total',
    help: 'Heartbeats to the control plane that failed (unreachable, or refused).',
    registers: [this.registry],
  });

  /** `processMetrics`: prom-client's process metrics (CPU, memory, event-loop lag, GC), off when nobody can scrape them. */
  constructor(driver: Pick<Driver, 'list' | 'capabilities'>, processMetrics = true) {
    if (processMetrics) collectDefaultMetrics({ register: this.registry, prefix: 'nestbox_host_agent_' });
    new Gauge({
      name: 'nestbox_host_agent_sandboxes',
      help: 'Sandboxes this host agent knows, by driver status (running, paused, stopped, …).',
      labelNames: ['status'] as const,
      registers: [this.registry],
      async collect() {
        const counts = new Map<string, number>([['running', 0], ['paused', 0], ['stopped', 0]]);
        for (const s of await driver.list()) counts.set(s.status, (counts.get(s.status) ?? 0) + 1);
        for (const [status, n] of counts) this.set({ status }, n);
      },
    });
    new Gauge({
      name: 'nestbox_host_agent_slot_pool',
      help: 'The pool of prepared network slots (local driver), by what: size (the configured number kept ready), idle (ready now).',
      labelNames: ['what'] as const,
      registers: [this.registry],
      collect() {
        const probes = driver.capabilities().probes;
        if (typeof probes.slotPoolSize === 'number') this.set({ what: 'size' }, probes.slotPoolSize);
        if (typeof probes.slotPoolIdle === 'number') this.set({ what: 'idle' }, probes.slotPoolIdle);
      },
    });
    new Gauge({
      name: 'nestbox_host_agent_capacity',
      help: 'What this machine offers sandboxes, by resource: cpu (vCPUs a sandbox may have at most: the machine\'s CPUs), memory_bytes (the machine\'s memory).',
      labelNames: ['resource'] as const,
      registers: [this.registry],
      collect() {
        this.set({ resource: 'cpu' }, driver.capabilities().maxVcpus);
        this.set({ resource: 'memory_bytes' }, totalmem());
      },
    });
  }

  /** Times one pass-through to a guest agent: call once the answer started (or failed, status 0). */
  guestRequestTimer(agentPath: string): (status: number) => void {
    const slash = agentPath.indexOf('/', 1);
    const query = agentPath.indexOf('?');
    const end = slash === -1 ? (query === -1 ? agentPath.length : query) : query === -1 ? slash : Math.min(slash, query);
    const family = agentPath.slice(1, end);
    const call = GUEST_CALLS.has(family) ? family : 'other';
    const started = performance.now();
    return (status) => this.guestRequests.observe({ call, status: String(status) }, (performance.now() - started) / 1000);
  }

  scrape(): Promise<string> {
    return this.registry.metrics();
  }
}

/**
 * The same driver, with every call that changes something timed in `metrics.driverCalls`. A
 * Proxy, so methods a driver adds later pass through untouched, and `this` inside the driver
 * stays the driver.
 */
export function meterDriver<D extends Driver>(driver: D, metrics: HostAgentMetrics): D {
  const timed = new Set<string>(TIMED_CALLS);
  const wrapped = new Map<string, unknown>();
  return new Proxy(driver, {
    get(target, prop) {
      const value = Reflect.get(target, prop) as unknown;
      if (typeof prop !== 'string' || typeof value !== 'function') return value;
      // Made once per method (a driver call per request must not allocate a new function).
      let fn = wrapped.get(prop);
      if (fn) return fn;
      const method = value as (...a: unknown[]) => unknown;
      if (!timed.has(prop)) {
        fn = method.bind(target);
      } else {
        const call = prop as TimedCall;
        fn = async (...args: unknown[]) => {
          const started = performance.now();
          try {
            const result = await method.apply(target, args);
            metrics.driverCalls.observe({ call, outcome: 'ok' }, (performance.now() - started) / 1000);
            return result;
          } catch (err) {
            metrics.driverCalls.observe({ call, outcome: 'error' }, (performance.now() - started) / 1000);
            throw err;
          }
        };
      }
      wrapped.set(prop, fn);
      return fn;
    },
  });
}
