// The lifecycle engine: every write of a sandbox's state goes through here, and what it writes
// comes from the table in state-machine.ts. Each write is a compare-and-set on the state the
// table expects (and, for an operation's outcome, on the operation id), so a stale or raced
// write changes nothing; the repository additionally refuses any state change the table lacks.
import type { Db, DbOrTx } from './store/db.js';
import { sandboxRepository, type NewSandbox, type SandboxPatch } from './store/repositories/sandboxes.js';
import { errors } from './errors.js';
import { newOperationId } from './ids.js';
import {
  assertCanBegin,
  operationInFlight,
  OPERATIONS,
  type HostView,
  type Operation,
  type OperationName,
  type Outcome,
  type OutcomeKind,
  type SandboxEvent,
} from './state-machine.js';
import type { Sandbox } from './types.js';
import type { SandboxState } from './state-machine.js';
import { SandboxStateEvents, type OperationNotice, type StateChangeCause } from './sandbox-events.js';

/** Operations this instance initiated and has not ended yet, for the endings' durations. Bounded: an operation whose ending never came (its process died, or a takeover elsewhere ended it) is forgotten after an hour or past the cap. */
const IN_FLIGHT_MAX = 10_000;
const IN_FLIGHT_TTL_MS = 3_600_000;

const ENDING_PHASE = { succeeded: 'succeeded', failed: 'failed', rolledBack: 'rolled_back' } as const satisfies Record<OutcomeKind, OperationNotice['phase']>;

/** The one computation of `expiresAt`: when a sandbox's timeout, counted from `from`, ends (null: never). */
export function timeoutDeadline(timeoutSeconds: number, from: Date): Date | null {
  return timeoutSeconds === 0 ? null : new Date(from.getTime() + timeoutSeconds * 1000);
}

/** Values an outcome's `given` columns take. */
export interface OutcomeFacts {
  errorMessage?: string;
  stopReason?: string;
  pauseReason?: string;
  memoryRestored?: boolean;
  resumeReason?: string | null;
}

const OPERATION_CLEARED = { operation: null, operationId: null, operationOwner: null, operationStartedAt: null } as const satisfies SandboxPatch;

/**
 * The row `outcome` writes for `sandbox` at `now`. The facts must be exactly the outcome's
 * `given` columns: a missing one would leave a stale value, an extra one would be a write the
 * table does not describe.
 */
export function outcomePatch(outcome: Outcome, sandbox: Pick<Sandbox, 'timeoutSeconds'>, facts: OutcomeFacts, now: Date): SandboxPatch {
  const given = new Set<string>(outcome.given ?? []);
  for (const key of Object.keys(facts)) if (!given.has(key)) throw errors.internal(`state table: an outcome to ${outcome.to} does not take ${key}`);
  for (const key of given) if (!(key in facts)) throw errors.internal(`state table: an outcome to ${outcome.to} needs ${key}`);
  const patch: SandboxPatch = { state: outcome.to, ...OPERATION_CLEARED };
  for (const field of outcome.clear ?? []) patch[field] = null;
  for (const field of outcome.stamp ?? []) patch[field] = now;
  if (outcome.startsTimeout) patch.expiresAt = timeoutDeadline(sandbox.timeoutSeconds, now);
  return { ...patch, ...outcome.fixed, ...facts };
}

/** How a failed host call reads on the sandbox (`errorMessage`). */
export function failureMessage(op: Operation, cause: { message: string }): string {
  return `${op.name} failed: ${cause.message}`;
}

/** A host's answer about a sandbox, as the takeover table reads it. */
export function hostViewOf(runtime: { status: 'running' | 'paused' | 'stopped' } | undefined): HostView {
  return runtime?.status ?? 'absent';
}

/** Tells `events` that `written` moved from `from` (once `db`'s transaction, if any, commits), and why. */
async function announce(events: SandboxStateEvents | undefined, db: DbOrTx, written: Sandbox | undefined, from: SandboxState, cause?: StateChangeCause): Promise<Sandbox | undefined> {
  if (written && events && written.state !== from) await events.publishAfterCommit(db, { kind: 'state', sandbox: written, oldState: from, newState: written.state, ...(cause ? { cause } : {}) });
  return written;
}

/**
 * Runs `work` in `db`'s transaction, or in a new one when `db` is the pool: a state write and
 * what announce records with it (its durable event, core/events.ts) commit together or not at all.
 */
function inTransaction<T>(db: DbOrTx, work: (tx: DbOrTx) => Promise<T>): Promise<T> {
  return 'isTransaction' in db && db.isTransaction ? work(db) : (db as Db).transaction((tx) => work(tx));
}

/** The reason an outcome's facts record, if any. */
const reasonOf = (facts: OutcomeFacts): string | undefined => facts.errorMessage ?? facts.stopReason ?? facts.pauseReason;

/**
 * A state change that happens outside any operation (see EVENTS), compare-and-set on the state
 * it was seen in; published on `events` when given.
 */
export async function applyEvent(db: DbOrTx, sandbox: Sandbox, event: SandboxEvent, facts: OutcomeFacts, events?: SandboxStateEvents): Promise<Sandbox | undefined> {
  if (!event.from.includes(sandbox.state)) throw errors.internal(`state table: ${event.name} does not happen to a ${sandbox.state} sandbox`);
  const reason = reasonOf(facts);
  return inTransaction(db, async (tx) => {
    const written = await sandboxRepository(tx).transition(sandbox.id, [sandbox.state], outcomePatch(event.outcome, sandbox, facts, new Date()));
    return announce(events, tx, written, sandbox.state, { step: 'event', operation: event.name, ...(reason ? { reason } : {}) });
  });
}

/**
 * `event` for every sandbox of host `hostId` in one of its `from` states, as one UPDATE in
 * `db`'s transaction (or a new one), each change published once committed. The event's outcome
 * must not start a timeout (each row has its own).
 */
export async function applyEventOnHost(db: DbOrTx, hostId: string, event: SandboxEvent, facts: OutcomeFacts, events?: SandboxStateEvents): Promise<Sandbox[]> {
  if (event.outcome.startsTimeout) throw errors.internal(`state table: ${event.name} starts timeouts and cannot be written to a host's rows at once`);
  const reason = reasonOf(facts);
  return inTransaction(db, async (tx) => {
    const written = await sandboxRepository(tx).transitionOnHost(hostId, event.from, outcomePatch(event.outcome, { timeoutSeconds: 0 }, facts, new Date()));
    for (const { sandbox, from } of written) await announce(events, tx, sandbox, from, { step: 'event', operation: event.name, ...(reason ? { reason } : {}) });
    return written.map((w) => w.sandbox);
  });
}

export class Lifecycle {
  constructor(
    private readonly db: Db,
    /** Id of this control-plane instance, recorded as the owner of the operations it runs. */
    private readonly instanceId: string,
    /** Where every state this engine writes is published once committed (sandbox-events.ts). */
    private readonly events: SandboxStateEvents = new SandboxStateEvents(),
  ) {}

  private readonly inFlight = new Map<string, { at: number; initiator: OperationNotice['initiator'] }>();

  /** Reports `op` initiated on `sandbox` (once `db` commits) and remembers when, for its ending. */
  private initiated(db: DbOrTx, op: OperationName, operationId: string, sandbox: Sandbox, initiator: OperationNotice['initiator']): void {
    const now = Date.now();
    if (this.inFlight.size >= IN_FLIGHT_MAX) {
      for (const [id, entry] of this.inFlight) if (now - entry.at > IN_FLIGHT_TTL_MS || this.inFlight.size >= IN_FLIGHT_MAX) this.inFlight.delete(id);
    }
    this.inFlight.set(operationId, { at: now, initiator });
    this.events.notifyOperationAfterCommit(db, { phase: 'initiated', operation: op, operationId, sandbox, initiator });
  }

  /** Reports the ending of the operation run under `operationId`: `written` is the row the outcome wrote, undefined when it lost the race. */
  private ended(phase: OperationNotice['phase'], op: OperationName, operationId: string, before: Sandbox, written: Sandbox | undefined, facts: OutcomeFacts): void {
    const started = this.inFlight.get(operationId);
    this.inFlight.delete(operationId);
    const reason = reasonOf(facts);
    this.events.notifyOperation({
      phase,
      operation: op,
      operationId,
      sandbox: written ?? before,
      initiator: started?.initiator ?? 'request',
      ...(started ? { durationMs: Date.now() - started.at } : {}),
      written: written !== undefined,
      ...(reason ? { reason } : {}),
    });
  }

  /** The operation columns of a row this instance starts `op` on. */
  private owned(op: Operation): { operation: OperationName; operationId: string; operationOwner: string; operationStartedAt: Date } {
    return { operation: op.name, operationId: newOperationId(), operationOwner: this.instanceId, operationStartedAt: new Date() };
  }

  /** New rows of a create or fork, in `creating` and owned by this instance (inside the caller's quota transaction). */
  async insert(tx: DbOrTx, op: typeof OPERATIONS.create | typeof OPERATIONS.fork, operationId: string, row: Omit<NewSandbox, 'operation' | 'operationId' | 'operationOwner'>): Promise<Sandbox> {
    const created = await sandboxRepository(tx).insertCreating({ ...row, operation: op.name, operationId, operationOwner: this.instanceId });
    await this.events.publishAfterCommit(tx, { kind: 'created', sandbox: created, oldState: null, newState: created.state, cause: { step: 'begin', operation: op.name, initiator: 'request' } });
    this.initiated(tx, op.name, operationId, created, 'request');
    return created;
  }

  /**
   * Mark the beginning of `op`: compare-and-set into its transitional state, owned by this
   * instance. A sandbox that moved on meanwhile is the typed state conflict.
   */
  async begin(sandbox: Sandbox, op: Operation, db: DbOrTx = this.db): Promise<{ sandbox: Sandbox; operationId: string }> {
    assertCanBegin(op, sandbox.id, sandbox.state);
    const owned = this.owned(op);
    return inTransaction(db, async (tx) => {
      const began = await sandboxRepository(tx).transition(sandbox.id, op.from, { state: op.via, ...owned });
      if (!began) {
        const current = (await sandboxRepository(tx).findById(sandbox.id))?.state ?? 'deleted';
        throw errors.invalidState('sandbox', sandbox.id, current, op.from, op.name);
      }
      await announce(this.events, tx, began, sandbox.state, { step: 'begin', operation: op.name, initiator: 'request' });
      this.initiated(tx, op.name, owned.operationId, began, 'request');
      return { sandbox: began, operationId: owned.operationId };
    });
  }

  /** What a background sweeper writes into the rows it claims for `op` (one per row: each gets its own id). */
  claimPatch(op: Operation): () => SandboxPatch {
    return () => ({ state: op.via, ...this.owned(op) });
  }

  /**
   * A sweeper's claim of rows in `from` for `op`: `run` writes them with the patch it is given
   * (the repository's claim, SKIP LOCKED) in `db`, a transaction that also records each claimed
   * row's change. `reason` is why the sweeper acts (`timeout`, `idle`), kept on the events.
   */
  async claim(op: Operation, from: SandboxState, run: (patch: () => SandboxPatch, db: DbOrTx) => Promise<Sandbox[]>, reason?: string): Promise<Sandbox[]> {
    return inTransaction(this.db, async (tx) => {
      const claimed = await run(this.claimPatch(op), tx);
      for (const sandbox of claimed) {
        await announce(this.events, tx, sandbox, from, { step: 'begin', operation: op.name, initiator: 'sweeper', ...(reason ? { reason } : {}) });
        if (sandbox.operationId) this.initiated(tx, op.name, sandbox.operationId, sandbox, 'sweeper');
      }
      return claimed;
    });
  }

  /**
   * Write the outcome `kind` of `op` (run under `operationId`). Undefined when the row is no
   * longer that operation's (another request or the reconciler moved it on).
   */
  finish(sandbox: Sandbox, op: Operation, kind: OutcomeKind, operationId: string, facts: OutcomeFacts = {}): Promise<Sandbox | undefined> {
    const outcome = op[kind];
    if (!outcome) throw errors.internal(`state table: ${op.name} has no ${kind} outcome`);
    const reason = reasonOf(facts);
    return inTransaction(this.db, async (tx) => {
      const written = await sandboxRepository(tx).transition(sandbox.id, [op.via], outcomePatch(outcome, sandbox, facts, new Date()), operationId);
      return announce(this.events, tx, written, op.via, { step: kind, operation: op.name, operationId, ...(reason ? { reason } : {}) });
    })
      .then((written) => {
        this.ended(ENDING_PHASE[kind], op.name, operationId, sandbox, written, facts);
        return written;
      });
  }

  /**
   * Take over an operation whose owner died: re-own the row under a new operation id (a
   * compare-and-set on the old one, so two reconcilers never act on the same orphan).
   * Undefined when another reconciler, or the operation itself, got there first.
   */
  async adopt(orphan: Sandbox): Promise<{ sandbox: Sandbox; operation: Operation; operationId: string } | undefined> {
    const operation = operationInFlight(orphan.state, orphan.operation);
    if (!operation) return undefined;
    const operationId = newOperationId();
    const sandbox = await sandboxRepository(this.db).transition(orphan.id, [orphan.state], { operationId, operationOwner: this.instanceId }, orphan.operationId ?? undefined);
    if (sandbox) this.initiated(this.db, operation.name, operationId, sandbox, 'takeover');
    return sandbox ? { sandbox, operation, operationId } : undefined;
  }

  /**
   * Settle an adopted operation by what the host reports (the takeover column of the table).
   * `interrupted` is the message for outcomes that record one.
   */
  settle(sandbox: Sandbox, op: Operation, view: HostView, operationId: string, interrupted: string): Promise<Sandbox | undefined> {
    if (op.takeover === 'finish') throw errors.internal(`state table: ${op.name} is finished, not settled, on takeover`);
    const outcome = op.takeover[view];
    const facts: OutcomeFacts = {};
    for (const field of outcome.given ?? []) {
      if (field === 'errorMessage') facts.errorMessage = interrupted;
      // A pause's reason is written with its outcome, so an interrupted one has none yet.
      else if (field === 'pauseReason') facts.pauseReason = sandbox.pauseReason ?? 'user';
      else throw errors.internal(`state table: a takeover cannot know ${field}`);
    }
    const reason = reasonOf(facts);
    return inTransaction(this.db, async (tx) => {
      const written = await sandboxRepository(tx).transition(sandbox.id, [op.via], outcomePatch(outcome, sandbox, facts, new Date()), operationId);
      return announce(this.events, tx, written, op.via, { step: 'takeover', operation: op.name, initiator: 'takeover', operationId, ...(reason ? { reason } : {}) });
    })
      .then((written) => {
        this.ended('taken_over', op.name, operationId, sandbox, written, facts);
        return written;
      });
  }
}
