// Hosted ports: a sandbox's TCP port published on a URL of the server. Public ports answer
// anyone; private ones need their token (`?_token=` once, then a cookie, or a header). Tokens
// are shown once and stored as SHA-256, so re-publishing a private port (or switching a port
// from public to private) mints a new one and the old one stops working.
//
// The proxy itself is a front-door concern (src/http/port-proxy.ts); this service decides who
// may reach what, and wakes the sandbox through the sandbox engine.
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import type { Db } from '../store/db.js';
import { EVERY_PORT, portRepository, type PortRecord } from '../store/repositories/ports.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors } from '../errors.js';
import { randomId } from '../ids.js';
import type { Principal, Sandbox } from '../types.js';
import { requireScope } from './auth.js';
import type { HostService } from './hosts.js';
import type { SandboxService } from './sandboxes.js';
import type { PortProxyTarget } from '../host-client.js';
import type { SandboxTokenService } from './sandbox-tokens.js';

export interface PortServiceOptions {
  /** `<port>-<sandboxId>.<publicDomain>` URLs when set. */
  publicDomain?: string;
  publicScheme: 'http' | 'https';
  /** Base of the path-form URLs (`<base>/p/<sandboxId>/<port>/`): the server's public URL. */
  baseUrl: () => string;
  /** Key for signed, expiring port tokens (derived from the server's master secret). */
  signingKey: string;
  /** Longest lifetime of a signed preview URL (NESTBOX_SIGNED_URL_MAX_SECONDS). */
  signedUrlMaxSeconds: number;
}

export interface PublishPortInput {
  port: number;
  public?: boolean;
}

export interface PublishedPort {
  sandboxId: string;
  port: number;
  public: boolean;
  /** The host form when a public domain is configured, the path form otherwise. */
  url: string;
  /** Always served, on the server's own port. */
  pathUrl: string;
  createdAt: Date;
  updatedAt: Date;
  /** Private ports, in the publish answer only. */
  token?: string;
}

export { EVERY_PORT };

/** Everything the proxy needs to decide about one request. */
export type PortLookup =
  | { found: false }
  | {
      found: true;
      /** The port's own record if it was published, else the sandbox's every-port record. */
      port: PortRecord;
      /** The every-port record, when the sandbox has one (besides a published record). */
      everyPort?: PortRecord;
      sandbox: Sandbox;
    };

/** What a request presents: a port token (query, cookie, header), and E2B's traffic token. */
export interface PresentedCredentials {
  portToken?: string;
  trafficToken?: string;
}

/** Hosted-port traffic is recorded as activity at most this often per sandbox. */
const ACTIVITY_EVERY_MS = 5_000;
const TOKEN_PREFIX = 'nbxp_';
const SIGNED_TOKEN_PREFIX = 'nbxs_';
/** `nbxs_<expires>_<api key id>_<mac>`: the key that signed it is in the token, so revoking the key ends it. */
const SIGNED_TOKEN = /^nbxs_(\d{1,12})_([a-z0-9]{1,40})_([A-Za-z0-9_-]{43})$/;
/** How long "this key is not revoked" is believed for signed preview tokens (they are checked per request). */
const KEY_STATE_CACHE_MS = 1_000;

export function hashPortToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/**
 * Proxied requests look their port up on every request; a short cache of the port record keeps
 * that query off the hot path. This replica's own publish/unpublish clears its entry at once;
 * another replica sees a change (say, a rotated token) within this long.
 */
const LOOKUP_CACHE_MS = 1_000;
const LOOKUP_CACHE_MAX = 10_000;
/** How long a running sandbox's row is believed by the proxy (see sandboxRow). */
export const SANDBOX_CACHE_MS = 1_000;

export class PortService {
  private readonly activityNoted = new Map<string, number>();
  private readonly lookupCache = new Map<string, { at: number; record: PortRecord | undefined }>();
  private readonly keyStateCache = new Map<string, { at: number; active: boolean }>();
  private readonly sandboxCache = new Map<string, { at: number; sandbox: Sandbox }>();
  /** Bumped by every forgetSandbox, so a read that raced a change is not cached. */
  private sandboxGeneration = 0;

  constructor(
    private readonly db: Db,
    private readonly sandboxes: SandboxService,
    private readonly hosts: HostService,
    private readonly options: PortServiceOptions,
    /** E2B's traffic tokens open a sandbox's every-port record when it is not public. */
    private readonly sandboxTokens?: Pick<SandboxTokenService, 'authenticate'>,
  ) {}

  /**
   * Open every port of the sandbox (see EVERY_PORT): to anyone when `public`, else to requests
   * carrying one of the sandbox's traffic tokens (E2B's `e2b-traffic-access-token`). Ports
   * published on their own keep their own rule besides this one.
   */
  async openEveryPort(principal: Principal, sandboxId: string, input: { public: boolean }): Promise<void> {
    requireScope(principal, 'sandboxes:operate');
    noCredential(principal);
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    await portRepository(this.db).upsert({ sandboxId: sandbox.id, port: EVERY_PORT, organizationId: sandbox.organizationId, public: input.public, tokenHash: null, tokenApiKeyId: null });
    this.forget(sandbox.id, EVERY_PORT);
  }

  /** Undo openEveryPort: only published ports stay reachable. */
  async closeEveryPort(principal: Principal, sandboxId: string): Promise<void> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    await portRepository(this.db).remove(sandbox.id, EVERY_PORT);
    this.forget(sandbox.id, EVERY_PORT);
  }

  /** Which of these sandboxes (of the caller's organisation) have every port open to anyone: one query for a page. */
  async everyPortPublic(principal: Principal, sandboxIds: string[]): Promise<Set<string>> {
    requireScope(principal, 'sandboxes:read');
    return portRepository(this.db).everyPortPublic(principal.organizationId, sandboxIds);
  }

  /** Whether every port of the sandbox is open, and to whom (undefined: only published ports). */
  async everyPortAccess(principal: Principal, sandboxId: string): Promise<{ public: boolean } | undefined> {
    requireScope(principal, 'sandboxes:read');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    const record = await portRepository(this.db).find(sandbox.id, EVERY_PORT);
    return record ? { public: record.public } : undefined;
  }

  async publish(principal: Principal, sandboxId: string, input: PublishPortInput): Promise<PublishedPort> {
    requireScope(principal, 'sandboxes:operate');
    noCredential(principal);
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    const port = validatePort(input.port);
    if (input.public !== undefined && typeof input.public !== 'boolean') throw errors.validation('public', 'must be true or false');
    const isPublic = input.public ?? false;
    const token = isPublic ? undefined : `${TOKEN_PREFIX}${randomId(40)}`;
    const record = await portRepository(this.db).upsert({
      sandboxId: sandbox.id,
      port,
      organizationId: sandbox.organizationId,
      public: isPublic,
      tokenHash: token ? hashPortToken(token) : null,
      tokenApiKeyId: token ? principal.keyId : null,
    });
    this.forget(sandbox.id, port);
    return { ...this.render(record), ...(token ? { token } : {}) };
  }

  private forget(sandboxId: string, port: number): void {
    this.lookupCache.delete(`${sandboxId}:${port}`);
  }

  async list(principal: Principal, sandboxId: string): Promise<PublishedPort[]> {
    requireScope(principal, 'sandboxes:read');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    return (await portRepository(this.db).list(sandbox.id)).filter((record) => record.port !== EVERY_PORT).map((record) => this.render(record));
  }

  async unpublish(principal: Principal, sandboxId: string, port: number): Promise<void> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    this.forget(sandbox.id, port);
    if (!(await portRepository(this.db).remove(sandbox.id, validatePort(port)))) throw errors.notFound('port', `${port} of sandbox ${sandbox.id}`);
  }

  /** The published port and its sandbox, whoever owns them (the proxy authorises by token). */
  async lookup(sandboxId: string, port: number): Promise<PortLookup> {
    if (!/^[a-z0-9]{1,32}$/.test(sandboxId) || !Number.isInteger(port) || port < 1 || port > 65535) return { found: false };
    const [record, everyPort, sandbox] = await Promise.all([this.portRecord(sandboxId, port), this.portRecord(sandboxId, EVERY_PORT), this.sandboxRow(sandboxId)]);
    const chosen = record ?? everyPort;
    if (!chosen || !sandbox || sandbox.state === 'deleted') return { found: false };
    return { found: true, port: chosen, ...(everyPort ? { everyPort } : {}), sandbox };
  }

  /**
   * The sandbox's row, from a short cache while it runs. Its state decides whether a request is
   * proxied, woken or answered 503, so a cached row is believed only while it says `running`,
   * for at most SANDBOX_CACHE_MS, and any state change of the sandbox that this replica hears of
   * (its own writes at once, other replicas' through the bus relay) forgets it (`forgetSandbox`,
   * wired to SandboxStateEvents by the composition root). Any other state is read fresh.
   */
  private async sandboxRow(sandboxId: string): Promise<Sandbox | undefined> {
    const cached = this.sandboxCache.get(sandboxId);
    if (cached && Date.now() - cached.at < SANDBOX_CACHE_MS) return cached.sandbox;
    const generation = this.sandboxGeneration;
    const sandbox = await sandboxRepository(this.db).findById(sandboxId);
    // A change heard while the read was under way may be newer than what it returned.
    if (sandbox?.state === 'running' && generation === this.sandboxGeneration) {
      if (this.sandboxCache.size >= LOOKUP_CACHE_MAX) this.sandboxCache.clear();
      this.sandboxCache.set(sandboxId, { at: Date.now(), sandbox });
    } else this.sandboxCache.delete(sandboxId);
    return sandbox;
  }

  /** A state change of the sandbox (SandboxStateEvents): its next request reads the row again. */
  forgetSandbox(sandboxId: string): void {
    this.sandboxGeneration++;
    this.sandboxCache.delete(sandboxId);
  }

  /** May the request pass: by the port's own rule, or by the sandbox's every-port rule. */
  async admits(lookup: Extract<PortLookup, { found: true }>, presented: PresentedCredentials): Promise<boolean> {
    if (lookup.port.port !== EVERY_PORT && (await this.authorizes(lookup.port, presented.portToken))) return true;
    const every = lookup.everyPort;
    if (!every) return false;
    if (every.public) return true;
    if (!presented.trafficToken || !this.sandboxTokens) return false;
    try {
      await this.sandboxTokens.authenticate(presented.trafficToken, every.sandboxId, ['traffic']);
      return true;
    } catch {
      return false;
    }
  }

  /** The published port (public flag, token hash), cached briefly: it is read on every proxied request. */
  private async portRecord(sandboxId: string, port: number): Promise<PortRecord | undefined> {
    const key = `${sandboxId}:${port}`;
    const cached = this.lookupCache.get(key);
    if (cached && Date.now() - cached.at < LOOKUP_CACHE_MS) return cached.record;
    const record = await portRepository(this.db).find(sandboxId, port);
    // Absence is cached too: every proxied request also asks for the sandbox's every-port record,
    // which most sandboxes do not have. This replica's own writes forget() their entry at once.
    if (this.lookupCache.size >= LOOKUP_CACHE_MAX) this.lookupCache.clear();
    this.lookupCache.set(key, { at: Date.now(), record });
    return record;
  }


  /**
   * May a request presenting `presented` pass? Public ports: yes. Private ports: the port's own
   * token, unless the key that minted it was revoked; or a signed token that has not expired and
   * whose key is not revoked. Constant-time comparisons throughout.
   */
  async authorizes(record: PortRecord, presented: string | undefined): Promise<boolean> {
    if (record.public) return true;
    // The every-port record has no token of its own (see admits).
    if (record.port === EVERY_PORT) return false;
    if (presented?.startsWith(SIGNED_TOKEN_PREFIX)) return this.signedTokenValid(record, presented);
    if (!presented || !record.tokenHash || record.tokenKeyRevoked) return false;
    const given = Buffer.from(hashPortToken(presented), 'hex');
    const expected = Buffer.from(record.tokenHash, 'hex');
    return given.length === expected.length && timingSafeEqual(given, expected);
  }

  /**
   * A URL that opens a private port until `expiresInSeconds` from now (at most
   * NESTBOX_SIGNED_URL_MAX_SECONDS), without the port's own token: the token in it is an HMAC of
   * (sandbox, port, expiry, signing key id), so nothing is stored, any replica can check it, and
   * it stops working when that API key is revoked or the sandbox deleted. Publishes the port
   * (private) if it was not published yet.
   */
  async signedUrl(principal: Principal, sandboxId: string, input: { port: number; expiresInSeconds: number }): Promise<{ url: string; token: string; expiresAt: Date }> {
    requireScope(principal, 'sandboxes:operate');
    noCredential(principal);
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    const port = validatePort(input.port);
    const max = this.options.signedUrlMaxSeconds;
    if (!Number.isInteger(input.expiresInSeconds) || input.expiresInSeconds < 1 || input.expiresInSeconds > max) {
      throw errors.validation('expiresInSeconds', `must be an integer from 1 to ${max}`);
    }
    const existing = await portRepository(this.db).find(sandbox.id, port);
    if (!existing) await this.publish(principal, sandbox.id, { port, public: false });
    const expiresAt = new Date(Date.now() + input.expiresInSeconds * 1000);
    const token = this.signToken(sandbox.id, port, Math.floor(expiresAt.getTime() / 1000), principal.keyId);
    const base = (existing ? this.render(existing) : this.render((await portRepository(this.db).find(sandbox.id, port))!)).url;
    return { url: `${base}?_token=${encodeURIComponent(token)}`, token, expiresAt };
  }

  private signToken(sandboxId: string, port: number, expiresUnix: number, keyId: string): string {
    const mac = createHmac('sha256', this.options.signingKey).update(`v2:${sandboxId}:${port}:${expiresUnix}:${keyId}`).digest('base64url');
    return `${SIGNED_TOKEN_PREFIX}${expiresUnix}_${keyId}_${mac}`;
  }

  private async signedTokenValid(record: PortRecord, presented: string): Promise<boolean> {
    const m = SIGNED_TOKEN.exec(presented);
    if (!m) return false;
    const expiresUnix = Number(m[1]);
    if (expiresUnix * 1000 < Date.now()) return false;
    const expected = Buffer.from(this.signToken(record.sandboxId, record.port, expiresUnix, m[2]));
    const given = Buffer.from(presented);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return false;
    return this.keyActive(m[2]);
  }

  /** Is this API key still valid (not revoked)? Cached briefly: it is asked on every proxied request. */
  private async keyActive(keyId: string): Promise<boolean> {
    const cached = this.keyStateCache.get(keyId);
    if (cached && Date.now() - cached.at < KEY_STATE_CACHE_MS) return cached.active;
    const row = (await this.db('api_keys').select('revoked_at').where({ id: keyId }).first()) as { revoked_at: Date | null } | undefined;
    const active = row !== undefined && row.revoked_at === null;
    if (this.keyStateCache.size >= LOOKUP_CACHE_MAX) this.keyStateCache.clear();
    this.keyStateCache.set(keyId, { at: Date.now(), active });
    return active;
  }

  /**
   * The sandbox, ready for traffic: running as it is, or woken when paused or idle-stopped.
   * Returns the sandbox as it then is (the caller answers 503 unless it runs).
   */
  async readyForTraffic(sandbox: Sandbox): Promise<Sandbox | undefined> {
    if (sandbox.state !== 'running') return this.sandboxes.wakeForTraffic(sandbox.id);
    const now = Date.now();
    if (now - (this.activityNoted.get(sandbox.id) ?? 0) >= ACTIVITY_EVERY_MS) {
      this.activityNoted.set(sandbox.id, now);
      if (this.activityNoted.size > 10_000) this.activityNoted.clear();
      await this.sandboxes.noteActivity(sandbox.id);
    }
    return sandbox;
  }

  /** Traffic on an open connection (a WebSocket) keeps counting as activity. */
  async noteTraffic(sandboxId: string): Promise<void> {
    await this.sandboxes.noteActivity(sandboxId);
  }

  async proxyTarget(sandbox: Sandbox, port: number): Promise<PortProxyTarget> {
    if (!sandbox.hostId) throw errors.internal(`sandbox ${sandbox.id} has no host`);
    return (await this.hosts.clientFor(sandbox.hostId)).portProxyTarget(sandbox.id, port);
  }

  /** The public domain hosted-port URLs use, if any (for host-based routing). */
  get publicDomain(): string | undefined {
    return this.options.publicDomain;
  }

  pathUrl(sandboxId: string, port: number): string {
    return `${this.options.baseUrl()}/p/${sandboxId}/${port}/`;
  }

  private render(record: PortRecord): PublishedPort {
    const pathUrl = this.pathUrl(record.sandboxId, record.port);
    const hostUrl = this.options.publicDomain ? `${this.options.publicScheme}://${record.port}-${record.sandboxId}.${this.options.publicDomain}/` : undefined;
    return {
      sandboxId: record.sandboxId,
      port: record.port,
      public: record.public,
      url: hostUrl ?? pathUrl,
      pathUrl,
      createdAt: record.createdAt,
      updatedAt: record.updatedAt,
    };
  }
}

function validatePort(port: unknown): number {
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535) throw errors.validation('port', 'must be an integer from 1 to 65535');
  return port;
}

/** Port tokens are minted by API keys only: a credential minted from a key never mints another. */
function noCredential(principal: Principal): void {
  if (principal.credentialId !== undefined) throw errors.forbidden('a sandbox credential cannot publish ports or sign preview URLs; use the API key');
}
