// Which sandbox (and which in-sandbox service) a request is for, and who may act on it.
// e2b.md (a) "Routing headers" and "One-server recipe": SDKs ≥ 2.7 name the sandbox in
// `E2b-Sandbox-Id` / `E2b-Sandbox-Port`; older ones (and browsers given signed URLs) need the
// fallbacks: a token that is unique per sandbox, a signature, or a `<port>-<id>.<domain>` host.
import { createHash } from 'node:crypto';
import { errors, NestboxError } from '../../core/errors.js';
import type { Services } from '../../src/services.js';
import type { SandboxTarget } from './guest.js';

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
  services: Services,
  headers: HeaderBag,
  route: SandboxRoute,
  opts: { allowTrafficToken?: boolean } = {},
): Promise<SandboxTarget> {
  const access = header(headers, 'x-access-token');
  const traffic = header(headers, 'e2b-traffic-access-token');
  if (access) {
    const principal = await services.sandboxTokens.authenticate(access, route.sandboxId);
    return { principal, sandboxId: [...principal.sandboxIds!][0] };
  }
  if (opts.allowTrafficToken && traffic && route.sandboxId) {
    const principal = await services.sandboxTokens.authenticate(traffic, route.sandboxId, ['traffic']);
    return { principal, sandboxId: route.sandboxId };
  }
  throw errors.unauthorized('unauthorized access, please provide a valid access token (X-Access-Token)');
}

/** The sandbox named by the route, without a credential (`/health` needs none upstream). */
export async function unauthenticatedTarget(services: Services, route: SandboxRoute): Promise<SandboxTarget> {
  const owner = route.sandboxId ? await services.sandboxTokens.owner(route.sandboxId) : undefined;
  if (!owner) throw errors.notFound('sandbox', route.sandboxId ?? '(none named)');
  return { principal: services.sandboxTokens.principalFor(owner), sandboxId: owner.id };
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
 * sandbox's token is tried; otherwise every live sandbox's (one shared host, no headers).
 */
export async function authenticateSignature(
  services: Services,
  route: SandboxRoute,
  q: { path: string; username: string; signature: string; expiration?: string },
  operation: 'read' | 'write',
): Promise<SandboxTarget> {
  if (q.expiration !== undefined) {
    const expiry = Number(q.expiration);
    if (!Number.isInteger(expiry) || expiry * 1000 < Date.now()) throw new NestboxError('unauthorized', 'signature has expired');
  }
  const candidates = route.sandboxId
    ? await services.sandboxTokens.owner(route.sandboxId).then((o) => (o ? [{ ...o, token: services.sandboxTokens.tokenFor(o.id) }] : []))
    : await services.sandboxTokens.liveSandboxTokens();
  for (const c of candidates) {
    if (fileSignature(q.path, operation, q.username, c.token, q.expiration) === q.signature) {
      return { principal: services.sandboxTokens.principalFor(c), sandboxId: c.id };
    }
  }
  throw new NestboxError('unauthorized', 'invalid signature');
}

/**
 * `Authorization: Basic base64("<user>:")` selects the Unix user (e2b.md (c) headers). E2B's
 * default user `user` does not exist in Nestbox images; it means the sandbox's default user.
 */
export function unixUserOf(headers: HeaderBag, username?: string | null): string | undefined {
  let user = username ?? undefined;
  const auth = header(headers, 'authorization');
  if (!user && auth?.startsWith('Basic ')) {
    const decoded = Buffer.from(auth.slice(6).trim(), 'base64').toString('utf8');
    user = decoded.split(':')[0];
  }
  return user && user !== 'user' ? user : undefined;
}
