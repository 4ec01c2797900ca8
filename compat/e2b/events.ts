// E2B's sandbox lifecycle events API and lifecycle webhooks (E2B docs "Monitor sandbox lifecycle
// events" and "Sandbox lifecycle webhooks"), translated onto core's durable events
// (core/services/events.ts) and webhooks (core/services/webhooks.ts): one store of events, one
// outbox and dispatcher. What is E2B's here is the vocabulary, the JSON shapes and the signing:
// an E2B webhook is a core webhook of signing scheme `e2b` whose secret the client chose.
//
// Wire facts (from E2B's docs pages and its dashboard's calls):
// - GET /events/sandboxes and /events/sandboxes/{sandboxID}: `offset` (default 0), `limit`
//   (default 10, 1..100), `orderAsc` (default false: newest first), `types` (repeatable); the
//   answer is a JSON array of events {version, id, type, eventData, sandboxBuildId,
//   sandboxExecutionId, sandboxId, sandboxTeamId, sandboxTemplateId, timestamp}.
// - POST /events/webhooks {name, url, enabled, events, signatureSecret} → 201; GET (list), and
//   GET / PATCH (the same fields, each optional) / DELETE (200) /events/webhooks/{webhookID};
//   a webhook is {id, teamID, name, createdAt, enabled, url, events}, never its secret.
// - A delivery is a POST of the event's JSON (the same shape as the API's) with headers
//   e2b-webhook-id, e2b-delivery-id, e2b-signature-version (v1) and e2b-signature: SHA-256 of
//   secret + raw body, base64url without padding.
import { createHash } from 'node:crypto';
import type { Request, Response, Router } from 'express';
import { errors } from '../../core/errors.js';
import type { EventType, SandboxEventRecord } from '../../core/services/events.js';
import type { WebhookRecord, WebhookSigningScheme } from '../../core/services/webhooks.js';
import type { Principal } from '../../core/types.js';
import type { E2bDeps } from './deps.js';

type Handler = (req: Request, res: Response, principal: Principal) => Promise<void>;
type Route = (handler: Handler) => (req: Request, res: Response) => Promise<void>;

export const E2B_EVENT_TYPES = [
  'sandbox.lifecycle.created',
  'sandbox.lifecycle.killed',
  'sandbox.lifecycle.paused',
  'sandbox.lifecycle.resumed',
  'sandbox.lifecycle.updated',
  'sandbox.lifecycle.checkpointed',
] as const;
export type E2bEventType = (typeof E2B_EVENT_TYPES)[number];

/**
 * The core events each E2B type is told by. E2B's sandbox is running or paused (a stopped core
 * sandbox is listed as paused, and connect resumes it), so a stop is E2B's pause and a start its
 * resume; a kill is a delete; a timeout ends as `sandbox.timed_out`, which is a kill or a pause
 * by the operation the sweeper ran (e2bTypeOf). Core records no event for a changed timeout or
 * metadata (E2B's `updated`) nor for a snapshot (E2B's `checkpointed`): those types match nothing.
 */
const CORE_TYPES_OF: Record<E2bEventType, EventType[]> = {
  'sandbox.lifecycle.created': ['sandbox.created'],
  'sandbox.lifecycle.killed': ['sandbox.deleted', 'sandbox.timed_out'],
  'sandbox.lifecycle.paused': ['sandbox.paused', 'sandbox.stopped', 'sandbox.timed_out'],
  'sandbox.lifecycle.resumed': ['sandbox.resumed', 'sandbox.started'],
  'sandbox.lifecycle.updated': [],
  'sandbox.lifecycle.checkpointed': [],
};

/** The E2B type of a core event, or undefined for the ones E2B has no word for (creating, failures, …). */
export function e2bTypeOf(type: string, details: { operation?: string } | undefined): E2bEventType | undefined {
  switch (type) {
    case 'sandbox.created':
      return 'sandbox.lifecycle.created';
    case 'sandbox.deleted':
      return 'sandbox.lifecycle.killed';
    case 'sandbox.timed_out':
      return details?.operation === 'stop' ? 'sandbox.lifecycle.paused' : 'sandbox.lifecycle.killed';
    case 'sandbox.paused':
    case 'sandbox.stopped':
      return 'sandbox.lifecycle.paused';
    case 'sandbox.resumed':
    case 'sandbox.started':
      return 'sandbox.lifecycle.resumed';
    default:
      return undefined;
  }
}

/** Core types of a list of E2B types (their union, without repeats). */
const coreTypesOf = (types: readonly E2bEventType[]): EventType[] => [...new Set(types.flatMap((t) => CORE_TYPES_OF[t]))];

/** The E2B types a core subscription covers: each whose every core type it has. */
function e2bTypesOfSubscription(coreTypes: string[]): E2bEventType[] {
  const have = new Set(coreTypes);
  return E2B_EVENT_TYPES.filter((t) => CORE_TYPES_OF[t].length > 0 && CORE_TYPES_OF[t].every((c) => have.has(c)));
}

interface E2bEventSource {
  id: string;
  type: string;
  timestamp: string;
  organizationId: string;
  sandboxId: string;
  details: { operation?: string } | undefined;
}

/**
 * An event as E2B shows it. Nestbox has no template build ids nor per-run execution ids
 * (they are empty), and no E2B event data (null); the team is the organisation.
 */
export function renderE2bEvent(e: E2bEventSource, type: string, templateId = ''): Record<string, unknown> {
  return {
    version: 'v1',
    id: e.id,
    type,
    eventData: null,
    sandboxBuildId: '',
    sandboxExecutionId: '',
    sandboxId: e.sandboxId,
    sandboxTeamId: e.organizationId,
    sandboxTemplateId: templateId,
    timestamp: e.timestamp,
  };
}

/** E2B's webhook signature: SHA-256 of the secret followed by the raw body, base64url without padding. */
export const e2bSignature = (secret: string, body: string): string => createHash('sha256').update(secret + body).digest('base64url');

/** How core's dispatcher sends an E2B webhook's deliveries (its stored payload is core's webhookPayload). */
export const E2B_WEBHOOK_SCHEME: WebhookSigningScheme = {
  body(payload) {
    const details = payload.data as { operation?: string } | undefined;
    const type = String(payload.type);
    const source: E2bEventSource = {
      id: String(payload.id),
      type,
      timestamp: String(payload.timestamp),
      organizationId: String(payload.organizationId),
      sandboxId: String(payload.sandboxId ?? ''),
      details,
    };
    return JSON.stringify(renderE2bEvent(source, e2bTypeOf(type, details) ?? type));
  },
  headers: ({ secret, body, webhookId, deliveryId, attempt }) => ({
    'e2b-webhook-id': webhookId,
    // "Unique ID for the delivery attempt": the delivery's record id and the attempt's number.
    'e2b-delivery-id': `${deliveryId}-${attempt}`,
    'e2b-signature-version': 'v1',
    'e2b-signature': e2bSignature(secret, body),
  }),
};

export const E2B_SIGNING_SCHEME = 'e2b';

function intQuery(value: unknown, field: string, min: number, max: number, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (typeof value !== 'string' || !/^\d{1,9}$/.test(value) || n < min || n > max) throw errors.validation(field, `must be an integer from ${min} to ${max}`);
  return n;
}

function boolQuery(value: unknown, field: string): boolean {
  if (value === undefined) return false;
  if (value === 'true') return true;
  if (value === 'false') return false;
  throw errors.validation(field, 'must be true or false');
}

function typesQuery(value: unknown): E2bEventType[] | undefined {
  if (value === undefined) return undefined;
  const list = Array.isArray(value) ? value : [value];
  for (const t of list) {
    if (typeof t !== 'string' || !(E2B_EVENT_TYPES as readonly string[]).includes(t)) throw errors.validation('types', `unknown event type ${String(t)} (one of ${E2B_EVENT_TYPES.join(', ')})`);
  }
  return [...new Set(list as E2bEventType[])];
}

/** A webhook's subscription: E2B types onto core's. Types Nestbox records no event for are refused rather than kept silent. */
function subscriptionOf(value: unknown): EventType[] {
  if (!Array.isArray(value) || value.length === 0) throw errors.validation('events', 'must be a non-empty list of event types');
  for (const t of value) {
    if (typeof t !== 'string' || !(E2B_EVENT_TYPES as readonly string[]).includes(t)) throw errors.validation('events', `unknown event type ${String(t)} (one of ${E2B_EVENT_TYPES.join(', ')})`);
    if (CORE_TYPES_OF[t as E2bEventType].length === 0) {
      throw errors.validation('events', `${t} is not recorded by Nestbox (it has no event for timeout or metadata changes, nor for snapshots); subscribe to created, killed, paused or resumed`);
    }
  }
  return coreTypesOf(value as E2bEventType[]);
}

function nameOf(value: unknown): string {
  if (typeof value !== 'string' || value.length < 1 || value.length > 1000) throw errors.validation('name', 'must be a string of 1 to 1000 characters');
  return value;
}

function secretOf(value: unknown): string {
  if (typeof value !== 'string' || value.length < 1 || value.length > 1000) throw errors.validation('signatureSecret', 'must be a string of 1 to 1000 characters');
  return value;
}

const renderWebhook = (w: WebhookRecord) => ({
  id: w.id,
  teamID: w.organizationId,
  name: w.description,
  createdAt: w.createdAt.toISOString(),
  enabled: w.enabled,
  url: w.url,
  events: e2bTypesOfSubscription(w.eventTypes),
});

/**
 * Registers the events and webhooks routes (order as in scopes.ts), and E2B's signing scheme
 * with core's webhooks. `templateIds` names what each sandbox started from, as the sandbox
 * routes do (the control plane's own lookup).
 */
export function registerEventRoutes(router: Router, deps: E2bDeps, route: Route, templateIds: (principal: Principal, sandboxIds: string[]) => Promise<Map<string, string>>): void {
  const core = deps.core;
  core.webhooks.registerScheme(E2B_SIGNING_SCHEME, E2B_WEBHOOK_SCHEME);
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' && !Array.isArray(req.body) ? (req.body as Record<string, unknown>) : {});

  const listEvents = (perSandbox: boolean): Handler => async (req, res, principal) => {
    const offset = intQuery(req.query.offset, 'offset', 0, 100_000, 0);
    const limit = intQuery(req.query.limit, 'limit', 1, 100, 10);
    const orderAsc = boolQuery(req.query.orderAsc, 'orderAsc');
    const wanted = typesQuery(req.query.types);
    const types = coreTypesOf(wanted ?? E2B_EVENT_TYPES);
    if (types.length === 0) {
      res.status(200).json([]);
      return;
    }
    const { items } = await core.events.list(principal, {
      types,
      limit,
      offset,
      newestFirst: !orderAsc,
      ...(perSandbox ? { sandboxId: String(req.params.sandboxID) } : {}),
    });
    // A timeout is a kill or a pause by its operation: a filter on one of them drops the other
    // (the page can then be shorter than `limit`; offsets still count the same events).
    const typed = items
      .map((e: SandboxEventRecord) => ({ e, type: e2bTypeOf(e.type, e.details) }))
      .filter((x): x is { e: SandboxEventRecord; type: E2bEventType } => x.type !== undefined && (!wanted || wanted.includes(x.type)));
    const templates = await templateIds(principal, [...new Set(typed.map((x) => x.e.sandboxId))]);
    res.status(200).json(
      typed.map(({ e, type }) =>
        renderE2bEvent({ id: e.id, type: e.type, timestamp: e.createdAt.toISOString(), organizationId: e.organizationId, sandboxId: e.sandboxId, details: e.details }, type, templates.get(e.sandboxId) ?? ''),
      ),
    );
  };

  router.get('/events/sandboxes', route(listEvents(false)));
  router.get('/events/sandboxes/:sandboxID', route(listEvents(true)));

  /** One of the organisation's E2B webhooks (a native one is not E2B's to show or change). */
  async function e2bWebhook(principal: Principal, id: string): Promise<WebhookRecord> {
    const w = await core.webhooks.get(principal, id);
    if (w.signingScheme !== E2B_SIGNING_SCHEME) throw errors.notFound('webhook', id);
    return w;
  }
  const webhookId = (req: Request): string => String(req.params.webhookID);

  router.post('/events/webhooks', route(async (req, res, principal) => {
    const b = body(req);
    const name = nameOf(b.name);
    if (b.url === undefined) throw errors.validation('url', 'required');
    const eventTypes = subscriptionOf(b.events);
    const secret = secretOf(b.signatureSecret);
    if (b.enabled !== undefined && typeof b.enabled !== 'boolean') throw errors.validation('enabled', 'must be a boolean');
    const { webhook } = await core.webhooks.create(principal, { url: b.url, eventTypes, enabled: b.enabled, description: name, secret }, E2B_SIGNING_SCHEME);
    res.status(201).json(renderWebhook(webhook));
  }));
  router.get('/events/webhooks', route(async (_req, res, principal) => {
    const all = await core.webhooks.list(principal);
    res.status(200).json(all.filter((w) => w.signingScheme === E2B_SIGNING_SCHEME).map(renderWebhook));
  }));
  router.get('/events/webhooks/:webhookID', route(async (req, res, principal) => {
    res.status(200).json(renderWebhook(await e2bWebhook(principal, webhookId(req))));
  }));
  // "The update will replace the previous configuration fields with provided fields."
  router.patch('/events/webhooks/:webhookID', route(async (req, res, principal) => {
    const b = body(req);
    await e2bWebhook(principal, webhookId(req));
    if (b.enabled !== undefined && typeof b.enabled !== 'boolean') throw errors.validation('enabled', 'must be a boolean');
    const updated = await core.webhooks.update(principal, webhookId(req), {
      ...(b.name !== undefined ? { description: nameOf(b.name) } : {}),
      ...(b.url !== undefined ? { url: b.url } : {}),
      ...(b.events !== undefined ? { eventTypes: subscriptionOf(b.events) } : {}),
      ...(b.enabled !== undefined ? { enabled: b.enabled } : {}),
      ...(b.signatureSecret !== undefined ? { secret: secretOf(b.signatureSecret) } : {}),
    });
    res.status(200).json(renderWebhook(updated));
  }));
  router.delete('/events/webhooks/:webhookID', route(async (req, res, principal) => {
    await e2bWebhook(principal, webhookId(req));
    await core.webhooks.remove(principal, webhookId(req));
    res.status(200).end();
  }));
}
