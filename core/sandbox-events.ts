// Sandbox state changes as the lifecycle engine (lifecycle.ts, the only writer of states)
// commits them, for whoever wants them pushed rather than polled (Daytona's Socket.IO event
// stream, compat/daytona/events.ts). Each change carries the row as written, so a subscriber
// can render it without reading the database again.
//
// Subscribers of the instance that wrote a change get it at once. With several control-plane
// instances on one PostgreSQL, `relay` (sandbox-events-postgres.ts: NOTIFY in the writing
// transaction, one LISTEN connection per instance) carries it to the others. A change missed
// while that connection is down costs latency only: the clients this serves (the Daytona SDK)
// poll beside the stream.
import type { DbOrTx } from './store/db.js';
import type { OperationName, SandboxState } from './state-machine.js';
import type { Sandbox } from './types.js';
import type { Logger } from './logger.js';
import { silentLogger } from './logger.js';

export interface SandboxStateChange {
  /** `created`: a new row (create or fork); `state`: an existing row moved to another state. */
  kind: 'created' | 'state';
  /** The row as written (its organisation decides who may see the change). */
  sandbox: Sandbox;
  /** The state before the write; null for a new row. */
  oldState: SandboxState | null;
  newState: SandboxState;
  /** What made the change (the durable events of core/events.ts are typed from it). */
  cause?: StateChangeCause;
}

/**
 * Why a state was written: the operation step (`begin`: its transitional state; `succeeded`,
 * `failed`, `rolledBack`: its outcome; `takeover`: settled by the reconciler) or an event outside
 * any operation (`event`, e.g. `vanished`), with the reason recorded (error, stop/pause reason).
 */
export interface StateChangeCause {
  step: 'begin' | 'succeeded' | 'failed' | 'rolledBack' | 'takeover' | 'event';
  /** The operation (create, stop, …) or the event's name (vanished). */
  operation: string;
  initiator?: OperationNotice['initiator'];
  /** Endings: the operation id they end (a begin's is on the row). */
  operationId?: string;
  reason?: string;
}

/** Writes `change` durably in `db`'s transaction (core/events.ts): a state write and its event commit together. */
export type SandboxStateRecorder = (db: DbOrTx, change: SandboxStateChange) => Promise<void>;

export type SandboxStateListener = (change: SandboxStateChange) => void;

/**
 * One step of a lifecycle operation as this instance's engine ran it: `initiated` when the row
 * entered the operation's transitional state (a request's begin, a sweeper's claim, a takeover's
 * adoption), then one ending (the outcome it wrote). Observability hangs off these (the
 * lifecycle log lines, metrics, traces); they are in-process only and never relayed: every
 * instance reports the operations it ran itself.
 */
export interface OperationNotice {
  phase: 'initiated' | 'succeeded' | 'failed' | 'rolled_back' | 'taken_over';
  operation: OperationName;
  operationId: string;
  /** The row as written; for an ending whose write lost (the row had moved on), the row as the caller last saw it. */
  sandbox: Sandbox;
  /** Who started it: an API call (`request`), a background sweeper (`sweeper`), or the reconciler adopting an orphan (`takeover`). */
  initiator: 'request' | 'sweeper' | 'takeover';
  /** Endings: milliseconds since this instance saw the operation initiated (absent when it did not). */
  durationMs?: number;
  /** Endings: false when the row was no longer the operation's, so nothing was written. */
  written?: boolean;
  /** Endings: the reason recorded (error message, stop or pause reason), when there is one. */
  reason?: string;
}

export type OperationListener = (notice: OperationNotice) => void;

/** Carries a change to the other control-plane instances, in `db`'s transaction when it is one. */
export type SandboxStateRelay = (db: DbOrTx, change: SandboxStateChange) => Promise<void>;

export class SandboxStateEvents {
  private readonly listeners = new Set<SandboxStateListener>();
  private readonly operationListeners = new Set<OperationListener>();
  /** Set by a cross-instance fan-out (sandbox-events-postgres.ts); none with one instance. */
  relay?: SandboxStateRelay;
  /** Set by the durable event log (core/events.ts); awaited inside the writing transaction. */
  recorder?: SandboxStateRecorder;

  constructor(private readonly log: Logger = silentLogger) {}

  /** Calls `listener` with every change from now on; the returned function stops that. */
  subscribe(listener: SandboxStateListener): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  /** Calls `listener` with every operation step this instance's engine runs (OperationNotice). */
  onOperation(listener: OperationListener): () => void {
    this.operationListeners.add(listener);
    return () => {
      this.operationListeners.delete(listener);
    };
  }

  /** Hands `notice` to every operation listener; one that throws is logged and skipped. */
  notifyOperation(notice: OperationNotice): void {
    for (const listener of this.operationListeners) {
      try {
        listener(notice);
      } catch (err) {
        this.log.error({ err, sandboxId: notice.sandbox.id, operation: notice.operation }, 'an operation listener failed');
      }
    }
  }

  /** `notifyOperation` once what `db` wrote is committed (never when its transaction rolls back). */
  notifyOperationAfterCommit(db: DbOrTx, notice: OperationNotice): void {
    if (!this.operationListeners.size) return;
    if ('executionPromise' in db && db.isTransaction) db.executionPromise.then(() => this.notifyOperation(notice), () => undefined);
    else this.notifyOperation(notice);
  }

  /**
   * Hands `change` to every subscriber. A subscriber that throws is logged and skipped: a state
   * write never fails because someone watching it did.
   */
  publish(change: SandboxStateChange): void {
    for (const listener of this.listeners) {
      try {
        listener(change);
      } catch (err) {
        this.log.error({ err, sandboxId: change.sandbox.id }, 'a sandbox state subscriber failed');
      }
    }
  }

  /**
   * Publishes `change` once what `db` wrote is visible to others: at once outside a
   * transaction, after the commit inside one, never when it rolls back (a subscriber told of a
   * row that does not exist would look it up and find nothing). The relay, when there is one,
   * is awaited: inside a transaction its NOTIFY must be sent before the commit; so is the
   * recorder, whose event row commits (or rolls back) with the state.
   */
  async publishAfterCommit(db: DbOrTx, change: SandboxStateChange): Promise<void> {
    await this.recorder?.(db, change);
    if (this.listeners.size) {
      if ('executionPromise' in db && db.isTransaction) db.executionPromise.then(() => this.publish(change), () => undefined);
      else this.publish(change);
    }
    await this.relay?.(db, change);
  }
}
