// Daytona's organisation secrets (`daytona.secret.*`: api-client SecretApi) onto Nestbox's
// (core/services/secrets.ts), and what a sandbox is given (`secrets` at create, updateSecrets).
//
// Daytona injects a placeholder (`dtn_secret_<id>`) as the variable's value and swaps in the real
// value on outbound requests to the secret's `hosts`. Nestbox has no such egress proxy: the
// variable holds the value itself, and `hosts` is stored and reported, not enforced. The
// `placeholder` field is still given (the SDK types it as always present).
import type { RequestHandler, Request, Response, Router } from 'express';
import { z } from 'zod';
import { errors } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { SecretRecord, SecretRef } from '../../core/services/secrets.js';
import type { Principal } from '../../core/types.js';

type Api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) => RequestHandler;

export const renderDaytonaSecret = (s: SecretRecord) => ({
  id: s.id,
  name: s.name,
  description: s.description === '' ? undefined : s.description,
  placeholder: `dtn_secret_${s.id}`,
  hosts: s.hosts,
  createdAt: s.createdAt.toISOString(),
  updatedAt: s.updatedAt.toISOString(),
});

/** `[{ENV_NAME: "secretName"}, …]` (one single-key object each) as core's references. */
export function daytonaSecretRefs(raw: unknown): SecretRef[] | undefined {
  if (raw === undefined || raw === null) return undefined;
  if (!Array.isArray(raw)) throw errors.validation('secrets', 'must be an array of {ENV_NAME: "secretName"} objects');
  return raw.map((item, i) => {
    const entries = item !== null && typeof item === 'object' && !Array.isArray(item) ? Object.entries(item as Record<string, unknown>) : [];
    if (entries.length !== 1 || typeof entries[0]![1] !== 'string') throw errors.validation(`secrets[${i}]`, 'must be one {ENV_NAME: "secretName"} pair');
    return { env: entries[0]![0], name: entries[0]![1] as string };
  });
}

const Query = z.object({
  cursor: z.string().max(200).optional(),
  limit: z.coerce.number().int().min(1).max(200).optional(),
  name: z.string().max(128).optional(),
  sort: z.enum(['name', 'createdAt', 'updatedAt']).optional(),
  order: z.enum(['asc', 'desc']).optional(),
});

function parse<T>(schema: z.ZodType<T>, value: unknown): T {
  const r = schema.safeParse(value);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    throw errors.validation(issue.path.join('.') || 'query', issue.message);
  }
  return r.data;
}

export function registerSecretRoutes(router: Router, secrets: CompatPort['secrets'], api: Api): void {
  router.get('/secret/paginated', api(async (req, res, principal) => {
    const q = parse(Query, req.query);
    const page = await secrets.list(principal, { cursor: q.cursor, limit: q.limit ?? 100, name: q.name, sort: q.sort ?? 'createdAt', order: q.order ?? 'desc' });
    res.status(200).json({ items: page.items.map(renderDaytonaSecret), total: page.total, nextCursor: page.nextCursor });
  }));
  router.get('/secret', api(async (_req, res, principal) => {
    const page = await secrets.list(principal, { limit: 1000, sort: 'createdAt', order: 'desc' });
    res.status(200).json(page.items.map(renderDaytonaSecret));
  }));
  router.post('/secret', api(async (req, res, principal) => {
    const body = (req.body ?? {}) as Record<string, unknown>;
    res.status(201).json(renderDaytonaSecret(await secrets.create(principal, { name: body.name, value: body.value, description: body.description, hosts: body.hosts })));
  }));
  router.get('/secret/:secretId', api(async (req, res, principal) => {
    res.status(200).json(renderDaytonaSecret(await secrets.get(principal, String(req.params.secretId))));
  }));
  router.patch('/secret/:secretId', api(async (req, res, principal) => {
    const body = (req.body ?? {}) as Record<string, unknown>;
    res.status(200).json(renderDaytonaSecret(await secrets.update(principal, String(req.params.secretId), { value: body.value, description: body.description, hosts: body.hosts, name: body.name })));
  }));
  router.delete('/secret/:secretId', api(async (req, res, principal) => {
    await secrets.remove(principal, String(req.params.secretId));
    res.status(204).end();
  }));
}
