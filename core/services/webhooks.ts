// Webhooks: an organisation's HTTPS/HTTP endpoints that are told about lifecycle events, signed
// per Standard Webhooks (the `standardwebhooks` package: `webhook-id` is the event id, so a
// receiver dedupes redeliveries on it; `webhook-timestamp`; `webhook-signature` v1 HMAC-SHA256).
//
// Delivery is an outbox: events.ts inserts one `webhook_deliveries` row per matching webhook in
// the transaction of the state write; the dispatcher (any number of replicas) claims due rows
// with FOR UPDATE SKIP LOCKED and a lease, sends one attempt, and records it. A replica that dies
// mid-attempt leaves its lease to run out, and the attempt is sent again (at-least-once, same
// webhook-id). Order: per webhook, deliveries are sent one at a time in event order; a delivery
// waiting for a retry holds the later ones back until it succeeds or is given up (`failed`, after
// config.webhooks.retrySeconds). Across webhooks there is no order.
//
// Signing schemes: a webhook is signed per Standard Webhooks (`standard`, what the native API
// creates) unless it was created with another scheme a front door registered (registerScheme):
// E2B's lifecycle webhooks (compat/e2b/events.ts) sign and shape the body their own way, over
// the same outbox, retries and records.
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import dnsCallback from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import net, { BlockList } from 'node:net';
import { Webhook } from 'standardwebhooks';
import type { Db, DbOrTx } from '../store/db.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import type { Principal } from '../types.js';
import type { Logger } from '../logger.js';
import { requireScope } from './auth.js';
import { deleteCounted } from '../store/repositories/rows-deleted.js';

/** The fields of an event (services/events.ts, which inserts deliveries through here) a webhook body carries. */
export interface DeliverableEvent {
  id: string;
  type: string;
  organizationId: string;
  sandboxId: string;
  createdAt: Date;
  details: unknown;
}

export interface WebhookOptions {
  retrySeconds: number;
  timeoutMs: number;
  maxPerOrganization: number;
  allowPrivateTargets: boolean;
}

export interface WebhookRecord {
  id: string;
  organizationId: string;
  url: string;
  eventTypes: string[];
  enabled: boolean;
  description: string;
  /** `standard` (Standard Webhooks) or a scheme a front door registered (`e2b`). */
  signingScheme: string;
  createdAt: Date;
  updatedAt: Date;
}

/**
 * How a non-standard webhook's attempts are made: its body from the stored payload (the native
 * body, webhookPayload) and its headers, signed with the webhook's secret.
 */
export interface WebhookSigningScheme {
  body(payload: Record<string, unknown>): string;
  headers(attempt: { secret: string; body: string; webhookId: string; deliveryId: string; messageId: string; attempt: number }): Record<string, string>;
}

export type DeliveryStatus = 'pending' | 'delivered' | 'failed';

export interface DeliveryRecord {
  id: string;
  webhookId: string;
  messageId: string;
  eventId: string | null;
  eventType: string;
  status: DeliveryStatus;
  /** True while one replica is sending an attempt (its lease has not run out). */
  sending: boolean;
  attempts: number;
  lastError: string | null;
  responseStatus: number | null;
  createdAt: Date;
  lastAttemptAt: Date | null;
  nextAttemptAt: Date | null;
  deliveredAt: Date | null;
}

const date = (v: Date | string | null): Date | null => (v === null ? null : v instanceof Date ? v : new Date(v));

interface WebhookRow {
  id: string;
  organization_id: string;
  url: string;
  event_types: string[];
  enabled: boolean;
  description: string;
  secret_encrypted: string;
  signing_scheme?: string;
  created_at: Date | string;
  updated_at: Date | string;
}

interface DeliveryRow {
  seq: string | number;
  id: string;
  webhook_id: string;
  organization_id: string;
  message_id: string;
  event_id: string | null;
  event_type: string;
  payload: unknown;
  status: string;
  attempts: number;
  next_attempt_at: Date | string;
  lease_until: Date | string | null;
  last_error: string | null;
  response_status: number | null;
  created_at: Date | string;
  last_attempt_at: Date | string | null;
  delivered_at: Date | string | null;
}

const webhookFromRow = (r: WebhookRow): WebhookRecord => ({
  id: r.id,
  organizationId: r.organization_id,
  url: r.url,
  eventTypes: r.event_types,
  enabled: r.enabled,
  description: r.description,
  signingScheme: r.signing_scheme ?? 'standard',
  createdAt: date(r.created_at)!,
  updatedAt: date(r.updated_at)!,
});

const deliveryFromRow = (r: DeliveryRow): DeliveryRecord => ({
  id: r.id,
  webhookId: r.webhook_id,
  messageId: r.message_id,
  eventId: r.event_id,
  eventType: r.event_type,
  status: r.status as DeliveryStatus,
  sending: r.status === 'pending' && r.lease_until !== null && date(r.lease_until)!.getTime() > Date.now(),
  attempts: r.attempts,
  lastError: r.last_error,
  responseStatus: r.response_status,
  createdAt: date(r.created_at)!,
  lastAttemptAt: date(r.last_attempt_at),
  nextAttemptAt: r.status === 'pending' ? date(r.next_attempt_at) : null,
  deliveredAt: date(r.delivered_at),
});

export const newWebhookId = (): string => `whk${randomBytes(10).toString('hex')}`;
const newDeliveryId = (): string => `dlv${randomBytes(12).toString('hex')}`;

/** The body a webhook receives for an event. */
export function webhookPayload(e: DeliverableEvent): Record<string, unknown> {
  return { id: e.id, type: e.type, timestamp: e.createdAt.toISOString(), organizationId: e.organizationId, sandboxId: e.sandboxId, data: e.details };
}

/**
 * One delivery per enabled webhook of the event's organisation subscribed to its type (an empty
 * list: every type), in `db`: the event's own transaction.
 */
export async function insertDeliveriesFor(db: DbOrTx, event: DeliverableEvent): Promise<number> {
  const hooks = (await db('webhooks')
    .where({ organization_id: event.organizationId, enabled: true })
    .where((q) => q.whereRaw('cardinality(event_types) = 0').orWhereRaw('? = ANY(event_types)', [event.type]))
    .select('id')) as { id: string }[];
  if (!hooks.length) return 0;
  const payload = JSON.stringify(webhookPayload(event));
  await db('webhook_deliveries').insert(
    hooks.map((h) => ({ id: newDeliveryId(), webhook_id: h.id, organization_id: event.organizationId, message_id: event.id, event_id: event.id, event_type: event.type, payload, status: 'pending' })),
  );
  return hooks.length;
}

// ---- SSRF policy ----------------------------------------------------------------------------

/** Addresses a webhook may not target unless private targets are allowed: the networks the control plane sits in. */
const PRIVATE = new BlockList();
for (const [net4, bits] of [
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12], ['192.0.0.0', 24],
  ['192.0.2.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['198.51.100.0', 24], ['203.0.113.0', 24], ['224.0.0.0', 4], ['240.0.0.0', 4],
] as const) PRIVATE.addSubnet(net4, bits, 'ipv4');
for (const [net6, bits] of [['::', 128], ['::1', 128], ['fc00::', 7], ['fe80::', 10], ['ff00::', 8], ['64:ff9b::', 96], ['2001:db8::', 32]] as const) PRIVATE.addSubnet(net6, bits, 'ipv6');

export function isPrivateAddress(address: string): boolean {
  const family = net.isIP(address);
  if (family === 4) return PRIVATE.check(address, 'ipv4');
  if (family === 6) {
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
    return mapped ? PRIVATE.check(mapped, 'ipv4') : PRIVATE.check(address, 'ipv6');
  }
  return true;
}

const refused = (field: string, address: string) => errors.validation(field, `resolves to ${address}, a loopback, private or link-local address (webhooks may not target them unless NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS=true)`);

/** Parses a webhook URL and, unless private targets are allowed, checks every address it resolves to now. */
export async function checkTarget(raw: unknown, allowPrivate: boolean, field = 'url'): Promise<URL> {
  if (typeof raw !== 'string' || raw.length > 2048) throw errors.validation(field, 'must be an http(s) URL of at most 2048 characters');
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw errors.validation(field, 'must be an absolute http(s) URL');
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw errors.validation(field, 'must be an http or https URL');
  if (url.username || url.password) throw errors.validation(field, 'must not carry credentials');
  if (allowPrivate) return url;
  const host = url.hostname.replace(/^\[|\]$/g, '');
  const addresses = net.isIP(host) ? [host] : await lookup(host, { all: true }).then((a) => a.map((x) => x.address), () => {
    throw errors.validation(field, `host ${host} does not resolve`);
  });
  for (const a of addresses) if (isPrivateAddress(a)) throw refused(field, a);
  return url;
}

/** A DNS lookup for the delivery's own connection that refuses private addresses: the check holds for the address actually connected to. */
function guardedLookup(hostname: string, options: dnsCallback.LookupOptions, callback: (err: NodeJS.ErrnoException | null, address: string | dnsCallback.LookupAddress[], family?: number) => void): void {
  dnsCallback.lookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, '');
    const bad = addresses.find((a) => isPrivateAddress(a.address));
    if (bad) return callback(Object.assign(new Error(`${hostname} resolves to ${bad.address}, a private address`), { code: 'EPRIVATE' }), '');
    if (options.all) return callback(null, addresses);
    callback(null, addresses[0]!.address, addresses[0]!.family);
  });
}

// ---- secrets --------------------------------------------------------------------------------

/** Signing secrets are kept encrypted (AES-256-GCM) under a key derived from the master host secret. */
class SecretBox {
  private readonly key: Buffer;
  constructor(masterSecret: string) {
    this.key = createHmac('sha256', masterSecret).update('nestbox-webhook-secrets').digest();
  }
  seal(plain: string): string {
    const iv = randomBytes(12);
    const c = createCipheriv('aes-256-gcm', this.key, iv);
    const body = Buffer.concat([c.update(plain, 'utf8'), c.final()]);
    return ['v1', iv.toString('base64url'), c.getAuthTag().toString('base64url'), body.toString('base64url')].join('.');
  }
  open(sealed: string): string {
    const [v, iv, tag, body] = sealed.split('.');
    if (v !== 'v1' || !iv || !tag || body === undefined) throw errors.internal('a webhook secret is not in a format this server wrote');
    const d = createDecipheriv('aes-256-gcm', this.key, Buffer.from(iv, 'base64url'));
    d.setAuthTag(Buffer.from(tag, 'base64url'));
    return Buffer.concat([d.update(Buffer.from(body, 'base64url')), d.final()]).toString('utf8');
  }
}

const newSigningSecret = (): string => `whsec_${randomBytes(24).toString('base64')}`;

// ---- the service ----------------------------------------------------------------------------

export interface WebhookInput {
  url?: unknown;
  eventTypes?: unknown;
  enabled?: unknown;
  description?: unknown;
  /** A signing secret the client chose: only for a non-standard scheme (Standard Webhooks secrets are generated). */
  secret?: unknown;
}

export class WebhookService {
  private readonly secrets: SecretBox;
  private readonly schemes = new Map<string, WebhookSigningScheme>();
  /** Called when a delivery is queued by this process (the dispatcher wakes at once). */
  onQueued: () => void = () => undefined;

  constructor(
    private readonly db: Db,
    masterSecret: string,
    private readonly opts: WebhookOptions,
    private readonly eventTypes: readonly string[],
  ) {
    this.secrets = new SecretBox(masterSecret);
  }

  private types(raw: unknown): string[] {
    if (raw === undefined) return [];
    if (!Array.isArray(raw) || raw.length > this.eventTypes.length || raw.some((t) => typeof t !== 'string')) throw errors.validation('eventTypes', 'must be a list of event types');
    for (const t of raw as string[]) if (!this.eventTypes.includes(t)) throw errors.validation('eventTypes', `unknown event type ${t} (one of ${this.eventTypes.join(', ')})`);
    return [...new Set(raw as string[])];
  }

  private description(raw: unknown): string {
    if (raw === undefined) return '';
    if (typeof raw !== 'string' || raw.length > 1000) throw errors.validation('description', 'must be a string of at most 1000 characters');
    return raw;
  }

  /** A front door's signing scheme, by the name its webhooks are created with. */
  registerScheme(name: string, scheme: WebhookSigningScheme): void {
    if (name === 'standard') throw errors.internal('the standard scheme is built in');
    this.schemes.set(name, scheme);
  }

  schemeOf(name: string): WebhookSigningScheme | undefined {
    return this.schemes.get(name);
  }

  private chosenSecret(raw: unknown, field: string): string {
    if (typeof raw !== 'string' || raw.length < 1 || raw.length > 1000) throw errors.validation(field, 'must be a string of 1 to 1000 characters');
    return raw;
  }

  private enabled(raw: unknown): boolean {
    if (typeof raw !== 'boolean') throw errors.validation('enabled', 'must be a boolean');
    return raw;
  }

  async create(principal: Principal, input: WebhookInput, signingScheme = 'standard'): Promise<{ webhook: WebhookRecord; secret: string }> {
    requireScope(principal, 'webhooks:manage');
    if (signingScheme !== 'standard' && !this.schemes.has(signingScheme)) throw errors.internal(`no webhook signing scheme ${signingScheme}`);
    const url = await checkTarget(input.url, this.opts.allowPrivateTargets);
    const eventTypes = this.types(input.eventTypes);
    const description = this.description(input.description);
    const enabled = input.enabled === undefined ? true : this.enabled(input.enabled);
    if (signingScheme === 'standard' && input.secret !== undefined) throw errors.validation('secret', 'is generated by the server for Standard Webhooks signing');
    const secret = input.secret === undefined ? newSigningSecret() : this.chosenSecret(input.secret, 'secret');
    const row = await this.db.transaction(async (tx) => {
      // The cap is checked under a lock on the organisation, so two creates cannot both pass it.
      await tx('organizations').where({ id: principal.organizationId }).forUpdate().first('id');
      const [{ count }] = (await tx('webhooks').where({ organization_id: principal.organizationId }).count('id as count')) as { count: string | number }[];
      if (Number(count) >= this.opts.maxPerOrganization) throw new NestboxError('limit_reached', `an organisation may have at most ${this.opts.maxPerOrganization} webhooks (NESTBOX_WEBHOOK_MAX_PER_ORG)`, { limit: 'webhooks', max: this.opts.maxPerOrganization });
      const [r] = (await tx('webhooks')
        .insert({ id: newWebhookId(), organization_id: principal.organizationId, url: url.toString(), event_types: eventTypes, enabled, description, secret_encrypted: this.secrets.seal(secret), signing_scheme: signingScheme })
        .returning('*')) as WebhookRow[];
      return r!;
    });
    return { webhook: webhookFromRow(row), secret };
  }

  private async row(principal: Principal, id: string): Promise<WebhookRow> {
    const row = (await this.db('webhooks').where({ id, organization_id: principal.organizationId }).first()) as WebhookRow | undefined;
    if (!row) throw errors.notFound('webhook', id);
    return row;
  }

  async get(principal: Principal, id: string): Promise<WebhookRecord> {
    requireScope(principal, 'webhooks:manage');
    return webhookFromRow(await this.row(principal, id));
  }

  async list(principal: Principal): Promise<WebhookRecord[]> {
    requireScope(principal, 'webhooks:manage');
    return ((await this.db('webhooks').where({ organization_id: principal.organizationId }).orderBy('created_at')) as WebhookRow[]).map(webhookFromRow);
  }

  async update(principal: Principal, id: string, input: WebhookInput): Promise<WebhookRecord> {
    requireScope(principal, 'webhooks:manage');
    const current = await this.row(principal, id);
    const patch: Record<string, unknown> = { updated_at: new Date() };
    if (input.secret !== undefined) {
      if ((current.signing_scheme ?? 'standard') === 'standard') throw errors.validation('secret', 'is generated by the server for Standard Webhooks signing (rotate it instead)');
      patch.secret_encrypted = this.secrets.seal(this.chosenSecret(input.secret, 'secret'));
    }
    if (input.url !== undefined) patch.url = (await checkTarget(input.url, this.opts.allowPrivateTargets)).toString();
    if (input.eventTypes !== undefined) patch.event_types = this.types(input.eventTypes);
    if (input.description !== undefined) patch.description = this.description(input.description);
    if (input.enabled !== undefined) patch.enabled = this.enabled(input.enabled);
    const [row] = (await this.db('webhooks').where({ id, organization_id: principal.organizationId }).update(patch).returning('*')) as WebhookRow[];
    if (!row) throw errors.notFound('webhook', id);
    return webhookFromRow(row);
  }

  async remove(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'webhooks:manage');
    const n = await deleteCounted(this.db('webhooks').where({ id, organization_id: principal.organizationId }));
    if (n === 0) throw errors.notFound('webhook', id);
  }

  /** A new signing secret, shown in this answer only; the old one stops signing at once. */
  async rotateSecret(principal: Principal, id: string): Promise<{ webhook: WebhookRecord; secret: string }> {
    requireScope(principal, 'webhooks:manage');
    await this.row(principal, id);
    const secret = newSigningSecret();
    const [row] = (await this.db('webhooks').where({ id, organization_id: principal.organizationId }).update({ secret_encrypted: this.secrets.seal(secret), updated_at: new Date() }).returning('*')) as WebhookRow[];
    return { webhook: webhookFromRow(row!), secret };
  }

  /** Deliveries of a webhook, newest first, `before` a delivery id's position (cursor). */
  async deliveries(principal: Principal, id: string, q: { limit?: number; cursor?: string; status?: string }): Promise<{ items: DeliveryRecord[]; nextCursor: string | null }> {
    requireScope(principal, 'webhooks:manage');
    await this.row(principal, id);
    const limit = q.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 500) throw errors.validation('limit', 'must be an integer from 1 to 500');
    if (q.status !== undefined && !['pending', 'delivered', 'failed'].includes(q.status)) throw errors.validation('status', 'must be pending, delivered or failed');
    const query = this.db<DeliveryRow>('webhook_deliveries').where({ webhook_id: id }).orderBy('seq', 'desc').limit(limit);
    if (q.status) query.where({ status: q.status });
    if (q.cursor) {
      const seq = /^\d{1,18}$/.test(Buffer.from(q.cursor, 'base64url').toString()) ? Number(Buffer.from(q.cursor, 'base64url').toString()) : undefined;
      if (seq === undefined) throw errors.validation('cursor', 'is not a cursor this server gave');
      query.where('seq', '<', seq);
    }
    const rows = (await query.select('*')) as DeliveryRow[];
    const last = rows[rows.length - 1];
    return { items: rows.map(deliveryFromRow), nextCursor: rows.length === limit && last ? Buffer.from(String(last.seq)).toString('base64url') : null };
  }

  /** The attempts record of one message (by event id or delivery id) across the organisation's webhooks. */
  async deliveriesOfMessage(principal: Principal, messageId: string): Promise<DeliveryRecord[]> {
    requireScope(principal, 'webhooks:manage');
    const rows = (await this.db('webhook_deliveries').where({ organization_id: principal.organizationId }).where((q) => q.where({ message_id: messageId }).orWhere({ id: messageId })).orderBy('seq')) as DeliveryRow[];
    return rows.map(deliveryFromRow);
  }

  /**
   * Sends a delivery again: a new delivery of the same message (same webhook-id, so a receiver
   * that processed it already can tell), queued after the webhook's others.
   */
  async replayDelivery(principal: Principal, webhookId: string, deliveryId: string): Promise<DeliveryRecord> {
    requireScope(principal, 'webhooks:manage');
    await this.row(principal, webhookId);
    const original = (await this.db('webhook_deliveries').where({ id: deliveryId, webhook_id: webhookId }).first()) as DeliveryRow | undefined;
    if (!original) throw errors.notFound('delivery', deliveryId);
    return this.enqueue(webhookId, principal.organizationId, original.message_id, original.event_id, original.event_type, original.payload);
  }

  /** Sends an event (still kept: within retention) to a webhook, subscribed to its type or not. */
  async replayEvent(principal: Principal, webhookId: string, eventId: string): Promise<DeliveryRecord> {
    requireScope(principal, 'webhooks:manage');
    await this.row(principal, webhookId);
    const row = (await this.db('sandbox_events').where({ id: eventId, organization_id: principal.organizationId }).first()) as
      | { id: string; type: string; organization_id: string; sandbox_id: string; details: unknown; created_at: Date | string; seq: string }
      | undefined;
    if (!row) throw errors.notFound('event', eventId);
    const details = typeof row.details === 'string' ? JSON.parse(row.details) : row.details;
    const payload = { id: row.id, type: row.type, timestamp: date(row.created_at)!.toISOString(), organizationId: row.organization_id, sandboxId: row.sandbox_id, data: details };
    return this.enqueue(webhookId, principal.organizationId, row.id, row.id, row.type, payload);
  }

  /** A `webhook.ping` message, delivered like any other (signed, retried, recorded). */
  async ping(principal: Principal, webhookId: string): Promise<DeliveryRecord> {
    requireScope(principal, 'webhooks:manage');
    await this.row(principal, webhookId);
    const messageId = `msg${randomBytes(12).toString('hex')}`;
    return this.enqueue(webhookId, principal.organizationId, messageId, null, 'webhook.ping', { id: messageId, type: 'webhook.ping', timestamp: new Date().toISOString(), organizationId: principal.organizationId, data: { webhookId } });
  }

  private async enqueue(webhookId: string, organizationId: string, messageId: string, eventId: string | null, eventType: string, payload: unknown): Promise<DeliveryRecord> {
    const [row] = (await this.db('webhook_deliveries')
      .insert({ id: newDeliveryId(), webhook_id: webhookId, organization_id: organizationId, message_id: messageId, event_id: eventId, event_type: eventType, payload: typeof payload === 'string' ? payload : JSON.stringify(payload), status: 'pending' })
      .returning('*')) as DeliveryRow[];
    this.onQueued();
    return deliveryFromRow(row!);
  }

  /** The signer of a webhook (the dispatcher's). */
  signerFor(sealed: string): Webhook {
    return new Webhook(this.secrets.open(sealed));
  }

  /** A webhook's secret in clear (the dispatcher's, for a registered scheme). */
  secretOf(sealed: string): string {
    return this.secrets.open(sealed);
  }
}

// ---- the dispatcher -------------------------------------------------------------------------

/** Gap before retry `attempt` (1-based), doubling from a first gap scaled to the retry window, with ±20 % jitter. */
export function backoffMs(attempt: number, retrySeconds: number): number {
  const first = Math.min(5000, Math.max(50, (retrySeconds * 1000) / 100));
  const cap = Math.max(first, Math.min(3_600_000, (retrySeconds * 1000) / 4));
  const gap = Math.min(cap, first * 2 ** Math.min(30, attempt - 1));
  return Math.round(gap * (0.8 + Math.random() * 0.4));
}

/**
 * Sends due deliveries. Every replica runs one; the claim (SKIP LOCKED + lease, in SQL on the
 * database's clock) makes each attempt one replica's.
 */
export class WebhookDispatcher {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  private readonly inFlight = new Set<Promise<void>>();

  constructor(
    private readonly db: Db,
    private readonly service: WebhookService,
    private readonly opts: WebhookOptions & { pollMs: number; batch?: number },
    private readonly log: Logger,
  ) {}

  start(): void {
    this.service.onQueued = () => this.kick();
    this.timer = setInterval(() => this.kick(), this.opts.pollMs);
    this.timer.unref();
    this.kick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    await this.running;
    await Promise.allSettled([...this.inFlight]);
  }

  /** Runs a pass now (or right after the one running). */
  kick(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.pass()
      .catch((err) => this.log.warn({ err: toNestboxError(err).message }, 'webhook dispatch pass failed'))
      .finally(() => {
        this.running = undefined;
        if (this.again) {
          this.again = false;
          this.kick();
        }
      });
  }

  /** Lease of one attempt: its timeout plus a margin; a process that dies mid-attempt holds it no longer. */
  private get leaseMs(): number {
    return this.opts.timeoutMs + 1000;
  }

  private async pass(): Promise<void> {
    for (let round = 0; round < 20 && !this.stopped; round++) {
      const claimed = await this.claim();
      if (!claimed.length) return;
      // One delivery per webhook is claimed at a time (its head), so these run in parallel safely.
      await Promise.allSettled(claimed.map((d) => this.track(this.attempt(d))));
    }
  }

  private track(p: Promise<void>): Promise<void> {
    this.inFlight.add(p);
    return p.finally(() => this.inFlight.delete(p));
  }

  /** The due head of each webhook's queue (its oldest pending delivery), leased to this replica. */
  async claim(): Promise<(DeliveryRow & { url: string; secret_encrypted: string; signing_scheme: string })[]> {
    const { rows } = (await this.db.raw(
      `UPDATE webhook_deliveries d
          SET lease_until = now() + make_interval(secs => ?), attempts = d.attempts + 1, last_attempt_at = now()
         FROM webhooks w
        WHERE w.id = d.webhook_id
          AND d.id IN (
            SELECT c.id FROM webhook_deliveries c JOIN webhooks cw ON cw.id = c.webhook_id AND cw.enabled
             WHERE c.status = 'pending' AND c.next_attempt_at <= now() AND (c.lease_until IS NULL OR c.lease_until < now())
               AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e WHERE e.webhook_id = c.webhook_id AND e.status = 'pending' AND e.seq < c.seq)
             ORDER BY c.seq
             LIMIT ?
             FOR UPDATE OF c SKIP LOCKED)
        RETURNING d.*, w.url, w.secret_encrypted, w.signing_scheme`,
      [this.leaseMs / 1000, this.opts.batch ?? 20],
    )) as { rows: (DeliveryRow & { url: string; secret_encrypted: string; signing_scheme: string })[] };
    return rows;
  }

  private async attempt(d: DeliveryRow & { url: string; secret_encrypted: string; signing_scheme: string }): Promise<void> {
    const stored = typeof d.payload === 'string' ? d.payload : JSON.stringify(d.payload);
    let status: number | undefined;
    let error: string | undefined;
    try {
      if (d.signing_scheme && d.signing_scheme !== 'standard') {
        // A process without the front door that registered the scheme fails the attempt (retried).
        const scheme = this.service.schemeOf(d.signing_scheme);
        if (!scheme) throw new Error(`no ${d.signing_scheme} webhook signing in this process`);
        const body = scheme.body(JSON.parse(stored) as Record<string, unknown>);
        const headers = scheme.headers({ secret: this.service.secretOf(d.secret_encrypted), body, webhookId: d.webhook_id, deliveryId: d.id, messageId: d.message_id, attempt: d.attempts });
        status = await this.send(new URL(d.url), body, headers);
      } else {
        const signer = this.service.signerFor(d.secret_encrypted);
        const now = new Date();
        status = await this.send(new URL(d.url), stored, {
          'webhook-id': d.message_id,
          'webhook-timestamp': String(Math.floor(now.getTime() / 1000)),
          'webhook-signature': signer.sign(d.message_id, now, stored),
        });
      }
      if (status < 200 || status >= 300) error = `the receiver answered ${status}`;
    } catch (err) {
      error = (err as Error).message || String(err);
    }
    // Only this attempt's own write counts: a lease that ran out meanwhile went to another attempt.
    const mine = this.db('webhook_deliveries').where({ id: d.id, attempts: d.attempts, status: 'pending' });
    if (!error) {
      await mine.update({ status: 'delivered', response_status: status, last_error: null, lease_until: null, delivered_at: this.db.fn.now() });
      return;
    }
    const ageMs = Date.now() - date(d.created_at)!.getTime();
    const gap = backoffMs(d.attempts, this.opts.retrySeconds);
    const giveUp = ageMs + gap > this.opts.retrySeconds * 1000;
    await mine.update({
      status: giveUp ? 'failed' : 'pending',
      response_status: status ?? null,
      last_error: error.slice(0, 1000),
      lease_until: null,
      next_attempt_at: this.db.raw(`now() + make_interval(secs => ?)`, [gap / 1000]),
    });
    this.log.info({ deliveryId: d.id, webhookId: d.webhook_id, attempt: d.attempts, status, err: error }, giveUp ? 'webhook delivery given up' : 'webhook delivery will be retried');
    if (!giveUp) setTimeout(() => this.kick(), gap + 10).unref();
  }

  /** One POST; resolves with the status. Private targets are refused on the address actually connected to. */
  private send(url: URL, body: string, headers: Record<string, string>): Promise<number> {
    const host = url.hostname.replace(/^\[|\]$/g, '');
    if (!this.opts.allowPrivateTargets && net.isIP(host) && isPrivateAddress(host)) return Promise.reject(new Error(`${host} is a loopback, private or link-local address`));
    const client = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = client.request(
        url,
        {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'user-agent': 'nestbox-webhooks', 'content-length': Buffer.byteLength(body), ...headers },
          timeout: this.opts.timeoutMs,
          ...(this.opts.allowPrivateTargets ? {} : { lookup: guardedLookup as unknown as typeof dnsCallback.lookup }),
        },
        (res) => {
          // The body is not needed; it is drained (bounded by the timeout) so the socket is freed.
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
          res.on('error', reject);
        },
      );
      const deadline = setTimeout(() => req.destroy(new Error(`no answer within ${this.opts.timeoutMs} ms`)), this.opts.timeoutMs);
      req.on('close', () => clearTimeout(deadline));
      req.on('timeout', () => req.destroy(new Error(`no answer within ${this.opts.timeoutMs} ms`)));
      req.on('error', reject);
      req.end(body);
    });
  }
}
