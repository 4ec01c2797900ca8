// Spans for core and host, over @opentelemetry/api only: the SDK (exporter, sampler, context
// manager) is started by the process entry points (src/tracing.ts), which then switch this
// module on. Off (NESTBOX_OTLP_ENDPOINT unset), every helper here is one boolean test and a
// direct call of the wrapped function: no span object, no context, no closure is made, so the
// exec round trip pays nothing for tracing it does not do.
//
// Client spans join a trace, they never start one: a host call made with no span active (a
// background pass, a heartbeat) is not traced, so the collector gets requests and lifecycle
// operations, not every poll.
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags, type Attributes, type Context, type Span } from '@opentelemetry/api';

let enabled = false;

/** Whether a tracer provider was started in this process (src/tracing.ts). */
export function tracingEnabled(): boolean {
  return enabled;
}

/** Called by src/tracing.ts when it has registered (true) or shut down (false) the SDK. */
export function setTracingEnabled(on: boolean): void {
  enabled = on;
}

/** The instrumentation scope of every span the program makes. */
const SCOPE = 'nestbox';

function tracer() {
  return trace.getTracer(SCOPE);
}

/** Marks `span` failed with `error`'s message (an exception event included) without ending it. */
export function recordFailure(span: Span, error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  span.recordException(error instanceof Error ? error : message);
  span.setStatus({ code: SpanStatusCode.ERROR, message });
}

/**
 * Runs `fn` inside a new span (the active one while `fn` runs, so host calls made by it are its
 * children), ended when `fn` settles, failed when it throws. Off: just `fn()`.
 */
export function inSpan<T>(name: string, attributes: Attributes, fn: (span: Span | undefined) => Promise<T>): Promise<T> {
  if (!enabled) return fn(undefined);
  return tracer().startActiveSpan(name, { kind: SpanKind.INTERNAL, attributes }, async (span) => {
    try {
      return await fn(span);
    } catch (error) {
      recordFailure(span, error);
      throw error;
    } finally {
      span.end();
    }
  });
}

/**
 * A client span for an outgoing HTTP request, child of the active span, with its context
 * injected into `headers` (W3C `traceparent`). Undefined when tracing is off or no span is
 * active (see the top of this file).
 */
export function startClientSpan(name: string, attributes: Attributes, headers: OutgoingHttpHeaders): Span | undefined {
  if (!enabled) return undefined;
  const parent = context.active();
  if (!trace.getSpan(parent)) return undefined;
  const span = tracer().startSpan(name, { kind: SpanKind.CLIENT, attributes }, parent);
  propagation.inject(trace.setSpan(parent, span), headers);
  return span;
}

/**
 * Ends a client span when its response is over (its body read, or the exchange cut), with the
 * status it got; a 5xx or a cut response is a failure.
 */
export function endClientSpanWith(span: Span, response: IncomingMessage): void {
  const status = response.statusCode ?? 0;
  span.setAttribute('http.response.status_code', status);
  const finish = () => {
    if (status >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: `HTTP ${status}` });
    else if (!response.complete) span.setStatus({ code: SpanStatusCode.ERROR, message: 'response cut off' });
    span.end();
  };
  if (response.complete) finish();
  else response.once('close', finish);
}

/** Ends a client span whose request failed before any answer. */
export function endClientSpanFailed(span: Span, error: unknown): void {
  recordFailure(span, error);
  span.end();
}

/**
 * Runs `handle` for one incoming request inside a server span continuing the caller's trace
 * (its `traceparent`, if any), ended when the answer is finished or cut. `route` names the
 * span (a template, not the raw path with its ids); `atEnd` may rename it or add what the
 * request learnt (its operation, organisation, sandbox) just before it ends.
 */
export function serveInSpan(req: IncomingMessage, res: ServerResponse, route: string, attributes: Attributes, handle: () => void, atEnd?: (span: Span) => void): void {
  if (!enabled) return handle();
  const parent = propagation.extract(ROOT_CONTEXT, req.headers);
  const span = tracer().startSpan(`${req.method} ${route}`, { kind: SpanKind.SERVER, attributes: { 'http.request.method': req.method, 'http.route': route, ...attributes } }, parent);
  res.once('close', () => {
    atEnd?.(span);
    span.setAttribute('http.response.status_code', res.statusCode);
    if (res.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: `HTTP ${res.statusCode}` });
    else if (!res.writableFinished) span.setStatus({ code: SpanStatusCode.ERROR, message: 'answer cut off' });
    span.end();
  });
  context.with(trace.setSpan(parent, span), handle);
}

/** The span active where this is called, when tracing is on. */
export function activeSpan(): Span | undefined {
  return enabled ? trace.getSpan(context.active()) : undefined;
}

/** Whether the trace active here is sampled (recorded and exported), even once its span has ended. */
export function inSampledTrace(): boolean {
  const span = activeSpan();
  return span !== undefined && (span.spanContext().traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED;
}

export type { Attributes, Context, Span };
