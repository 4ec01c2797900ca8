import { createHmac } from 'node:crypto';
import express, { type Express, type NextFunction, type Request, type Response } from 'express';
import { NestboxError } from '../../core/errors.js';
import { hostSecretMatches } from '../../core/services/hosts.js';
import { Heartbeat, HEARTBEAT_PATH } from '../../host/protocol/schemas.js';
import type { Services } from '../services.js';
import { createNativeRouter, renderNativeError } from './native/router.js';
import { PortProxy } from './port-proxy.js';
import { bodyIdleTimeout } from './slow-clients.js';
import { createDaytonaRouter, type DaytonaOptions } from '../../compat/daytona/router.js';
import { createE2bControlPlaneRouter, createE2bSandboxTrafficHandler, type E2bOptions } from '../../compat/e2b/index.js';
import { renderDaytonaError } from '../../compat/daytona/errors.js';
import { DAYTONA_S3_PATH, renderS3Error } from '../../compat/daytona/object-storage.js';
import { renderControlPlaneError } from '../../compat/e2b/errors.js';
import { requestTargetProblem } from '../../http-kit/request-checks.js';
import { assignRequestIds, requestLogger } from './request-id.js';
import { traceRequests } from './tracing.js';
import { tracingEnabled } from '../../core/tracing.js';
import type { Logger } from '../../core/logger.js';
import { dashboardHandler } from './dashboard.js';
import { httpMetrics, metricsEndpoint, tagFrontDoor, untagFrontDoor } from './metrics.js';
import { createMcpRouter, MCP_PATH } from './mcp.js';
import { createApiDocsRouter } from './api-docs.js';

/** The server settings the E2B layer needs beside core's port (compat/e2b/deps.ts). */
export function e2bOptionsOf(services: Services): E2bOptions {
  return {
    publicDomain: services.config.ports.publicDomain,
    maxUploadBytes: services.config.limits.maxUploadBytes,
    maxTimeoutSeconds: services.config.limits.maxTimeoutSeconds,
    streams: services.streams,
    log: services.logger.child({ component: 'e2b' }),
  };
}

/**
 * Render an error in the shape of the API the path belongs to. Used where no front door has
 * taken the request yet (a malformed URL) and by the last-resort error handler.
 */
export function renderErrorForPath(req: Request, res: Response, err: unknown, logger?: Logger): void {
  const path = req.path;
  const log = logger;
  if (path === DAYTONA_S3_PATH || path.startsWith(`${DAYTONA_S3_PATH}/`)) return renderS3Error(req, res, err, log);
  if (/^\/daytona\/(toolbox\/|api\/toolbox\/)/.test(path)) return renderDaytonaError(res, err, 'toolbox', log);
  if (path.startsWith('/daytona/')) return renderDaytonaError(res, err, 'api', log);
  if (path === '/e2b' || path.startsWith('/e2b/')) return renderControlPlaneError(res, err, log);
  renderNativeError(res, err, logger);
}

/** The server settings the Daytona layer needs besides core's port (it imports nothing of src/). */
export function daytonaOptionsOf(services: Services): DaytonaOptions {
  const { maxUploadBytes, maxTimeoutSeconds } = services.config.limits;
  // Object-storage credentials are HMACs under a key of their own, derived from the master secret.
  const credentialKey = createHmac('sha256', services.hostSecret).update('nestbox-daytona-object-storage').digest();
  return {
    maxUploadBytes,
    maxTimeoutSeconds,
    region: services.config.region,
    defaultSnapshot: services.config.daytonaDefaultSnapshot,
    streams: services.streams,
    objectStorage: { store: services.objects, credentialKey, publicUrl: services.config.ports.publicUrl },
    log: services.logger.child({ component: 'daytona' }),
  };
}

/** One HTTP app on one port: the native API, the internal host-agent routes, later the compat layers. */
export function createApp(services: Services): Express {
  const app = express();
  const e2bOptions = e2bOptionsOf(services);
  app.disable('x-powered-by');
  // First: every later line about the request can carry its id.
  app.use(assignRequestIds(services.logger));
  // Every request timed by front door, route template and status (src/http/metrics.ts); not
  // measured at all when no one can scrape it (no NESTBOX_METRICS_TOKEN).
  if (services.config.metrics.token) app.use(httpMetrics(services.metrics));
  // With tracing on, a server span per request (continuing a caller's traceparent); off, no middleware at all.
  if (tracingEnabled()) app.use(traceRequests());
  // An error rendered here is logged on the request's own logger (with its requestId).
  const errorLog = (req: Request) => requestLogger(req, services.logger);
  // Before every route: a body that stops arriving is cut, whatever reads it.
  app.use(bodyIdleTimeout(services.config.http.bodyIdleTimeoutMs));
  // Hosted ports first: a host-form request (`<port>-<id>.<domain>`) belongs to the sandbox
  // whatever its path, and path-form URLs must reach the sandbox exactly as sent.
  // E2B in-sandbox traffic (envd, code interpreter) is recognised by its routing headers or by
  // `49983-`/`49999-<id>.<domain>` hosts, so it goes first; other ports fall through.
  app.use(tagFrontDoor('e2b', 'sandbox-traffic'), createE2bSandboxTrafficHandler(services, e2bOptions));
  app.use(tagFrontDoor('proxy', 'hosted-port'), new PortProxy(services).middleware, untagFrontDoor);
  // Prometheus metrics, behind NESTBOX_METRICS_TOKEN (after the host-form proxy: there, /metrics is the sandbox's).
  app.get('/metrics', metricsEndpoint(services.metrics, services.config.metrics.token));
  // Collapse duplicate slashes so `//api/v1/...` from sloppy URL joining still routes.
  app.use((req, _res, next) => {
    if (req.url.includes('//')) req.url = req.url.replace(/\/{2,}/g, '/');
    next();
  });
  // Malformed percent-encoding or NUL bytes in the URL: a 400 in the API's own shape, before
  // any router decodes (and throws on) it or an id reaches the database.
  app.use((req, res, next) => {
    const problem = requestTargetProblem(req);
    if (problem) return renderErrorForPath(req, res, problem, errorLog(req));
    next();
  });

  // E2B SDKs given a domain (E2B_DOMAIN=<NESTBOX_PUBLIC_DOMAIN>) call their control plane at
  // https://api.<domain>/… with no prefix: that host is E2B's API, so its paths are /e2b's. (Its
  // envd and port hosts, `<port>-<id>.<domain>`, were routed above.)
  const e2bApiHost = services.config.ports.publicDomain ? `api.${services.config.ports.publicDomain.toLowerCase()}` : undefined;
  if (e2bApiHost) {
    app.use((req, _res, next) => {
      let host = String(req.headers.host ?? '').toLowerCase();
      if (!e2bApiHost.includes(':')) host = host.replace(/:\d+$/, '');
      if (host === e2bApiHost && req.url !== '/e2b' && !req.url.startsWith('/e2b/') && !req.url.startsWith('/e2b?')) req.url = `/e2b${req.url}`;
      next();
    });
  }
  app.use('/api/v1', createNativeRouter(services));
  // Daytona: control plane at /daytona/api, toolbox at /daytona/toolbox (compat/daytona/router.ts).
  app.use('/daytona', createDaytonaRouter(services, daytonaOptionsOf(services)));
  // E2B: control plane under /e2b (its in-sandbox traffic is routed above, before hosted ports).
  app.use('/e2b', createE2bControlPlaneRouter(services, e2bOptions));

  app.post(HEARTBEAT_PATH, express.json({ limit: '4mb' }), async (req: Request, res: Response) => {
    try {
      const parsed = Heartbeat.safeParse(req.body);
      if (!parsed.success) throw new NestboxError('validation_failed', `${parsed.error.issues[0].path.join('.') || 'body'}: ${parsed.error.issues[0].message}`);
      const header = req.headers.authorization ?? '';
      const secret = header.startsWith('Bearer ') ? header.slice(7) : '';
      if (!hostSecretMatches(services.hostSecret, parsed.data.hostId, secret)) throw new NestboxError('unauthorized', 'invalid host secret');
      await services.hosts.heartbeat(parsed.data);
      if (parsed.data.usage) await services.usage.record(parsed.data.hostId, parsed.data.usage);
      res.status(204).end();
    } catch (err) {
      renderNativeError(res, err, errorLog(req));
    }
  });

  // MCP over streamable HTTP: a client of the native API above, with the caller's key.
  app.use(MCP_PATH, tagFrontDoor('internal', MCP_PATH), createMcpRouter(services.config, services.logger));
  // The rendered API reference (src/http/api-docs.ts); public like the spec it renders.
  app.use('/docs', createApiDocsRouter());
  // The web dashboard at `/` (and its page paths): after every API, never shadowing one.
  app.use(dashboardHandler());

  app.use((req: Request, res: Response) => {
    renderNativeError(res, new NestboxError('not_found', `no route ${req.method} ${req.path}`));
  });
  // Last resort: whatever a router passed on with next(err) is answered in that API's shape,
  // never with express's HTML page (which quotes the stack and host paths).
  app.use((err: unknown, req: Request, res: Response, _next: NextFunction) => {
    renderErrorForPath(req, res, err, errorLog(req));
  });
  return app;
}
