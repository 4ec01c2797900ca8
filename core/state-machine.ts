// The sandbox state machine: one transition table for all three APIs. Compat layers map their
// own state names onto these; nothing else decides what may follow what.
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

const TRANSITIONS: Record<SandboxState, readonly SandboxState[]> = {
  creating: ['running', 'error', 'deleting'],
  running: ['stopping', 'pausing', 'deleting', 'error'],
  stopping: ['stopped', 'error'],
  // A failed start leaves the kept disk usable, so it falls back to stopped (with a message).
  starting: ['running', 'stopped', 'error'],
  stopped: ['starting', 'deleting', 'error'],
  pausing: ['paused', 'running', 'error'],
  paused: ['resuming', 'stopping', 'deleting', 'error'],
  resuming: ['running', 'paused', 'error'],
  deleting: ['deleted', 'error'],
  deleted: [],
  // An errored sandbox can be retried from its disk or deleted; nothing else.
  error: ['starting', 'deleting'],
};

export function canTransition(from: SandboxState, to: SandboxState): boolean {
  return TRANSITIONS[from].includes(to);
}

export function isTransitional(state: SandboxState): boolean {
  return TRANSITIONAL_STATES.includes(state);
}

/**
 * An operation moves a sandbox from one of `from` through `via` (persisted while it runs)
 * to `to` on success. The table below is the single definition of what each API verb may do.
 */
export interface Operation {
  name: string;
  from: readonly SandboxState[];
  via: SandboxState;
  to: SandboxState;
  /** Where a failed operation leaves the sandbox when the host reports the failure cleanly. */
  onFailure: SandboxState;
}

export const OPERATIONS = {
  create: { name: 'create', from: [], via: 'creating', to: 'running', onFailure: 'error' },
  stop: { name: 'stop', from: ['running', 'paused'], via: 'stopping', to: 'stopped', onFailure: 'error' },
  start: { name: 'resume', from: ['stopped', 'error'], via: 'starting', to: 'running', onFailure: 'stopped' },
  delete: { name: 'delete', from: ['running', 'stopped', 'paused', 'error', 'creating'], via: 'deleting', to: 'deleted', onFailure: 'error' },
  pause: { name: 'pause', from: ['running'], via: 'pausing', to: 'paused', onFailure: 'running' },
  unpause: { name: 'unpause', from: ['paused'], via: 'resuming', to: 'running', onFailure: 'paused' },
} as const satisfies Record<string, Operation>;

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

// Sanity check of the table at load time: every operation's path must be allowed transitions.
for (const op of Object.values(OPERATIONS) as Operation[]) {
  for (const from of op.from) {
    if (!canTransition(from, op.via)) throw new Error(`state table: ${op.name} cannot go ${from} → ${op.via}`);
  }
  if (!canTransition(op.via, op.to)) throw new Error(`state table: ${op.name} cannot go ${op.via} → ${op.to}`);
  if (!canTransition(op.via, op.onFailure)) throw new Error(`state table: ${op.name} cannot fail ${op.via} → ${op.onFailure}`);
}
