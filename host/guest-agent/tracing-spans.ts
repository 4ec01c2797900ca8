// The guest agent's spans, the OpenTelemetry half (loaded by tracing.ts at the first traced
// request: an agent that is never traced never loads OpenTelemetry, about 650 kB of the bundle).
// The guest agent's spans (contract: agent-protocol/telemetry.ts). A request that arrives with a
// sampled W3C `traceparent` (the host agent sends one only with tracing on) gets a server span,
// child of the host agent's; finished spans wait in a bounded buffer until the host agent drains
// them as OTLP JSON. There is no exporter, no timer and no global registration here: the sandbox
// reaches no collector, and a request without a `traceparent` costs one header lookup.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, defaultTextMapGetter, type Span } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { JsonTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { AlwaysOffSampler, BasicTracerProvider, ParentBasedSampler, type ReadableSpan, type SpanProcessor } from '@opentelemetry/sdk-trace-base';
import { GUEST_SPAN_BUFFER_MAX } from '../agent-protocol/telemetry.js';

/** Keeps finished spans, the newest `max`, until taken. */
class BoundedSpanBuffer implements SpanProcessor {
  private spans: ReadableSpan[] = [];
  dropped = 0;

  constructor(private readonly max: number) {}

  onStart(): void {}

  onEnd(span: ReadableSpan): void {
    if (this.spans.length >= this.max) {
      this.spans.shift();
      this.dropped++;
    }
    this.spans.push(span);
  }

  take(): ReadableSpan[] {
    const taken = this.spans;
    this.spans = [];
    return taken;
  }

  forceFlush(): Promise<void> {
    return Promise.resolve();
  }

  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}

export class GuestSpanRecorder {
  private readonly buffer: BoundedSpanBuffer;
  private readonly propagator = new W3CTraceContextPropagator();
  /** Made at the first traced request: an agent that is never traced never builds one. */
  private provider?: BasicTracerProvider;

  constructor(max = GUEST_SPAN_BUFFER_MAX) {
    this.buffer = new BoundedSpanBuffer(max);
  }

  /**
   * Starts the span of one request, ended when its answer is finished or cut; nothing when the
   * request carries no trace context.
   */
  traceRequest(req: IncomingMessage, res: ServerResponse, pathname: string, startTime: number = Date.now()): void {
    if (typeof req.headers.traceparent !== 'string') return;
    const parent = this.propagator.extract(ROOT_CONTEXT, req.headers, defaultTextMapGetter);
    if (!trace.getSpanContext(parent)) return;
    // Spans are only ever children: a root (no sampled parent) is never recorded here.
    this.provider ??= new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'nestbox-guest-agent' }),
      sampler: new ParentBasedSampler({ root: new AlwaysOffSampler() }),
      spanProcessors: [this.buffer],
    });
    const span: Span = this.provider.getTracer('nestbox-guest-agent').startSpan(
      `${req.method} ${pathname}`,
      { kind: SpanKind.SERVER, attributes: { 'http.request.method': req.method, 'url.path': pathname }, startTime },
      parent,
    );
    if (!span.isRecording()) return;
    res.once('close', () => {
      span.setAttribute('http.response.status_code', res.statusCode);
      if (res.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: `HTTP ${res.statusCode}` });
      else if (!res.writableFinished) span.setStatus({ code: SpanStatusCode.ERROR, message: 'answer cut off' });
      span.end();
    });
  }

  /** The buffered spans as an OTLP JSON export request (the buffer emptied); undefined when there are none. */
  drain(): Uint8Array | undefined {
    const spans = this.buffer.take();
    if (!spans.length) return undefined;
    return JsonTraceSerializer.serializeRequest(spans);
  }
}
