// Traces inside a sandbox (guest-agent wire contract). The guest agent cannot reach any
// collector: it records a span for each request that arrives with a W3C `traceparent` (only a
// host agent with tracing on sends one), keeps finished spans in a bounded buffer, and hands
// them over on
//   GET /telemetry/spans   → 200 application/json, an OTLP ExportTraceServiceRequest (JSON
//                            encoding), the buffer emptied; 204 when it holds nothing.
// The host agent drains it shortly after each traced request (host/agent/guest-spans.ts) and
// passes the spans on to its collector. Nothing is ever pushed: the guest never blocks on it.

export const GUEST_SPANS_ROUTE = '/telemetry/spans';
/** Finished spans a guest agent keeps until drained; past it the oldest are dropped. */
export const GUEST_SPAN_BUFFER_MAX = 2048;
