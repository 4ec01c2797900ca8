// Spans of lifecycle operations (tracing on only: src/server.ts calls traceLifecycle then).
// Each verb of the sandbox engine called by a request runs in a span of its own, `sandbox.<op>`,
// child of the request's and parent of the host-agent calls it makes; the engine's operation
// notices (sandbox-events.ts) give it the ids (sandbox, organisation, host, operation id) and
// an event per step, and a failed or rolled-back outcome marks it failed, as does a verb that
// throws. Operations no request runs (a sweeper's timeout stop, a takeover) get a root span
// from their `initiated` notice to their ending.
import { context, createContextKey, ROOT_CONTEXT, SpanStatusCode, trace, type Attributes, type Span } from '@opentelemetry/api';
import type { OperationNotice, SandboxStateEvents } from './sandbox-events.js';
import type { SandboxService } from './services/sandboxes.js';
import type { Principal } from './types.js';
import { inSpan } from './tracing.js';

/** The engine's methods that are a lifecycle verb, and the operation each runs. */
const VERBS = { create: 'create', resume: 'start', stop: 'stop', pause: 'pause', unpause: 'unpause', delete: 'delete', fork: 'fork' } as const;

/** Marks the context of a verb's span, so a notice knows the span it belongs to. */
const LIFECYCLE_SPAN = createContextKey('nestbox lifecycle span');
/** Background operations' spans still open, by operation id; bounded (an ending may never come here). */
const BACKGROUND_MAX = 1000;

function noticeAttributes(notice: OperationNotice): Attributes {
  return {
    'nestbox.operation': notice.operation,
    'nestbox.operation.id': notice.operationId,
    'nestbox.sandbox.id': notice.sandbox.id,
    'nestbox.organization.id': notice.sandbox.organizationId,
    ...(notice.sandbox.hostId ? { 'nestbox.host.id': notice.sandbox.hostId } : {}),
  };
}

function ending(span: Span, notice: OperationNotice): void {
  if (notice.phase === 'failed' || notice.phase === 'rolled_back') span.setStatus({ code: SpanStatusCode.ERROR, message: notice.reason ?? notice.phase });
}

/** Wraps `service`'s lifecycle verbs in spans and annotates them from `events`; the returned function stops the notices. */
export function traceLifecycle(service: SandboxService, events: SandboxStateEvents): () => void {
  const methods = service as unknown as Record<string, (principal: Principal, ...rest: unknown[]) => Promise<unknown>>;
  for (const [method, operation] of Object.entries(VERBS)) {
    const verb = methods[method].bind(service);
    methods[method] = (principal, ...rest) => {
      const attributes: Attributes = { 'nestbox.operation': operation, 'nestbox.organization.id': principal.organizationId };
      if (typeof rest[0] === 'string') attributes['nestbox.sandbox.id'] = rest[0];
      return inSpan(`sandbox.${operation}`, attributes, (span) => context.with(context.active().setValue(LIFECYCLE_SPAN, span), () => verb(principal, ...rest)));
    };
  }

  const background = new Map<string, Span>();
  const annotated = new WeakSet<Span>();
  return events.onOperation((notice) => {
    const own = context.active().getValue(LIFECYCLE_SPAN) as Span | undefined;
    if (own?.isRecording()) {
      // A fork's notices are one per child: the span keeps the first's ids, the events name each.
      if (!annotated.has(own)) {
        annotated.add(own);
        own.setAttributes(noticeAttributes(notice));
      }
      own.addEvent(`operation ${notice.phase}`, { 'nestbox.sandbox.id': notice.sandbox.id, 'nestbox.operation.id': notice.operationId, ...(notice.reason ? { 'nestbox.reason': notice.reason } : {}) });
      ending(own, notice);
      return;
    }
    if (notice.phase === 'initiated') {
      if (background.size >= BACKGROUND_MAX) return;
      const span = trace.getTracer('nestbox').startSpan(`sandbox.${notice.operation}`, { attributes: { ...noticeAttributes(notice), 'nestbox.initiator': notice.initiator } }, ROOT_CONTEXT);
      background.set(notice.operationId, span);
      return;
    }
    const span = background.get(notice.operationId);
    if (!span) return;
    background.delete(notice.operationId);
    if (notice.reason) span.setAttribute('nestbox.reason', notice.reason);
    ending(span, notice);
    span.end();
  });
}
