// The lifecycle's log lines: one when an operation is initiated and one when it ends, each with
// the ids an operator filters by (sandbox, organisation, host, operation and its id) in fields,
// and the reason of a failure. Fed by the engine's operation notices (sandbox-events.ts), so
// every verb, sweeper and takeover is covered without a log call in each of them.
import type { Logger } from './logger.js';
import type { OperationNotice, SandboxStateEvents } from './sandbox-events.js';

/** Logs every operation step `events` reports on `log`; the returned function stops that. */
export function logOperations(events: SandboxStateEvents, log: Logger): () => void {
  return events.onOperation((notice) => {
    const { sandbox } = notice;
    const fields = {
      operation: notice.operation,
      operationId: notice.operationId,
      phase: notice.phase,
      initiator: notice.initiator,
      sandboxId: sandbox.id,
      organizationId: sandbox.organizationId,
      hostId: sandbox.hostId ?? undefined,
      state: sandbox.state,
      ...(notice.durationMs !== undefined ? { durationMs: notice.durationMs } : {}),
      ...(notice.written === false ? { written: false } : {}),
      ...(notice.reason ? { reason: notice.reason } : {}),
    };
    log[levelOf(notice)](fields, sentenceOf(notice));
  });
}

function levelOf(notice: OperationNotice): 'info' | 'warn' {
  return notice.phase === 'failed' || notice.phase === 'rolled_back' ? 'warn' : 'info';
}

function sentenceOf(notice: OperationNotice): string {
  switch (notice.phase) {
    case 'initiated':
      return `${notice.operation} initiated`;
    case 'succeeded':
      return notice.written === false ? `${notice.operation} succeeded on the host, but the sandbox had moved on` : `${notice.operation} succeeded`;
    case 'failed':
      return `${notice.operation} failed${notice.reason ? `: ${notice.reason}` : ''}`;
    case 'rolled_back':
      return `${notice.operation} rolled back${notice.reason ? `: ${notice.reason}` : ''}`;
    case 'taken_over':
      return `${notice.operation} taken over from a stopped instance and settled as ${notice.sandbox.state}`;
  }
}
