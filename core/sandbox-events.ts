// Sandbox state changes as the lifecycle engine (lifecycle.ts, the only writer of states)
// commits them, for whoever wants them pushed rather than polled (Daytona's Socket.IO event
// stream, compat/daytona/events.ts). Each change carries the row as written, so a subscriber
// can render it without reading the database again.
//
// In-process only: a change is seen by the subscribers of the control-plane instance that wrote
// it. With several instances on one PostgreSQL, a client connected to another instance misses
// that change; the clients this serves (the Daytona SDK) poll beside the stream, so a missed
// event costs latency (up to their poll interval), never correctness. A fan-out through
// PostgreSQL (NOTIFY in the writing transaction, one LISTEN connection per instance feeding
// `publish`) would close that gap without changing this interface.
import type { DbOrTx } from './store/db.js';
import type { SandboxState } from './state-machine.js';
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
}

export type SandboxStateListener = (change: SandboxStateChange) => void;

export class SandboxStateEvents {
  private readonly listeners = new Set<SandboxStateListener>();

  constructor(private readonly log: Logger = silentLogger) {}

  /** Calls `listener` with every change from now on; the returned function stops that. */
  subscribe(listener: SandboxStateListener): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
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
   * row that does not exist would look it up and find nothing).
   */
  publishAfterCommit(db: DbOrTx, change: SandboxStateChange): void {
    if (!this.listeners.size) return;
    if ('executionPromise' in db && db.isTransaction) {
      db.executionPromise.then(() => this.publish(change), () => undefined);
      return;
    }
    this.publish(change);
  }
}
