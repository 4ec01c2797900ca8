// The sandbox state machine: one table for all three APIs. Compat layers map their own state
// names onto these; nothing else decides what may follow what, nor what an outcome writes.
// The transitions are derived from the operations and events below, so a transition exists
// exactly when some outcome makes it; `core/lifecycle.ts` performs the writes and the sandboxes
// repository refuses any state change this table does not allow.
import { errors } from './errors.js';

export const SANDBOX_STATES = [
  'creating',
  'running',
  'stopping',
  'stopped',
  'starting',
  'pausing',
  'paused',
  'resuming',
  'deleting',
  'deleted',
  'error',
] as const;
export type SandboxState = (typeof SANDBOX_STATES)[number];

/** States in which an operation is in flight; a crash can leave a row here, the reconciler finishes it. */
export const TRANSITIONAL_STATES: readonly SandboxState[] = ['creating', 'stopping', 'starting', 'pausing', 'resuming', 'deleting'];

export function isTransitional(state: SandboxState): boolean {
  return TRANSITIONAL_STATES.includes(state);
}

/** Columns an outcome sets to the time of its write. */
export type StampField = 'startedAt' | 'stoppedAt' | 'pausedAt' | 'deletedAt' | 'lastActivityAt';
/** Columns an outcome sets to null. */
export type ClearField = 'expiresAt' | 'errorMessage' | 'stopReason' | 'pauseReason' | 'pausedAt' | 'resumeReason';
/** Columns whose value the caller supplies with the outcome (a reason, a message, what the host said). */
export type GivenField = 'errorMessage' | 'stopReason' | 'pauseReason' | 'memoryRestored' | 'resumeReason';

/**
 * One result of an operation: the state it leaves and every column it writes besides the
 * operation columns (which every outcome clears: the operation is over). Columns not named are
 * left as they are.
 */
export interface Outcome {
  to: SandboxState;
  stamp?: readonly StampField[];
  clear?: readonly ClearField[];
  given?: readonly GivenField[];
  /** expiresAt := the sandbox's timeout counted from the write (none when the timeout is 0). */
  startsTimeout?: boolean;
  /** Constant values of this outcome. */
  fixed?: { memoryRestored?: boolean };
}

/**
 * What the reconciler learns from the host about the sandbox of an interrupted operation:
 * its runtime status, `absent` (the host does not know it) or `unreachable`.
 */
export const HOST_VIEWS = ['running', 'paused', 'stopped', 'absent', 'unreachable'] as const;
export type HostView = (typeof HOST_VIEWS)[number];

export const OPERATION_NAMES = ['create', 'fork', 'start', 'stop', 'pause', 'unpause', 'delete'] as const;
export type OperationName = (typeof OPERATION_NAMES)[number];

/**
 * An operation moves a sandbox from one of `from` (none: the row is inserted) through `via`
 * (persisted while the host works) to one of its outcomes.
 */
export interface Operation {
  name: OperationName;
  from: readonly SandboxState[];
  via: SandboxState;
  /** The host did it. */
  succeeded: Outcome;
  /** The host reported a failure (for create and fork: and could not remove what it built). */
  failed: Outcome;
  /** create and fork: the host removed what it built after a failure, so nothing is left. */
  rolledBack?: Outcome;
  /**
   * The owning control plane died mid-operation. `finish`: the reconciler runs the host call
   * again (stop and delete are safe to repeat). Otherwise the row settles by what the host reports.
   */
  takeover: 'finish' | Readonly<Record<HostView, Outcome>>;
}

export type OutcomeKind = 'succeeded' | 'failed' | 'rolledBack';

/** An interrupted operation the host cannot account for: the user sees why and may start or delete it. */
const INTERRUPTED: Outcome = { to: 'error', given: ['errorMessage'] };

const created: Outcome = { to: 'running', stamp: ['startedAt'], startsTimeout: true };
const createTakeover: Record<HostView, Outcome> = {
  running: created,
  // Nothing pauses a sandbox that is being created: the host's answer cannot be trusted.
  paused: INTERRUPTED,
  stopped: INTERRUPTED,
  absent: INTERRUPTED,
  unreachable: INTERRUPTED,
};

// Start = a stopped (or errored) sandbox boots again from its kept disk.
const started: Outcome = { to: 'running', stamp: ['startedAt', 'lastActivityAt'], startsTimeout: true, clear: ['errorMessage', 'stopReason'] };
// Unpause = a paused sandbox thaws; its timeout kept running while paused, so it is not restarted.
const unpaused: Outcome = { to: 'running', stamp: ['lastActivityAt'], clear: ['pausedAt', 'pauseReason', 'resumeReason'], fixed: { memoryRestored: true } };
const paused: Outcome = { to: 'paused', stamp: ['pausedAt'], given: ['pauseReason'] };

export const OPERATIONS = {
  create: {
    name: 'create',
    from: [],
    via: 'creating',
    succeeded: created,
    failed: INTERRUPTED,
    rolledBack: { to: 'deleted', stamp: ['deletedAt'], given: ['errorMessage'] },
    takeover: createTakeover,
  },
  fork: {
    name: 'fork',
    from: [],
    via: 'creating',
    succeeded: { ...created, given: ['memoryRestored', 'resumeReason'] },
    failed: INTERRUPTED,
    rolledBack: { to: 'deleted', stamp: ['deletedAt'], given: ['errorMessage'] },
    // Whether the memory came along is not known after a crash; those columns stay unset.
    takeover: createTakeover,
  },
  start: {
    name: 'start',
    from: ['stopped', 'error'],
    via: 'starting',
    succeeded: { ...started, given: ['memoryRestored', 'resumeReason'] },
    // A failed start leaves the kept disk usable, so it falls back to stopped (with a message).
    failed: { to: 'stopped', given: ['errorMessage'] },
    takeover: {
      running: started,
      paused: INTERRUPTED,
      // The host has it but did not boot it: the disk is there, as after a failed start.
      stopped: { to: 'stopped', given: ['errorMessage'] },
      absent: INTERRUPTED,
      unreachable: INTERRUPTED,
    },
  },
  stop: {
    name: 'stop',
    from: ['running', 'paused'],
    via: 'stopping',
    succeeded: { to: 'stopped', stamp: ['stoppedAt'], clear: ['expiresAt', 'pauseReason', 'pausedAt', 'errorMessage'], given: ['stopReason'] },
    failed: INTERRUPTED,
    takeover: 'finish',
  },
  pause: {
    name: 'pause',
    from: ['running'],
    via: 'pausing',
    // The timeout keeps running while paused: a paused sandbox still holds its memory.
    succeeded: paused,
    failed: { to: 'running', given: ['errorMessage'] },
    takeover: {
      paused,
      // The pause did not happen: the sandbox is as it was, clock included.
      running: { to: 'running' },
      stopped: INTERRUPTED,
      absent: INTERRUPTED,
      unreachable: INTERRUPTED,
    },
  },
  unpause: {
    name: 'unpause',
    from: ['paused'],
    via: 'resuming',
    succeeded: unpaused,
    failed: { to: 'paused', given: ['errorMessage'] },
    takeover: {
      running: unpaused,
      // The unpause did not happen: still paused since it was paused, for the same reason.
      paused: { to: 'paused' },
      stopped: INTERRUPTED,
      absent: INTERRUPTED,
      unreachable: INTERRUPTED,
    },
  },
  delete: {
    name: 'delete',
    from: ['running', 'stopped', 'paused', 'error', 'creating'],
    via: 'deleting',
    succeeded: { to: 'deleted', stamp: ['deletedAt'], clear: ['expiresAt'] },
    failed: INTERRUPTED,
    takeover: 'finish',
  },
} as const satisfies Record<OperationName, Operation>;

/** Something that happens to a settled sandbox outside any operation. */
export interface SandboxEvent {
  name: string;
  from: readonly SandboxState[];
  outcome: Outcome;
}

export const EVENTS = {
  /** The host no longer runs a sandbox the database calls running or paused (see HostService). */
  vanished: { name: 'vanished', from: ['running', 'paused'], outcome: { to: 'error', stamp: ['stoppedAt'], clear: ['expiresAt'], given: ['errorMessage'] } },
  /**
   * Its host missed heartbeats for the grace period (HostService.markLostHosts): every sandbox
   * that ran there or had an operation in flight there becomes `error`, stopReason `host_lost`,
   * in one UPDATE. An operation in flight loses its row (its outcome's compare-and-set fails).
   */
  hostLost: { name: 'host_lost', from: ['running', 'paused', ...TRANSITIONAL_STATES], outcome: { to: 'error', stamp: ['stoppedAt'], clear: ['expiresAt'], given: ['errorMessage', 'stopReason'] } },
  /** The lost host heartbeats again and still runs it: adopted back, its timeout counted from now. */
  hostReturnedRunning: { name: 'host_returned', from: ['error'], outcome: { to: 'running', stamp: ['lastActivityAt'], clear: ['errorMessage', 'stopReason'], startsTimeout: true } },
  /** The same for one the host kept paused (memory kept): paused again, as it was. */
  hostReturnedPaused: { name: 'host_returned', from: ['error'], outcome: { to: 'paused', clear: ['errorMessage', 'stopReason'], startsTimeout: true } },
} as const satisfies Record<string, SandboxEvent>;

/** Every outcome of `op`, with what it is called (for checks and tests). */
export function outcomesOf(op: Operation): { kind: string; outcome: Outcome }[] {
  const out: { kind: string; outcome: Outcome }[] = [{ kind: 'succeeded', outcome: op.succeeded }, { kind: 'failed', outcome: op.failed }];
  if (op.rolledBack) out.push({ kind: 'rolledBack', outcome: op.rolledBack });
  if (op.takeover !== 'finish') for (const view of HOST_VIEWS) out.push({ kind: `takeover:${view}`, outcome: op.takeover[view] });
  return out;
}

const ALL_OPERATIONS: readonly Operation[] = Object.values(OPERATIONS);

/** The transition table, derived: a transition exists because an operation or event makes it. */
const TRANSITIONS: Record<SandboxState, ReadonlySet<SandboxState>> = (() => {
  const table = Object.fromEntries(SANDBOX_STATES.map((s) => [s, new Set<SandboxState>()])) as Record<SandboxState, Set<SandboxState>>;
  for (const op of ALL_OPERATIONS) {
    for (const from of op.from) table[from].add(op.via);
    for (const { outcome } of outcomesOf(op)) table[op.via].add(outcome.to);
  }
  for (const event of Object.values(EVENTS) as SandboxEvent[]) for (const from of event.from) table[from].add(event.outcome.to);
  return table;
})();

export function canTransition(from: SandboxState, to: SandboxState): boolean {
  return TRANSITIONS[from].has(to);
}

/** The states a row may be in for a write of `to` to be a transition the table allows. */
export function statesLeadingTo(to: SandboxState): SandboxState[] {
  return SANDBOX_STATES.filter((from) => canTransition(from, to));
}

/**
 * The operation a row in the transitional `state` is running. The state decides (only create
 * and fork share one, `creating`); the stored name only tells those two apart, so rows written
 * under an older name are still recognised.
 */
export function operationInFlight(state: SandboxState, storedName: string | null): Operation | undefined {
  if (state === 'creating') return storedName === 'fork' ? OPERATIONS.fork : OPERATIONS.create;
  return ALL_OPERATIONS.find((op) => op.via === state);
}

/** Throws the typed state conflict (409 carrying current and wanted states) when `op` cannot start. */
export function assertCanBegin(op: Operation, sandboxId: string, current: SandboxState): void {
  if (!op.from.includes(current)) {
    throw errors.invalidState('sandbox', sandboxId, current, op.from, op.name);
  }
}

/** Throws unless the sandbox is running: exec and file operations need a live guest agent. */
export function assertRunning(sandboxId: string, current: SandboxState, operation: string): void {
  if (current !== 'running') throw errors.invalidState('sandbox', sandboxId, current, ['running'], operation);
}

// Sanity checks of the table at load time.
for (const op of ALL_OPERATIONS) {
  if (!isTransitional(op.via)) throw new Error(`state table: ${op.name} runs in ${op.via}, which is not transitional`);
  if ((op.from.length === 0) !== (op.rolledBack !== undefined)) throw new Error(`state table: only inserted operations (create, fork) roll back`);
  for (const { kind, outcome } of outcomesOf(op)) {
    if (isTransitional(outcome.to)) throw new Error(`state table: ${op.name} ${kind} ends in ${outcome.to}, which is transitional`);
    const stamped = new Set<string>(outcome.stamp ?? []);
    for (const field of [...(outcome.clear ?? []), ...(outcome.given ?? []), ...Object.keys(outcome.fixed ?? {})]) {
      if (stamped.has(field)) throw new Error(`state table: ${op.name} ${kind} writes ${field} twice`);
      stamped.add(field);
    }
    if (outcome.startsTimeout && stamped.has('expiresAt')) throw new Error(`state table: ${op.name} ${kind} writes expiresAt twice`);
  }
}
for (const s of TRANSITIONAL_STATES) {
  if (!ALL_OPERATIONS.some((op) => op.via === s)) throw new Error(`state table: no operation runs in ${s}`);
}
