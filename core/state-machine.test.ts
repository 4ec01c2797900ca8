import { describe, expect, it } from 'vitest';
import { NestboxError } from './errors.js';
import { assertCanBegin, assertRunning, canTransition, isTransitional, OPERATIONS, SANDBOX_STATES } from './state-machine.js';

describe('sandbox state machine', () => {
  it('allows the documented lifecycle and nothing out of deleted', () => {
    expect(canTransition('creating', 'running')).toBe(true);
    expect(canTransition('running', 'stopping')).toBe(true);
    expect(canTransition('stopping', 'stopped')).toBe(true);
    expect(canTransition('stopped', 'starting')).toBe(true);
    expect(canTransition('starting', 'running')).toBe(true);
    expect(canTransition('running', 'pausing')).toBe(true);
    expect(canTransition('paused', 'resuming')).toBe(true);
    for (const s of SANDBOX_STATES) expect(canTransition('deleted', s)).toBe(false);
    expect(canTransition('stopped', 'running')).toBe(false);
    expect(canTransition('running', 'stopped')).toBe(false);
  });

  it('marks in-flight states as transitional', () => {
    expect(SANDBOX_STATES.filter(isTransitional).sort()).toEqual(['creating', 'deleting', 'pausing', 'resuming', 'starting', 'stopping']);
  });

  it('refuses an operation from the wrong state with a 409 that carries current and wanted states', () => {
    try {
      assertCanBegin(OPERATIONS.start, 'abc', 'running');
      expect.unreachable();
    } catch (err) {
      expect(err).toBeInstanceOf(NestboxError);
      const e = err as NestboxError;
      expect(e.status).toBe(409);
      expect(e.code).toBe('invalid_state');
      expect(e.details).toMatchObject({ state: 'running', wanted: ['stopped', 'error'] });
    }
    expect(() => assertCanBegin(OPERATIONS.stop, 'abc', 'running')).not.toThrow();
  });

  it('exec needs a running sandbox', () => {
    expect(() => assertRunning('abc', 'stopped', 'run a command in')).toThrow(/it is stopped/);
    expect(() => assertRunning('abc', 'running', 'run a command in')).not.toThrow();
  });
});
