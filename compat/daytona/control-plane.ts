// Daytona control plane (daytona.md (b)) → core's sandbox and snapshot services.
import type { EgressPolicy } from '../../core/host-client.js';
import express, { type Request, type Response, type Router } from 'express';
import { z } from 'zod';
import { NestboxError, errors } from '../../core/errors.js';
import type { CreateSandboxInput, LifecyclePolicy, ListSandboxesInput } from '../../core/services/sandboxes.js';
import type { SandboxState } from '../../core/state-machine.js';
import type { Principal, Sandbox, Snapshot } from '../../core/types.js';
import type { CompatPort } from '../../core/compat-port.js';
import { handle, principalOf, toolboxProxyUrl, type DaytonaOptions } from './context.js';
import { notSupported } from './errors.js';
import { CORE_STATES_OF, renderDaytonaSandbox, renderDaytonaSnapshot, SANDBOX_USER } from './sandbox-dto.js';
import { requireScope } from '../../core/services/auth.js';
import { isIpv4Entry, parseEgressEntry } from '../../core/egress.js';
import { issueStorageAccess } from './object-storage.js';

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

function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue.path.join('.') || 'body';
    throw new NestboxError('validation_failed', `${field}: ${issue.message}`, { field });
  }
  return parsed.data;
}

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
  if (body.buildInfo !== undefined) throw notSupported('building an image (image / buildInfo)', 'sandboxes start from the base image or a snapshot; pass `snapshot` instead');
  if (body.gpu) throw notSupported('GPUs', 'this server has no GPU sandboxes');
  if (body.volumes?.length) throw notSupported('volumes');
  if (body.secrets?.length) throw notSupported('secrets');
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

/** `sb.updateNetworkSettings()`: the SDK requires at least one of these. */
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

export function createControlPlaneRouter(core: Pick<CompatPort, 'sandboxes' | 'snapshots' | 'sandboxTokens' | 'ports'>, options: Pick<DaytonaOptions, 'log' | 'maxTimeoutSeconds' | 'region' | 'objectStorage'>): Router {
  const router = express.Router();
  const { sandboxes, snapshots } = core;
  const maxSeconds = options.maxTimeoutSeconds;
  /** Sandbox DTOs of one answer; `public` (every preview link open) is read for all of them in one query. */
  const dtos = async (req: Request, principal: Principal, list: Sandbox[], full: boolean) => {
    const open = await core.ports.everyPortPublic(principal, list.map((s) => s.id));
    return list.map((s) => renderDaytonaSandbox(s, toolboxProxyUrl(req), { full, region: options.region, public: open.has(s.id) }));
  };
  const dto = async (req: Request, s: Sandbox, full = true) => (await dtos(req, principalOf(req.res!), [s], full))[0];
  const api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) =>
    handle(options.log, 'api', (req, res) => fn(req, res, principalOf(res)));
  /** Path ids may be names too (daytona.md (b): `GET /sandbox/{sandboxIdOrName}`). */
  const resolve = async (principal: Principal, req: Request): Promise<Sandbox> => sandboxes.getByIdOrName(principal, String(req.params.sandboxId));

  router.post('/sandbox', api(async (req, res, principal) => {
    const body = parseBody(CreateBody, req.body);
    checkTarget(body.target, options.region);
    const input = createInput(body, maxSeconds);
    const unknown = unknownOptions(body);
    if (unknown.length) {
      res.setHeader('X-Nestbox-Unhonoured-Options', unknown.join(', ').replace(/[^\x20-\x7e]/g, '?'));
      options.log.warn({ unknown }, `daytona create: options unknown to this server had no effect: ${unknown.join(', ')}`);
    }
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

  router.get('/sandbox/:sandboxId', api(async (req, res, principal) => {
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
  unsupportedSandboxRoute('post', '/sandbox/:sandboxId/resize', 'resizing a sandbox');
  // sb.updateNetworkSettings(): the new posture replaces the old one, as Daytona's runner does
  // (block all; else the lists given; else, with networkBlockAll false or empty lists, open
  // again), in force at once on a running sandbox.
  router.post('/sandbox/:sandboxId/network-settings', api(async (req, res, principal) => {
    const body = parseBody(NetworkSettingsBody, req.body);
    const s = await resolve(principal, req);
    res.json(await dto(req, await sandboxes.update(principal, s.id, { egress: egressOf(body) ?? { mode: 'allow-all' } })));
  }));
  unsupportedSandboxRoute('put', '/sandbox/:sandboxId/secrets', 'secrets');
  unsupportedSandboxRoute('post', '/sandbox/:sandboxId/ssh-access', 'SSH access');
  unsupportedSandboxRoute('delete', '/sandbox/:sandboxId/ssh-access', 'SSH access');
  unsupportedSandboxRoute('get', '/sandbox/ssh-access/validate', 'SSH access');
  unsupportedSandboxRoute('get', '/sandbox/:sandboxId/telemetry/metrics', 'historical metrics (getMetrics)', 'use getMetricsLatest');
  unsupportedSandboxRoute('get', '/sandbox/:sandboxId/build-logs-url', 'build logs', 'Nestbox does not build images');
  unsupportedSandboxRoute('get', '/sandbox/:sandboxId/build-logs', 'build logs', 'Nestbox does not build images');

  // Named snapshots (daytona.md (b) snapshot rows) over core's SnapshotService.
  const findSnapshot = async (principal: Principal, idOrName: string): Promise<Snapshot> => {
    const all = await snapshots.list(principal);
    const found = all.find((s) => s.id === idOrName) ?? all.find((s) => s.name === idOrName);
    if (!found) throw errors.notFound('snapshot', idOrName);
    return found;
  };
  router.get('/snapshots', api(async (req, res, principal) => {
    const page = Math.max(1, Number(req.query.page ?? 1) || 1);
    const limit = Math.min(200, Math.max(1, Number(req.query.limit ?? 100) || 100));
    let all = await snapshots.list(principal);
    if (typeof req.query.sourceSandboxId === 'string') all = all.filter((s) => s.sourceSandboxId === req.query.sourceSandboxId);
    res.json({ items: all.slice((page - 1) * limit, page * limit).map(renderDaytonaSnapshot), total: all.length, page, totalPages: Math.max(1, Math.ceil(all.length / limit)) });
  }));
  router.get('/snapshots/:snapshot', api(async (req, res, principal) => {
    res.json(renderDaytonaSnapshot(await findSnapshot(principal, String(req.params.snapshot))));
  }));
  router.delete('/snapshots/:snapshot', api(async (req, res, principal) => {
    const snapshot = await findSnapshot(principal, String(req.params.snapshot));
    await snapshots.delete(principal, snapshot.name);
    res.status(200).end();
  }));
  // Nestbox snapshots are usable as soon as they exist; there is no inactive state to leave.
  router.post('/snapshots/:snapshot/activate', api(async (req, res, principal) => {
    res.json(renderDaytonaSnapshot(await findSnapshot(principal, String(req.params.snapshot))));
  }));
  router.post('/snapshots', api(async () => {
    throw notSupported('creating a snapshot from an image', 'Nestbox does not build images; take one from a sandbox with sandbox.createSnapshot(name)');
  }));
  router.get('/snapshots/:snapshot/build-logs-url', api(async () => {
    throw notSupported('snapshot build logs', 'Nestbox does not build images');
  }));

  const unsupportedArea = (path: string, feature: string) => router.all(path, api(async () => {
    throw notSupported(feature);
  }));
  unsupportedArea(/^\/volumes(\/.*)?$/ as unknown as string, 'volumes');
  unsupportedArea(/^\/secret(\/.*)?$/ as unknown as string, 'secrets');
  unsupportedArea(/^\/warm-pools(\/.*)?$/ as unknown as string, 'warm pools');
  // daytona-wave2 §2.1: S3 credentials for this organisation's build contexts (object-storage.ts).
  router.get('/object-storage/push-access', api(async (req, res, principal) => {
    res.json(issueStorageAccess(req, principal, options.objectStorage));
  }));
  unsupportedArea(/^\/object-storage(\/.*)?$/ as unknown as string, 'object storage calls other than push-access');
  return router;
}
