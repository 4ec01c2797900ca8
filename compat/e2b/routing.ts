// Which sandbox (and which in-sandbox service) a request is for, and who may act on it.
// e2b.md (a) "Routing headers" and "One-server recipe": SDKs ≥ 2.7 name the sandbox in
// `E2b-Sandbox-Id` / `E2b-Sandbox-Port`; older ones (and browsers given signed URLs) need the
// fallbacks: a token that is unique per sandbox, a signature, or a `<port>-<id>.<domain>` host.
import { createHash } from 'node:crypto';
import { errors, NestboxError } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { SandboxTarget } from './target.js';
import { sandboxAccounts, type SandboxAccount } from '../sandbox-accounts.js';
import { templateDefaults } from './template-defaults.js';

/** What authenticating in-sandbox traffic needs of core: its sandbox tokens, and the rate limits it counts against. */
type TokenPort = Pick<CompatPort, 'sandboxTokens' | 'requestRates'>;

export const ENVD_PORT = 49983;
export const CODE_INTERPRETER_PORT = 49999;
/** Advertised envd version: ≥ 0.6.4 unlocks every SDK feature (e2b.md (c) "envd version thresholds"). */
export const ENVD_VERSION = '0.6.13';

export interface SandboxRoute {
  sandboxId?: string;
  port?: number;
}

type HeaderBag = { get(name: string): string | null | undefined } | Record<string, string | string[] | undefined>;

export function header(headers: HeaderBag, name: string): string | undefined {
  if (typeof (headers as { get?: unknown }).get === 'function') return (headers as { get(n: string): string | null }).get(name) ?? undefined;
  const v = (headers as Record<string, string | string[] | undefined>)[name];
  return Array.isArray(v) ? v[0] : v;
}

/** Sandbox ids are `[a-z0-9]+`, so the left-most host label splits on its one `-`. */
const HOST_LABEL = /^(\d{1,5})-([a-z0-9]{1,64})$/;

export function sandboxRouteOf(headers: HeaderBag, publicDomain?: string): SandboxRoute {
  const id = header(headers, 'e2b-sandbox-id');
  const port = header(headers, 'e2b-sandbox-port');
  if (id) return { sandboxId: id, port: port ? Number(port) : ENVD_PORT };
  if (publicDomain) {
    // Same rule as the hosted-port proxy: a domain without a port matches any port.
    let host = (header(headers, 'host') ?? '').toLowerCase();
    if (!publicDomain.includes(':')) host = host.replace(/:\d+$/, '');
    if (host.endsWith(`.${publicDomain}`)) {
      const m = host.slice(0, -publicDomain.length - 1).match(HOST_LABEL);
      if (m) return { sandboxId: m[2], port: Number(m[1]) };
    }
  }
  return port ? { port: Number(port) } : {};
}

/**
 * The envd credential: `X-Access-Token`, the sandbox's own token (upstream envd rejects a wrong
 * one even when a signature would do; so do we). The code interpreter sends it only on
 * /execute; its other calls carry the traffic token (e2b.md (e) headers), accepted there.
 */
export async function authenticateSandboxTraffic(
  core: TokenPort,
  headers: HeaderBag,
  route: SandboxRoute,
  opts: { allowTrafficToken?: boolean } = {},
): Promise<SandboxTarget> {
  const access = header(headers, 'x-access-token');
  const traffic = header(headers, 'e2b-traffic-access-token');
  // envd and code-interpreter calls count against the key the token was minted from (and its
  // organisation), like the key's own calls: a 429 in envd's shape (Connect resource_exhausted,
  // HTTP 429), which the SDK raises as RateLimitError.
  if (access) {
    const principal = await core.sandboxTokens.authenticate(access, route.sandboxId);
    await core.requestRates.admit(principal, 'e2b');
    return { principal, sandboxId: [...principal.sandboxIds!][0] };
  }
  if (opts.allowTrafficToken && traffic && route.sandboxId) {
    const principal = await core.sandboxTokens.authenticate(traffic, route.sandboxId, ['traffic']);
    await core.requestRates.admit(principal, 'e2b');
    return { principal, sandboxId: route.sandboxId };
  }
  throw errors.unauthorized('unauthorized access, please provide a valid access token (X-Access-Token)');
}

/**
 * Signed `/files` URLs (e2b.md (d) "Signature algorithm"):
 * `v1_` + unpadded base64(sha256("<path>:<operation>:<username>:<token>[:<expiry>]")).
 */
export function fileSignature(path: string, operation: 'read' | 'write', username: string, token: string, expiration?: string): string {
  const raw = `${path}:${operation}:${username}:${token}${expiration ? `:${expiration}` : ''}`;
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

/**
 * A signed URL proves the sandbox without any header. With a routed sandbox id only that
 * sandbox's credentials are tried; otherwise those of every live sandbox (one shared host, no
 * headers). The URL acts with the scopes of the key its token came from, so a read-only key's
 * upload URL is refused. Its lifetime is bounded twice: `signature_expiration`, when given, may
 * lie at most NESTBOX_SIGNED_URL_MAX_SECONDS ahead; and the token it hashes expires itself
 * (NESTBOX_SANDBOX_TOKEN_TTL_SECONDS), so even a URL signed without an expiration dies with it.
 */
export async function authenticateSignature(
  core: TokenPort,
  route: SandboxRoute,
  q: { path: string; username: string; signature: string; expiration?: string },
  operation: 'read' | 'write',
): Promise<SandboxTarget> {
  // envd binds `signature_expiration` as an integer: anything else is the client's mistake.
  if (q.expiration !== undefined && !/^-?\d{1,12}$/.test(q.expiration)) {
    throw new NestboxError('validation_failed', 'signature_expiration: expected an integer (Unix seconds)', { field: 'signature_expiration' });
  }
  // As envd: the signature is checked first, its expiry after, with envd's own messages
  // (the SDK's tests compare them), so an expired URL of a forged signature is "invalid".
  const candidates = await core.sandboxTokens.signatureCandidates('envd', route.sandboxId ? { sandboxId: route.sandboxId } : { sandboxStates: ['running', 'paused'] });
  const match = candidates.find((c) => fileSignature(q.path, operation, q.username, c.secret, q.expiration) === q.signature);
  if (!match) throw new NestboxError('unauthorized', 'invalid signature');
  if (match.organizationSuspended) throw errors.organizationSuspended(match.principal.organizationId);
  if (q.expiration !== undefined) {
    const expiry = Number(q.expiration);
    const now = Date.now() / 1000;
    if (expiry < now) throw new NestboxError('unauthorized', 'signature is already expired');
    const max = core.sandboxTokens.signedUrlMaxSeconds;
    if (expiry > now + max) throw new NestboxError('unauthorized', `signature_expiration: more than ${max} seconds ahead (this server's maximum for signed URLs)`);
  }
  await core.requestRates.admit(match.principal, 'e2b');
  return { principal: match.principal, sandboxId: match.sandboxId };
}

/**
 * `Authorization: Basic base64("<user>:")` selects the Unix user (e2b.md (c) headers), as does a
 * signed URL's `username`; absent = E2B's default user (E2B_DEFAULT_USER).
 */
export function unixUserOf(headers: HeaderBag, username?: string | null): string | undefined {
  let user = username ?? undefined;
  const auth = header(headers, 'authorization');
  if (!user && auth?.startsWith('Basic ')) {
    const decoded = Buffer.from(auth.slice(6).trim(), 'base64').toString('utf8');
    user = decoded.split(':')[0];
  }
  return user || undefined;
}

/**
 * E2B runs commands, code and file operations as `user` (home /home/user, passwordless sudo),
 * unless the SDK names another user; Nestbox's default image has it (host/images/base-image.ts).
 */
export const E2B_DEFAULT_USER = 'user';

/**
 * The account a request acts as: the one it names, else the default of the sandbox's template
 * (its last setUser, template-defaults.ts), else E2B's `user` (root in an image without it).
 */
export async function e2bAccount(core: Pick<CompatPort, 'toolbox' | 'sandboxes' | 'images'>, target: SandboxTarget, headers: HeaderBag, username?: string | null): Promise<SandboxAccount> {
  const requested = unixUserOf(headers, username);
  const fallback = requested ? E2B_DEFAULT_USER : ((await templateDefaults(core, target)).user ?? E2B_DEFAULT_USER);
  return sandboxAccounts(core.toolbox).resolve(target.principal, target.sandboxId, requested, fallback);
}
