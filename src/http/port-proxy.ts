// The hosted-port proxy of the control plane. Two URL forms reach a sandbox's port:
//   host form  <port>-<sandboxId>.<PUBLIC_DOMAIN>/… when NESTBOX_PUBLIC_DOMAIN is set (wildcard
//              DNS and TLS in front of the server), routed before anything else. The form for
//              browsers: every port is its own origin, so a sandbox's page can touch neither the
//              API nor another sandbox's page, storage or cookies.
//   path form  /p/<sandboxId>/<port>/…              on the server's own port, always. For API
//              clients and tests: all ports share the API's origin, so the proxy makes that safe
//              itself (below).
// Requests go to the host agent that owns the sandbox (`/v1/sandboxes/{id}/ports/{port}/…`),
// which connects to the sandbox's slot address, so a sandbox on another machine works the same.
// HTTP/1.1 bodies stream both ways; upgrades (WebSocket) become a byte relay.
//
// Access: public ports answer anyone. A private port needs its token: `?_token=` once (answered
// with a cookie of its own, see below), the cookie afterwards, or the header
// `X-Nestbox-Port-Token`. The token never reaches the sandbox's server.
//
// Cookies. Every cookie whose name starts with `nestbox` (also behind `__Host-`/`__Secure-`) is
// Nestbox's: the proxy never forwards one to a sandbox and strips any `Set-Cookie` a sandbox
// sends for such a name, so no sandbox can read or replace a port token. The token cookie is
// named per sandbox and port (`nestbox_port_<id>_<port>`), HttpOnly, SameSite=Strict, Secure
// on https, and scoped to the port's own URL (`Path=/p/<id>/<port>/` in the path form, its own
// host in the host form). A sandbox's own cookies stay its own: in the path form their Path is
// confined to the port's prefix, and in both forms a Domain attribute is removed (host-only),
// so a sandbox cannot plant cookies on the API or on its neighbours.
//
// Path-form answers carry `Content-Security-Policy: sandbox …` without allow-same-origin, so a
// sandbox's page runs in an opaque origin: no access to the API origin's storage, cookies or
// same-origin requests with the user's credentials. (Browsers may then leave SameSite cookies
// off the page's own sub-requests; private ports meant for browsers belong on the host form.)
import { requestLogger } from './request-id.js';
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { NextFunction, Request, Response } from 'express';
import { publicError, type NestboxError } from '../../core/errors.js';
import type { Sandbox } from '../../core/types.js';
import type { PortLookup } from '../../core/services/ports.js';
import { forwardableHeaders, proxyHttp, proxyUpgrade, writeRawResponse, type ProxyTarget } from '../../host/protocol/http-proxy.js';
import { PORT_PROXY_AUTH_HEADER, PORT_PROXY_ERROR_HEADER } from '../../host/protocol/schemas.js';
import type { Services } from '../services.js';
import { claimUpgrade, isUpgradeClaimed } from '../../http-kit/upgrade-claims.js';

export const PORT_TOKEN_HEADER = 'x-nestbox-port-token';
/** Names of the cookies Nestbox owns start with this (case-insensitive, after a `__Host-`/`__Secure-` prefix). */
export const NESTBOX_COOKIE_PREFIX = 'nestbox';
/** Path-form answers: the page runs in an opaque origin (no allow-same-origin). */
export const PATH_FORM_CSP = 'sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads';
const PORT_TOKEN_QUERY = '_token';
/** E2B's credential for a sandbox whose ports are not public (allowPublicTraffic false). */
const E2B_TRAFFIC_TOKEN_HEADER = 'e2b-traffic-access-token';
/** envd and the code interpreter: E2B's in-sandbox services, answered by compat/e2b before this proxy. */
const E2B_SERVICE_PORTS = new Set([49983, 49999]);
/** An open WebSocket to a port counts as activity this often. */
const ACTIVITY_TICK_MS = 10_000;
/** Headers the client may not forge towards the sandbox (we set them) or that carry our secrets. */
const DROPPED_REQUEST_HEADERS = [PORT_TOKEN_HEADER, 'x-daytona-preview-token', E2B_TRAFFIC_TOKEN_HEADER, PORT_PROXY_AUTH_HEADER, 'x-forwarded-prefix'];

const PATH_ROUTE = /^\/p\/([a-z0-9]{1,32})\/(\d{1,5})(\/[^?#]*)?(\?.*)?$/;

export interface PortRoute {
  sandboxId: string;
  port: number;
  /** Path and query for the sandbox's server (the `_token` parameter removed). */
  upstreamPath: string;
  /** `/p/<id>/<port>` in the path form (X-Forwarded-Prefix, cookie path), empty in the host form. */
  prefix: string;
  /** The token given as `?_token=`, if any. */
  queryToken?: string;
  /** `/p/<id>/<port>` without the slash: redirect there so relative links resolve. */
  redirectTo?: string;
}

/** Which hosted port a request is for, if it is for one (both URL forms). */
export function matchPortRoute(req: http.IncomingMessage, publicDomain: string | undefined): PortRoute | undefined {
  const rawUrl = req.url ?? '/';
  // E2B's header form (SDKs >= 2.7 behind one URL): E2b-Sandbox-Id and E2b-Sandbox-Port name a
  // sandbox's own port the way the host form does.
  const e2b = e2bHeaderRoute(req);
  if (e2b) return withQuery(e2b.sandboxId, e2b.port, '', rawUrl);
  const byHost = publicDomain ? matchHost(String(req.headers.host ?? ''), publicDomain) : undefined;
  if (byHost) return withQuery(byHost.sandboxId, byHost.port, '', rawUrl);
  const match = PATH_ROUTE.exec(rawUrl);
  if (!match) return undefined;
  const [, sandboxId, portText, path, query = ''] = match;
  const prefix = `/p/${sandboxId}/${portText}`;
  if (path === undefined) return { sandboxId, port: Number(portText), upstreamPath: '/', prefix, redirectTo: `${prefix}/${query}` };
  return withQuery(sandboxId, Number(portText), prefix, `${path}${query}`);
}

/** Cheap test for the WebSocket dispatcher: does this request belong to the port proxy? */
export function isPortProxyRequest(req: http.IncomingMessage, publicDomain: string | undefined): boolean {
  return matchPortRoute(req, publicDomain) !== undefined;
}

function e2bHeaderRoute(req: http.IncomingMessage): { sandboxId: string; port: number } | undefined {
  const id = req.headers['e2b-sandbox-id'];
  const port = req.headers['e2b-sandbox-port'];
  if (typeof id !== 'string' || typeof port !== 'string' || !/^[a-z0-9]{1,32}$/.test(id) || !/^\d{1,5}$/.test(port)) return undefined;
  if (E2B_SERVICE_PORTS.has(Number(port))) return undefined;
  return { sandboxId: id, port: Number(port) };
}

function matchHost(hostHeader: string, publicDomain: string): { sandboxId: string; port: number } | undefined {
  let host = hostHeader.toLowerCase();
  // A domain without a port matches whatever port the client used (TLS in front is usually 443).
  if (!publicDomain.includes(':')) host = host.replace(/:\d+$/, '');
  if (!host.endsWith(`.${publicDomain}`)) return undefined;
  const label = host.slice(0, -publicDomain.length - 1);
  const match = /^(\d{1,5})-([a-z0-9]{1,32})$/.exec(label);
  return match ? { port: Number(match[1]), sandboxId: match[2] } : undefined;
}

/** Splits off `_token` without re-encoding anything else of the query. */
function withQuery(sandboxId: string, port: number, prefix: string, pathAndQuery: string): PortRoute {
  const at = pathAndQuery.indexOf('?');
  const path = at === -1 ? pathAndQuery : pathAndQuery.slice(0, at);
  if (at === -1) return { sandboxId, port, prefix, upstreamPath: path || '/' };
  let queryToken: string | undefined;
  const kept: string[] = [];
  for (const part of pathAndQuery.slice(at + 1).split('&')) {
    if (part.startsWith(`${PORT_TOKEN_QUERY}=`)) {
      try {
        queryToken = decodeURIComponent(part.slice(PORT_TOKEN_QUERY.length + 1).replace(/\+/g, ' '));
      } catch {
        queryToken = '';
      }
    } else if (part) kept.push(part);
  }
  return { sandboxId, port, prefix, queryToken, upstreamPath: `${path || '/'}${kept.length ? `?${kept.join('&')}` : ''}` };
}

/** The token cookie of one sandbox's port: its own name, so no other port's cookie can stand in for it. */
export function portTokenCookieName(sandboxId: string, port: number): string {
  return `${NESTBOX_COOKIE_PREFIX}_port_${sandboxId}_${port}`;
}

export function isNestboxCookieName(name: string): boolean {
  return name
    .trim()
    .toLowerCase()
    .replace(/^__(host|secure)-/, '')
    .startsWith(NESTBOX_COOKIE_PREFIX);
}

/** `name=value` pairs of a Cookie header (a pair without `=` is a value with an empty name, as browsers send it). */
function cookiePairs(req: http.IncomingMessage): { name: string; pair: string; value: string }[] {
  return String(req.headers.cookie ?? '')
    .split(';')
    .map((part) => part.trim())
    .filter(Boolean)
    .map((pair) => {
      const at = pair.indexOf('=');
      return at === -1 ? { name: '', pair, value: pair } : { name: pair.slice(0, at).trim(), pair, value: pair.slice(at + 1).trim() };
    });
}

function cookieToken(req: http.IncomingMessage, route: PortRoute): string | undefined {
  const name = portTokenCookieName(route.sandboxId, route.port);
  return cookiePairs(req).find((cookie) => cookie.name === name)?.value;
}

/** The request's Cookie header without any of Nestbox's cookies (the sandbox's own pass). */
function sandboxCookies(req: http.IncomingMessage): string | undefined {
  const kept = cookiePairs(req).filter((cookie) => !isNestboxCookieName(cookie.name) && !(cookie.name === '' && isNestboxCookieName(cookie.value)));
  return kept.length ? kept.map((cookie) => cookie.pair).join('; ') : undefined;
}

/**
 * A sandbox's Set-Cookie as the client may see it, or undefined when it must not pass: never
 * one of Nestbox's names; no Domain attribute (host-only); in the path form a Path inside the
 * port's prefix (anything else is replaced by the prefix).
 */
export function sandboxSetCookie(header: string, prefix: string): string | undefined {
  const [first, ...attributes] = header.split(';');
  const at = first.indexOf('=');
  const name = at === -1 ? '' : first.slice(0, at).trim();
  const value = at === -1 ? first.trim() : first.slice(at + 1).trim();
  // A nameless cookie is stored under its value as a name by some browsers: judge both.
  if (isNestboxCookieName(name) || (!name && isNestboxCookieName(value))) return undefined;
  const kept: string[] = [];
  let pathInside = false;
  for (const attribute of attributes) {
    const key = attribute.split('=')[0].trim().toLowerCase();
    if (key === 'domain') continue;
    if (key === 'path' && prefix) {
      const path = attribute.slice(attribute.indexOf('=') + 1).trim();
      if (path !== prefix && !path.startsWith(`${prefix}/`)) continue;
      pathInside = true;
    }
    kept.push(attribute.trim());
  }
  if (prefix && !pathInside) kept.push(`Path=${prefix}/`);
  return [first.trim(), ...kept].join('; ');
}

/** The sandbox's response headers (raw pairs) with its Set-Cookies filtered by `sandboxSetCookie`. */
function filterSandboxResponseHeaders(raw: string[], prefix: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() !== 'set-cookie') {
      out.push(raw[i], raw[i + 1]);
      continue;
    }
    const cookie = sandboxSetCookie(raw[i + 1], prefix);
    if (cookie !== undefined) out.push(raw[i], cookie);
  }
  return out;
}

function isHttps(req: http.IncomingMessage): boolean {
  const forwarded = String(req.headers['x-forwarded-proto'] ?? '').split(',')[0].trim();
  return forwarded ? forwarded === 'https' : !!(req.socket as { encrypted?: boolean }).encrypted;
}

function wantsHtml(req: http.IncomingMessage): boolean {
  return String(req.headers.accept ?? '').includes('text/html');
}

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

interface ProxyPage {
  status: number;
  code: string;
  title: string;
  message: string;
}

/** A page of our own (not the sandbox's): HTML for browsers, the native error shape otherwise. */
function renderPage(req: http.IncomingMessage, page: ProxyPage): { headers: Record<string, string>; body: string } {
  const headers: Record<string, string> = { 'cache-control': 'no-store', [PORT_PROXY_ERROR_HEADER]: page.code };
  if (wantsHtml(req)) {
    headers['content-type'] = 'text/html; charset=utf-8';
    const body = `<!doctype html>\n<html><head><meta charset="utf-8"><title>${page.status} ${escapeHtml(page.title)}</title></head>\n<body style="font-family:sans-serif;max-width:40em;margin:4em auto"><h1>${escapeHtml(page.title)}</h1><p>${escapeHtml(page.message)}</p><p><small>Nestbox hosted port · ${page.status} ${escapeHtml(page.code)}</small></p></body></html>\n`;
    return { headers, body };
  }
  headers['content-type'] = 'application/json';
  return { headers, body: JSON.stringify({ error: { code: page.code, message: page.message } }) };
}

function sendPage(req: http.IncomingMessage, res: http.ServerResponse, page: ProxyPage): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const { headers, body } = renderPage(req, page);
  res.writeHead(page.status, { ...headers, 'content-length': String(Buffer.byteLength(body)) });
  res.end(body);
}

const pages = {
  unknown: (route: PortRoute): ProxyPage => ({
    status: 404,
    code: 'not_found',
    title: 'No such port',
    message: `Sandbox ${route.sandboxId} does not exist or has not published port ${route.port}.`,
  }),
  unauthorized: (route: PortRoute): ProxyPage => ({
    status: 401,
    code: 'unauthorized',
    title: 'This port is private',
    message: `Port ${route.port} of sandbox ${route.sandboxId} needs its token: open the URL with ?${PORT_TOKEN_QUERY}=<token> once, or send the ${PORT_TOKEN_HEADER} header.`,
  }),
  notRunning: (route: PortRoute, sandbox: Sandbox): ProxyPage => ({
    status: 503,
    code: 'sandbox_not_running',
    title: 'The sandbox is not running',
    message:
      sandbox.stopReason === 'host_lost'
        ? `Sandbox ${route.sandboxId} is ${sandbox.state} (host_lost): the machine it runs on stopped answering. It comes back by itself if that machine returns with it running; otherwise resume it once the machine is back.`
        : `Sandbox ${route.sandboxId} is ${sandbox.state}${sandbox.stopReason ? ` (${sandbox.stopReason})` : ''}; resume it to reach port ${route.port}.`,
  }),
  notListening: (route: PortRoute): ProxyPage => ({
    status: 502,
    code: 'port_not_listening',
    title: 'Nothing is listening on this port',
    message: `Nothing in sandbox ${route.sandboxId} accepts connections on port ${route.port} (a server must listen on 0.0.0.0:${route.port}).`,
  }),
  hostUnavailable: (route: PortRoute, detail: string): ProxyPage => ({
    status: 502,
    code: 'host_unavailable',
    title: "The sandbox's host is not reachable",
    message: `Could not reach the host of sandbox ${route.sandboxId}: ${detail}`,
  }),
  tooManyStreams: (detail: string): ProxyPage => ({ status: 429, code: 'rate_limited', title: 'Too many open connections', message: detail }),
  internal: (detail: string): ProxyPage => ({ status: 500, code: 'internal', title: 'Proxy error', message: detail }),
  /** Anything thrown on the way: its own status if it is ours, else a 500 whose text stays in the log. */
  failed: (e: NestboxError): ProxyPage => ({ status: e.status, code: e.code, title: e.status >= 500 ? 'Proxy error' : 'Request refused', message: e.message }),
};

/** Our page for an answer the host agent made itself (marked with PORT_PROXY_ERROR_HEADER). */
function hostAgentPage(route: PortRoute, kind: string, sandbox: Sandbox): ProxyPage {
  if (kind === 'not_listening') return pages.notListening(route);
  if (kind === 'not_running') {
    // The database still said running (a stop or pause is under way): the host knows better.
    return { ...pages.notRunning(route, sandbox), message: `Sandbox ${route.sandboxId} is not running on its host right now; try again once it is running.` };
  }
  if (kind === 'not_found') return pages.unknown(route);
  return pages.internal(`the host agent refused the request (${kind})`);
}

type Decision = { ok: true; sandbox: Sandbox; target: ProxyTarget; setCookie?: string } | { ok: false; page: ProxyPage };

export class PortProxy {
  /** Keep-alive connections to host agents, shared by all proxied requests. */
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 1024, keepAliveMsecs: 1_000 });

  constructor(private readonly services: Services) {}

  /** Express middleware: must be mounted first, so host-form requests never reach other routes. */
  readonly middleware = (req: Request, res: Response, next: NextFunction): void => {
    const route = matchPortRoute(req, this.services.ports.publicDomain);
    if (!route) return next();
    if (route.redirectTo) {
      res.writeHead(308, { location: route.redirectTo, 'content-length': '0' }).end();
      return;
    }
    this.decide(req, route)
      .then((decision) => {
        if (!decision.ok) {
          req.resume();
          return sendPage(req, res, decision.page);
        }
        const { sandbox, target, setCookie } = decision;
        proxyHttp(req, res, { ...target, agent: this.agent }, {
          onUpstreamError: (error) => sendPage(req, res, pages.hostUnavailable(route, error.code ?? error.message)),
          onResponse: (upstream) => {
            const kind = upstream.headers[PORT_PROXY_ERROR_HEADER];
            if (typeof kind === 'string') {
              sendPage(req, res, hostAgentPage(route, kind, sandbox));
              return { handled: true };
            }
            return { headers: [...(setCookie ? ['Set-Cookie', setCookie] : []), ...(route.prefix ? ['Content-Security-Policy', PATH_FORM_CSP] : [])] };
          },
          rewriteResponseHeaders: (raw) => filterSandboxResponseHeaders(raw, route.prefix),
        });
      })
      .catch((error: unknown) => sendPage(req, res, pages.failed(publicError(error, requestLogger(req, this.services.logger), 'port proxy'))));
  };

  /** For the server's 'upgrade' event; true when the request was the proxy's to answer. */
  handleUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): boolean {
    if (isUpgradeClaimed(req)) return false;
    const route = matchPortRoute(req, this.services.ports.publicDomain);
    if (!route) return false;
    // Synchronously, so the native listener (which 404s unknown paths) leaves it alone.
    claimUpgrade(req);
    const refuse = (page: ProxyPage) => {
      const { headers, body } = renderPage(req, page);
      writeRawResponse(socket, page.status, headers, body);
    };
    if (route.redirectTo) {
      writeRawResponse(socket, 308, { location: route.redirectTo }, '');
      return true;
    }
    socket.on('error', () => socket.destroy());
    this.decide(req, route)
      .then((decision) => {
        if (!decision.ok) return refuse(decision.page);
        // An open upgrade holds sockets on every hop: counted against the sandbox's stream cap
        // until the client's socket closes (hosted-port traffic has no API key).
        try {
          this.services.streams.acquireUntilClosed({ sandboxId: route.sandboxId }, socket);
        } catch (error) {
          return refuse(pages.tooManyStreams(error instanceof Error ? error.message : String(error)));
        }
        proxyUpgrade(req, socket, head, decision.target, {
          onUpstreamError: (error) => refuse(pages.hostUnavailable(route, error.code ?? error.message)),
          onRefused: (upstream) => {
            const kind = upstream.headers[PORT_PROXY_ERROR_HEADER];
            if (typeof kind !== 'string') return false;
            refuse(hostAgentPage(route, kind, decision.sandbox));
            return true;
          },
          rewriteResponseHeaders: (raw) => filterSandboxResponseHeaders(raw, route.prefix),
          onOpen: (done) => {
            // An open connection is activity for as long as it lasts (idle policy).
            const timer = setInterval(() => void this.services.ports.noteTraffic(route.sandboxId).catch(() => undefined), ACTIVITY_TICK_MS);
            timer.unref();
            void done.then(() => clearInterval(timer));
          },
        });
      })
      .catch((error: unknown) => refuse(pages.failed(publicError(error, requestLogger(req, this.services.logger), 'port proxy'))));
    return true;
  }

  /** Who may pass, whether the sandbox can take traffic (waking it if it sleeps), and where to send it. */
  private async decide(req: http.IncomingMessage, route: PortRoute): Promise<Decision> {
    const { ports } = this.services;
    const lookup: PortLookup = await ports.lookup(route.sandboxId, route.port);
    if (!lookup.found) return { ok: false, page: pages.unknown(route) };
    // Daytona's SDKs send preview tokens in their own header; it means the same here.
    const headerToken = [PORT_TOKEN_HEADER, 'x-daytona-preview-token'].map((h) => req.headers[h]).find((v): v is string => typeof v === 'string');
    const presented = route.queryToken ?? headerToken ?? cookieToken(req, route);
    const trafficToken = req.headers[E2B_TRAFFIC_TOKEN_HEADER];
    if (!(await ports.admits(lookup, { portToken: presented, trafficToken: typeof trafficToken === 'string' ? trafficToken : undefined }))) return { ok: false, page: pages.unauthorized(route) };
    // A suspended organisation's ports answer 403 organization_suspended (and its sleeping
    // sandboxes are not woken); its running ones are being stopped anyway.
    await this.services.organizations.assertActive(lookup.sandbox.organizationId);
    const sandbox = await ports.readyForTraffic(lookup.sandbox);
    if (!sandbox) return { ok: false, page: pages.unknown(route) };
    if (sandbox.state !== 'running') return { ok: false, page: pages.notRunning(route, sandbox) };

    const hostTarget = await ports.proxyTarget(sandbox, route.port);
    const base = new URL(hostTarget.baseUrl);
    const headers = forwardableHeaders(req, [...DROPPED_REQUEST_HEADERS, 'cookie']);
    const cookies = sandboxCookies(req);
    if (cookies) headers.cookie = cookies;
    const client = req.socket.remoteAddress ?? '';
    const priorFor = req.headers['x-forwarded-for'];
    headers['x-forwarded-for'] = priorFor ? `${String(priorFor)}, ${client}` : client;
    headers['x-forwarded-proto'] = isHttps(req) ? 'https' : 'http';
    headers['x-forwarded-host'] = String(req.headers['x-forwarded-host'] ?? req.headers.host ?? '');
    if (route.prefix) headers['x-forwarded-prefix'] = route.prefix;
    Object.assign(headers, hostTarget.headers);

    let setCookie: string | undefined;
    if (!lookup.port.public && route.queryToken !== undefined) {
      // Scoped to this port's URL only: its path in the path form, its own host in the host form.
      const attributes = [`Path=${route.prefix ? `${route.prefix}/` : '/'}`, 'HttpOnly', 'SameSite=Strict', ...(this.isSecure(req, route) ? ['Secure'] : [])];
      setCookie = `${portTokenCookieName(route.sandboxId, route.port)}=${encodeURIComponent(route.queryToken)}; ${attributes.join('; ')}`;
    }
    return {
      ok: true,
      sandbox,
      setCookie,
      target: { host: base.hostname, port: Number(base.port || 80), path: `${base.pathname}${route.upstreamPath}`, headers, connectTimeoutMs: 10_000 },
    };
  }

  /** Whether the client sees this port over https (directly, through a proxy, or as configured). */
  private isSecure(req: http.IncomingMessage, route: PortRoute): boolean {
    if (isHttps(req)) return true;
    const { ports } = this.services.config;
    return route.prefix ? !!ports.publicUrl?.startsWith('https:') : ports.publicScheme === 'https';
  }

  close(): void {
    this.agent.destroy();
  }
}

/**
 * WebSocket (and other upgrade) requests for hosted ports. Attach before the native listener:
 * a request claimed here (upgrade-claims.ts) is left alone by it.
 */
export function attachPortProxyUpgrades(server: http.Server, services: Services): PortProxy {
  const proxy = new PortProxy(services);
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    proxy.handleUpgrade(req, socket, head);
  });
  return proxy;
}
