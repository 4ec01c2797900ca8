// The lifecycle engine and the state table it reads: every allowed and every refused transition,
// what each outcome writes, and the repository's refusal of writes outside the table, against
// real PostgreSQL and PGlite.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, type Db } from './store/db.js';
import { sandboxRepository } from './store/repositories/sandboxes.js';
import { organizationRepository } from './store/repositories/organizations.js';
import { hostRepository } from './store/repositories/hosts.js';
import { applyEvent, hostViewOf, Lifecycle, outcomePatch, timeoutDeadline, type OutcomeFacts } from './lifecycle.js';
import {
  canTransition,
  EVENTS,
  HOST_VIEWS,
  OPERATIONS,
  operationInFlight,
  outcomesOf,
  SANDBOX_STATES,
  statesLeadingTo,
  TRANSITIONAL_STATES,
  type Operation,
  type Outcome,
  type SandboxState,
} from './state-machine.js';
import type { Sandbox } from './types.js';
import { DB_BACKENDS } from './store/test-support.js';
import { SandboxStateEvents, type SandboxStateChange } from './sandbox-events.js';

/** Written out by hand: a change to the table has to change this list too. */
const ALLOWED: Record<SandboxState, SandboxState[]> = {
  creating: ['running', 'error', 'deleted', 'deleting'],
  running: ['stopping', 'pausing', 'deleting', 'error'],
  stopping: ['stopped', 'error'],
  starting: ['running', 'stopped', 'error'],
  stopped: ['starting', 'deleting'],
  pausing: ['paused', 'running', 'error'],
  paused: ['resuming', 'stopping', 'deleting', 'error'],
  resuming: ['running', 'paused', 'error'],
  deleting: ['deleted', 'error'],
  deleted: [],
  // running and paused: a lost host returns with the sandbox (EVENTS.hostReturned*).
  error: ['starting', 'deleting', 'running', 'paused'],
};

const PAIRS = SANDBOX_STATES.flatMap((from) => SANDBOX_STATES.filter((to) => to !== from).map((to) => ({ from, to, allowed: ALLOWED[from].includes(to) })));
const ALL_OPERATIONS = Object.values(OPERATIONS) as Operation[];
const OPERATION_COLUMNS = ['operation', 'operationId', 'operationOwner', 'operationStartedAt'] as const;

const SAMPLE_FACTS: Required<OutcomeFacts> = { errorMessage: 'it broke', stopReason: 'timeout', pauseReason: 'idle', memoryRestored: false, resumeReason: 'driver_has_no_memory_snapshot' };
const factsFor = (outcome: Outcome): OutcomeFacts => Object.fromEntries((outcome.given ?? []).map((f) => [f, SAMPLE_FACTS[f]]));

describe('the state table', () => {
  it.each(PAIRS)('$from → $to allowed: $allowed', ({ from, to, allowed }) => {
    expect(canTransition(from, to)).toBe(allowed);
    expect(statesLeadingTo(to).includes(from)).toBe(allowed);
  });

  it('names an operation for every transitional state, recognising rows an older release wrote', () => {
    for (const state of TRANSITIONAL_STATES) expect(operationInFlight(state, null)?.via).toBe(state);
    expect(operationInFlight('creating', 'fork')).toBe(OPERATIONS.fork);
    expect(operationInFlight('creating', 'create')).toBe(OPERATIONS.create);
    // `resume` was the name of start; the state decides.
    expect(operationInFlight('starting', 'resume')).toBe(OPERATIONS.start);
    expect(operationInFlight('running', null)).toBeUndefined();
    expect(OPERATIONS.start.name).toBe('start');
  });

  it('has the outcomes the lifecycle relies on', () => {
    const to = (op: Operation, kind: string) => outcomesOf(op).find((o) => o.kind === kind)?.outcome.to;
    expect(to(OPERATIONS.create, 'rolledBack')).toBe('deleted');
    expect(to(OPERATIONS.create, 'failed')).toBe('error');
    expect(to(OPERATIONS.start, 'failed')).toBe('stopped');
    expect(to(OPERATIONS.pause, 'failed')).toBe('running');
    expect(to(OPERATIONS.unpause, 'failed')).toBe('paused');
    expect(to(OPERATIONS.stop, 'failed')).toBe('error');
    expect(to(OPERATIONS.delete, 'failed')).toBe('error');
    expect(OPERATIONS.stop.takeover).toBe('finish');
    expect(OPERATIONS.delete.takeover).toBe('finish');
    // A create or start the host shows paused is not something either can produce.
    expect(to(OPERATIONS.create, 'takeover:paused')).toBe('error');
    expect(to(OPERATIONS.start, 'takeover:paused')).toBe('error');
    expect(to(OPERATIONS.start, 'takeover:stopped')).toBe('stopped');
    expect(to(OPERATIONS.pause, 'takeover:running')).toBe('running');
    expect(to(OPERATIONS.unpause, 'takeover:paused')).toBe('paused');
  });
});

describe('what each outcome writes', () => {
  const now = new Date('2026-12-01T12:00:00Z');
  const cases = [
    ...ALL_OPERATIONS.flatMap((op) => outcomesOf(op).map(({ kind, outcome }) => ({ name: `${op.name} ${kind}`, outcome }))),
    ...Object.values(EVENTS).map((e) => ({ name: `event ${e.name}`, outcome: e.outcome as Outcome })),
  ];

  it.each(cases)('$name', ({ outcome }) => {
    const facts = factsFor(outcome);
    const patch = outcomePatch(outcome, { timeoutSeconds: 60 }, facts, now);
    const expected: Record<string, unknown> = { state: outcome.to };
    for (const c of OPERATION_COLUMNS) expected[c] = null;
    for (const c of outcome.clear ?? []) expected[c] = null;
    for (const c of outcome.stamp ?? []) expected[c] = now;
    if (outcome.startsTimeout) expected.expiresAt = new Date(now.getTime() + 60_000);
    Object.assign(expected, outcome.fixed, facts);
    // Exactly these columns: nothing the table does not name is written.
    expect(patch).toEqual(expected);
    if (outcome.startsTimeout) expect(outcomePatch(outcome, { timeoutSeconds: 0 }, facts, now).expiresAt).toBeNull();
    // Facts are exactly the outcome's `given` columns.
    for (const missing of outcome.given ?? []) {
      const { [missing]: _, ...rest } = facts;
      expect(() => outcomePatch(outcome, { timeoutSeconds: 60 }, rest, now)).toThrow(/needs/);
    }
    const extra = (Object.keys(SAMPLE_FACTS) as (keyof OutcomeFacts)[]).find((f) => !(outcome.given ?? []).includes(f as never));
    if (extra) expect(() => outcomePatch(outcome, { timeoutSeconds: 60 }, { ...facts, [extra]: SAMPLE_FACTS[extra] }, now)).toThrow(/does not take/);
  });

  it('settles the drift of the old takeover copies', () => {
    const unpauseAdopted = outcomePatch(OPERATIONS.unpause.takeover.running, { timeoutSeconds: 60 }, {}, now);
    expect(unpauseAdopted).toMatchObject({ state: 'running', pausedAt: null, pauseReason: null, memoryRestored: true });
    expect(unpauseAdopted).not.toHaveProperty('expiresAt'); // the timeout kept running while paused
    expect(unpauseAdopted).toEqual(outcomePatch(OPERATIONS.unpause.succeeded, { timeoutSeconds: 60 }, {}, now));
    const pauseUndone = outcomePatch(OPERATIONS.pause.takeover.running, { timeoutSeconds: 60 }, {}, now);
    expect(pauseUndone).not.toHaveProperty('expiresAt');
    expect(pauseUndone).not.toHaveProperty('startedAt');
    expect(outcomePatch(OPERATIONS.unpause.takeover.paused, { timeoutSeconds: 60 }, {}, now)).not.toHaveProperty('pausedAt');
    expect(outcomePatch(OPERATIONS.start.takeover.running, { timeoutSeconds: 60 }, {}, now)).toMatchObject({ state: 'running', stopReason: null, errorMessage: null, lastActivityAt: now, startedAt: now });
  });

  it('computes expiresAt one way', () => {
    const from = new Date('2026-12-01T12:00:00Z');
    expect(timeoutDeadline(0, from)).toBeNull();
    expect(timeoutDeadline(90, from)).toEqual(new Date('2026-12-01T12:01:30Z'));
    expect(hostViewOf(undefined)).toBe('absent');
    expect(hostViewOf({ status: 'paused' })).toBe('paused');
  });
});


describe.each(DB_BACKENDS)('lifecycle writes on %s', (_name, open) => {
  let db: Db;
  let cleanup: () => Promise<void>;
  let lifecycle: Lifecycle;
  let seq = 0;
  beforeAll(async () => {
    ({ db, cleanup } = await open());
    await migrateToLatest(db);
    await organizationRepository(db).insert({ id: 'orga', name: 'a' });
    await hostRepository(db).upsertHeartbeat({ id: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
    lifecycle = new Lifecycle(db, 'cp-test');
  });
  afterAll(async () => cleanup());

  const insert = (op: typeof OPERATIONS.create | typeof OPERATIONS.fork = OPERATIONS.create) => {
    const id = `lc${++seq}`;
    return lifecycle.insert(db, op, `op-${id}`, { id, organizationId: 'orga', hostId: 'h1', image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, diskGiB: 1 });
  };
  /** Put a row in `state` directly, as a crash or an older release could have left it. */
  const force = async (id: string, state: SandboxState, columns: Record<string, unknown> = {}): Promise<Sandbox> => {
    await db('sandboxes').where({ id }).update({ state, ...columns });
    return (await sandboxRepository(db).findById(id))!;
  };

  it('the repository writes exactly the transitions the table allows (transition, update and claim)', async () => {
    const repo = sandboxRepository(db);
    const { id } = await insert();
    for (const { from, to, allowed } of PAIRS) {
      await force(id, from);
      const viaTransition = repo.transition(id, [from], { state: to });
      if (allowed) expect((await viaTransition)?.state, `${from} → ${to}`).toBe(to);
      else await expect(viaTransition, `${from} → ${to}`).rejects.toThrow(/state table: sandbox \S+ cannot go/);
      if (!allowed) expect((await repo.findById(id))?.state).toBe(from);

      await force(id, from);
      const viaUpdate = repo.update(id, { state: to });
      if (allowed) expect((await viaUpdate)?.state).toBe(to);
      else await expect(viaUpdate).rejects.toThrow(/state table/);
      if (!allowed) expect((await repo.findById(id))?.state).toBe(from);
    }
    // A claim out of a state is checked against the table before it writes anything.
    await force(id, 'stopped');
    await expect(repo.claim({ state: 'stopped', where: (q) => q.where({ id }) }, 5, () => ({ state: 'running' }))).rejects.toThrow(/state table/);
    expect((await repo.findById(id))?.state).toBe('stopped');
    expect((await repo.claim({ state: 'stopped', where: (q) => q.where({ id }) }, 5, lifecycle.claimPatch(OPERATIONS.delete))).map((s) => s.state)).toEqual(['deleting']);
    // Columns other than the state are written from any state.
    expect((await repo.update(id, { labels: { a: 'b' } }))?.labels).toEqual({ a: 'b' });
  });

  it.each(ALL_OPERATIONS.flatMap((op) => (['succeeded', 'failed', 'rolledBack'] as const).filter((kind) => op[kind as 'succeeded']).map((kind) => ({ op, kind }))))(
    '$op.name $kind: begin, then the outcome as the table says',
    async ({ op, kind }) => {
      let sandbox = await insert(op === OPERATIONS.fork ? OPERATIONS.fork : OPERATIONS.create);
      let operationId = sandbox.operationId!;
      if (op.from.length > 0) {
        sandbox = await force(sandbox.id, op.from[0], { operation: null, operation_id: null, operation_owner: null });
        ({ sandbox, operationId } = await lifecycle.begin(sandbox, op));
      }
      expect(sandbox).toMatchObject({ state: op.via, operation: op.name, operationId, operationOwner: 'cp-test' });
      const outcome = op[kind]!;
      // A write under another operation id is a lost race: nothing changes.
      expect(await lifecycle.finish(sandbox, op, kind, 'op-someone-else', factsFor(outcome))).toBeUndefined();
      const done = await lifecycle.finish(sandbox, op, kind, operationId, factsFor(outcome));
      expect(done).toMatchObject({ state: outcome.to, operation: null, operationId: null, operationOwner: null, operationStartedAt: null });
      for (const c of outcome.stamp ?? []) expect(done![c]).toBeInstanceOf(Date);
      for (const c of outcome.clear ?? []) expect(done![c]).toBeNull();
      // Finished is finished: the same outcome again finds no operation to end.
      expect(await lifecycle.finish(sandbox, op, kind, operationId, factsFor(outcome))).toBeUndefined();
    },
  );

  it('refuses to begin an operation from a state it does not start from', async () => {
    const sandbox = await force((await insert()).id, 'running', { operation: null, operation_id: null });
    await expect(lifecycle.begin(sandbox, OPERATIONS.start)).rejects.toMatchObject({ code: 'invalid_state', details: { operation: 'start', wanted: ['stopped', 'error'] } });
    // Seen as stopped but stopped no longer: the compare-and-set loses and reports the real state.
    await expect(lifecycle.begin({ ...sandbox, state: 'stopped' }, OPERATIONS.start)).rejects.toMatchObject({ code: 'invalid_state', details: { state: 'running' } });
  });

  const takeovers = ALL_OPERATIONS.flatMap((op) => (op.takeover === 'finish' ? [] : HOST_VIEWS.map((view) => ({ op, view }))));
  it.each(takeovers)('takeover of $op.name when the host says $view', async ({ op, view }) => {
    const pausedAt = new Date(Date.now() - 60_000);
    const expiresAt = new Date(Date.now() + 600_000);
    const startedAt = new Date(Date.now() - 120_000);
    const orphan = await force((await insert()).id, op.via, {
      operation: op.name, operation_id: 'op-dead', operation_owner: 'cp-dead', paused_at: pausedAt, pause_reason: 'idle', expires_at: expiresAt, started_at: startedAt,
    });
    const adopted = await lifecycle.adopt(orphan);
    expect(adopted?.operation).toBe(op);
    expect(adopted?.sandbox).toMatchObject({ state: op.via, operationOwner: 'cp-test' });
    // Re-owned under a new id: the dead owner's id no longer writes, and nobody adopts it twice.
    expect(await lifecycle.adopt(orphan)).toBeUndefined();
    const settled = await lifecycle.settle(adopted!.sandbox, op, view, adopted!.operationId, 'interrupted');
    const outcome = (op.takeover as Record<string, Outcome>)[view];
    expect(settled).toMatchObject({ state: outcome.to, operation: null, operationId: null });
    if ((outcome.given ?? []).includes('errorMessage')) expect(settled!.errorMessage).toBe('interrupted');
    if (op === OPERATIONS.unpause && view === 'running') expect(settled).toMatchObject({ pausedAt: null, pauseReason: null, expiresAt, memoryRestored: true });
    if (op === OPERATIONS.unpause && view === 'paused') expect(settled).toMatchObject({ pausedAt, pauseReason: 'idle', expiresAt });
    if (op === OPERATIONS.pause && view === 'running') expect(settled).toMatchObject({ expiresAt, startedAt });
    if (op === OPERATIONS.pause && view === 'paused') expect(settled!.pauseReason).toBe('idle');
    // An adopted create or start runs from now: its timeout counts from the adoption.
    if ((op === OPERATIONS.create || op === OPERATIONS.start) && view === 'running') expect(settled!.expiresAt!.getTime()).toBe(settled!.startedAt!.getTime() + 60_000);
  });

  it('adopts a start an older control plane recorded as "resume"', async () => {
    const orphan = await force((await insert()).id, 'starting', { operation: 'resume', operation_id: 'op-old', operation_owner: 'cp-old' });
    expect(orphan.operation).toBe('start');
    const adopted = await lifecycle.adopt(orphan);
    expect(adopted?.operation).toBe(OPERATIONS.start);
    expect((await lifecycle.settle(adopted!.sandbox, OPERATIONS.start, 'stopped', adopted!.operationId, 'interrupted'))?.state).toBe('stopped');
  });

  it('lets exactly one of two reconcilers adopt an orphan', async () => {
    const orphan = await force((await insert()).id, 'pausing', { operation: 'pause', operation_id: 'op-dead2', operation_owner: 'cp-dead' });
    const other = new Lifecycle(db, 'cp-other');
    const results = await Promise.all([lifecycle.adopt(orphan), other.adopt(orphan)]);
    expect(results.filter(Boolean)).toHaveLength(1);
  });

  it('records a vanished sandbox as error, only from the states the event has', async () => {
    const running = await force((await insert()).id, 'running', { operation: null, operation_id: null, expires_at: new Date(Date.now() + 60_000) });
    const vanished = await applyEvent(db, running, EVENTS.vanished, { errorMessage: 'gone' });
    expect(vanished).toMatchObject({ state: 'error', errorMessage: 'gone', expiresAt: null });
    expect(vanished!.stoppedAt).toBeInstanceOf(Date);
    await expect(applyEvent(db, vanished!, EVENTS.vanished, { errorMessage: 'gone' })).rejects.toThrow(/does not happen/);
    // Moved on since it was read: the compare-and-set writes nothing.
    const stopped = await force((await insert()).id, 'stopped', { operation: null, operation_id: null });
    expect(await applyEvent(db, { ...stopped, state: 'running' }, EVENTS.vanished, { errorMessage: 'gone' })).toBeUndefined();
    expect((await sandboxRepository(db).findById(stopped.id))?.state).toBe('stopped');
  });
});

describe.each(DB_BACKENDS)('state changes published by the engine on %s', (_name, open) => {
  let db: Db;
  let cleanup: () => Promise<void>;
  let seq = 0;
  const events = new SandboxStateEvents();
  const seen: SandboxStateChange[] = [];
  events.subscribe((c) => seen.push(c));
  let lifecycle: Lifecycle;
  beforeAll(async () => {
    ({ db, cleanup } = await open());
    await migrateToLatest(db);
    await organizationRepository(db).insert({ id: 'orgb', name: 'b' });
    await hostRepository(db).upsertHeartbeat({ id: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
    lifecycle = new Lifecycle(db, 'cp-events', events);
  });
  afterAll(async () => cleanup());
  const row = () => ({ id: `ev${++seq}`, organizationId: 'orgb', hostId: 'h1', image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, diskGiB: 1 });

  it('publishes a new row after its transaction commits and never when it rolls back', async () => {
    seen.length = 0;
    const kept = row();
    await db.transaction(async (tx) => {
      await lifecycle.insert(tx, OPERATIONS.create, `op-${kept.id}`, kept);
      expect(seen).toEqual([]);
    });
    expect(seen.map((c) => [c.kind, c.sandbox.id, c.oldState, c.newState])).toEqual([['created', kept.id, null, 'creating']]);
    seen.length = 0;
    const dropped = row();
    await db.transaction(async (tx) => {
      await lifecycle.insert(tx, OPERATIONS.create, `op-${dropped.id}`, dropped);
      throw new Error('roll back');
    }).catch(() => undefined);
    await new Promise((r) => setImmediate(r));
    expect(seen).toEqual([]);
  });

  it('publishes begin, finish and events with the state before and after; a lost compare-and-set publishes nothing', async () => {
    const r = row();
    const created = await lifecycle.insert(db, OPERATIONS.create, `op-${r.id}`, r);
    seen.length = 0;
    const running = (await lifecycle.finish(created, OPERATIONS.create, 'succeeded', `op-${r.id}`))!;
    const { operationId } = await lifecycle.begin(running, OPERATIONS.stop);
    expect(await lifecycle.finish(running, OPERATIONS.stop, 'succeeded', 'not-the-operation', { stopReason: 'user' })).toBeUndefined();
    await lifecycle.finish(running, OPERATIONS.stop, 'succeeded', operationId, { stopReason: 'user' });
    expect(seen.map((c) => [c.kind, c.oldState, c.newState, c.sandbox.state])).toEqual([
      ['state', 'creating', 'running', 'running'],
      ['state', 'running', 'stopping', 'stopping'],
      ['state', 'stopping', 'stopped', 'stopped'],
    ]);
    seen.length = 0;
    const other = row();
    const live = (await lifecycle.finish(await lifecycle.insert(db, OPERATIONS.create, `op-${other.id}`, other), OPERATIONS.create, 'succeeded', `op-${other.id}`))!;
    seen.length = 0;
    await applyEvent(db, live, EVENTS.vanished, { errorMessage: 'gone' }, events);
    expect(seen.map((c) => [c.oldState, c.newState])).toEqual([['running', 'error']]);
  });
});
