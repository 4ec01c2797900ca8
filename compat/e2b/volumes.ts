// E2B's volumes (e2b-wave2 §2) onto Nestbox volumes (core/services/volumes.ts):
//  - the control plane (`/volumes`, X-API-KEY): VolumeAndToken {volumeID, name, token, domain?},
//    the token minted from the key (core/services/volume-tokens.ts: that one volume, the key's
//    volume scopes, revoked with the key);
//  - the volume-content API (`/volumecontent/{volumeID}/…`, `Authorization: Bearer <token>`),
//    served by the volume's host agent on the volume itself, with or without a sandbox running
//    (host/agent/volume-files.ts: no symlink in the volume is ever followed).
// The SDK's content base URL is E2B_VOLUME_API_URL, else https://api.<domain>: with
// NESTBOX_PUBLIC_DOMAIN that host is this server's /e2b (src/http/app.ts).
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { NextFunction, Request, Response, Router } from 'express';
import { errors, NestboxError } from '../../core/errors.js';
import type { Principal, Volume } from '../../core/types.js';
import type { E2bDeps } from './deps.js';
import { renderControlPlaneError } from './errors.js';

type Handler = (req: Request, res: Response, principal: Principal) => Promise<void>;
type Route = (handler: Handler) => (req: Request, res: Response) => Promise<void>;

export function registerVolumeRoutes(router: Router, deps: E2bDeps, route: Route, domain: string | undefined): void {
  const { volumes, volumeTokens } = deps.core;
  const withToken = (principal: Principal, v: Volume) => ({
    volumeID: v.id,
    name: v.name,
    token: volumeTokens.mint(principal, v.id) ?? '',
    ...(domain ? { domain } : {}),
  });
  router.post('/volumes', route(async (req, res, principal) => {
    const name = (req.body as { name?: unknown } | undefined)?.name;
    if (typeof name !== 'string') throw errors.validation('name', 'a volume name (string) is required');
    res.status(201).json(withToken(principal, await volumes.create(principal, { name })));
  }));
  router.get('/volumes', route(async (_req, res, principal) => {
    res.status(200).json((await volumes.list(principal)).map((v) => ({ volumeID: v.id, name: v.name })));
  }));
  router.get('/volumes/:volumeID', route(async (req, res, principal) => {
    res.status(200).json(withToken(principal, await volumes.get(principal, String(req.params.volumeID))));
  }));
  router.delete('/volumes/:volumeID', route(async (req, res, principal) => {
    await volumes.delete(principal, String(req.params.volumeID));
    res.status(204).end();
  }));
}

/** `volumeMounts` of a create ([{name, path}], e2b-wave2 §2.3) as core's mounts. */
export function volumeMountsOf(value: unknown): { name: string; mountPath: string }[] | undefined {
  if (value === undefined || value === null) return undefined;
  if (!Array.isArray(value)) throw errors.validation('volumeMounts', 'must be an array of {name, path}');
  return value.map((m: unknown, i) => {
    const mount = m as { name?: unknown; path?: unknown } | null;
    if (!mount || typeof mount.name !== 'string' || mount.name === '') throw errors.validation(`volumeMounts[${i}].name`, 'must be a volume name');
    if (typeof mount.path !== 'string') throw errors.validation(`volumeMounts[${i}].path`, 'must be an absolute path');
    return { name: mount.name, mountPath: mount.path };
  });
}

/** Query values the host agent takes, from E2B's (`force` creates parents; a file write always overwrites). */
function contentQuery(req: Request, extra: Record<string, string> = {}): Record<string, string> {
  const q: Record<string, string> = { ...extra };
  const path = req.query.path;
  if (typeof path !== 'string') throw errors.validation('path', 'required');
  q.path = path;
  for (const name of ['uid', 'gid', 'mode', 'depth'] as const) {
    const value = req.query[name];
    if (value === undefined) continue;
    if (typeof value !== 'string' || !/^\d{1,10}$/.test(value)) throw errors.validation(name, 'must be a non-negative integer');
    q[name] = value;
  }
  if (req.query.force === 'true') q.parents = 'true';
  return q;
}

/**
 * The content API: `Authorization: Bearer <volume token>`, errors `{code, message}` (404 by
 * status). A middleware before the key check (like the template upload links): its routes carry
 * their own credential, so they are not in the X-API-KEY scope table.
 */
export function volumeContentMiddleware(deps: E2bDeps): (req: Request, res: Response, next: NextFunction) => void {
  const { volumes, volumeTokens } = deps.core;
  const ROUTE = /^\/volumecontent\/([^/]+)\/(dir|path|file)\/?$/;
  /** Relays the host's JSON answer (a Stat, a list) in E2B's shape. */
  const relayJson = async (res: Response, answer: import('node:http').IncomingMessage, status: number, map: (body: unknown) => unknown = (b) => b) => {
    const chunks: Buffer[] = [];
    for await (const chunk of answer) chunks.push(chunk as Buffer);
    res.status(status).json(map(JSON.parse(Buffer.concat(chunks).toString('utf8') || 'null')));
  };
  const handlers: Record<string, (req: Request, res: Response, principal: Principal, volumeId: string) => Promise<void>> = {
    'GET dir': async (req, res, principal, volumeId) => {
      const answer = await volumes.files(principal, volumeId, { method: 'GET', op: 'list', query: contentQuery(req) });
      await relayJson(res, answer, 200, (b) => (b as { entries: unknown[] }).entries);
    },
    'POST dir': async (req, res, principal, volumeId) => {
      await relayJson(res, await volumes.files(principal, volumeId, { method: 'POST', op: 'mkdir', query: contentQuery(req) }), 201);
    },
    'GET path': async (req, res, principal, volumeId) => {
      await relayJson(res, await volumes.files(principal, volumeId, { method: 'GET', op: 'stat', query: contentQuery(req) }), 200);
    },
    'PATCH path': async (req, res, principal, volumeId) => {
      const body = req.body && typeof req.body === 'object' ? (req.body as Record<string, unknown>) : {};
      const json: Record<string, unknown> = {};
      for (const name of ['uid', 'gid', 'mode'] as const) if (body[name] !== undefined && body[name] !== null) json[name] = body[name];
      await relayJson(res, await volumes.files(principal, volumeId, { method: 'PATCH', op: 'stat', query: contentQuery(req), json }), 200);
    },
    'DELETE path': async (req, res, principal, volumeId) => {
      (await volumes.files(principal, volumeId, { method: 'DELETE', op: '', query: contentQuery(req) })).resume();
      res.status(204).end();
    },
    'GET file': async (req, res, principal, volumeId) => {
      const answer = await volumes.files(principal, volumeId, { method: 'GET', op: 'content', query: contentQuery(req) });
      res.status(200).setHeader('content-type', 'application/octet-stream');
      if (answer.headers['content-length']) res.setHeader('content-length', answer.headers['content-length']);
      await pipeline(answer, res);
    },
    'PUT file': async (req, res, principal, volumeId) => {
      // Streamed through to the host: never held in memory; a full volume is a 507.
      await relayJson(res, await volumes.files(principal, volumeId, { method: 'PUT', op: 'content', query: contentQuery(req), body: req as unknown as Readable }), 201);
    },
  };
  return (req, res, next) => {
    if (!req.path.startsWith('/volumecontent/') && req.path !== '/volumecontent') return next();
    void (async () => {
      try {
        const m = ROUTE.exec(req.path);
        const handler = m ? handlers[`${req.method} ${m[2]}`] : undefined;
        if (!m || !handler) throw new NestboxError('not_found', `no volume content route ${req.method} ${req.path}`);
        const volumeId = decodeURIComponent(m[1]!);
        const header = req.headers.authorization;
        const token = typeof header === 'string' && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : undefined;
        const principal = await volumeTokens.authenticate(token, volumeId);
        await deps.core.requestRates.admit(principal, 'e2b');
        await handler(req, res, principal, volumeId);
      } catch (err) {
        if (!res.headersSent) req.resume();
        renderControlPlaneError(res, err, deps.log);
      }
    })();
  };
}
