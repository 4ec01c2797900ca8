// The compat layers' equivalent of native.yaml's `x-nestbox-scope`: every Daytona and E2B route
// declares the scope it needs in a table (compat/daytona/scopes.ts, compat/e2b/scopes.ts), and
// this gate, mounted in front of the routes, checks it before anything else runs (before body
// validation, before any lookup), so the answer to a key without the right never depends on
// the request. Core checks scopes again in its services; the table is the reviewed contract
// and test/scopes.test.ts fails when a route has no entry.
import express, { type NextFunction, type Request, type Response, type Router } from 'express';
import { requireScope } from '../core/services/auth.js';
import type { Principal, Scope } from '../core/types.js';

/**
 * What a route needs: a scope; `authenticated` (a valid key, nothing more: routes that only
 * answer "not supported"); or `public` (no key at all, e.g. Daytona's /config).
 */
export type RouteScope = Scope | 'authenticated' | 'public';

/** `"<METHOD> <express path>"` → scope, in the order the routes are registered (first match wins, as in the router). METHOD may be ALL. */
export type ScopeTable = readonly (readonly [string, RouteScope])[];

export interface ScopeGateOptions {
  /** The authenticated caller (undefined on public routes). */
  principalOf(res: Response): Principal | undefined;
  /** For a key limited to some sandboxes: throw not_found unless the sandbox named by this path parameter is one of them. */
  checkVisible?(principal: Principal, sandboxIdOrName: string): Promise<void>;
  /** Name of the path parameter holding the sandbox id. */
  sandboxParam: string;
  /** Render a refusal in the API's own shape. */
  onError(res: Response, err: unknown): void;
}

const GATED = Symbol('nestbox-scope-gated');

export function scopeGate(table: ScopeTable, options: ScopeGateOptions): Router {
  const gate = express.Router({ mergeParams: true });
  for (const [key, scope] of table) {
    const space = key.indexOf(' ');
    const method = key.slice(0, space).toLowerCase() as 'get' | 'post' | 'put' | 'delete' | 'patch' | 'all';
    const raw = key.slice(space + 1);
    // Regular-expression routes are written as the router lists them: `/^\/volumes(\/.*)?$/`.
    const path = raw.startsWith('/^') && raw.endsWith('$/') ? new RegExp(raw.slice(1, -1)) : raw;
    gate[method](path as string, (req: Request, res: Response, next: NextFunction) => {
      // Only the first matching entry decides, exactly like the router behind it.
      const locals = res.locals as Record<symbol, boolean>;
      if (locals[GATED]) return next();
      locals[GATED] = true;
      void decide(req, res, scope)
        .then(() => next())
        .catch((err) => options.onError(res, err));
    });
  }
  // Route listings (test/route-list.ts) skip the gate itself.
  (gate as unknown as { isScopeGate: boolean }).isScopeGate = true;
  return gate;

  async function decide(req: Request, res: Response, scope: RouteScope): Promise<void> {
    if (scope === 'public') return;
    const principal = options.principalOf(res);
    if (!principal) throw new Error('scope gate: route needs a principal but none was authenticated');
    if (scope !== 'authenticated') requireScope(principal, scope);
    const sandbox = req.params[options.sandboxParam];
    if (principal.sandboxIds !== null && typeof sandbox === 'string' && options.checkVisible) await options.checkVisible(principal, sandbox);
  }
}

/** Table entries as `"METHOD path"` strings, for tests that compare them with a router's routes. */
export function tableKeys(table: ScopeTable): string[] {
  return table.map(([key]) => key);
}
