// The HTTP side of the control plane's metrics: `GET /metrics` behind its bearer token, and the
// request-duration middleware for every front door (core/metrics.ts has the series).
//
// Route labels are templates, never raw paths (a path carries sandbox ids: one series per id
// would grow without bound). They are found as cheaply as possible when the answer ends:
// - the native API names its operationId (`noteRoute`, called by the native router);
// - the E2B in-sandbox traffic and the hosted-port proxy are tagged by a static middleware in
//   front of each (`tagFrontDoor`): a request they answer keeps the tag;
// - the Daytona and E2B express routers leave `req.route` (the matched route's path) and
//   `req.baseUrl` (where its router is mounted, with the sandbox id in the toolbox mounts,
//   which is replaced by its parameter name); a mount not known here is `unmatched`;
// - anything else (404s, malformed URLs) is `unmatched` under the API its path belongs to.
import { timingSafeEqual } from 'node:crypto';
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { ControlPlaneMetrics, HttpApi } from '../../core/metrics.js';

/** The route label of a request no router claimed (and of mounts this module does not know). */
export const UNMATCHED_ROUTE = 'unmatched';

const ROUTE = Symbol('nestbox.metrics.route');

/**
 * One route's labels, made once (for the process: their number is bounded) and reused by every
 * request on it; each server's histogram keeps its children by label, method and status, so a
 * request in the steady state allocates no label object, key string or child, only its `close`
 * listener.
 */
interface RouteLabel {
  api: HttpApi;
  route: string;
}

interface Labelled {
  [ROUTE]?: RouteLabel;
}

const labels = new Map<HttpApi, Map<string, RouteLabel>>();

function labelFor(api: HttpApi, route: string): RouteLabel {
  let byRoute = labels.get(api);
  if (!byRoute) labels.set(api, (byRoute = new Map()));
  let label = byRoute.get(route);
  if (!label) byRoute.set(route, (label = { api, route }));
  return label;
}

/** Called by a front door that knows the request's route template (the native operationId). */
export function noteRoute(req: Request, api: HttpApi, route: string): void {
  (req as Labelled)[ROUTE] = labelFor(api, route);
}

/**
 * A middleware put in front of a front door that answers without express routes (E2B in-sandbox
 * traffic, hosted ports): the request is labelled with it unless a later front door relabels it.
 */
export function tagFrontDoor(api: HttpApi, route: string): RequestHandler {
  const label = labelFor(api, route);
  return (req, _res, next) => {
    (req as Labelled)[ROUTE] = label;
    next();
  };
}

/** Clears the tag of the front doors above once none of them took the request. */
export const untagFrontDoor: RequestHandler = (req, _res, next) => {
  (req as Labelled)[ROUTE] = undefined;
  next();
};

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);
/** The Daytona toolbox mounts carry the sandbox id in their base URL. */
const DAYTONA_TOOLBOX_BASE = /^\/daytona(\/api)?\/toolbox\/[^/]+/;
/** Every router mount of the compat front doors (after the toolbox id is replaced). */
const KNOWN_BASES = new Set(
  ['', '/daytona', '/daytona/api', '/daytona/s3', '/e2b'].concat(
    ...['/daytona/api/toolbox/:sandboxId/toolbox', '/daytona/toolbox/:sandboxId'].map((base) => [base, `${base}/process/interpreter`, `${base}/git`, `${base}/lsp`]),
  ),
);

function apiOfPath(path: string): HttpApi {
  if (path.startsWith('/api/')) return 'native';
  if (path.startsWith('/daytona')) return 'daytona';
  if (path.startsWith('/e2b')) return 'e2b';
  if (path.startsWith('/p/')) return 'proxy';
  return 'internal';
}

/** Compat route labels by express route object, then by (templated) mount. */
const compatLabels = new WeakMap<object, Map<string, RouteLabel>>();

function labelOf(req: Request): RouteLabel {
  const noted = (req as Labelled)[ROUTE];
  if (noted) return noted;
  const api = apiOfPath(req.originalUrl);
  const route = (req as { route?: { path?: unknown } }).route;
  // (The native API is labelled by operationId above; its router has no express routes.)
  if (route && typeof route.path === 'string' && api !== 'native') {
    let byBase = compatLabels.get(route);
    if (!byBase) compatLabels.set(route, (byBase = new Map()));
    const cached = byBase.get(req.baseUrl);
    if (cached) return cached;
    const base = req.baseUrl.replace(DAYTONA_TOOLBOX_BASE, (_m, apiPart: string | undefined) => `/daytona${apiPart ?? ''}/toolbox/:sandboxId`);
    const label = labelFor(api, KNOWN_BASES.has(base) ? base + route.path : UNMATCHED_ROUTE);
    // Cached by the raw base only when it has no id in it (a toolbox base differs per sandbox).
    if (base === req.baseUrl) byBase.set(req.baseUrl, label);
    return label;
  }
  return labelFor(api, UNMATCHED_ROUTE);
}

/**
 * Times every request from its arrival to the end of its answer (or the client leaving), in
 * `nestbox_http_request_duration_seconds`. Mounted first, so every front door is covered.
 */
export function httpMetrics(metrics: ControlPlaneMetrics): RequestHandler {
  const histogram = metrics.httpDuration;
  const children = new Map<RouteLabel, Map<string, Map<number, { observe(value: number): void }>>>();
  return (req: Request, res: Response, next: NextFunction) => {
    const started = performance.now();
    res.once('close', () => {
      const label = labelOf(req);
      const method = METHODS.has(req.method) ? req.method : 'OTHER';
      // A client that left before the answer ended is recorded as status 0.
      const status = res.writableFinished ? res.statusCode : 0;
      let byMethod = children.get(label);
      if (!byMethod) children.set(label, (byMethod = new Map()));
      let byStatus = byMethod.get(method);
      if (!byStatus) byMethod.set(method, (byStatus = new Map()));
      let child = byStatus.get(status);
      if (!child) byStatus.set(status, (child = histogram.labels({ api: label.api, method, route: label.route, status: String(status) })));
      child.observe((performance.now() - started) / 1000);
    });
    next();
  };
}

/** Constant-time comparison of a presented bearer token with the configured one. */
export function bearerMatches(header: string | undefined, token: string): boolean {
  const given = Buffer.from(header?.startsWith('Bearer ') ? header.slice(7) : '');
  const expected = Buffer.from(token);
  return given.length === expected.length && timingSafeEqual(given, expected);
}

/**
 * `GET /metrics`: the exposition text, for `Authorization: Bearer <NESTBOX_METRICS_TOKEN>` only
 * (401 otherwise). Without a token configured the route does not exist (404, like any unknown path).
 */
export function metricsEndpoint(metrics: ControlPlaneMetrics, token: string | undefined): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    if (!token) return next();
    noteRoute(req, 'internal', '/metrics');
    if (!bearerMatches(req.headers.authorization, token)) {
      res.status(401).set('www-authenticate', 'Bearer').json({ error: { code: 'unauthorized', message: 'missing or invalid metrics token (Authorization: Bearer <NESTBOX_METRICS_TOKEN>)' } });
      return;
    }
    metrics.scrape().then(
      (text) => res.status(200).set('content-type', metrics.contentType).send(text),
      (err: unknown) => next(err),
    );
  };
}
