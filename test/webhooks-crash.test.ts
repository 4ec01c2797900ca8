// kill -9 of the control plane while a webhook delivery is in flight (issue 17): the attempt's
// lease runs out, the restarted worker sends it again with the same webhook-id, and the events
// queued behind it follow in order. Nothing is lost; the only duplicate is the attempt that was
// in flight (at-least-once, deduplicable on webhook-id). The server is the real program, in its
// own process, so the kill is real (needs `npm run build`).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { startServerProcess, waitFor, type TestServerProcess } from './harness.js';
import { startReceiver } from './webhook-receiver.js';

let server: TestServerProcess;
let receiver: Awaited<ReturnType<typeof startReceiver>>;
/** While set, the receiver holds requests open (never answers). */
let holding = false;

beforeAll(async () => {
  receiver = await startReceiver(() => (holding ? undefined : 200));
  server = await startServerProcess({ env: { NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true', NESTBOX_WEBHOOK_TIMEOUT_MS: '3000', NESTBOX_WEBHOOK_RETRY_SECONDS: '120' } });
}, 180_000);
afterAll(async () => {
  await server?.close();
  await receiver?.close();
}, 180_000);

describe('webhooks across a control-plane kill -9', () => {
  it('loses nothing and duplicates only the attempt in flight, with the same webhook-id', async () => {
    const hook = await server.http.post('/api/v1/webhooks').set(server.auth).send({ url: receiver.url });
    expect(hook.status, JSON.stringify(hook.body)).toBe(201);
    const secret = hook.body.secret as string;

    const created = await server.http.post('/api/v1/sandboxes').set(server.auth).send({ egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const sandboxId = created.body.id as string;
    await waitFor('the create events delivered', async () => receiver.received.length >= 2);

    // The next delivery is held open by the receiver; the delete's events queue behind it.
    holding = true;
    const ping = await server.http.post(`/api/v1/webhooks/${hook.body.id}/ping`).set(server.auth);
    expect(ping.status).toBe(202);
    await waitFor('the ping in flight', async () => receiver.received.some((r) => r.headers['webhook-id'] === ping.body.messageId));
    expect((await server.http.delete(`/api/v1/sandboxes/${sandboxId}`).set(server.auth)).status).toBe(204);

    const before = server.workerPid()!;
    process.kill(before, 'SIGKILL');
    holding = false;
    await waitFor('a new worker', async () => {
      const pid = server.workerPid();
      return pid !== undefined && pid !== before && (await server.http.get('/api/v1/health').catch(() => undefined))?.status === 200;
    }, 120_000);

    const events = (await server.http.get('/api/v1/events').query({ sandboxId }).set(server.auth)).body.items as { id: string; type: string }[];
    expect(events.map((e) => e.type)).toEqual(['sandbox.creating', 'sandbox.created', 'sandbox.deleting', 'sandbox.deleted']);
    const expected = [...events.slice(0, 2).map((e) => e.id), ping.body.messageId as string, ...events.slice(2).map((e) => e.id)];
    const arrivals = (id: string) => receiver.received.filter((r) => r.headers['webhook-id'] === id).length;
    await waitFor('every message delivered', async () => arrivals(ping.body.messageId) >= 2 && expected.every((id) => arrivals(id) >= 1), 120_000);

    // Every body is signed; each message arrived once, except the held one (twice, same id).
    const ids = receiver.received.map((r) => {
      const payload = new Webhook(secret).verify(r.body, r.headers as Record<string, string>) as { id: string };
      expect(payload.id).toBe(r.headers['webhook-id']);
      return payload.id;
    });
    const counts = new Map<string, number>();
    for (const id of ids) counts.set(id, (counts.get(id) ?? 0) + 1);
    expect([...counts.keys()].sort()).toEqual([...expected].sort());
    for (const id of expected) expect(counts.get(id), id).toBe(id === ping.body.messageId ? 2 : 1);
    // In order per webhook: first arrivals follow the event order, the redelivery before the events behind it.
    const firstArrival = expected.map((id) => ids.lastIndexOf(id));
    expect([...firstArrival].sort((a, b) => a - b)).toEqual(firstArrival);

    const deliveries = (await server.http.get(`/api/v1/webhooks/${hook.body.id}/deliveries`).set(server.auth)).body.items as { messageId: string; status: string; attempts: number }[];
    expect(deliveries.every((d) => d.status === 'delivered')).toBe(true);
    expect(deliveries.find((d) => d.messageId === ping.body.messageId)?.attempts).toBe(2);
  }, 300_000);
});

