// Daytona's warm pools (`daytona.warmPool`: api-client WarmPoolsApi, `/warm-pools`) onto an
// organisation's own pools in core (core/services/organization-warm-pools.ts).
//
// A pool is per snapshot and region (`target`), with a desired count `pool`; `currentSize` is its
// ready members. What Daytona calls a snapshot is an image here (images.ts): the pool's members
// start from that image, at the snapshot's resources (its `resources` labels, else the server's
// defaults), and a create of that snapshot at that size with no env, secrets or volumes of its
// own (Daytona's rule) is answered by one. Named snapshots of sandboxes are not poolable (their
// disk is one sandbox's): a 400 naming `snapshot`. Members are never listed (Daytona's
// `includeWarm` has nothing to add here), so no visible sandbox carries `warmPoolId`: Daytona
// sets it "only while it is an unclaimed member", and a claimed sandbox is an ordinary one.
import type { Request, RequestHandler, Response, Router } from 'express';
import { z } from 'zod';
import { errors } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { OrganizationWarmPool } from '../../core/services/organization-warm-pools.js';
import type { Principal } from '../../core/types.js';
import { findImageSnapshot, imageOfSnapshotName, imageSnapshotState, RESOURCE_LABELS } from './images.js';
import { SANDBOX_USER } from './sandbox-dto.js';
import { parseBody } from './parse-body.js';

type Api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) => RequestHandler;
type Core = Pick<CompatPort, 'organizationWarmPools' | 'snapshots' | 'images' | 'builds'>;

const CreateWarmPoolBody = z.object({
  snapshot: z.string().min(1).max(300),
  pool: z.number().int().min(0),
  target: z.string().max(100).optional(),
}).strict();
const UpdateWarmPoolBody = z.object({ pool: z.number().int().min(0) }).strict();


/** Daytona's WarmPool DTO (mem and disk in GiB). */
export function renderDaytonaWarmPool(p: OrganizationWarmPool) {
  return {
    id: p.id,
    organizationId: p.organizationId,
    snapshot: p.snapshot,
    target: p.region,
    pool: p.pool,
    currentSize: p.currentSize,
    cpu: p.cpu,
    mem: p.memoryMiB / 1024,
    disk: p.diskGiB,
    osUser: SANDBOX_USER,
    env: p.env,
    errorReason: p.errorReason,
    createdAt: p.createdAt.toISOString(),
    updatedAt: p.updatedAt.toISOString(),
  };
}

export function registerWarmPoolRoutes(router: Router, core: Core, api: Api, region: string): void {
  const pools = core.organizationWarmPools;
  router.get('/warm-pools', api(async (_req, res, principal) => {
    res.json((await pools.list(principal)).map(renderDaytonaWarmPool));
  }));
  router.post('/warm-pools', api(async (req, res, principal) => {
    const body = parseBody(CreateWarmPoolBody, req.body);
    const target = body.target === undefined || body.target === '' ? region : body.target;
    // Every host of this server is in one region (control-plane.ts checkTarget): another name would be a pool nobody's create could use.
    if (target !== region) throw errors.validation('target', `no host of this server is in region "${target}"; its region is "${region}" (NESTBOX_REGION): leave target unset or use "${region}"`);
    // A sandbox's named snapshot is one sandbox's disk: members cannot be made of it ahead of time.
    if (await core.snapshots.get(principal, body.snapshot).then(() => true, () => false)) {
      throw errors.validation('snapshot', `"${body.snapshot}" is a snapshot of a sandbox; warm pools keep sandboxes of image snapshots (snapshot.create, or the default)`);
    }
    const found = await findImageSnapshot(core, principal, body.snapshot);
    if (!found) throw errors.notFound('snapshot', body.snapshot);
    const { state, errorReason } = imageSnapshotState(found);
    if (state !== 'active' || !found.image) throw errors.validation('snapshot', `snapshot "${body.snapshot}" is ${state}${errorReason ? ` (${errorReason.split('\n')[0]})` : ''}; a warm pool needs an active snapshot`);
    // The size a create of this snapshot gets when it asks for none (control-plane.ts snapshotSource).
    const labels = found.image.config.labels;
    const resource = (key: string) => (labels[key] === undefined ? undefined : Number(labels[key]));
    const memory = resource(RESOURCE_LABELS.memory);
    const created = await pools.create(principal, {
      snapshot: body.snapshot,
      image: imageOfSnapshotName(found.name, 'snapshot').reference,
      cpu: resource(RESOURCE_LABELS.cpu),
      memoryMiB: memory === undefined ? undefined : memory * 1024,
      diskGiB: resource(RESOURCE_LABELS.disk),
      region: target,
      pool: body.pool,
    });
    res.status(201).json(renderDaytonaWarmPool(created));
  }));
  router.get('/warm-pools/:id', api(async (req, res, principal) => {
    res.json(renderDaytonaWarmPool(await pools.get(principal, String(req.params.id))));
  }));
  router.patch('/warm-pools/:id', api(async (req, res, principal) => {
    const body = parseBody(UpdateWarmPoolBody, req.body);
    res.json(renderDaytonaWarmPool(await pools.update(principal, String(req.params.id), body)));
  }));
  router.delete('/warm-pools/:id', api(async (req, res, principal) => {
    await pools.delete(principal, String(req.params.id));
    res.status(200).end();
  }));
}
