import express, { type Express, type Request, type Response } from 'express';
import { NestboxError } from '../../core/errors.js';
import { hostSecretMatches } from '../../core/services/hosts.js';
import { Heartbeat, HEARTBEAT_PATH } from '../../host/protocol/schemas.js';
import type { Services } from '../services.js';
import { createNativeRouter, renderNativeError } from './native/router.js';

/** One HTTP app on one port: the native API, the internal host-agent routes, later the compat layers. */
export function createApp(services: Services): Express {
  const app = express();
  app.disable('x-powered-by');
  // Collapse duplicate slashes so `//api/v1/...` from sloppy URL joining still routes.
  app.use((req, _res, next) => {
    if (req.url.includes('//')) req.url = req.url.replace(/\/{2,}/g, '/');
    next();
  });

  app.use('/api/v1', createNativeRouter(services));

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
