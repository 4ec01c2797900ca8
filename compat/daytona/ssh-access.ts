// Daytona's SSH access (wave 2 §6): createSshAccess / revokeSshAccess / validateSshAccess over
// core's SshAccessService. The token is the SSH username at the gateway (src/ssh/gateway.ts).
// Creating access revokes the sandbox's earlier tokens, as Daytona's server does.
import type { Request, Response, Router } from 'express';
import { errors } from '../../core/errors.js';
import { renderSshAccess } from '../../core/services/ssh-access.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { Principal, Sandbox } from '../../core/types.js';

type Api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) => (req: Request, res: Response, next: () => void) => void;

function queryString(req: Request, name: string): string | undefined {
  const v = req.query[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'string') throw errors.validation(name, 'must be given once, as a string');
  return v;
}

/** `GET /sandbox/ssh-access/validate`: register before `/sandbox/:sandboxId`, whose id it would otherwise be. */
export function registerSshValidateRoute(router: Router, core: Pick<CompatPort, 'sshAccess'>, api: Api): void {
  router.get('/sandbox/ssh-access/validate', api(async (req, res, principal) => {
    const token = queryString(req, 'token');
    if (!token) throw errors.validation('token', 'is required');
    res.json(await core.sshAccess.validate(principal, token));
  }));
}

export function registerSshAccessRoutes(
  router: Router,
  core: Pick<CompatPort, 'sshAccess'>,
  api: Api,
  resolve: (principal: Principal, req: Request) => Promise<Sandbox>,
  dto: (req: Request, s: Sandbox) => Promise<unknown>,
): void {
  router.post('/sandbox/:sandboxId/ssh-access', api(async (req, res, principal) => {
    const raw = queryString(req, 'expiresInMinutes');
    let expiresInMinutes: number | undefined;
    if (raw !== undefined) {
      expiresInMinutes = Number(raw);
      if (!/^\d+$/.test(raw)) throw errors.validation('expiresInMinutes', 'must be a whole number of minutes');
    }
    const s = await resolve(principal, req);
    // Daytona's SshAccessDto is the native answer's shape (core renders it once for both).
    const access = await core.sshAccess.createAccess(principal, s.id, { expiresInMinutes, revokeEarlier: true, requestHost: req.headers.host });
    res.json(renderSshAccess(access));
  }));
  router.delete('/sandbox/:sandboxId/ssh-access', api(async (req, res, principal) => {
    const token = queryString(req, 'token');
    const s = await resolve(principal, req);
    await core.sshAccess.revokeAccess(principal, s.id, token || undefined);
    res.json(await dto(req, s));
  }));
}
