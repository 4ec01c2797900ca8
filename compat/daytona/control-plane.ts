// Daytona control plane (daytona.md (b)) → core's sandbox and snapshot services.
import { registerVolumeRoutes } from './volumes.js';
import type { EgressPolicy } from '../../core/host-client.js';
import express, { type Request, type Response, type Router } from 'express';
import { z } from 'zod';
import { NestboxError, errors } from '../../core/errors.js';
import type { CreateSandboxInput, LifecyclePolicy, ListSandboxesInput } from '../../core/services/sandboxes.js';
import type { SandboxState } from '../../core/state-machine.js';
import type { Principal, Sandbox, Snapshot } from '../../core/types.js';
import type { CompatPort } from '../../core/compat-port.js';
import { handle, principalOf, toolboxProxyUrl, type DaytonaOptions } from './context.js';
import { daytonaSecretRefs, registerSecretRoutes } from './secrets.js';
import { registerWarmPoolRoutes } from './warm-pools.js';
import { notSupported } from './errors.js';
import { DAYTONA_METRICS_MAX_POINTS, instantOf as metricsInstantOf, metricNamesOf, metricSeries } from './metrics.js';
import { registerWebhookRoutes } from './webhooks.js';
import { registerSshAccessRoutes, registerSshValidateRoute } from './ssh-access.js';
import { CORE_STATES_OF, renderDaytonaSandbox, renderDaytonaSnapshot, SANDBOX_USER } from './sandbox-dto.js';
import { requireScope } from '../../core/services/auth.js';
import { isIpv4Entry, parseEgressEntry } from '../../core/egress.js';
import { issueStorageAccess } from './object-storage.js';
import { buildSpecOf, countsWithoutImage, findImageSnapshot, hideBuild, imageOfSnapshotName, imageSnapshotState, renderImageSnapshot, RESOURCE_LABELS, snapshotNameOf, snapshotRefOf, type ImageSnapshot } from './images.js';
import { PendingBuildSandboxes, renderPendingSandbox, streamBuildLog } from './builds.js';
import { publicOrigin } from './context.js';
import { FINISHED_BUILD_STATES } from '../../core/images/types.js';
import { parseBody } from './parse-body.js';

const Minutes = z.number().int();

/** daytona.md (b) "Create body": every field the SDK sends; others are passed through and reported. */
const CreateBody = z
  .object({
    name: z.string().optional(),
    snapshot: z.string().optional(),
    buildInfo: z.object({ dockerfileContent: z.string().optional(), contextHashes: z.array(z.string()).optional() }).passthrough().optional(),
    user: z.string().optional(),
    env: z.record(z.string(), z.string()).optional(),
    labels: z.record(z.string(), z.string()).optional(),
    public: z.boolean().optional(),
    target: z.string().optional(),
    cpu: z.number().int().optional(),
    gpu: z.number().int().min(0).optional(),
    gpuType: z.array(z.string()).optional(),
    spot: z.boolean().optional(),
    memory: z.number().positive().optional(),
    disk: z.number().int().optional(),
    autoStopInterval: Minutes.min(0).optional(),
    autoPauseInterval: Minutes.min(0).optional(),
    autoArchiveInterval: Minutes.min(0).optional(),
    autoDeleteInterval: Minutes.optional(),
    ttlMinutes: Minutes.min(0).optional(),
    volumes: z.array(z.object({ volumeId: z.string(), mountPath: z.string(), subpath: z.string().optional() })).optional(),
    kvm: z.boolean().optional(),
    networkBlockAll: z.boolean().optional(),
    networkAllowList: z.string().optional(),
    domainAllowList: z.string().optional(),
    outboundProxyUrl: z.string().optional(),
    otelEndpointOverride: z.string().optional(),
    linkedSandbox: z.string().optional(),
    secrets: z.array(z.record(z.string(), z.string())).optional(),
  })
  .passthrough();
type CreateBody = z.infer<typeof CreateBody>;


/** Daytona's default auto-stop: 15 minutes without activity. */
const DEFAULT_AUTO_STOP_MINUTES = 15;

/**
 * Daytona intervals (minutes) → core's lifecycle policy (seconds):
 * - autoStopInterval N → stop after N idle minutes (0 = never); autoPauseInterval N → pause after
 *   N idle minutes instead (core has one idle timer, so a non-zero pause interval wins);
 * - autoDeleteInterval: negative = never, 0 = as soon as it stops, N = N minutes after it stops;
 * - ttlMinutes N → stopped N minutes after it starts and deleted when it stops (auto-destroy).
 */
export function intervalsToPolicy(i: { autoStopInterval?: number; autoPauseInterval?: number; autoDeleteInterval?: number; ttlMinutes?: number }, maxSeconds: number): LifecyclePolicy & { timeoutSeconds?: number } {
  const policy: LifecyclePolicy & { timeoutSeconds?: number } = {};
  const seconds = (field: string, m: number): number => {
    if (m * 60 > maxSeconds) throw errors.validation(field, `must be at most ${Math.floor(maxSeconds / 60)} minutes on this server`);
    return m * 60;
  };
  if (i.autoPauseInterval) {
    policy.idleTimeoutSeconds = seconds('autoPauseInterval', i.autoPauseInterval);
    policy.idleAction = 'pause';
  } else if (i.autoStopInterval !== undefined) {
    policy.idleTimeoutSeconds = seconds('autoStopInterval', i.autoStopInterval);
    policy.idleAction = 'stop';
  }
  if (i.autoDeleteInterval !== undefined) policy.autoDeleteSeconds = i.autoDeleteInterval < 0 ? null : seconds('autoDeleteInterval', i.autoDeleteInterval);
  if (i.ttlMinutes !== undefined && i.ttlMinutes > 0) {
    policy.timeoutSeconds = seconds('ttlMinutes', i.ttlMinutes);
    policy.autoDeleteSeconds = 0;
  }
  return policy;
}

/**
 * Options unknown to this server (a newer SDK's): accepted, and the caller is told they had no
 * effect (a header and the log) rather than failing every create of that SDK. Every option this
 * server knows is honoured or refused (refuseUnsupported), never ignored.
 */
function unknownOptions(body: CreateBody): string[] {
  const known = new Set(Object.keys(CreateBody.shape));
  return Object.keys(body).filter((key) => !known.has(key));
}

/** Options whose silent omission would change what the user's code sees or may do: refused. */
function refuseUnsupported(body: CreateBody): void {
  if (body.buildInfo !== undefined && body.snapshot !== undefined) throw errors.validation('snapshot', 'give either a snapshot or an image (buildInfo), not both');
  if (body.gpu) throw notSupported('GPUs', 'this server has no GPU sandboxes');
  // Daytona places a linked sandbox on its partner's runner and gives the two a local network;
  // Nestbox sandboxes have no network between them, so the link would be a fake.
  if (body.linkedSandbox) throw notSupported('linkedSandbox (a local network between two sandboxes)', 'Nestbox sandboxes cannot reach each other');
  if (body.user !== undefined && body.user !== SANDBOX_USER) throw notSupported(`user "${body.user}" (the toolbox acts as ${SANDBOX_USER}, who has passwordless sudo)`, `leave user unset or "${SANDBOX_USER}"; run a command as root with sudo`);
  if (body.gpuType?.length) throw notSupported('gpuType', 'this server has no GPU sandboxes');
  if (body.spot === true) throw notSupported('spot sandboxes', 'sandboxes here are never preempted; leave spot unset or false');
  if (body.kvm === true) throw notSupported('kvm (/dev/kvm inside the sandbox)', 'this server runs sandboxes without nested virtualization');
  if (body.outboundProxyUrl !== undefined) throw notSupported('outboundProxyUrl', 'sandboxes reach the network directly, under their egress policy (networkAllowList / networkBlockAll)');
  if (body.otelEndpointOverride !== undefined) throw notSupported('otelEndpointOverride', 'sandboxes do not export telemetry');
  if (body.autoPauseInterval && body.autoStopInterval) throw errors.validation('autoStopInterval', 'autoStopInterval and autoPauseInterval are mutually exclusive; set at most one of them to a non-zero value');
}

/**
 * Daytona's `target` names a region. Every host of this server is in one region today
 * (NESTBOX_REGION), so `target` may be unset or that name; any other would be placed where the
 * caller did not ask (a 400 naming `target`, never a silent move).
 */
export function checkTarget(target: string | undefined, region: string): void {
  if (target === undefined || target === '' || target === region) return;
  throw errors.validation('target', `no host of this server is in region "${target}"; its region is "${region}" (NESTBOX_REGION): leave target unset or use "${region}"`);
}

/**
 * Daytona's network options (daytona.md (b)) onto core's egress policy: `networkBlockAll`
 * denies all; `networkAllowList` (comma-separated IPv4 addresses and CIDRs) and
 * `domainAllowList` (comma-separated names) allow only those. Each entry is checked here so a
 * 400 names the Daytona field (`networkAllowList[1]`), not core's.
 */
export function egressOf(body: { networkBlockAll?: boolean; networkAllowList?: string; domainAllowList?: string }): EgressPolicy | undefined {
  const split = (v: string | undefined) => (v ?? '').split(',').map((x) => x.trim()).filter(Boolean);
  const cidrs = split(body.networkAllowList).map((entry, i) => parseEgressEntry(entry, `networkAllowList[${i}]`, 'addresses'));
  const domains = split(body.domainAllowList).map((entry, i) => {
    const where = `domainAllowList[${i}]`;
    if (isIpv4Entry(entry)) throw errors.validation(where, `"${entry}" is an address: put addresses and CIDRs in networkAllowList`);
    return parseEgressEntry(entry, where);
  });
  const allow = [...cidrs, ...domains];
  if (body.networkBlockAll) return { mode: 'deny-all' };
  if (allow.length > 0) return { mode: 'allow-list', allow };
  return undefined;
}

/** daytona-wave2 §1.2 `CreateSnapshot`. */
const CreateSnapshotBody = z
  .object({
    name: z.string().min(1),
    // One image reference: it becomes the FROM line of a one-line Dockerfile.
    imageName: z.string().regex(/^[^\s]{1,512}$/, 'must be one image reference, e.g. "python:3.12" or "default"').optional(),
    entrypoint: z.array(z.string()).optional(),
    buildInfo: z.object({ dockerfileContent: z.string(), contextHashes: z.array(z.string()).optional() }).passthrough().optional(),
    cpu: z.number().int().positive().optional(),
    gpu: z.number().int().min(0).optional(),
    gpuType: z.array(z.string()).optional(),
    memory: z.number().positive().optional(),
    disk: z.number().int().positive().optional(),
    regionId: z.string().optional(),
    sandboxClass: z.string().optional(),
  })
  .passthrough();

/** `sb.updateNetworkSettings()`: the SDK requires at least one of these. */
const ResizeBody = z
  .object({ cpu: z.number().int().min(1).optional(), memory: z.number().int().min(1).optional(), disk: z.number().int().min(1).optional() })
  .strict();

const NetworkSettingsBody = z
  .object({ networkBlockAll: z.boolean().optional(), networkAllowList: z.string().optional(), domainAllowList: z.string().optional() })
  .strict();

export function createInput(body: CreateBody, maxSeconds: number): CreateSandboxInput {
  refuseUnsupported(body);
  const policy = intervalsToPolicy({
    autoStopInterval: body.autoStopInterval ?? DEFAULT_AUTO_STOP_MINUTES,
    autoPauseInterval: body.autoPauseInterval,
    autoDeleteInterval: body.autoDeleteInterval,
    ttlMinutes: body.ttlMinutes,
  }, maxSeconds);
  if (body.memory !== undefined && !Number.isInteger(body.memory * 1024)) throw errors.validation('memory', 'must be a whole number of MiB (GiB × 1024)');
  return {
    name: body.name,
    snapshot: body.snapshot,
    cpu: body.cpu,
    memoryMiB: body.memory === undefined ? undefined : body.memory * 1024,
    // GiB in both APIs: the size of the sandbox's disk (400 naming `diskGiB` when out of range).
    diskGiB: body.disk,
    env: body.env,
    labels: body.labels,
    // Daytona sandboxes have no absolute lifetime unless a TTL is set; idleness stops them.
    timeoutSeconds: policy.timeoutSeconds ?? 0,
    idleTimeoutSeconds: policy.idleTimeoutSeconds,
    idleAction: policy.idleAction,
    autoDeleteSeconds: policy.autoDeleteSeconds,
    ...(egressOf(body) ? { egress: egressOf(body) } : {}),
    // A public sandbox's preview links need no token (every port, as Daytona's proxy does).
    ...(body.public ? { everyPort: { public: true } } : {}),
    // Organisation secrets as env variables (secrets.ts); checked by core (400 naming secrets[i]).
    ...(body.secrets?.length ? { secrets: daytonaSecretRefs(body.secrets) } : {}),
    // `volumeId` may be an id or a name (daytona-wave2 §3); Daytona mounts are read-write.
    ...(body.volumes?.length ? { volumes: body.volumes.map((v) => ({ volumeId: v.volumeId, mountPath: v.mountPath, readOnly: false, ...(v.subpath ? { subpath: v.subpath } : {}) })) } : {}),
  };
}

const SORT_KEYS: Record<string, NonNullable<ListSandboxesInput['sort']>['key']> = {
  name: 'name',
  cpu: 'cpu',
  memoryGib: 'memoryMiB',
  // Not a sort key of core's list (yet): disk order falls back to creation order.
  diskGib: 'createdAt',
  lastActivityAt: 'lastActivityAt',
  createdAt: 'createdAt',
};

const UNSUPPORTED_LIST_FILTERS = ['snapshots', 'regionIds', 'minCpu', 'maxCpu', 'minMemoryGiB', 'maxMemoryGiB', 'minDiskGiB', 'maxDiskGiB', 'isPublic', 'isRecoverable', 'createdAtAfter', 'createdAtBefore', 'lastEventAfter', 'lastEventBefore', 'autoDestroyAtAfter', 'autoDestroyAtBefore'];

function listInput(req: Request): ListSandboxesInput {
  const one = (n: string) => (req.query[n] === undefined ? undefined : String(Array.isArray(req.query[n]) ? (req.query[n] as unknown[])[0] : req.query[n]));
  const many = (n: string) => {
    const v = req.query[n] ?? req.query[`${n}[]`];
    return v === undefined ? [] : (Array.isArray(v) ? v : [v]).map(String);
  };
  for (const f of UNSUPPORTED_LIST_FILTERS) if (req.query[f] !== undefined) throw notSupported(`the sandbox list filter "${f}"`);
  const input: ListSandboxesInput = {};
  const limit = one('limit');
  if (limit !== undefined) {
    input.limit = Number(limit);
    if (!Number.isInteger(input.limit) || input.limit < 1 || input.limit > 200) throw errors.validation('limit', 'must be an integer from 1 to 200');
  }
  input.cursor = one('cursor') || undefined;
  input.idPrefix = one('id') || undefined;
  input.namePrefix = one('name') || undefined;
  const labels = one('labels');
  if (labels) {
    try {
      const parsed = JSON.parse(labels) as unknown;
      if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed) || Object.values(parsed).some((v) => typeof v !== 'string')) throw new Error();
      input.labels = parsed as Record<string, string>;
    } catch {
      throw errors.validation('labels', 'must be a JSON object of string values, e.g. {"team":"x"}');
    }
  }
  const states = many('states');
  if (states.length) {
    const core = new Set<SandboxState>();
    for (const s of states) {
      if (!/^[a-z_]+$/.test(s)) throw errors.validation('states', `unknown state "${s}"`);
      for (const c of CORE_STATES_OF[s] ?? []) core.add(c);
    }
    // A filter of only states Nestbox never has matches nothing (not everything).
    input.states = core.size ? [...core] : ['deleted'];
  }
  const sort = one('sort');
  const order = one('order') ?? 'desc';
  if (order !== 'asc' && order !== 'desc') throw errors.validation('order', 'must be asc or desc');
  if (sort !== undefined) {
    const key = SORT_KEYS[sort];
    if (!key) throw errors.validation('sort', `must be one of ${Object.keys(SORT_KEYS).join(', ')}`);
    input.sort = { key, order };
  } else if (order === 'asc') {
    input.sort = { key: 'createdAt', order };
  }
  return input;
}

export function createControlPlaneRouter(core: Pick<CompatPort, 'sandboxes' | 'snapshots' | 'sandboxTokens' | 'ports' | 'images' | 'builds' | 'usage' | 'webhooks' | 'pendingSandboxes' | 'hostRegions' | 'sshAccess' | 'secrets' | 'volumes' | 'organizationWarmPools'>, options: Pick<DaytonaOptions, 'log' | 'maxTimeoutSeconds' | 'region' | 'objectStorage' | 'defaultSnapshot'>): Router {
  const router = express.Router();
  const { sandboxes, snapshots } = core;
  const pending = new PendingBuildSandboxes(core, options.log);
  /**
   * `create({snapshot})`: a Nestbox named snapshot of that name, else an image snapshot
   * (images.ts), whose `resources` are the sandbox's defaults; neither: core's own 400.
   */
  const snapshotSource = async (principal: Principal, name: string, body: CreateBody): Promise<Partial<CreateSandboxInput>> => {
    if (await snapshots.get(principal, name).then(() => true, () => false)) return { snapshot: name };
    const found = await findImageSnapshot(core, principal, name);
    if (!found) return { snapshot: name };
    const { state, errorReason } = imageSnapshotState(found);
    if (state !== 'active' || !found.image) throw errors.validation('snapshot', `snapshot "${name}" is ${state}${errorReason ? ` (${errorReason.split('\n')[0]})` : ''}; sandboxes start from an active snapshot`);
    const labels = found.image.config.labels;
    const resource = (key: string) => (labels[key] === undefined ? undefined : Number(labels[key]));
    const cpu = body.cpu ?? resource(RESOURCE_LABELS.cpu);
    const memory = body.memory ?? resource(RESOURCE_LABELS.memory);
    const disk = body.disk ?? resource(RESOURCE_LABELS.disk);
    return { snapshot: undefined, image: imageOfSnapshotName(found.name, 'snapshot').reference, ...(cpu ? { cpu } : {}), ...(memory ? { memoryMiB: memory * 1024 } : {}), ...(disk ? { diskGiB: disk } : {}) };
  };
  const maxSeconds = options.maxTimeoutSeconds;
  /** Sandbox DTOs of one answer; `public` (every preview link open) is read for all of them in one query. */
  const dtos = async (req: Request, principal: Principal, list: Sandbox[], full: boolean) => {
    const [open, regions] = await Promise.all([core.ports.everyPortPublic(principal, list.map((s) => s.id)), core.hostRegions.regionsOf(list.map((s) => s.hostId))]);
    return list.map((s) => renderDaytonaSandbox(s, toolboxProxyUrl(req), { full, region: regions.get(s.hostId) ?? options.region, public: open.has(s.id) }));
  };
  const dto = async (req: Request, s: Sandbox, full = true) => (await dtos(req, principalOf(req.res!), [s], full))[0];
  const api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) =>
    handle(options.log, 'api', (req, res) => fn(req, res, principalOf(res)));
  /** Path ids may be names too (daytona.md (b): `GET /sandbox/{sandboxIdOrName}`). */
  const resolve = async (principal: Principal, req: Request): Promise<Sandbox> => sandboxes.getByIdOrName(principal, String(req.params.sandboxId));

  router.post('/sandbox', api(async (req, res, principal) => {
    const body = parseBody(CreateBody, req.body);
    const input = createInput(body, maxSeconds);
    // Daytona's `target` is a region: core places the sandbox on a host whose `region` label
    // (or, unlabelled, NESTBOX_REGION) is that name, and refuses one no live host is in.
    if (body.target !== undefined && body.target !== '') input.placement = { region: body.target, regionField: 'target' };
    const unknown = unknownOptions(body);
    if (unknown.length) {
      res.setHeader('X-Nestbox-Unhonoured-Options', unknown.join(', ').replace(/[^\x20-\x7e]/g, '?'));
      options.log.warn({ unknown }, `daytona create: options unknown to this server had no effect: ${unknown.join(', ')}`);
    }
    if (body.buildInfo !== undefined) {
      // daytona-wave2 §1.4: built on demand, once per Dockerfile and contexts (snapshotRef).
      const info = body.buildInfo;
      const snapshotRef = snapshotRefOf(info);
      const spec = buildSpecOf(info);
      if (body.name !== undefined && ((await pending.has(principal.organizationId, body.name)) || (await sandboxes.getByIdOrName(principal, body.name).then(() => true, () => false)))) {
        throw new NestboxError('conflict', `name: a sandbox named "${body.name}" already exists`, { field: 'name' });
      }
      if (await core.images.get(principal, snapshotRef).then(() => true, () => false)) {
        const created = await sandboxes.create(principal, { ...input, image: snapshotRef });
        res.status(200).json(await dto(req, created));
        return;
      }
      const [refName, refTag] = snapshotRef.split(':');
      const running = (await core.builds.list(principal, { name: refName, states: ['queued', 'running'], limit: 1 }))[0];
      // The build's RUN steps reach the network as the sandbox will (a stricter posture of the
      // sandbox is not bypassed by its build); without network options, as any Daytona build.
      const build = running ?? (await core.builds.create(principal, { name: refName, tags: [refTag], spec, ...(input.egress ? { egress: input.egress } : {}) }));
      const record = await pending.start(principal, { name: body.name, buildId: build.id, snapshotRef, contextHashes: info.contextHashes ?? [], dockerfileContent: info.dockerfileContent ?? '', input, region: options.region });
      res.status(200).json(renderPendingSandbox(record, toolboxProxyUrl(req)));
      return;
    }
    // Daytona's default snapshot carries a data stack; the operator may name one that does
    // (NESTBOX_DAYTONA_DEFAULT_SNAPSHOT), else a create without one gets the `default` image.
    const snapshot = body.snapshot ?? options.defaultSnapshot;
    if (snapshot !== undefined) Object.assign(input, await snapshotSource(principal, snapshot, body));
    const created = await sandboxes.create(principal, input);
    res.status(200).json(await dto(req, created));
  }));

  router.get('/sandbox', api(async (req, res, principal) => {
    const page = await sandboxes.list(principal, listInput(req));
    res.json({ items: await dtos(req, principal, page.items, false), nextCursor: page.nextCursor });
  }));

  // SDK 0.161–0.175 (daytona.md appendix A): page-numbered listing.
  router.get('/sandbox/paginated', api(async (req, res, principal) => {
    const page = Math.max(1, Number(req.query.page ?? 1) || 1);
    const limit = Math.min(200, Math.max(1, Number(req.query.limit ?? 100) || 100));
    const all: Sandbox[] = [];
    let cursor: string | undefined;
    const labels = listInput(req).labels;
    do {
      const chunk = await sandboxes.list(principal, { labels, limit: 200, cursor });
      all.push(...chunk.items);
      cursor = chunk.nextCursor ?? undefined;
    } while (cursor);
    res.json({ items: await dtos(req, principal, all.slice((page - 1) * limit, page * limit), false), total: all.length, page, totalPages: Math.max(1, Math.ceil(all.length / limit)) });
  }));

  // SSH access (ssh-access.ts); validate's literal path first, before `/sandbox/:sandboxId`.
  registerSshValidateRoute(router, core, api);
  registerSshAccessRoutes(router, core, api, resolve, (req, s) => dto(req, s));

  router.get('/sandbox/:sandboxId', api(async (req, res, principal) => {
    const id = String(req.params.sandboxId);
    const record = await pending.get(principal, id);
    // A sandbox still being built (builds.ts); once created it is found by its name (the pending id).
    if (record && record.phase !== 'created') return void res.json(renderPendingSandbox(record, toolboxProxyUrl(req)));
    res.json(await dto(req, await resolve(principal, req)));
  }));

  router.get('/sandbox/:sandboxId/toolbox-proxy-url', api(async (req, res, principal) => {
    await resolve(principal, req);
    res.json({ url: toolboxProxyUrl(req) });
  }));

  // start: a stopped sandbox resumes from its disk, a paused one is unpaused (memory kept).
  router.post('/sandbox/:sandboxId/start', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.resume(principal, s.id)));
  }));

  // stop: `force` is always sent (daytona.md (h) 16); Nestbox's stop is the same either way.
  router.post('/sandbox/:sandboxId/stop', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.stop(principal, s.id)));
  }));

  // archive = stop: a stopped Nestbox sandbox already keeps only its disk.
  router.post('/sandbox/:sandboxId/archive', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.stop(principal, s.id)));
  }));

  // recover = resume: an errored sandbox is started again from its kept disk.
  router.post('/sandbox/:sandboxId/recover', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    if (req.query.skipStart === 'true') throw notSupported('recover with skipStart', 'a recovered sandbox is started');
    res.json(await dto(req, await sandboxes.resume(principal, s.id)));
  }));

  router.post('/sandbox/:sandboxId/pause', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.pause(principal, s.id)));
  }));

  router.delete('/sandbox/:sandboxId', api(async (req, res, principal) => {
    const record = await pending.get(principal, String(req.params.sandboxId));
    if (record && record.phase !== 'created' && record.phase !== 'deleted') {
      requireScope(principal, 'sandboxes:delete');
      await pending.delete(principal, record);
      return void res.json(renderPendingSandbox(record, toolboxProxyUrl(req)));
    }
    const s = await resolve(principal, req);
    await sandboxes.delete(principal, s.id);
    res.json(await dto(req, { ...s, state: 'deleted' }));
  }));

  router.put('/sandbox/:sandboxId/labels', api(async (req, res, principal) => {
    const { labels } = parseBody(z.object({ labels: z.record(z.string(), z.string()) }), req.body);
    const s = await resolve(principal, req);
    const updated = await sandboxes.update(principal, s.id, { labels });
    res.json({ labels: updated.labels });
  }));

  const intervalRoute = (segment: string, apply: (s: Sandbox, m: number) => Parameters<typeof sandboxes.update>[2]) => {
    router.post(`/sandbox/:sandboxId/${segment}/:minutes`, api(async (req, res, principal) => {
      const m = Number(req.params.minutes);
      if (!Number.isInteger(m)) throw errors.validation('interval', 'must be an integer number of minutes');
      const s = await resolve(principal, req);
      res.json(await dto(req, await sandboxes.update(principal, s.id, apply(s, m))));
    }));
  };
  intervalRoute('autostop', (_s, m) => {
    if (m < 0) throw errors.validation('autoStopInterval', 'must be 0 (never) or more minutes');
    return intervalsToPolicy({ autoStopInterval: m }, maxSeconds);
  });
  intervalRoute('autopause', (s, m) => {
    if (m < 0) throw errors.validation('autoPauseInterval', 'must be 0 (never) or more minutes');
    // 0 turns auto-pause off; an auto-stop timer that was set stays as it was.
    if (m === 0) return s.idleAction === 'pause' ? { idleTimeoutSeconds: 0 } : {};
    return intervalsToPolicy({ autoPauseInterval: m }, maxSeconds);
  });
  intervalRoute('autodelete', (_s, m) => intervalsToPolicy({ autoDeleteInterval: m }, maxSeconds));
  intervalRoute('ttl', (_s, m) => {
    if (m < 0) throw errors.validation('ttlMinutes', 'must be 0 (none) or more minutes');
    if (m === 0) return { timeoutSeconds: 0 };
    const p = intervalsToPolicy({ ttlMinutes: m }, maxSeconds);
    return { timeoutSeconds: p.timeoutSeconds, autoDeleteSeconds: p.autoDeleteSeconds };
  });
  router.post('/sandbox/:sandboxId/autoarchive/:minutes', api(async (req, res, principal) => {
    // Daytona archives a stopped sandbox after N minutes: its disk moves to object storage and
    // the sandbox keeps its files. A stopped Nestbox sandbox is that already (its disk kept, no
    // memory, started again on demand), so every interval is satisfied at once.
    const minutes = Number(req.params.minutes);
    if (!Number.isInteger(minutes) || minutes < 0) throw errors.validation('autoArchiveInterval', 'must be 0 or more minutes');
    res.json(await dto(req, await resolve(principal, req)));
  }));
  // sb.setPublic / updatePublicStatus: every preview link of the sandbox open to anyone, or
  // back to each port's own token.
  router.post('/sandbox/:sandboxId/public/:isPublic', api(async (req, res, principal) => {
    const flag = String(req.params.isPublic);
    if (flag !== 'true' && flag !== 'false') throw errors.validation('isPublic', 'must be true or false');
    const s = await resolve(principal, req);
    if (flag === 'true') await core.ports.openEveryPort(principal, s.id, { public: true });
    else await core.ports.closeEveryPort(principal, s.id);
    res.json(await dto(req, s));
  }));

  router.post('/sandbox/:sandboxId/last-activity', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    await sandboxes.keepAlive(principal, s.id);
    res.status(201).end();
  }));

  router.post('/sandbox/:sandboxId/fork', api(async (req, res, principal) => {
    const { name } = parseBody(z.object({ name: z.string().optional() }).passthrough(), req.body);
    const s = await resolve(principal, req);
    const result = await sandboxes.fork(principal, s.id, { name, timeoutSeconds: s.timeoutSeconds });
    res.json(await dto(req, result.sandboxes[0]));
  }));

  router.post('/sandbox/:sandboxId/snapshot', api(async (req, res, principal) => {
    const { name, includeMemory } = parseBody(z.object({ name: z.string(), includeMemory: z.boolean().optional() }).passthrough(), req.body);
    if (includeMemory) throw notSupported('snapshots with memory (includeMemory)', 'a snapshot keeps the disk only');
    const s = await resolve(principal, req);
    await snapshots.create(principal, { sandboxId: s.id, name });
    res.json(await dto(req, await sandboxes.get(principal, s.id)));
  }));

  // The key is minted for the calling API key (core/services/sandbox-tokens.ts): it carries that
  // key's file scopes and no more, expires, and dies with the key or the sandbox.
  router.get('/sandbox/:sandboxId/signing-key', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    res.json(await core.sandboxTokens.daytonaSigningKey(principal, s.id));
  }));
  // Every signing key of the sandbox (whoever fetched it) stops working; the caller gets a new one.
  router.post('/sandbox/:sandboxId/signing-key/rotate', api(async (req, res, principal) => {
    requireScope(principal, 'sandboxes:operate');
    const s = await resolve(principal, req);
    res.json(await core.sandboxTokens.rotateDaytonaSigningKeys(principal, s.id));
  }));

  const unsupportedSandboxRoute = (method: 'get' | 'post' | 'put' | 'delete', path: string, feature: string, why?: string) =>
    router[method](path, api(async (req, _res, principal) => {
      if (req.params.sandboxId) await resolve(principal, req);
      throw notSupported(feature, why);
    }));
  // Preview link = a private hosted port (core/services/ports.ts). The token goes as `?_token=`
  // or the X-Nestbox-Port-Token header. Tokens are stored hashed, so each call mints a new one
  // and the previous token of that port stops working.
  router.get('/sandbox/:sandboxId/ports/:port/preview-url', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    const published = await core.ports.publish(principal, s.id, { port: Number(req.params.port), public: false });
    res.json({ sandboxId: s.id, url: published.url, token: published.token ?? '' });
  }));
  // Signed preview URL (daytona.md (b)): an expiring HMAC token in the URL, checked by the
  // port proxy without any stored state. Default lifetime as the SDK documents: 60 s.
  router.get('/sandbox/:sandboxId/ports/:port/signed-preview-url', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    const port = Number(req.params.port);
    const expiresInSeconds = req.query.expiresInSeconds === undefined ? 60 : Number(req.query.expiresInSeconds);
    const signed = await core.ports.signedUrl(principal, s.id, { port, expiresInSeconds });
    res.json({ sandboxId: s.id, port, token: signed.token, url: signed.url });
  }));
  // Expiring one signed URL early would need stored revocations; refused rather than faked.
  unsupportedSandboxRoute('post', '/sandbox/:sandboxId/ports/:port/signed-preview-url/:token/expire', 'expiring a signed preview URL early', 'signed URLs end at their expiry time');
  // sandbox.resize({cpu, memory, disk}) (daytona-wave2 §7): cores and GiB, each ≥ 1. Synchronous
  // (core/services/sandbox-resize.ts): the answer is already started or stopped, never
  // `resizing`, which the SDK's wait accepts at once. CPU and memory change live, decreases too.
  router.post('/sandbox/:sandboxId/resize', api(async (req, res, principal) => {
    const body = parseBody(ResizeBody, req.body);
    if (body.cpu === undefined && body.memory === undefined && body.disk === undefined) throw errors.validation('cpu', 'No resource changes specified');
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.resize(principal, s.id, { cpu: body.cpu, memoryMiB: body.memory === undefined ? undefined : body.memory * 1024, diskGiB: body.disk })));
  }));
  // sb.updateNetworkSettings(): the new posture replaces the old one, as Daytona's runner does
  // (block all; else the lists given; else, with networkBlockAll false or empty lists, open
  // again), in force at once on a running sandbox.
  router.post('/sandbox/:sandboxId/network-settings', api(async (req, res, principal) => {
    const body = parseBody(NetworkSettingsBody, req.body);
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.update(principal, s.id, { egress: egressOf(body) ?? { mode: 'allow-all' } })));
  }));
  // sb.updateSecrets(): the set given replaces the old one; a running sandbox's later processes
  // see it at once, a stopped one at its next start (core/services/secrets.ts replaceRefs).
  router.put('/sandbox/:sandboxId/secrets', api(async (req, res, principal) => {
    const s = await resolve(principal, req);
    const refs = daytonaSecretRefs((req.body as { secrets?: unknown } | undefined)?.secrets ?? []) ?? [];
    res.json(await dto(req, await core.secrets.replaceRefs(principal, s.id, refs)));
  }));
  // Metrics history (getMetrics): from core's usage samples; default range = since creation (the SDK always sends both).
  router.get('/sandbox/:sandboxId/telemetry/metrics', api(async (req, res, principal) => {
    const names = metricNamesOf(req.query.metricNames);
    const from = metricsInstantOf(req.query.from, 'from');
    const to = metricsInstantOf(req.query.to, 'to');
    const sandbox = await resolve(principal, req);
    const { points } = await core.usage.range(principal, sandbox.id, { start: from ?? sandbox.createdAt, end: to, maxPoints: DAYTONA_METRICS_MAX_POINTS });
    res.json({ series: metricSeries(points, names) });
  }));
  // daytona-wave2 §1.4: the build log of a sandbox built on demand (its pending record, or the
  // build of the image it was created from). A URL without a query: the SDK appends `?follow=true`.
  const sandboxBuildId = async (principal: Principal, idOrName: string): Promise<string> => {
    const record = await pending.get(principal, idOrName);
    if (record) return record.buildId;
    const s = await sandboxes.getByIdOrName(principal, idOrName);
    const built = s.image.endsWith(':daytona') ? await findImageSnapshot(core, principal, s.image).catch(() => undefined) : undefined;
    if (!built?.build) throw errors.notFound('build', `Sandbox ${idOrName} has no build info`);
    return built.build.id;
  };
  router.get('/sandbox/:sandboxId/build-logs-url', api(async (req, res, principal) => {
    const id = String(req.params.sandboxId);
    await sandboxBuildId(principal, id);
    res.json({ url: `${publicOrigin(req)}${req.baseUrl}/sandbox/${encodeURIComponent(id)}/build-logs` });
  }));
  router.get('/sandbox/:sandboxId/build-logs', api(async (req, res, principal) => {
    const buildId = await sandboxBuildId(principal, String(req.params.sandboxId));
    await streamBuildLog(core, principal, buildId, req.query.follow === 'true', res);
  }));

  // Snapshots (images.ts): Nestbox named snapshots of sandboxes, and images (built by
  // snapshot.create, or by create({image}), or the native API's). A name is looked up in that order.
  const findSnapshot = async (principal: Principal, idOrName: string): Promise<Snapshot | undefined> => {
    if (!principal.scopes.has('snapshots:read')) return undefined;
    const all = await snapshots.list(principal);
    return all.find((s) => s.id === idOrName) ?? all.find((s) => s.name === idOrName);
  };
  const findAny = async (principal: Principal, idOrName: string): Promise<{ named?: Snapshot; image?: ImageSnapshot }> => {
    const named = await findSnapshot(principal, idOrName);
    if (named) return { named };
    const image = await findImageSnapshot(core, principal, idOrName);
    if (image) return { image };
    throw new NestboxError('not_found', `Snapshot ${idOrName} not found`);
  };
  const renderAny = (principal: Principal, f: { named?: Snapshot; image?: ImageSnapshot }) => (f.named ? renderDaytonaSnapshot(f.named) : renderImageSnapshot(f.image!, principal.organizationId));
  /** Every image snapshot: tagged images, and builds of names that have no image (yet, or that failed). */
  const imageSnapshots = async (principal: Principal): Promise<ImageSnapshot[]> => {
    const out: ImageSnapshot[] = [];
    const seen = new Set<string>();
    let cursor: string | undefined;
    for (let page = 0; page < 20; page++) {
      const chunk = await core.images.list(principal, { limit: 1000, cursor });
      for (const image of chunk.items) {
        for (const tag of image.tags) {
          const name = snapshotNameOf(image.name, tag);
          seen.add(name);
          out.push({ name, image });
        }
      }
      if (!chunk.nextCursor) break;
      cursor = chunk.nextCursor;
    }
    const builds = await core.builds.list(principal, { limit: 1000 });
    const buildOf = new Map(builds.filter((b) => b.imageId).map((b) => [b.imageId!, b]));
    for (const s of out) if (s.image?.buildId) s.build = buildOf.get(s.image.id);
    for (const b of builds) {
      const name = snapshotNameOf(b.name, b.tags[0] ?? 'latest');
      const newer = !FINISHED_BUILD_STATES.includes(b.state);
      if (seen.has(name) && !newer) continue;
      if (seen.has(name)) {
        // A rebuild of a name in progress: that build decides the state.
        const s = out.find((x) => x.name === name);
        if (s && s.image && b.createdAt > s.image.createdAt) s.build = b;
        continue;
      }
      seen.add(name);
      if (!countsWithoutImage(b)) continue;
      out.push({ name, build: b });
    }
    return out;
  };
  router.get('/snapshots', api(async (req, res, principal) => {
    const page = Math.max(1, Number(req.query.page ?? 1) || 1);
    const limit = Math.min(200, Math.max(1, Number(req.query.limit ?? 100) || 100));
    const source = typeof req.query.sourceSandboxId === 'string' ? req.query.sourceSandboxId : undefined;
    let named = principal.scopes.has('snapshots:read') ? await snapshots.list(principal) : [];
    if (source) named = named.filter((s) => s.sourceSandboxId === source);
    // Images have no source sandbox: a filter by one lists only named snapshots.
    // A key limited to some sandboxes sees only the snapshots that concern them: no image is one.
    const images = source || principal.sandboxIds !== null || !principal.scopes.has('images:read') ? [] : await imageSnapshots(principal);
    let all = [...named.map(renderDaytonaSnapshot), ...images.map((s) => renderImageSnapshot(s, principal.organizationId))];
    if (typeof req.query.name === 'string' && req.query.name) all = all.filter((s) => String(s.name).includes(String(req.query.name)));
    res.json({ items: all.slice((page - 1) * limit, page * limit), total: all.length, page, totalPages: Math.max(1, Math.ceil(all.length / limit)) });
  }));
  router.get('/snapshots/:snapshot', api(async (req, res, principal) => {
    res.json(renderAny(principal, await findAny(principal, String(req.params.snapshot))));
  }));
  router.delete('/snapshots/:snapshot', api(async (req, res, principal) => {
    const found = await findAny(principal, String(req.params.snapshot));
    if (found.named) {
      await snapshots.delete(principal, found.named.name);
    } else {
      const s = found.image!;
      if (s.image?.id === 'default') throw new NestboxError('conflict', 'the built-in snapshot "default" cannot be deleted');
      // A build in progress is cancelled; the image (if any) goes unless a sandbox uses it (409).
      if (s.image) await core.images.delete(principal, imageOfSnapshotName(s.name).reference);
      if (s.build && !FINISHED_BUILD_STATES.includes(s.build.state)) await core.builds.cancel(principal, s.build.id);
      if (s.build) hideBuild(s.build.id);
    }
    res.status(200).end();
  }));
  // Nestbox snapshots and images are usable as soon as they exist; there is no inactive state to leave.
  router.post('/snapshots/:snapshot/activate', api(async (req, res, principal) => {
    res.json(renderAny(principal, await findAny(principal, String(req.params.snapshot))));
  }));
  router.post('/snapshots', api(async (req, res, principal) => {
    const body = parseBody(CreateSnapshotBody, req.body);
    // A newer SDK's fields: accepted and reported as without effect, as for sandbox creates.
    const unknown = Object.keys(body).filter((key) => !(key in CreateSnapshotBody.shape));
    if (unknown.length) {
      res.setHeader('X-Nestbox-Unhonoured-Options', unknown.join(', ').replace(/[^\x20-\x7e]/g, '?'));
      options.log.warn({ unknown }, `daytona snapshot create: options unknown to this server had no effect: ${unknown.join(', ')}`);
    }
    if (body.gpu) throw notSupported('GPUs', 'this server has no GPU sandboxes');
    if (body.gpuType?.length) throw notSupported('gpuType', 'this server has no GPU sandboxes');
    if (body.sandboxClass !== undefined) throw notSupported('sandboxClass', 'this server has one class of sandbox');
    checkTarget(body.regionId, options.region);
    if (body.imageName === undefined && body.buildInfo === undefined) throw errors.validation('imageName', 'give an imageName or a buildInfo');
    if (body.imageName !== undefined && body.buildInfo !== undefined) throw errors.validation('imageName', 'give an imageName or a buildInfo, not both');
    if (body.entrypoint !== undefined && body.imageName === undefined) throw errors.validation('entrypoint', 'goes with imageName; put an ENTRYPOINT in the Dockerfile of a buildInfo');
    const ref = imageOfSnapshotName(body.name);
    // A name whose last build failed may be built again; any other existing snapshot is a 409.
    const existing = (await findSnapshot(principal, body.name)) ? undefined : await findImageSnapshot(core, principal, body.name);
    if ((await findSnapshot(principal, body.name)) || (existing && !['build_failed', 'error'].includes(imageSnapshotState(existing).state))) {
      throw new NestboxError('conflict', `Snapshot with name "${body.name}" already exists for this organization`, { field: 'name' });
    }
    if (body.memory !== undefined && !Number.isInteger(body.memory * 1024)) throw errors.validation('memory', 'must be a whole number of MiB (GiB × 1024)');
    // An image name is a one-line Dockerfile: FROM it (pulled by the host), with its ENTRYPOINT.
    const info = body.buildInfo ?? { dockerfileContent: `FROM ${body.imageName}\n${body.entrypoint?.length ? `ENTRYPOINT ${JSON.stringify(body.entrypoint)}\n` : ''}`, contextHashes: [] };
    const labels: [string, string][] = [];
    if (body.cpu) labels.push([RESOURCE_LABELS.cpu, String(body.cpu)]);
    if (body.memory) labels.push([RESOURCE_LABELS.memory, String(body.memory)]);
    if (body.disk) labels.push([RESOURCE_LABELS.disk, String(body.disk)]);
    const spec = buildSpecOf(info, labels);
    const build = await core.builds.create(principal, { name: ref.name, tags: [ref.tag], spec });
    const dto = renderImageSnapshot({ name: snapshotNameOf(ref.name, ref.tag), build }, principal.organizationId);
    // The build is accepted and its log open from its first line: `building`, so the SDK follows
    // the log from the start (it only does for a state other than `pending`, and a quick build
    // may be over before its first 1-s poll). Later polls show a build still queued as `pending`.
    res.status(200).json({ ...dto, state: 'building' });
  }));
  const snapshotBuildId = async (principal: Principal, idOrName: string): Promise<string> => {
    const found = await findAny(principal, idOrName);
    if (!found.image?.build) throw new NestboxError('not_found', `Snapshot ${idOrName} has no build info`);
    return found.image.build.id;
  };
  // daytona-wave2 §1.3: a URL without a query (the SDK appends `?follow=true`), served below.
  router.get('/snapshots/:snapshot/build-logs-url', api(async (req, res, principal) => {
    const id = String(req.params.snapshot);
    await snapshotBuildId(principal, id);
    res.json({ url: `${publicOrigin(req)}${req.baseUrl}/snapshots/${encodeURIComponent(id)}/build-logs` });
  }));
  router.get('/snapshots/:snapshot/build-logs', api(async (req, res, principal) => {
    const buildId = await snapshotBuildId(principal, String(req.params.snapshot));
    await streamBuildLog(core, principal, buildId, req.query.follow === 'true', res);
  }));

  const unsupportedArea = (path: string, feature: string) => router.all(path, api(async () => {
    throw notSupported(feature);
  }));
  registerVolumeRoutes(router, core.volumes, api);
  registerSecretRoutes(router, core.secrets, api);
  registerWarmPoolRoutes(router, core, api, options.region);
  // daytona-wave2 §2.1: S3 credentials for this organisation's build contexts (object-storage.ts).
  router.get('/object-storage/push-access', api(async (req, res, principal) => {
    res.json(issueStorageAccess(req, principal, options.objectStorage));
  }));
  unsupportedArea(/^\/object-storage(\/.*)?$/ as unknown as string, 'object storage calls other than push-access');
  registerWebhookRoutes(router, core.webhooks, api);
  return router;
}
