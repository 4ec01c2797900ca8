import express, { type Express, type Request, type Response } from 'express';
import { NestboxError } from '../../core/errors.js';
import { hostSecretMatches } from '../../core/services/hosts.js';
import { Heartbeat, HEARTBEAT_PATH } from '../../host/protocol/schemas.js';
import type { Services } from '../services.js';
import { createNativeRouter, renderNativeError } from './native/router.js';
import { PortProxy } from './port-proxy.js';
import { bodyIdleTimeout } from './slow-clients.js';
import { createDaytonaRouter } from '../../compat/daytona/router.js';
import { createE2bControlPlaneRouter, createE2bSandboxTrafficHandler } from '../../compat/e2b/index.js';

/** One HTTP app on one port: the native API, the internal host-agent routes, later the compat layers. */
export function createApp(services: Services): Express {
  const app = express();
  app.disable('x-powered-by');
  // Before every route: a body that stops arriving is cut, whatever reads it.
  app.use(bodyIdleTimeout(services.config.http.bodyIdleTimeoutMs));
  // Hosted ports first: a host-form request (`<port>-<id>.<domain>`) belongs to the sandbox
  // whatever its path, and path-form URLs must reach the sandbox exactly as sent.
  // E2B in-sandbox traffic (envd, code interpreter) is recognised by its routing headers or by
  // `49983-`/`49999-<id>.<domain>` hosts, so it goes first; other ports fall through.
  app.use(createE2bSandboxTrafficHandler(services, { publicDomain: services.config.ports.publicDomain }));
  app.use(new PortProxy(services).middleware);
  // Collapse duplicate slashes so `//api/v1/...` from sloppy URL joining still routes.
  app.use((req, _res, next) => {
    if (req.url.includes('//')) req.url = req.url.replace(/\/{2,}/g, '/');
    next();
  });

  app.use('/api/v1', createNativeRouter(services));
  // Daytona: control plane at /daytona/api, toolbox at /daytona/toolbox (compat/daytona/router.ts).
  app.use('/daytona', createDaytonaRouter(services));
  // E2B: control plane under /e2b (its in-sandbox traffic is routed above, before hosted ports).
  app.use('/e2b', createE2bControlPlaneRouter(services, { publicDomain: services.config.ports.publicDomain }));

  app.post(HEARTBEAT_PATH, express.json({ limit: '4mb' }), async (req: Request, res: Response) => {
    try {
      const parsed = Heartbeat.safeParse(req.body);
      if (!parsed.success) throw new NestboxError('validation_failed', `${parsed.error.issues[0].path.join('.') || 'body'}: ${parsed.error.issues[0].message}`);
      const header = req.headers.authorization ?? '';
      const secret = header.startsWith('Bearer ') ? header.slice(7) : '';
      if (!hostSecretMatches(services.hostSecret, parsed.data.hostId, secret)) throw new NestboxError('unauthorized', 'invalid host secret');
      await services.hosts.heartbeat(parsed.data);
      res.status(204).end();
    } catch (err) {
      renderNativeError(res, err, services.log);
    }
  });

  app.use((req: Request, res: Response) => {
    renderNativeError(res, new NestboxError('not_found', `no route ${req.method} ${req.path}`));
  });
  return app;
}
