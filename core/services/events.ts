// Durable lifecycle events: every sandbox state the lifecycle engine writes becomes one row of
// `sandbox_events`, inserted in the transaction of the state write (SandboxStateEvents.recorder),
// together with the webhook deliveries it owes. So an event exists exactly when its state was
// committed, and a delivery exists exactly when its event does (an outbox: the dispatcher in
// webhooks.ts only reads what committed).
//
// Vocabulary (EVENT_TYPES): transitional states are events of their own (`sandbox.stopping`: the
// platform began something), endings are named by what happened (`sandbox.stopped`, or
// `sandbox.stop_failed` when the operation landed elsewhere than it meant to, `sandbox.failed`
// when the sandbox went to `error`), and a stop or delete the timeout sweeper began ends as
// `sandbox.timed_out`. `details` always has the old and new state and the operation.
import { randomBytes } from 'node:crypto';
import type { Db, DbOrTx } from '../store/db.js';
import { errors } from '../errors.js';
import { OPERATIONS, type OperationName, type SandboxState } from '../state-machine.js';
import type { SandboxStateChange, SandboxStateEvents } from '../sandbox-events.js';
import type { Principal } from '../types.js';
import { canSeeSandbox, requireScope } from './auth.js';
import { insertDeliveriesFor } from './webhooks.js';
import { deleteCounted } from '../store/repositories/rows-deleted.js';

export const EVENT_TYPES = [
  'sandbox.creating',
  'sandbox.created',
  'sandbox.create_failed',
  'sandbox.starting',
  'sandbox.started',
  'sandbox.start_failed',
  'sandbox.stopping',
  'sandbox.stopped',
  'sandbox.stop_failed',
  'sandbox.pausing',
  'sandbox.paused',
  'sandbox.pause_failed',
  'sandbox.resuming',
  'sandbox.resumed',
  'sandbox.resume_failed',
  'sandbox.deleting',
  'sandbox.deleted',
  'sandbox.delete_failed',
  'sandbox.timed_out',
  'sandbox.failed',
  // Not a state change: what a webhook's test ping sends.
  'webhook.ping',
] as const;
export type EventType = (typeof EVENT_TYPES)[number];

export interface EventDetails {
  oldState: SandboxState | null;
  newState: SandboxState;
  /** The operation (create, fork, start, stop, pause, unpause, delete) or event (vanished) that wrote the state. */
  operation?: string;
  operationId?: string;
  /** request (an API call), sweeper (timeouts, idle policy, auto-delete) or takeover (the reconciler). */
  initiator?: string;
  /** The stop or pause reason (user, timeout, idle, auto-delete) when there is one. */
  reason?: string;
  /** The error recorded on the sandbox by a failed step. */
  error?: string;
}

export interface SandboxEventRecord {
  id: string;
  seq: number;
  type: EventType;
  organizationId: string;
  sandboxId: string;
  createdAt: Date;
  details: EventDetails;
}

/** The name an operation's verb has in event types (`unpause` is what users call resume). */
const VERB: Record<string, string> = { create: 'create', fork: 'create', start: 'start', stop: 'stop', pause: 'pause', unpause: 'resume', delete: 'delete' };
const SUCCEEDED: Record<string, EventType> = {
  create: 'sandbox.created',
  fork: 'sandbox.created',
  start: 'sandbox.started',
  stop: 'sandbox.stopped',
  pause: 'sandbox.paused',
  unpause: 'sandbox.resumed',
  delete: 'sandbox.deleted',
};

/** The event type of a state change (see the vocabulary at the top). `beganFor` is the reason the operation was begun with. */
export function eventTypeOf(change: SandboxStateChange, beganFor?: string): EventType {
  const { newState, cause } = change;
  if (newState === 'error') return 'sandbox.failed';
  const op = cause?.operation as OperationName | undefined;
  if (cause && cause.step !== 'begin' && cause.step !== 'event' && op && op in OPERATIONS) {
    if (newState === OPERATIONS[op].succeeded.to) {
      if ((op === 'stop' || op === 'delete') && (cause.reason ?? beganFor) === 'timeout') return 'sandbox.timed_out';
      return SUCCEEDED[op]!;
    }
    return `sandbox.${VERB[op]}_failed` as EventType;
  }
  const byState: Partial<Record<SandboxState, EventType>> = {
    creating: 'sandbox.creating',
    starting: 'sandbox.starting',
    stopping: 'sandbox.stopping',
    pausing: 'sandbox.pausing',
    resuming: 'sandbox.resuming',
    deleting: 'sandbox.deleting',
    running: 'sandbox.started',
    stopped: 'sandbox.stopped',
    paused: 'sandbox.paused',
    deleted: 'sandbox.deleted',
  };
  return byState[newState] ?? 'sandbox.failed';
}

const FAILED_TYPES = new Set<EventType>(['sandbox.failed', 'sandbox.create_failed', 'sandbox.start_failed', 'sandbox.stop_failed', 'sandbox.pause_failed', 'sandbox.resume_failed', 'sandbox.delete_failed']);

export const isFailureType = (type: EventType): boolean => FAILED_TYPES.has(type);

export const newEventId = (): string => `evt${randomBytes(12).toString('hex')}`;

interface EventRow {
  seq: string | number;
  id: string;
  organization_id: string;
  sandbox_id: string;
  type: string;
  details: unknown;
  created_at: Date | string;
}

const fromRow = (r: EventRow): SandboxEventRecord => ({
  id: r.id,
  seq: Number(r.seq),
  type: r.type as EventType,
  organizationId: r.organization_id,
  sandboxId: r.sandbox_id,
  createdAt: r.created_at instanceof Date ? r.created_at : new Date(r.created_at),
  details: (typeof r.details === 'string' ? JSON.parse(r.details) : r.details) as EventDetails,
});

/** The JSON an event is on every surface (native listing, webhook bodies). */
export function renderEvent(e: SandboxEventRecord): Record<string, unknown> {
  return { id: e.id, type: e.type, timestamp: e.createdAt.toISOString(), organizationId: e.organizationId, sandboxId: e.sandboxId, data: e.details };
}

/** A page position: the sequence number of the last event seen, opaque to clients. */
export const encodeCursor = (seq: number): string => Buffer.from(`e${seq}`).toString('base64url');
function decodeCursor(cursor: string): number {
  const text = Buffer.from(cursor, 'base64url').toString();
  const seq = /^e(\d{1,18})$/.exec(text)?.[1];
  if (!seq) throw errors.validation('cursor', 'is not a cursor this server gave');
  return Number(seq);
}

export interface EventQuery {
  types?: string[];
  sandboxId?: string;
  since?: Date;
  cursor?: string;
  limit?: number;
  /** Newest first (the cursor then continues to older events): E2B's default order. */
  newestFirst?: boolean;
  /** Events to skip before the page (E2B's offset paging), at most 100 000. */
  offset?: number;
}

/** A sandbox's log line, from its events: what the platform did to it. */
export interface SandboxLogEntry {
  timestamp: Date;
  level: 'info' | 'warn' | 'error';
  message: string;
  fields: Record<string, string>;
}

export function logEntryOf(e: SandboxEventRecord): SandboxLogEntry {
  const d = e.details;
  const level = isFailureType(e.type) ? 'error' : e.type === 'sandbox.timed_out' ? 'warn' : 'info';
  const what = `${e.type.slice('sandbox.'.length).replace('_', ' ')}`;
  const why = d.error ?? d.reason;
  const message = `sandbox ${what} (${d.oldState ?? 'new'} → ${d.newState}${d.operation ? `, ${d.operation}` : ''})${why ? `: ${why}` : ''}`;
  const fields: Record<string, string> = { eventId: e.id, type: e.type, newState: d.newState };
  if (d.oldState) fields.oldState = d.oldState;
  for (const key of ['operation', 'operationId', 'initiator', 'reason', 'error'] as const) if (d[key]) fields[key] = d[key]!;
  return { timestamp: e.createdAt, level, message, fields };
}

export class EventService {
  constructor(
    private readonly db: Db,
    private readonly opts: { retentionDays: number; maxListLimit?: number },
  ) {}

  /** Makes every state the engine writes an event, in the writing transaction; `onQueued` runs once an event that owes deliveries commits. */
  attach(bus: SandboxStateEvents, onQueued?: () => void): void {
    bus.recorder = async (db, change) => {
      const { deliveries } = await this.record(db, change);
      if (onQueued && deliveries > 0) {
        const onRecorded = onQueued;
        if ('executionPromise' in db && db.isTransaction) db.executionPromise.then(onRecorded, () => undefined);
        else onRecorded();
      }
    };
  }

  /** Inserts the event of `change` (and its webhook deliveries) in `db`, which should be the state write's transaction. */
  async record(db: DbOrTx, change: SandboxStateChange): Promise<{ event: SandboxEventRecord; deliveries: number }> {
    const { sandbox, cause } = change;
    let beganFor: string | undefined;
    const operationId = cause?.step === 'begin' ? (sandbox.operationId ?? undefined) : cause?.operationId;
    // A stop or delete the timeout sweeper began ends as timed_out: the reason is on its begin.
    if (cause && (cause.step === 'succeeded' || cause.step === 'takeover') && !cause.reason && cause.operationId && (cause.operation === 'stop' || cause.operation === 'delete')) {
      const began = (await db('sandbox_events').where({ sandbox_id: sandbox.id }).whereRaw(`details->>'operationId' = ?`, [cause.operationId]).first('reason')) as { reason: string | null } | undefined;
      beganFor = began?.reason ?? undefined;
    }
    const type = eventTypeOf(change, beganFor);
    const reason = cause?.reason ?? beganFor;
    const details: EventDetails = {
      oldState: change.oldState,
      newState: change.newState,
      ...(cause?.operation ? { operation: cause.operation } : {}),
      ...(operationId ? { operationId } : {}),
      ...(cause?.initiator ? { initiator: cause.initiator } : {}),
      ...(reason && !isFailureType(type) ? { reason } : {}),
      ...(isFailureType(type) ? { error: reason ?? sandbox.errorMessage ?? 'unknown error' } : {}),
    };
    const [row] = (await db('sandbox_events')
      .insert({ id: newEventId(), organization_id: sandbox.organizationId, sandbox_id: sandbox.id, type, old_state: change.oldState, new_state: change.newState, operation: cause?.operation ?? null, reason: reason ?? null, details: JSON.stringify(details) })
      .returning('*')) as EventRow[];
    const event = fromRow(row!);
    return { event, deliveries: await insertDeliveriesFor(db, event) };
  }

  /** The organisation's events, oldest first, after `cursor`. `nextCursor` continues (also to tail the feed); `hasMore` says a full page came back. */
  async list(principal: Principal, q: EventQuery): Promise<{ items: SandboxEventRecord[]; nextCursor: string | null; hasMore: boolean }> {
    requireScope(principal, 'sandboxes:read');
    const limit = q.limit ?? 100;
    const max = this.opts.maxListLimit ?? 1000;
    if (!Number.isInteger(limit) || limit < 1 || limit > max) throw errors.validation('limit', `must be an integer from 1 to ${max}`);
    for (const t of q.types ?? []) if (!(EVENT_TYPES as readonly string[]).includes(t)) throw errors.validation('type', `unknown event type ${t} (one of ${EVENT_TYPES.join(', ')})`);
    if (q.sandboxId !== undefined && !canSeeSandbox(principal, q.sandboxId)) return { items: [], nextCursor: q.cursor ?? null, hasMore: false };
    const offset = q.offset ?? 0;
    if (!Number.isInteger(offset) || offset < 0 || offset > 100_000) throw errors.validation('offset', 'must be an integer from 0 to 100000');
    const query = this.db<EventRow>('sandbox_events').where({ organization_id: principal.organizationId }).orderBy('seq', q.newestFirst ? 'desc' : 'asc').limit(limit).offset(offset);
    if (q.cursor) query.where('seq', q.newestFirst ? '<' : '>', decodeCursor(q.cursor));
    if (q.types?.length) query.whereIn('type', q.types);
    if (q.sandboxId) query.where({ sandbox_id: q.sandboxId });
    if (principal.sandboxIds) query.whereIn('sandbox_id', [...principal.sandboxIds]);
    if (q.since) query.where('created_at', '>=', q.since);
    const items = ((await query.select('*')) as EventRow[]).map(fromRow);
    const last = items[items.length - 1];
    return { items, nextCursor: last ? encodeCursor(last.seq) : (q.cursor ?? null), hasMore: items.length === limit };
  }

  /**
   * A sandbox's events as log entries (what the platform did to it), oldest first from `since`
   * (or newest first with `direction: 'backward'`, before `until`). Deleted sandboxes keep their
   * logs until retention removes the events; a sandbox this caller cannot see has none (404).
   */
  async sandboxLogs(
    principal: Principal,
    sandboxId: string,
    q: { since?: Date; until?: Date; limit: number; direction?: 'forward' | 'backward'; minLevel?: SandboxLogEntry['level']; search?: string },
  ): Promise<SandboxLogEntry[]> {
    requireScope(principal, 'sandboxes:read');
    const known = canSeeSandbox(principal, sandboxId)
      ? ((await this.db('sandbox_events').where({ organization_id: principal.organizationId, sandbox_id: sandboxId }).first('seq')) ??
        (await this.db('sandboxes').where({ organization_id: principal.organizationId, id: sandboxId }).first('id')))
      : undefined;
    if (!known) throw errors.notFound('sandbox', sandboxId);
    const backward = q.direction === 'backward';
    const rank = { info: 0, warn: 1, error: 2 } as const;
    const query = this.db<EventRow>('sandbox_events').where({ organization_id: principal.organizationId, sandbox_id: sandboxId }).orderBy('seq', backward ? 'desc' : 'asc');
    if (q.since) query.where('created_at', '>=', q.since);
    if (q.until) query.where('created_at', '<=', q.until);
    // Level and search filter what the rows render to, so they are applied here, over a bounded scan.
    const rows = ((await query.limit(q.minLevel || q.search ? 10_000 : q.limit).select('*')) as EventRow[]).map(fromRow);
    const out: SandboxLogEntry[] = [];
    for (const e of rows) {
      const entry = logEntryOf(e);
      if (q.minLevel && rank[entry.level] < rank[q.minLevel]) continue;
      if (q.search && !entry.message.includes(q.search)) continue;
      out.push(entry);
      if (out.length >= q.limit) break;
    }
    return out;
  }

  /** One bounded retention pass: events older than the retention (and their deliveries, by cascade) and pings as old, a batch at a time. */
  async removeExpired(now = new Date(), batch = 5000): Promise<number> {
    const cutoff = new Date(now.getTime() - this.opts.retentionDays * 86_400_000);
    let removed = 0;
    for (let i = 0; i < 20; i++) {
      const n = await deleteCounted(this.db('sandbox_events').whereIn('seq', this.db('sandbox_events').select('seq').where('created_at', '<', cutoff).orderBy('seq').limit(batch)), 'seq');
      removed += n;
      if (n < batch) break;
    }
    // Pings belong to no event: their deliveries age out on their own.
    await this.db('webhook_deliveries').whereIn('seq', this.db('webhook_deliveries').select('seq').whereNull('event_id').where('created_at', '<', cutoff).limit(batch)).delete();
    return removed;
  }
}
