// Lifecycle events and webhooks (issue 17): events listed in order with a cursor, per
// organisation; sandbox logs; webhooks signed per Standard Webhooks received in order on a
// loopback receiver; retries with growing gaps; the SSRF policy at create and at delivery time.
// The kill -9 of the control plane during a delivery is in webhooks-crash.test.ts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { startReceiver, type Received } from './webhook-receiver.js';
import knexFactory from 'knex';
import { checkTarget, isPrivateAddress, newWebhookId, WebhookDispatcher, WebhookService } from '../core/services/webhooks.js';
import { EVENT_TYPES } from '../core/services/events.js';
import { Lifecycle } from '../core/lifecycle.js';
import { SandboxStateEvents } from '../core/sandbox-events.js';
import { OPERATIONS } from '../core/state-machine.js';
import { sandboxRepository } from '../core/store/repositories/sandboxes.js';
import { silentLogger } from '../core/logger.js';

const verify = (secret: string, r: Received) => new Webhook(secret).verify(r.body, r.headers as Record<string, string>) as { id: string; type: string; sandboxId: string };

let t: TestServer;
let otherOrg: { Authorization: string };

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true', NESTBOX_WEBHOOK_RETRY_SECONDS: '30', NESTBOX_WEBHOOK_TIMEOUT_MS: '5000' } });
  const org = await t.server.services.auth.createOrganization('events-other');
  const key = await t.server.services.auth.createApiKey(org.id, { name: 'other-admin', preset: 'admin' });
  otherOrg = { Authorization: `Bearer ${key.key}` };
}, 180_000);
afterAll(async () => {
  await t?.close();
});

async function lifecycle(): Promise<string> {
  const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ labels: { suite: 'events' }, egress: { mode: 'deny-all' } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  const id = created.body.id as string;
  expect((await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(t.auth)).status).toBe(200);
  expect((await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth)).status).toBe(204);
  return id;
}

const LIFECYCLE_TYPES = ['sandbox.creating', 'sandbox.created', 'sandbox.stopping', 'sandbox.stopped', 'sandbox.deleting', 'sandbox.deleted'];

describe('lifecycle events', () => {
  it('lists every state change of a sandbox in order, page by page with a cursor, and only to its organisation', async () => {
    const id = await lifecycle();
    const seen: { id: string; type: string; data: { oldState: string | null; newState: string; operation?: string } }[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 10; page++) {
      const res = await t.http.get('/api/v1/events').query({ sandboxId: id, limit: 2, ...(cursor ? { cursor } : {}) }).set(t.auth);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      expect(res.body.items.length).toBeLessThanOrEqual(2);
      seen.push(...res.body.items);
      cursor = res.body.nextCursor;
      if (!res.body.hasMore) break;
    }
    expect(seen.map((e) => e.type)).toEqual(LIFECYCLE_TYPES);
    expect(seen[0]!.data).toMatchObject({ oldState: null, newState: 'creating', operation: 'create' });
    expect(seen[3]!.data).toMatchObject({ oldState: 'stopping', newState: 'stopped', operation: 'stop', reason: 'user' });
    // Tailing: the last cursor gives nothing new, and keeps its place.
    const tail = await t.http.get('/api/v1/events').query({ sandboxId: id, cursor }).set(t.auth);
    expect(tail.body).toMatchObject({ items: [], nextCursor: cursor, hasMore: false });
    // A type filter.
    const deleted = await t.http.get('/api/v1/events').query({ sandboxId: id, type: 'sandbox.deleted' }).set(t.auth);
    expect(deleted.body.items.map((e: { id: string }) => e.id)).toEqual([seen[5]!.id]);

    // Another organisation sees none of it: not in its feed, not as logs.
    const other = await t.http.get('/api/v1/events').query({ limit: 1000 }).set(otherOrg);
    expect(other.status).toBe(200);
    expect(other.body.items).toEqual([]);
    expect((await t.http.get(`/api/v1/sandboxes/${id}/logs`).set(otherOrg)).status).toBe(404);

    // The sandbox's logs (kept after its deletion): one entry per event, with times and levels.
    const logs = await t.http.get(`/api/v1/sandboxes/${id}/logs`).set(t.auth);
    expect(logs.status, JSON.stringify(logs.body)).toBe(200);
    expect(logs.body.entries.map((e: { fields: { type: string } }) => e.fields.type)).toEqual(LIFECYCLE_TYPES);
    for (const e of logs.body.entries) {
      expect(e.level).toBe('info');
      expect(Number.isNaN(Date.parse(e.timestamp))).toBe(false);
    }
    const backward = await t.http.get(`/api/v1/sandboxes/${id}/logs`).query({ direction: 'backward', limit: 1 }).set(t.auth);
    expect(backward.body.entries.map((e: { fields: { type: string } }) => e.fields.type)).toEqual(['sandbox.deleted']);
  });

  it('a stop the timeout began ends as sandbox.timed_out, with the reason', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 1, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    const events = await waitFor('the timeout events', async () => {
      const res = await t.http.get('/api/v1/events').query({ sandboxId: id }).set(t.auth);
      return res.body.items.some((e: { type: string }) => e.type === 'sandbox.timed_out') ? res.body.items : undefined;
    }, 60_000);
    expect(events.map((e: { type: string }) => e.type)).toEqual(['sandbox.creating', 'sandbox.created', 'sandbox.stopping', 'sandbox.timed_out']);
    expect(events[2].data).toMatchObject({ operation: 'stop', initiator: 'sweeper', reason: 'timeout' });
    expect(events[3].data).toMatchObject({ oldState: 'stopping', newState: 'stopped', reason: 'timeout' });
    const logs = await t.http.get(`/api/v1/sandboxes/${id}/logs`).query({ level: 'warn' }).set(t.auth);
    expect(logs.body.entries.map((e: { level: string; fields: { type: string } }) => [e.level, e.fields.type])).toEqual([['warn', 'sandbox.timed_out']]);
    await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth);
  });

  it('a state write and its event commit together: an event that cannot be written leaves the state as it was', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' } });
    const id = created.body.id as string;
    const sandbox = (await sandboxRepository(t.server.db).findById(id))!;
    const bus = new SandboxStateEvents();
    bus.recorder = async () => {
      throw new Error('the event store is down');
    };
    await expect(new Lifecycle(t.server.db, 'cp-test', bus).begin(sandbox, OPERATIONS.stop)).rejects.toThrow(/event store is down/);
    expect((await sandboxRepository(t.server.db).findById(id))!.state).toBe('running');
    const events = await t.http.get('/api/v1/events').query({ sandboxId: id }).set(t.auth);
    expect(events.body.items.map((e: { type: string }) => e.type)).toEqual(['sandbox.creating', 'sandbox.created']);
    await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth);
  });

  it('the retention pass removes events older than the retention, and nothing newer', async () => {
    const [{ seq }] = (await t.server.db('sandbox_events').orderBy('seq').limit(1).select('seq')) as { seq: string }[];
    await t.server.db('sandbox_events').where({ seq }).update({ created_at: new Date(Date.now() - 31 * 86_400_000) });
    const total = Number(((await t.server.db('sandbox_events').count('seq as n')) as { n: string }[])[0]!.n);
    expect(await t.server.services.events.removeExpired()).toBe(1);
    expect(Number(((await t.server.db('sandbox_events').count('seq as n')) as { n: string }[])[0]!.n)).toBe(total - 1);
  });

  it('refuses a cursor it did not give and an unknown type, naming the field', async () => {
    const bad = await t.http.get('/api/v1/events').query({ cursor: 'nonsense' }).set(t.auth);
    expect(bad.status).toBe(400);
    expect(bad.body.error.message).toMatch(/^cursor\b/);
    const type = await t.http.get('/api/v1/events').query({ type: 'sandbox.exploded' }).set(t.auth);
    expect(type.status).toBe(400);
  });
});

describe('webhooks', () => {
  it('shows the secret once, and delivers signed events in order with the event id as webhook-id', async () => {
    const receiver = await startReceiver();
    try {
      const created = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: receiver.url, description: 'ordered' });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const secret = created.body.secret as string;
      expect(secret).toMatch(/^whsec_/);
      const got = await t.http.get(`/api/v1/webhooks/${created.body.id}`).set(t.auth);
      expect(got.body.secret).toBeUndefined();
      expect(JSON.stringify((await t.http.get('/api/v1/webhooks').set(t.auth)).body)).not.toContain(secret.slice(6));
      // Another organisation cannot see it.
      expect((await t.http.get(`/api/v1/webhooks/${created.body.id}`).set(otherOrg)).status).toBe(404);

      const id = await lifecycle();
      const mine = () => receiver.received.map((r) => verify(secret, r)).filter((p) => p.sandboxId === id);
      await waitFor('every event delivered', async () => mine().length >= LIFECYCLE_TYPES.length, 60_000);
      const payloads = mine();
      expect(payloads.map((p) => p.type)).toEqual(LIFECYCLE_TYPES);
      const listed = await t.http.get('/api/v1/events').query({ sandboxId: id }).set(t.auth);
      expect(receiver.received.filter((r) => verify(secret, r).sandboxId === id).map((r) => r.headers['webhook-id'])).toEqual(listed.body.items.map((e: { id: string }) => e.id));
      // A tampered body fails verification (the signature covers it).
      const first = receiver.received[0]!;
      expect(() => new Webhook(secret).verify(first.body.replace('sandbox.', 'sandbox.x'), first.headers as Record<string, string>)).toThrow();

      // Delivery records.
      const deliveries = await waitFor('deliveries recorded', async () => {
        const res = await t.http.get(`/api/v1/webhooks/${created.body.id}/deliveries`).set(t.auth);
        return res.body.items.length >= LIFECYCLE_TYPES.length && res.body.items.every((d: { status: string }) => d.status === 'delivered') ? res.body.items : undefined;
      });
      expect(deliveries[0]).toMatchObject({ status: 'delivered', attempts: 1, responseStatus: 200, lastError: null });

      // Rotation: a new secret signs from now on; replay resends the same message id.
      const rotated = await t.http.post(`/api/v1/webhooks/${created.body.id}/rotate-secret`).set(t.auth);
      expect(rotated.status).toBe(200);
      expect(rotated.body.secret).not.toBe(secret);
      const before = receiver.received.length;
      const replay = await t.http.post(`/api/v1/webhooks/${created.body.id}/deliveries/${deliveries[0].id}/replay`).set(t.auth);
      expect(replay.status, JSON.stringify(replay.body)).toBe(202);
      await waitFor('the replay', async () => receiver.received.length > before);
      const again = receiver.received[before]!;
      expect(again.headers['webhook-id']).toBe(deliveries[0].messageId);
      expect(verify(rotated.body.secret, again).id).toBe(deliveries[0].messageId);
      expect(() => verify(secret, again)).toThrow();
      expect((await t.http.delete(`/api/v1/webhooks/${created.body.id}`).set(t.auth)).status).toBe(204);
    } finally {
      await receiver.close();
    }
  });

  it('retries a failing receiver with growing gaps, then records the success', async () => {
    const receiver = await startReceiver((n) => (n <= 3 ? 500 : 200));
    try {
      const created = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: receiver.url, eventTypes: ['sandbox.deleted'] });
      expect(created.status).toBe(201);
      const ping = await t.http.post(`/api/v1/webhooks/${created.body.id}/ping`).set(t.auth);
      expect(ping.status).toBe(202);
      const delivery = await waitFor('the ping delivered', async () => {
        const res = await t.http.get(`/api/v1/webhooks/${created.body.id}/deliveries`).set(t.auth);
        return res.body.items[0]?.status === 'delivered' ? res.body.items[0] : undefined;
      }, 60_000);
      expect(delivery).toMatchObject({ attempts: 4, responseStatus: 200, eventType: 'webhook.ping' });
      expect(receiver.received).toHaveLength(4);
      expect(new Set(receiver.received.map((r) => r.headers['webhook-id']))).toEqual(new Set([delivery.messageId]));
      const gaps = receiver.received.slice(1).map((r, i) => r.at - receiver.received[i]!.at);
      // Doubling gaps with ±20 % jitter: the third is about four times the first.
      expect(gaps[2]!).toBeGreaterThan(gaps[0]!);
      await t.http.delete(`/api/v1/webhooks/${created.body.id}`).set(t.auth);
    } finally {
      await receiver.close();
    }
  });

  it('gives a failing delivery up after the retry window, recording the last error', async () => {
    const receiver = await startReceiver(() => 503);
    try {
      const created = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: receiver.url, eventTypes: ['sandbox.deleted'] });
      // Give-up comes from the age of the delivery: age it instead of waiting for it.
      const ping = await t.http.post(`/api/v1/webhooks/${created.body.id}/ping`).set(t.auth);
      await t.server.db('webhook_deliveries').where({ id: ping.body.id }).update({ created_at: new Date(Date.now() - 29_900) });
      const failed = await waitFor('the delivery given up', async () => {
        const res = await t.http.get(`/api/v1/webhooks/${created.body.id}/deliveries`).query({ status: 'failed' }).set(t.auth);
        return res.body.items[0];
      }, 60_000);
      expect(failed).toMatchObject({ status: 'failed', responseStatus: 503, lastError: 'the receiver answered 503', nextAttemptAt: null });
      await t.http.delete(`/api/v1/webhooks/${created.body.id}`).set(t.auth);
    } finally {
      await receiver.close();
    }
  });

  it('two dispatchers on one database send each attempt once (SKIP LOCKED + lease)', async () => {
    const receiver = await startReceiver();
    // A second replica's dispatcher: its own pool on the same database.
    const db2 = knexFactory({ client: 'pg', connection: t.databaseUrl!, pool: { min: 0, max: 4 } });
    const opts = { retrySeconds: 30, timeoutMs: 5000, maxPerOrganization: 25, allowPrivateTargets: true, pollMs: 20 };
    const other = new WebhookDispatcher(db2, new WebhookService(db2, t.server.services.hostSecret, opts, EVENT_TYPES), opts, silentLogger);
    try {
      const created = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: receiver.url, eventTypes: ['sandbox.deleted'] });
      other.start();
      const pings: string[] = [];
      for (let i = 0; i < 15; i++) pings.push((await t.http.post(`/api/v1/webhooks/${created.body.id}/ping`).set(t.auth)).body.messageId);
      await waitFor('every ping delivered', async () => pings.every((id) => receiver.received.some((r) => r.headers['webhook-id'] === id)), 60_000);
      await new Promise((r) => setTimeout(r, 300));
      // Once each, and in the order queued.
      expect(receiver.received.map((r) => r.headers['webhook-id'])).toEqual(pings);
      await t.http.delete(`/api/v1/webhooks/${created.body.id}`).set(t.auth);
    } finally {
      await other.stop();
      await db2.destroy();
      await receiver.close();
    }
  });

  it('caps webhooks per organisation', async () => {
    const ids: string[] = [];
    try {
      for (let i = 0; i < 25; i++) {
        const res = await t.http.post('/api/v1/webhooks').set(otherOrg).send({ url: 'http://127.0.0.1:9/x', enabled: false });
        expect(res.status, JSON.stringify(res.body)).toBe(201);
        ids.push(res.body.id);
      }
      const over = await t.http.post('/api/v1/webhooks').set(otherOrg).send({ url: 'http://127.0.0.1:9/x' });
      expect(over.status).toBe(429);
      expect(over.body.error.code).toBe('limit_reached');
    } finally {
      for (const id of ids) await t.http.delete(`/api/v1/webhooks/${id}`).set(otherOrg);
    }
  });

  it('refuses bad input naming the field', async () => {
    const bad = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: 'ftp://example.invalid/x' });
    expect(bad.status).toBe(400);
    expect(bad.body.error.message).toMatch(/^url\b/);
    const type = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: 'http://127.0.0.1:1/x', eventTypes: ['nope'] });
    expect(type.status).toBe(400);
  });
});

describe('SSRF policy (private targets not allowed)', () => {
  it('classifies addresses', () => {
    for (const a of ['127.0.0.1', '10.1.2.3', '172.16.0.1', '192.168.1.1', '169.254.169.254', '::1', 'fe80::1', 'fd00::1', '::ffff:127.0.0.1', '0.0.0.0', '100.64.0.1']) expect(isPrivateAddress(a), a).toBe(true);
    for (const a of ['93.184.216.34', '8.8.8.8', '2606:4700::1111']) expect(isPrivateAddress(a), a).toBe(false);
  });

  it('refuses a loopback target at create (literal and by name)', async () => {
    await expect(checkTarget('http://127.0.0.1:8080/x', false)).rejects.toThrow(/^url: resolves to 127\.0\.0\.1/);
    await expect(checkTarget('http://localhost:8080/x', false)).rejects.toThrow(/^url: resolves to/);
    await expect(checkTarget('http://[::1]:8080/x', false)).rejects.toThrow(/^url: resolves to ::1/);
  });

  it('a server that does not allow private targets refuses them on create and at delivery time', async () => {
    const strict = await startTestServer({ database: 'pglite' });
    const receiver = await startReceiver();
    try {
      const refused = await strict.http.post('/api/v1/webhooks').set(strict.auth).send({ url: receiver.url });
      expect(refused.status).toBe(400);
      expect(refused.body.error.message).toMatch(/^url: resolves to 127\.0\.0\.1/);
      // A row that points at loopback anyway (as if DNS changed after the create) is refused when sent.
      const created = await strict.http.post('/api/v1/webhooks').set(strict.auth).send({ url: 'http://93.184.216.34/hook', eventTypes: ['sandbox.deleted'] });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      await strict.server.db('webhooks').where({ id: created.body.id }).update({ url: receiver.url });
      await strict.http.post(`/api/v1/webhooks/${created.body.id}/ping`).set(strict.auth);
      const attempted = await waitFor('an attempt recorded', async () => {
        const res = await strict.http.get(`/api/v1/webhooks/${created.body.id}/deliveries`).set(strict.auth);
        return res.body.items[0]?.lastError ? res.body.items[0] : undefined;
      });
      expect(attempted.lastError).toMatch(/private/);
      expect(receiver.received).toHaveLength(0);
      expect(newWebhookId()).toMatch(/^whk[a-f0-9]{20}$/);
    } finally {
      await receiver.close();
      await strict.close();
    }
  }, 180_000);
});
