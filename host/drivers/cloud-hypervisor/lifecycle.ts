// VM state transitions with the check Kata does after every call (host-runtime.md, rule 1):
// a call that "succeeded" but left the VM in another state than expected is a failure too, and
// a failed call is reported with CH's whole error chain plus the state vm.info shows afterwards.
import { ChApi, ChApiError, type VmState } from './api.js';

export class VmOperationError extends Error {
  constructor(
    readonly operation: string,
    message: string,
    /** CH's error chain, outermost first (empty when the failure was a state mismatch). */
    readonly chain: string[],
    /** What vm.info reported after the failure; `unreachable` = the VMM did not answer. */
    readonly observedState: VmState | 'unreachable' | undefined,
    readonly status?: number,
  ) {
    super(message);
    this.name = 'VmOperationError';
  }
}

/** vm.info's state, or `unreachable` when the VMM does not answer (crashed, socket gone). */
export async function observeState(api: ChApi): Promise<VmState | 'unreachable' | undefined> {
  try {
    return (await api.info()).state;
  } catch (error) {
    if (error instanceof ChApiError && error.unreachable) return 'unreachable';
    // 404 "VM is not created": the VMM runs but holds no VM.
    return undefined;
  }
}

/** Throws unless vm.info reports `expected`. */
export async function expectState(api: ChApi, expected: VmState, operation: string): Promise<void> {
  const observed = await observeState(api);
  if (observed !== expected) {
    throw new VmOperationError(operation, `after ${operation} the VM is ${observed ?? 'not created'}, expected ${expected}`, [], observed);
  }
}

/**
 * Runs one CH call and checks the state it must lead to. Any failure becomes a
 * VmOperationError carrying the chain and the observed state.
 */
export async function transition(api: ChApi, operation: string, call: () => Promise<unknown>, expected: VmState): Promise<void> {
  try {
    await call();
  } catch (error) {
    if (error instanceof ChApiError) {
      const observed = await observeState(api);
      throw new VmOperationError(operation, `${error.message} (VM now ${observed ?? 'not created'})`, error.chain, observed, error.status);
    }
    throw error;
  }
  await expectState(api, expected, operation);
}

/** The state a record should end up in for what vm.info says. */
export function runtimeStatusFor(state: VmState | 'unreachable' | undefined): 'running' | 'paused' | 'stopped' {
  if (state === 'Running') return 'running';
  if (state === 'Paused') return 'paused';
  return 'stopped';
}
