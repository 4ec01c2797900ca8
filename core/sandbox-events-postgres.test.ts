// Two control-plane instances on one PostgreSQL database: a state one of them writes reaches the
// other's subscribers (NOTIFY in the writing transaction, LISTEN per instance), once, and a
// rolled-back write reaches nobody.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase } from '../test/harness.js';
import { migrateToLatest, openDatabase, type Db } from './store/db.js';
import { organizationRepository } from './store/repositories/organizations.js';
import { hostRepository } from './store/repositories/hosts.js';
import { Lifecycle } from './lifecycle.js';
import { OPERATIONS } from './state-machine.js';
import { SandboxStateEvents, type SandboxStateChange } from './sandbox-events.js';
import { PostgresStateFanOut } from './sandbox-events-postgres.js';
import { silentLogger } from './logger.js';

interface Instance {
  db: Db;
  events: SandboxStateEvents;
  seen: SandboxStateChange[];
  fanOut: PostgresStateFanOut;
  lifecycle: Lifecycle;
}

describe('sandbox state changes across instances sharing PostgreSQL', () => {
  let drop: () => Promise<void>;
  let a: Instance;
  let b: Instance;
  let seq = 0;
  const row = () => ({ id: `fan${++seq}`, organizationId: 'orgf', hostId: 'h1', image: 'default', cpu: 1, memoryMiB: 256, env: {}, labels: {}, timeoutSeconds: 60, diskGiB: 1 });

  beforeAll(async () => {
    const t = await createTestDatabase();
    drop = t.drop;
    const start = async (instanceId: string): Promise<Instance> => {
      const db = openDatabase({ kind: 'postgres', url: t.url });
      const events = new SandboxStateEvents();
      const seen: SandboxStateChange[] = [];
      events.subscribe((c) => seen.push(c));
      const fanOut = new PostgresStateFanOut(t.url, db, events, instanceId, silentLogger);
      await fanOut.start();
      return { db, events, seen, fanOut, lifecycle: new Lifecycle(db, instanceId, events) };
    };
    a = await start('cp-a');
    await migrateToLatest(a.db);
    await organizationRepository(a.db).insert({ id: 'orgf', name: 'f' });
    await hostRepository(a.db).upsertHeartbeat({ id: 'h1', url: 'http://127.0.0.1:1', driver: 'local', capabilities: {} }, new Date());
    b = await start('cp-b');
  });
  afterAll(async () => {
    for (const i of [a, b]) {
      await i?.fanOut.stop();
      await i?.db.destroy();
    }
    await drop?.();
  });

  /** Bounded wait for the other instance's notification. */
  const until = async (what: string, test: () => boolean) => {
    for (let i = 0; i < 200 && !test(); i++) await new Promise((r) => setTimeout(r, 50));
    if (!test()) throw new Error(`timed out waiting for ${what}`);
  };

  it('carries a committed create and state change to the other instance, once each, with the row', async () => {
    a.seen.length = 0;
    b.seen.length = 0;
    const r = row();
    const created = await a.db.transaction((tx) => a.lifecycle.insert(tx, OPERATIONS.create, `op-${r.id}`, r));
    await a.lifecycle.finish(created, OPERATIONS.create, 'succeeded', `op-${r.id}`);
    await until('both changes on b', () => b.seen.length >= 2);
    expect(b.seen.map((c) => [c.kind, c.sandbox.id, c.oldState, c.newState])).toEqual([
      ['created', r.id, null, 'creating'],
      ['state', r.id, 'creating', 'running'],
    ]);
    expect(b.seen[1].sandbox.organizationId).toBe('orgf');
    // The writer published them itself and skips its own notices.
    await new Promise((res) => setTimeout(res, 300));
    expect(a.seen.map((c) => c.newState)).toEqual(['creating', 'running']);
  });

  it('carries nothing of a rolled-back write', async () => {
    b.seen.length = 0;
    const r = row();
    await a.db.transaction(async (tx) => {
      await a.lifecycle.insert(tx, OPERATIONS.create, `op-${r.id}`, r);
      throw new Error('roll back');
    }).catch(() => undefined);
    // A later committed write is seen: anything from the rolled-back one would have come first.
    const later = row();
    await a.lifecycle.insert(a.db, OPERATIONS.create, `op-${later.id}`, later);
    await until('the later create on b', () => b.seen.some((c) => c.sandbox.id === later.id));
    expect(b.seen.map((c) => c.sandbox.id)).toEqual([later.id]);
  });
});
