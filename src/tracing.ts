// OpenTelemetry traces of one process (control-plane worker or host agent), started where the
// process starts and only when NESTBOX_OTLP_ENDPOINT is set: then a NodeTracerProvider with
// the configured ratio sampler (parent-based: a request that arrives traced stays traced), W3C
// trace context propagation, and spans batched to `<endpoint>/v1/traces` over OTLP/HTTP (JSON).
// Unset, nothing here runs and core/tracing.ts stays off: the @opentelemetry/api calls left in
// the program are its no-ops.
//
// Spans are made by hand (core/tracing.ts) rather than by @opentelemetry/instrumentation-http:
// the program is ESM, and the instrumentation's require hook never sees an ESM import of
// `node:http` (tried with 0.223: registered before the import, it made no span for a server,
// a default-import `http.request` or a named `request`; only an ESM loader hook given to node
// at start would). It would also trace every heartbeat and health poll, and not the guest
// agent, which is bundled and has no hook at all.
import { context, propagation, trace } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor, NodeTracerProvider, ParentBasedSampler, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace-node';
import type { Config } from './config.js';
import type { Logger } from '../core/logger.js';
import { setTracingEnabled, tracingEnabled } from '../core/tracing.js';

export type ServiceName = 'nestbox-control-plane' | 'nestbox-host-agent';

/** The largest body of guest-agent spans passed on to the collector at once. */
const MAX_GUEST_SPANS_BYTES = 8 * 1024 * 1024;
const EXPORT_TIMEOUT_MS = 10_000;

export interface Tracing {
  /**
   * Passes on spans a sandbox's guest agent recorded (OTLP JSON, drained by the host agent:
   * host/agent/guest-spans.ts) to the collector, marked with the sandbox and host they come from.
   */
  forwardGuestSpans(otlpJson: Buffer, where: { sandboxId: string; hostId: string }): Promise<void>;
  /** Exports what is still batched and unregisters the SDK (a process exiting, a test's server closing). */
  shutdown(): Promise<void>;
}

/**
 * Starts tracing for this process when `settings.otlpEndpoint` is set; undefined otherwise.
 * One per process: the API's globals (tracer provider, context manager, propagator) are set here.
 */
export function startTracing(settings: Config['tracing'], service: ServiceName, log: Logger, attributes: Record<string, string> = {}): Tracing | undefined {
  const endpoint = settings.otlpEndpoint;
  if (!endpoint) return undefined;
  if (tracingEnabled()) {
    // A second server in one process (tests): its spans go through the first one's provider.
    log.warn('tracing: already started in this process; this server uses the provider started first');
    return undefined;
  }
  const url = `${endpoint}/v1/traces`;
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': service, ...attributes }),
    sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(settings.sampleRatio) }),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url, timeoutMillis: EXPORT_TIMEOUT_MS }))],
  });
  // The async-hooks context manager (so a span stays active across awaits) and W3C propagation only.
  provider.register({ propagator: new W3CTraceContextPropagator() });
  setTracingEnabled(true);
  log.info({ otlpEndpoint: endpoint, sampleRatio: settings.sampleRatio }, `tracing: spans go to ${url}`);

  let guestFailure = '';
  return {
    async forwardGuestSpans(otlpJson, where) {
      if (otlpJson.length > MAX_GUEST_SPANS_BYTES) return;
      let body: { resourceSpans?: { resource?: { attributes?: { key: string; value: unknown }[] } }[] };
      try {
        body = JSON.parse(otlpJson.toString('utf8')) as typeof body;
      } catch {
        return;
      }
      if (!Array.isArray(body.resourceSpans)) return;
      // What the sandbox says about itself is not trusted: the service and the ids are ours.
      const ours = [
        { key: 'service.name', value: { stringValue: 'nestbox-guest-agent' } },
        { key: 'nestbox.sandbox.id', value: { stringValue: where.sandboxId } },
        { key: 'nestbox.host.id', value: { stringValue: where.hostId } },
      ];
      for (const resourceSpans of body.resourceSpans) {
        const given = (resourceSpans.resource?.attributes ?? []).filter((a) => !ours.some((o) => o.key === a.key));
        resourceSpans.resource = { ...resourceSpans.resource, attributes: [...given, ...ours] };
      }
      try {
        const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(EXPORT_TIMEOUT_MS) });
        await res.arrayBuffer();
        if (!res.ok) throw new Error(`the collector answered ${res.status}`);
        guestFailure = '';
      } catch (err) {
        // One line per kind of failure, not one per drain: a collector that is down stays quiet.
        const message = err instanceof Error ? err.message : String(err);
        if (message !== guestFailure) log.warn({ sandboxId: where.sandboxId }, `tracing: guest agent spans could not be exported: ${message}`);
        guestFailure = message;
      }
    },
    async shutdown() {
      try {
        await provider.shutdown();
      } catch (err) {
        log.warn(`tracing: the last spans could not be exported: ${err instanceof Error ? err.message : String(err)}`);
      } finally {
        setTracingEnabled(false);
        trace.disable();
        context.disable();
        propagation.disable();
      }
    },
  };
}
