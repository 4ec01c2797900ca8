// Takeover of pauses, unpauses and starts whose control plane died, against real sandboxes: each
// row settles as the state table's takeover column says for what the host reports.
// (background.test.ts covers interrupted creates, stops and deletes.)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t?.close();
});

const api = '/api/v1/sandboxes';
const get = async (id: string) => (await t.http.get(`${api}/${id}`).set(t.auth)).body;
const post = async (id: string, verb: string) => {
  const res = await t.http.post(`${api}/${id}/${verb}`).set(t.auth);
  expect(res.status, `${verb}: ${JSON.stringify(res.body)}`).toBe(200);
  return res.body;
};
const row = async (id: string) => t.server.db('sandboxes').where({ id }).first();
/** What a kill -9 in the middle of an operation leaves: a transitional row owned by a dead instance. */
const orphan = (id: string, state: string, operation: string, extra: Record<string, unknown> = {}) =>
  t.server.db('sandboxes').where({ id }).update({ state, operation, operation_id: `op-dead-${id}`, operation_owner: 'cp-dead', operation_started_at: new Date(), ...extra });
const settled = (id: string) => waitFor(`sandbox ${id} to settle`, async () => {
  const r = await row(id);
  return r && r.operation_owner !== 'cp-dead' && r.operation === null ? r : undefined;
}, 30_000);

describe('takeover of interrupted pauses, unpauses and starts', () => {
  const ids: Record<string, string> = {};

  it('sets up sandboxes in the states the host will report', async () => {
    for (const name of ['stillPaused', 'unpaused', 'stopped', 'notPaused']) {
      const res = await t.http.post(api).set(t.auth).send({ timeoutSeconds: 600 });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
      ids[name] = res.body.id;
    }
    await post(ids.stillPaused, 'pause');
    await post(ids.unpaused, 'pause');
    await post(ids.unpaused, 'unpause');
    await post(ids.stopped, 'stop');
  });

  it('an unpause the host never did leaves the sandbox paused as it was', async () => {
    const before = await row(ids.stillPaused);
    await orphan(ids.stillPaused, 'resuming', 'unpause');
    const after = await settled(ids.stillPaused);
    expect(after.state).toBe('paused');
    expect(new Date(after.paused_at).getTime()).toBe(new Date(before.paused_at).getTime());
    expect(after.pause_reason).toBe('user');
    expect(new Date(after.expires_at).getTime()).toBe(new Date(before.expires_at).getTime());
  });

  it('an unpause the host did is adopted as running, no longer paused', async () => {
    const before = await row(ids.unpaused);
    // The crash came after the host thawed it and before the row said so.
    await orphan(ids.unpaused, 'resuming', 'unpause', { paused_at: new Date(), pause_reason: 'user' });
    const after = await settled(ids.unpaused);
    expect(after).toMatchObject({ state: 'running', paused_at: null, pause_reason: null, memory_restored: true });
    // The timeout kept running while it was paused, as after any unpause.
    expect(new Date(after.expires_at).getTime()).toBe(new Date(before.expires_at).getTime());
    expect((await t.http.post(`${api}/${ids.unpaused}/commands`).set(t.auth).send({ cmd: 'echo thawed' })).body.stdout).toBe('thawed\n');
  });

  it('a start recorded under its old name that the host never booted falls back to stopped, and starts again', async () => {
    await orphan(ids.stopped, 'starting', 'resume');
    const after = await settled(ids.stopped);
    expect(after.state).toBe('stopped');
    expect(after.error_message).toBe('the start operation was interrupted by a control-plane restart');
    expect((await post(ids.stopped, 'resume')).state).toBe('running');
  });

  it('a pause the host never did leaves the sandbox running with its clock as it was', async () => {
    const before = await row(ids.notPaused);
    await orphan(ids.notPaused, 'pausing', 'pause');
    const after = await settled(ids.notPaused);
    expect(after.state).toBe('running');
    expect(new Date(after.started_at).getTime()).toBe(new Date(before.started_at).getTime());
    expect(new Date(after.expires_at).getTime()).toBe(new Date(before.expires_at).getTime());
    expect((await get(ids.notPaused)).state).toBe('running');
  });
});
