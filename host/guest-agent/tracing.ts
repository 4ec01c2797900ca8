// The guest agent's spans (contract: agent-protocol/telemetry.ts), the part loaded at boot. The
// OpenTelemetry half (tracing-spans.ts) is imported at the first request that carries a
// `traceparent` (the host agent sends one only with tracing on), so an untraced agent neither
// parses nor evaluates it on its way to answering its first request (issue 20).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { GUEST_SPAN_BUFFER_MAX } from '../agent-protocol/telemetry.js';
import type { GuestSpanRecorder } from './tracing-spans.js';

export class GuestTracing {
  private recorder?: GuestSpanRecorder;
  private loading?: Promise<GuestSpanRecorder>;

  constructor(private readonly max = GUEST_SPAN_BUFFER_MAX) {}

  private load(): Promise<GuestSpanRecorder> {
    this.loading ??= import('./tracing-spans.js').then(({ GuestSpanRecorder }) => (this.recorder = new GuestSpanRecorder(this.max)));
    return this.loading;
  }

  /**
   * Starts the span of one request, ended when its answer is finished or cut; nothing when the
   * request carries no trace context. Returns a promise only while OpenTelemetry is still being
   * loaded: the request must wait for it, so its span starts (dated from its arrival) before
   * its handler runs.
   */
  traceRequest(req: IncomingMessage, res: ServerResponse, pathname: string): Promise<void> | undefined {
    if (typeof req.headers.traceparent !== 'string') return undefined;
    if (this.recorder) {
      this.recorder.traceRequest(req, res, pathname);
      return undefined;
    }
    const arrived = Date.now();
    return this.load().then((recorder) => recorder.traceRequest(req, res, pathname, arrived));
  }

  /** The buffered spans as an OTLP JSON export request (the buffer emptied); undefined when there are none. */
  drain(): Uint8Array | undefined {
    return this.recorder?.drain();
  }
}
