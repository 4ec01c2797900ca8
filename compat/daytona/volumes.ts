// Daytona's volume API (daytona-wave2 §3) onto Nestbox volumes (core/services/volumes.ts).
// Daytona's volumes are S3 prefixes mounted by FUSE on its runners; here a volume is a file
// system of its own with a size limit (NESTBOX_VOLUME_DEFAULT_MIB: Daytona's create sends only a
// name), on one host, bind-mounted into the sandboxes that name it. `POST /volumes` answers
// `ready` at once (the SDK never waits, and `get(name, true)` then `create({volumes})` must work).
import type { Request, RequestHandler, Response, Router } from 'express';
import { z } from 'zod';
import { errors, NestboxError } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { Principal, Volume } from '../../core/types.js';

type Api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) => RequestHandler;

/** Nestbox's states onto Daytona's (`creating, ready, pending_create, pending_delete, deleting, deleted, error`). */
const STATE: Record<Volume['state'], string> = { creating: 'creating', ready: 'ready', deleting: 'deleting', error: 'error' };

export function volumeDto(v: Volume) {
  return {
    id: v.id,
    name: v.name,
    organizationId: v.organizationId,
    state: STATE[v.state],
    createdAt: v.createdAt.toISOString(),
    updatedAt: v.updatedAt.toISOString(),
    lastUsedAt: v.lastUsedAt ? v.lastUsedAt.toISOString() : null,
    errorReason: v.errorMessage,
  };
}

const CreateVolumeBody = z.object({ name: z.string().min(1) }).passthrough();

export function registerVolumeRoutes(router: Router, volumes: CompatPort['volumes'], api: Api): void {
  router.get('/volumes', api(async (_req, res, principal) => {
    res.json((await volumes.list(principal)).map(volumeDto));
  }));
  router.get('/volumes/by-name/:name', api(async (req, res, principal) => {
    res.json(volumeDto(await volumes.getByName(principal, String(req.params.name))));
  }));
  router.get('/volumes/:volumeId', api(async (req, res, principal) => {
    res.json(volumeDto(await volumes.get(principal, String(req.params.volumeId))));
  }));
  router.post('/volumes', api(async (req, res, principal) => {
    const parsed = CreateVolumeBody.safeParse(req.body ?? {});
    if (!parsed.success) throw errors.validation('name', 'a volume name (string) is required');
    const body = parsed.data;
    try {
      res.status(200).json(volumeDto(await volumes.create(principal, { name: body.name })));
    } catch (err) {
      // Daytona answers a taken name with 400 `Volume with name <n> already exists`.
      if (err instanceof NestboxError && err.code === 'conflict') throw errors.validation('name', `Volume with name ${body.name} already exists`);
      throw err;
    }
  }));
  router.delete('/volumes/:volumeId', api(async (req, res, principal) => {
    await volumes.delete(principal, String(req.params.volumeId));
    res.status(200).end();
  }));
}
