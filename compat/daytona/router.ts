// The Daytona-compatible front door, mounted at /daytona (daytona.md (a), (c)):
//   /daytona/api/...                          control plane (users set DAYTONA_API_URL=<origin>/daytona/api)
//   /daytona/toolbox/{id}/...                 toolbox, returned as `toolboxProxyUrl`
//   /daytona/api/toolbox/{id}/toolbox/...     legacy toolbox route of SDKs ≤ 0.111
// `Authorization: Bearer <Nestbox API key>` on everything except /config and signed file URLs.
import express, { type NextFunction, type Request, type Response, type Router } from 'express';
import { NestboxError } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import { bearerToken, handle, toolboxProxyUrl, type DaytonaOptions } from './context.js';
import { createControlPlaneRouter } from './control-plane.js';
import { renderDaytonaError, type DaytonaSurface } from './errors.js';
import { verifySignedFileUrl } from './signing.js';
import { createToolboxRouter } from './toolbox.js';
import { DAYTONA_API_SCOPES, DAYTONA_TOOLBOX_SCOPES } from './scopes.js';
import { scopeGate, type ScopeTable } from '../scope-gate.js';
import type { Principal } from '../../core/types.js';
import { rejectNulInJsonBody } from '../../http-kit/request-checks.js';
import { createS3Router } from './object-storage.js';

export { attachDaytonaWebSockets } from './websockets.js';
export type { DaytonaOptions } from './context.js';

/** Scopes a signed file URL grants: exactly the one operation it was signed for. */
const SIGNED_URL_OPERATIONS: Record<string, { path: string; scope: 'files:read' | 'files:write' }> = {
  GET: { path: '/files/download', scope: 'files:read' },
  POST: { path: '/files/upload-v2', scope: 'files:write' },
};

/** The Daytona front door over core's port; `options` carries the server settings it needs. */
export function createDaytonaRouter(core: CompatPort, options: DaytonaOptions): Router {
  const { log } = options;
  const router = express.Router();
  // daytona.md (h) 14: empty POSTs carry x-www-form-urlencoded; only JSON bodies are parsed.
  const json = express.json({ limit: '16mb', type: 'application/json' });

  const authenticate = (surface: DaytonaSurface) => (req: Request, res: Response, next: NextFunction): void => {
    core.auth
      .authenticate(bearerToken(req))
      // Rate limits before anything else is done for the request (core/services/rate-limits.ts).
      .then(async (principal) => {
        await core.requestRates.admit(principal, 'daytona');
        res.locals.principal = principal;
        next();
      })
      .catch((err) => renderDaytonaError(res, err, surface, log));
  };

  // Toolbox auth: a bearer key, or for the two signed-URL routes a valid signature (no key).
  const toolboxAuth = (req: Request, res: Response, next: NextFunction): void => {
    const signed = SIGNED_URL_OPERATIONS[req.method];
    if (!req.headers.authorization && signed && req.path === signed.path && typeof req.query.signature === 'string') {
      const sandboxId = String(req.params.sandboxId);
      Promise.resolve()
        .then(() => verifySignedFileUrl(core.sandboxTokens, sandboxId, req.method, String(req.query.path ?? ''), String(req.query.expires ?? ''), String(req.query.signature), signed.scope))
        .then(async (principal) => {
          // A signed URL counts against the key that signed it.
          await core.requestRates.admit(principal, 'daytona');
          res.locals.principal = principal;
          next();
        })
        .catch((err) => renderDaytonaError(res, err, 'toolbox', log));
      return;
    }
    authenticate('toolbox')(req, res, next);
  };

  // Body-parser failures (bad JSON 400, too large 413, a charset other than UTF-8 415) in
  // Daytona's shape, not express's HTML page; core's toNestboxError gives each its status.
  const jsonErrors = (surface: DaytonaSurface) => (err: unknown, _req: Request, res: Response, next: NextFunction): void => {
    if (!err) return next();
    renderDaytonaError(res, err, surface, log);
  };
  const noNul = (surface: DaytonaSurface) => rejectNulInJsonBody((res, err) => renderDaytonaError(res, err, surface));

  // Declared scopes (scopes.ts), checked before bodies are parsed and before any handler runs.
  const gate = (table: ScopeTable, surface: DaytonaSurface) =>
    scopeGate(table, {
      principalOf: (res) => (res.locals as { principal?: Principal }).principal,
      sandboxParam: 'sandboxId',
      // Visibility only (ids or names; a limited key sees the others as absent): no scope is used.
      checkVisible: async (principal, idOrName) => {
        if (principal.sandboxIds?.has(idOrName)) return;
        await core.sandboxes.getByIdOrName({ ...principal, scopes: new Set(['sandboxes:read']) }, idOrName);
      },
      onError: (res, err) => renderDaytonaError(res, err, surface, log),
    });
  const toolbox = createToolboxRouter(core, options);
  const toolboxChain = [toolboxAuth, gate(DAYTONA_TOOLBOX_SCOPES, 'toolbox'), json, jsonErrors('toolbox'), noNul('toolbox'), toolbox];

  // /config needs no auth on the real server; SDK 0.113–0.13x read proxyToolboxUrl from it (appendix A).
  router.get('/api/config', handle(log, 'api', async (req, res) => {
    res.json({ proxyToolboxUrl: toolboxProxyUrl(req), version: 'nestbox', defaultSnapshot: null, dashboardUrl: null, maintananceMode: false });
  }));
  router.use('/api/toolbox/:sandboxId/toolbox', ...toolboxChain);
  router.use('/api', authenticate('api'), gate(DAYTONA_API_SCOPES, 'api'), json, jsonErrors('api'), noNul('api'), createControlPlaneRouter(core, options));
  router.use('/toolbox/:sandboxId', ...toolboxChain);
  // The S3 endpoint push-access points at: SigV4 credentials instead of an API key, S3's XML errors.
  router.use('/s3', createS3Router({ ...options.objectStorage, maxUploadBytes: options.maxUploadBytes, log }));

  router.use('/api', (req: Request, res: Response) => renderDaytonaError(res, new NestboxError('not_found', `no route ${req.method} ${req.originalUrl.split('?')[0]}`), 'api'));
  router.use((req: Request, res: Response) => renderDaytonaError(res, new NestboxError('not_found', `no route ${req.method} ${req.originalUrl.split('?')[0]}`), 'toolbox'));
  return router;
}
