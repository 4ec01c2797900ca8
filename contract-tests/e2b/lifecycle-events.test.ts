// E2B's sandbox lifecycle events API and lifecycle webhooks (E2B docs "Monitor sandbox lifecycle
// events" and "Sandbox lifecycle webhooks"). Neither E2B SDK has a client for them (the docs
// call them with fetch and X-API-Key), so these tests do the same, with sandboxes driven by the
// real `e2b` SDK; the delivery's `e2b-signature` is checked by the docs' own recipe, computed
// here independently of the server's code.
import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';
import { waitFor } from '../../test/harness.js';
import { startReceiver } from '../../test/webhook-receiver.js';

let t: E2bTestServer;
let otherKey: string;

beforeAll(async () => {
  t = await startE2bTestServer({ NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true', NESTBOX_WEBHOOK_RETRY_SECONDS: '30', NESTBOX_WEBHOOK_TIMEOUT_MS: '5000' });
  const org = await t.server.services.auth.createOrganization('e2b-events-other');
  otherKey = (await t.server.services.auth.createApiKey(org.id, { name: 'other-admin', preset: 'admin' })).key;
}, 180_000);
afterAll(async () => {
  await t?.close();
});

interface E2bEvent {
  version: string;
  id: string;
  type: string;
  eventData: unknown;
  sandboxBuildId: string;
  sandboxExecutionId: string;
  sandboxId: string;
  sandboxTeamId: string;
  sandboxTemplateId: string;
  timestamp: string;
}

interface E2bWebhook {
  id: string;
  teamID: string;
  name: string;
  createdAt: string;
  enabled: boolean;
  url: string;
  events: string[];
}

async function e2b(method: string, path: string, opts: { body?: unknown; key?: string | null } = {}): Promise<{ status: number; json: any }> {
  const headers: Record<string, string> = {};
  if (opts.key !== null) headers['X-API-Key'] = opts.key ?? t.opts.apiKey;
  if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(`${t.opts.apiUrl}${path}`, { method, headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : undefined };
}

/** The docs' verification recipe: base64 of SHA-256(secret + payload), `+`→`-`, `/`→`_`, padding removed. */
function documentedSignature(secret: string, payload: string): string {
  return createHash('sha256').update(secret + payload).digest('base64').replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

const opts = () => ({ ...t.opts, timeoutMs: 120_000, allowInternetAccess: false });

describe('e2b lifecycle events API', () => {
  it('lists a sandbox created, paused, resumed and killed, per sandbox and per team, paged and filtered', async () => {
    const sbx = await Sandbox.create(opts());
    expect(await sbx.pause()).toBe(true);
    await Sandbox.connect(sbx.sandboxId, t.opts);
    expect(await Sandbox.kill(sbx.sandboxId, t.opts)).toBe(true);
    const id = sbx.sandboxId;

    const asc = await e2b('GET', `/events/sandboxes/${id}?orderAsc=true`);
    expect(asc.status, JSON.stringify(asc.json)).toBe(200);
    const events = asc.json as E2bEvent[];
    expect(events.map((e) => e.type)).toEqual(['sandbox.lifecycle.created', 'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.killed']);
    for (const e of events) {
      expect(e).toMatchObject({ version: 'v1', sandboxId: id, sandboxTemplateId: 'base', eventData: null });
      expect(Object.keys(e).sort()).toEqual(['eventData', 'id', 'sandboxBuildId', 'sandboxExecutionId', 'sandboxId', 'sandboxTeamId', 'sandboxTemplateId', 'timestamp', 'type', 'version']);
      expect(Number.isNaN(Date.parse(e.timestamp))).toBe(false);
      expect(typeof e.sandboxTeamId).toBe('string');
    }
    expect(new Set(events.map((e) => e.id)).size).toBe(4);

    // Newest first by default.
    const desc = await e2b('GET', `/events/sandboxes/${id}`);
    expect((desc.json as E2bEvent[]).map((e) => e.id)).toEqual(events.map((e) => e.id).reverse());
    // offset and limit.
    const page = await e2b('GET', `/events/sandboxes/${id}?orderAsc=true&offset=1&limit=2`);
    expect((page.json as E2bEvent[]).map((e) => e.type)).toEqual(['sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed']);
    // types, repeated.
    const filtered = await e2b('GET', `/events/sandboxes/${id}?orderAsc=true&types=sandbox.lifecycle.killed&types=sandbox.lifecycle.paused`);
    expect((filtered.json as E2bEvent[]).map((e) => e.type)).toEqual(['sandbox.lifecycle.paused', 'sandbox.lifecycle.killed']);
    // Nestbox records no `updated` events: the filter matches nothing.
    expect((await e2b('GET', `/events/sandboxes/${id}?types=sandbox.lifecycle.updated`)).json).toEqual([]);

    // The team's feed has them too (newest first, at most `limit`).
    const team = await e2b('GET', '/events/sandboxes?limit=100');
    expect(team.status).toBe(200);
    const mine = (team.json as E2bEvent[]).filter((e) => e.sandboxId === id);
    expect(mine.map((e) => e.id)).toEqual(events.map((e) => e.id).reverse());
    expect((await e2b('GET', '/events/sandboxes')).json.length).toBeLessThanOrEqual(10);

    // Bad input: 400 naming the parameter, in E2B's error shape.
    const tooMany = await e2b('GET', '/events/sandboxes?limit=101');
    expect(tooMany.status).toBe(400);
    expect(tooMany.json).toMatchObject({ code: 400 });
    expect(tooMany.json.message).toMatch(/^limit\b/);
    const unknown = await e2b('GET', `/events/sandboxes/${id}?types=sandbox.lifecycle.exploded`);
    expect(unknown.status).toBe(400);
    expect(unknown.json.message).toMatch(/^types\b/);
    expect((await e2b('GET', '/events/sandboxes?orderAsc=maybe')).status).toBe(400);
    expect((await e2b('GET', '/events/sandboxes', { key: null })).status).toBe(401);

    // Another organisation sees none of it.
    expect((await e2b('GET', `/events/sandboxes/${id}`, { key: otherKey })).json).toEqual([]);
    const theirs = await e2b('GET', '/events/sandboxes?limit=100', { key: otherKey });
    expect(theirs.status).toBe(200);
    expect((theirs.json as E2bEvent[]).filter((e) => e.sandboxId === id)).toEqual([]);
  });
});

describe('e2b lifecycle webhooks', () => {
  it('creates, lists, gets, updates and deletes webhooks; deliveries have E2B shape and a verifiable e2b-signature', async () => {
    const receiver = await startReceiver();
    try {
      const secret = 'e2b-contract-secret-0123456789abcdef';
      const created = await e2b('POST', '/events/webhooks', {
        body: { name: 'contract hook', url: receiver.url, enabled: true, events: ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'], signatureSecret: secret },
      });
      expect(created.status, JSON.stringify(created.json)).toBe(201);
      const hook = created.json as E2bWebhook;
      expect(hook).toMatchObject({ name: 'contract hook', url: receiver.url, enabled: true, events: ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'] });
      expect(Object.keys(hook).sort()).toEqual(['createdAt', 'enabled', 'events', 'id', 'name', 'teamID', 'url']);
      expect(JSON.stringify(hook)).not.toContain(secret);

      expect((await e2b('GET', '/events/webhooks')).json as E2bWebhook[]).toContainEqual(hook);
      expect((await e2b('GET', `/events/webhooks/${hook.id}`)).json).toEqual(hook);
      expect((await e2b('GET', `/events/webhooks/${hook.id}`, { key: otherKey })).status).toBe(404);
      expect((await e2b('GET', '/events/webhooks', { key: otherKey })).json).toEqual([]);

      // A sandbox's create and kill reach the receiver, signed as E2B documents.
      const sbx = await Sandbox.create(opts());
      expect(await sbx.pause()).toBe(true);
      expect(await Sandbox.kill(sbx.sandboxId, t.opts)).toBe(true);
      const forSandbox = (id: string) => receiver.received.filter((r) => (JSON.parse(r.body) as E2bEvent).sandboxId === id);
      await waitFor('two deliveries', async () => forSandbox(sbx.sandboxId).length >= 2, 60_000);
      const deliveries = forSandbox(sbx.sandboxId);
      expect(deliveries.map((r) => (JSON.parse(r.body) as E2bEvent).type)).toEqual(['sandbox.lifecycle.created', 'sandbox.lifecycle.killed']);
      const listed = (await e2b('GET', `/events/sandboxes/${sbx.sandboxId}?orderAsc=true&types=sandbox.lifecycle.created&types=sandbox.lifecycle.killed`)).json as E2bEvent[];
      for (const [i, r] of deliveries.entries()) {
        expect(r.headers['content-type']).toMatch(/^application\/json/);
        expect(r.headers['e2b-webhook-id']).toBe(hook.id);
        expect(r.headers['e2b-signature-version']).toBe('v1');
        expect(r.headers['e2b-delivery-id']).toEqual(expect.any(String));
        expect(r.headers['e2b-signature']).toBe(documentedSignature(secret, r.body));
        expect(r.headers['e2b-signature']).not.toBe(documentedSignature('another-secret', r.body));
        // The body is the event as the API lists it, the team being the webhook's.
        expect(JSON.parse(r.body)).toEqual({ ...listed[i], sandboxTemplateId: '' });
        expect((JSON.parse(r.body) as E2bEvent).sandboxTeamId).toBe(hook.teamID);
      }
      expect(new Set(deliveries.map((r) => r.headers['e2b-delivery-id'])).size).toBe(2);

      // PATCH replaces the given fields, the secret too.
      const newSecret = 'rotated-e2b-contract-secret-abcdef0123456789';
      const patched = await e2b('PATCH', `/events/webhooks/${hook.id}`, { body: { name: 'renamed', events: ['sandbox.lifecycle.paused'], signatureSecret: newSecret } });
      expect(patched.status, JSON.stringify(patched.json)).toBe(200);
      expect(patched.json).toEqual({ ...hook, name: 'renamed', events: ['sandbox.lifecycle.paused'] });
      const second = await Sandbox.create(opts());
      expect(await second.pause()).toBe(true);
      await waitFor('the pause delivery', async () => forSandbox(second.sandboxId).length >= 1, 60_000);
      await Sandbox.kill(second.sandboxId, t.opts);
      const paused = forSandbox(second.sandboxId);
      expect(paused.map((r) => (JSON.parse(r.body) as E2bEvent).type)).toEqual(['sandbox.lifecycle.paused']);
      expect(paused[0]!.headers['e2b-signature']).toBe(documentedSignature(newSecret, paused[0]!.body));

      // Bad input names the field; types Nestbox records no event for are refused, not kept silent.
      const noSecret = await e2b('POST', '/events/webhooks', { body: { name: 'x', url: receiver.url, events: ['sandbox.lifecycle.created'] } });
      expect(noSecret.status).toBe(400);
      expect(noSecret.json.message).toMatch(/^signatureSecret\b/);
      const updated = await e2b('PATCH', `/events/webhooks/${hook.id}`, { body: { events: ['sandbox.lifecycle.updated'] } });
      expect(updated.status).toBe(400);
      expect(updated.json.message).toMatch(/^events\b/);
      const badUrl = await e2b('POST', '/events/webhooks', { body: { name: 'x', url: 'ftp://example.invalid/', events: ['sandbox.lifecycle.created'], signatureSecret: secret } });
      expect(badUrl.status).toBe(400);
      expect(badUrl.json.message).toMatch(/^url\b/);

      // A native (Standard Webhooks) webhook is not an E2B one.
      const native = await t.http.post('/api/v1/webhooks').set(t.auth).send({ url: receiver.url, enabled: false });
      expect(native.status, JSON.stringify(native.body)).toBe(201);
      expect(((await e2b('GET', '/events/webhooks')).json as E2bWebhook[]).map((w) => w.id)).toEqual([hook.id]);
      expect((await e2b('GET', `/events/webhooks/${native.body.id}`)).status).toBe(404);
      expect((await e2b('DELETE', `/events/webhooks/${native.body.id}`)).status).toBe(404);
      await t.http.delete(`/api/v1/webhooks/${native.body.id}`).set(t.auth);

      expect((await e2b('DELETE', `/events/webhooks/${hook.id}`, { key: otherKey })).status).toBe(404);
      expect((await e2b('DELETE', `/events/webhooks/${hook.id}`)).status).toBe(200);
      expect((await e2b('GET', `/events/webhooks/${hook.id}`)).status).toBe(404);
      expect((await e2b('GET', '/events/webhooks')).json).toEqual([]);
    } finally {
      await receiver.close();
    }
  });
});

