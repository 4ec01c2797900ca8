// Server-side duties: timeouts, and taking over operations whose control plane died.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { residueOf, slotNamesOf, snapshotWithout } from './residue.js';

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t?.close();
});

const state = async (id: string) => (await t.http.get(`/api/v1/sandboxes/${id}`).set(t.auth)).body.state as string;

describe('background jobs', () => {
  it('stops a sandbox whose timeout passed, on its own', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 1 });
    expect(created.status).toBe(201);
    await waitFor('the timeout stop', async () => (await state(created.body.id)) === 'stopped', 30_000);
    const s = (await t.http.get(`/api/v1/sandboxes/${created.body.id}`).set(t.auth)).body;
    expect(s.expiresAt).toBeNull();
    expect(s.stoppedAt).not.toBeNull();
    // The processes are really gone: exec is refused by the host too.
    expect((await t.http.post(`/api/v1/sandboxes/${created.body.id}/commands`).set(t.auth).send({ cmd: 'true' })).status).toBe(409);
  });

  it('finishes operations left in flight by a dead control plane', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0 });
      expect(res.status).toBe(201);
      ids.push(res.body.id);
    }
    const [stopping, creating, deleting] = ids;
    const network = snapshotWithout(slotNamesOf(deleting, `${t.dataDir}/host`));
    // What a kill -9 in the middle of each request leaves: a transitional row owned by an
    // instance that no longer heartbeats.
    const orphan = (state: string, operation: string) => ({ state, operation, operation_id: `op-dead-${operation}`, operation_owner: 'cp-dead', operation_started_at: new Date() });
    await t.server.db('sandboxes').where({ id: stopping }).update(orphan('stopping', 'stop'));
    await t.server.db('sandboxes').where({ id: creating }).update(orphan('creating', 'create'));
    await t.server.db('sandboxes').where({ id: deleting }).update(orphan('deleting', 'delete'));

    await waitFor('reconciled rows', async () => {
      const rows = await t.server.db('sandboxes').whereIn('id', ids).select('id', 'state');
      return rows.every((r: { state: string }) => ['running', 'stopped', 'deleted', 'error'].includes(r.state)) ? rows : undefined;
    }, 30_000);
    const states = Object.fromEntries((await t.server.db('sandboxes').whereIn('id', ids).select('id', 'state')).map((r: { id: string; state: string }) => [r.id, r.state]));
    expect(states[stopping]).toBe('stopped');
    expect(states[creating]).toBe('running'); // the host runs it: adopted
    expect(states[deleting]).toBe('deleted');
    expect((await t.http.post(`/api/v1/sandboxes/${creating}/commands`).set(t.auth).send({ cmd: 'echo adopted' })).body.stdout).toBe('adopted\n');
    expect(residueOf(deleting, `${t.dataDir}/host`, network)).toEqual([]);
  });
});
