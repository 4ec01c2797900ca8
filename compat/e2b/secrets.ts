// E2B's secrets (`Secret.create/update/getInfo/list/exists/destroy` of the e2b SDK: `/secrets`,
// `/secrets/{secretID}`) onto Nestbox's organisation secrets (core/services/secrets.ts).
//
// E2B resolves `${e2b.secrets.<name>}` placeholders in its egress proxy (network transform
// rules); Nestbox has no such proxy. What a sandbox can do instead: an `envVars` value that is
// exactly a placeholder (`Secret.fill(name)`) gives the sandbox that secret as that variable
// (e2bSecretEnv below), resolved by the control plane at every start, never stored in the
// sandbox's env. `{secretID}` is the id or the name; names are lower-cased, as E2B stores them.
import type { Request, Response, Router } from 'express';
import { errors } from '../../core/errors.js';
import type { SecretRecord, SecretRef } from '../../core/services/secrets.js';
import type { Principal } from '../../core/types.js';
import type { E2bDeps } from './deps.js';

type Handler = (req: Request, res: Response, principal: Principal) => Promise<void>;
type Route = (handler: Handler) => (req: Request, res: Response) => Promise<void>;

const PLACEHOLDER = /^\$\{e2b\.secrets\.([^{}\p{Cc}]+)\}$/u;

export const renderE2bSecret = (s: SecretRecord) => ({
  secretID: s.id,
  name: s.name,
  currentVersion: s.version,
  metadata: s.metadata,
  createdAt: s.createdAt.toISOString(),
  updatedAt: s.updatedAt.toISOString(),
});

/** Splits create's `envVars` into plain variables and secret references (values `${e2b.secrets.<name>}`). */
export function e2bSecretEnv(env: Record<string, string> | undefined): { env: Record<string, string> | undefined; secrets: SecretRef[] } {
  if (!env) return { env, secrets: [] };
  const plain: Record<string, string> = {};
  const secrets: SecretRef[] = [];
  for (const [name, value] of Object.entries(env)) {
    const m = PLACEHOLDER.exec(value);
    if (m) secrets.push({ name: m[1]!.toLowerCase(), env: name });
    else plain[name] = value;
  }
  return { env: plain, secrets };
}

export function registerSecretRoutes(router: Router, deps: E2bDeps, route: Route): void {
  const secrets = deps.core.secrets;
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' && !Array.isArray(req.body) ? (req.body as Record<string, unknown>) : {});
  const name = (raw: unknown): unknown => (typeof raw === 'string' ? raw.toLowerCase() : raw);
  const secretOf = (principal: Principal, req: Request) => secrets.getByIdOrName(principal, name(String(req.params.secretID)) as string);

  // A page per call; the next page's token in `x-next-token` (the SDK's paginator reads it).
  router.get('/secrets', route(async (req, res, principal) => {
    const raw = req.query.limit;
    const limit = raw === undefined ? 100 : Number(raw);
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw errors.validation('limit', 'must be an integer from 1 to 1000');
    const token = typeof req.query.nextToken === 'string' ? req.query.nextToken : undefined;
    const page = await secrets.list(principal, { limit, cursor: token, sort: 'createdAt', order: 'asc' });
    if (page.nextCursor) res.setHeader('x-next-token', page.nextCursor);
    res.status(200).json(page.items.map(renderE2bSecret));
  }));
  router.post('/secrets', route(async (req, res, principal) => {
    const b = body(req);
    res.status(201).json(renderE2bSecret(await secrets.create(principal, { name: name(b.name), value: b.value, metadata: b.metadata })));
  }));
  router.get('/secrets/:secretID', route(async (req, res, principal) => {
    res.status(200).json(renderE2bSecret(await secretOf(principal, req)));
  }));
  // A new value is a new version (the SDK's update always sends one).
  router.post('/secrets/:secretID', route(async (req, res, principal) => {
    const b = body(req);
    if (b.value === undefined) throw errors.validation('value', 'is required');
    const current = await secretOf(principal, req);
    res.status(200).json(renderE2bSecret(await secrets.update(principal, current.id, { value: b.value, metadata: b.metadata })));
  }));
  router.delete('/secrets/:secretID', route(async (req, res, principal) => {
    const current = await secretOf(principal, req);
    await secrets.remove(principal, current.id);
    res.status(204).end();
  }));
}
