// E2B's control-plane REST API (e2b.md (b)), served under /e2b: users set
// E2B_API_URL=<origin>/e2b. Every route authenticates X-API-KEY as a Nestbox API key and
// translates onto core's sandbox and snapshot services.
import express, { type NextFunction, type Request, type Response, type Router } from 'express';
import { errors, NestboxError } from '../../core/errors.js';
import { isTransitional, type SandboxState } from '../../core/state-machine.js';
import type { Principal, Sandbox, Snapshot } from '../../core/types.js';
import type { E2bDeps } from './deps.js';
import { notSupported, renderControlPlaneError } from './errors.js';
import { E2B_METRICS_MAX_POINTS, e2bMetric, sandboxIdsOf, unixSecondsOf } from './metrics.js';
import { ENVD_VERSION } from './routing.js';
import { E2B_CONTROL_PLANE_SCOPES } from './scopes.js';
import { e2bEgressPolicy, e2bNetworkInfo } from './network.js';
import { scopeGate } from '../scope-gate.js';
import { canSeeSandbox } from '../../core/services/auth.js';
import { rejectNulInJsonBody } from '../../http-kit/request-checks.js';
import { CODE_INTERPRETER_IMAGE, CODE_INTERPRETER_TEMPLATES, DEFAULT_TEMPLATES } from './template-spec.js';
import { findTemplateImage, registerTemplateRoutes, templateUploadMiddleware } from './templates.js';
import { registerEventRoutes } from './events.js';
import { e2bSecretEnv, registerSecretRoutes } from './secrets.js';
import { registerVolumeRoutes, volumeContentMiddleware, volumeMountsOf } from './volumes.js';

/** E2B's default sandbox lifetime when a create names none (e2b.md (b) create body: "server default 300"). */
const DEFAULT_TIMEOUT_SECONDS = 300;
const DEFAULT_LIST_LIMIT = 100;
/** How long connect waits for a stop or pause in progress to finish. */
const SETTLE_WAIT_MS = 60_000;

type Handler = (req: Request, res: Response, principal: Principal) => Promise<void>;

/**
 * E2B states: running and paused. A core sandbox that is stopped (disk kept, memory not) is
 * "paused" too: connect resumes it, and reports memoryRestored false.
 */
export function e2bState(state: SandboxState): 'running' | 'paused' {
  return ['paused', 'pausing', 'stopping', 'stopped', 'error'].includes(state) ? 'paused' : 'running';
}

const CORE_STATES: Record<string, SandboxState[]> = {
  running: ['running', 'creating', 'starting', 'resuming'],
  paused: ['paused', 'pausing', 'stopping', 'stopped', 'error'],
};

function timeoutOf(body: Record<string, unknown>, field = 'timeout'): number | undefined {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) throw errors.validation(field, 'must be a number of seconds');
  return Math.ceil(value);
}

/**
 * A timeout that must be positive, as E2B's resume, fork and connect-with-resume insist: in
 * Nestbox 0 means "never", in E2B it would end the sandbox at once, so neither meaning is given
 * to it there (upstream answers 400 "Timeout must be greater than 0").
 */
function positiveTimeoutOf(body: Record<string, unknown>): number | undefined {
  const timeout = timeoutOf(body);
  if (timeout === 0) throw errors.validation('timeout', 'must be greater than 0');
  return timeout;
}

/** An ISO 8601 moment of a list query (`startedAfter`), or undefined when not given. */
function instantOf(value: unknown, field: string): Date | undefined {
  if (value === undefined || value === '') return undefined;
  const at = typeof value === 'string' ? new Date(value) : new Date(Number.NaN);
  if (Number.isNaN(at.getTime())) throw errors.validation(field, 'must be an ISO 8601 date-time');
  return at;
}

const DEFAULT_SNAPSHOT_LIST_LIMIT = 100;

/** E2B's log levels; core's sandbox logs use info, warn and error. */
const E2B_LEVELS = ['debug', 'info', 'warn', 'error'];

/** A millisecond timestamp query parameter (`start`, `cursor`). */
function msQuery(value: unknown, field: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (typeof value !== 'string' || !/^\d{1,15}$/.test(value) || !Number.isSafeInteger(n)) throw errors.validation(field, 'must be a Unix time in milliseconds');
  return n;
}

function intQuery(value: unknown, field: string, min: number, max: number): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (typeof value !== 'string' || !/^\d{1,9}$/.test(value) || n < min || n > max) throw errors.validation(field, `must be an integer from ${min} to ${max}`);
  return n;
}

/** E2B's SandboxLogEntry. */
const renderE2bLogEntry = (e: { timestamp: Date; level: string; message: string; fields: Record<string, string> }) => ({
  timestamp: e.timestamp.toISOString(),
  level: e.level,
  message: e.message,
  fields: e.fields,
});

function stringMap(body: Record<string, unknown>, field: string): Record<string, string> | undefined {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value) || Object.values(value).some((v) => typeof v !== 'string')) {
    throw errors.validation(field, 'must be an object of strings');
  }
  return value as Record<string, string>;
}

/**
 * `metadata` arrives encoded three times (e2b.md (b) "Metadata filter encoding"): the framework
 * decoded it once; parse it as a form string (second), then decode each part (third).
 */
export function parseMetadataFilter(value: unknown): Record<string, string> | undefined {
  if (typeof value !== 'string' || value === '') return undefined;
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(value)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      throw errors.validation('metadata', 'is not correctly percent-encoded');
    }
  }
  return out;
}

export function createControlPlaneRouter(deps: E2bDeps): Router {
  const core = deps.core;
  // `publicDomain`: the wildcard domain for `<port>-<id>.<domain>` hosts, returned as `domain` so getHost() works.
  const options = { publicDomain: deps.publicDomain };
  const router = express.Router();
  // Upload links (templates.ts) carry their own authorization: before the key check, and before
  // any body parsing (the tar streams into the object store).
  router.use(templateUploadMiddleware(deps));
  router.use(express.json({ limit: '1mb' }));
  router.use(rejectNulInJsonBody((res, err) => renderControlPlaneError(res, err)));
  // Volume contents carry a volume token (Bearer), not X-API-KEY (volumes.ts).
  router.use(volumeContentMiddleware(deps));

  // Every route: the key (401), then the route's declared scope and, for a key limited to some
  // sandboxes, the sandbox in the path (scopes.ts), before any handler runs.
  router.use((req: Request, res: Response, next: NextFunction) => {
    const key = req.headers['x-api-key'];
    core.auth
      .authenticate(typeof key === 'string' ? key.trim() : undefined)
      // Rate limits before anything else is done for the request (core/services/rate-limits.ts).
      .then(async (principal) => {
        await core.requestRates.admit(principal, 'e2b');
        res.locals.principal = principal;
        next();
      })
      .catch((err) => renderControlPlaneError(res, err, deps.log));
  });
  router.use(
    scopeGate(E2B_CONTROL_PLANE_SCOPES, {
      principalOf: (res) => (res.locals as { principal?: Principal }).principal,
      sandboxParam: 'sandboxID',
      checkVisible: async (principal, sandboxId) => {
        if (!canSeeSandbox(principal, sandboxId)) throw errors.notFound('sandbox', sandboxId);
      },
      onError: (res, err) => renderControlPlaneError(res, err, deps.log),
    }),
  );

  const route = (handler: Handler) => async (req: Request, res: Response) => {
    try {
      await handler(req, res, (res.locals as { principal: Principal }).principal);
    } catch (err) {
      renderControlPlaneError(res, err, deps.log);
    }
  };
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' ? (req.body as Record<string, unknown>) : {});
  const id = (req: Request): string => String(req.params.sandboxID);

  /**
   * Template id → what a sandbox starts from: the default image for E2B's base templates, else a
   * template built here (an image: `name` is its `default` tag, `name:tag` that tag), else a
   * named snapshot (Sandbox.createSnapshot's templates).
   */
  async function templateSource(principal: Principal, templateID: unknown): Promise<{ snapshot?: string; image?: string }> {
    if (typeof templateID === 'string' && CODE_INTERPRETER_TEMPLATES.has(templateID)) return { image: CODE_INTERPRETER_IMAGE };
    if (templateID === undefined || templateID === null || (typeof templateID === 'string' && DEFAULT_TEMPLATES.has(templateID))) return {};
    if (typeof templateID !== 'string' || templateID === '') throw errors.validation('templateID', 'must be a template id');
    if (templateID === 'mcp-gateway') throw notSupported('the MCP gateway template');
    const image = await findTemplateImage(deps, principal, templateID).catch((err: unknown) => {
      // Not an image name (snapshot names are freer): maybe a snapshot.
      if (err instanceof NestboxError && err.code === 'validation_failed') return undefined;
      throw err;
    });
    if (image) return image.id === 'default' ? {} : { image: image.id };
    try {
      await core.snapshots.get(principal, templateID);
    } catch (err) {
      if (err instanceof NestboxError && err.code === 'not_found') throw new NestboxError('not_found', `template ${templateID} not found (templates are images built here, or Nestbox snapshots; "base" is the default image)`);
      throw err;
    }
    return { snapshot: templateID };
  }

  /** Names of what sandboxes started from, by snapshot id and by image id (their templateID). */
  async function templateNames(principal: Principal, sandboxes: Sandbox[] = []): Promise<Map<string, string>> {
    const names = new Map<string, string>();
    if (principal.scopes.has('snapshots:read')) for (const s of await core.snapshots.list(principal)) names.set(s.id, s.name);
    const imageOf = new Map(sandboxes.filter((s) => s.imageId).map((s) => [s.imageId!, s]));
    for (const [imageId, s] of imageOf) {
      const image = await core.images.ofSandbox(s).catch(() => undefined);
      if (image) names.set(imageId, image.name);
    }
    return names;
  }

  function templateIdOf(s: Sandbox, names: Map<string, string>): string {
    if (s.imageId && names.has(s.imageId)) return names.get(s.imageId)!;
    return s.sourceSnapshotId ? (names.get(s.sourceSnapshotId) ?? s.sourceSnapshotId) : 'base';
  }

  /**
   * The key's envd credential for the sandbox: a token limited to what the key may do (a
   * read-only key's token reads files and nothing else), expiring, and dead once the key is
   * revoked or the sandbox deleted. A key that could do nothing with one gets none; the SDK then
   * sends no token (e2b.md (b) "envdAccessToken: optional").
   */
  async function envdTokens(principal: Principal, s: Sandbox): Promise<{ envdAccessToken?: string; trafficAccessToken: string | null }> {
    const credential = await core.sandboxTokens.envdCredential(principal, s.id);
    return credential ? { envdAccessToken: credential.accessToken, trafficAccessToken: credential.trafficToken } : { trafficAccessToken: null };
  }

  /** The "Sandbox" object of create and connect (e2b.md (b) "Create / connect response"). */
  async function sandboxResponse(principal: Principal, s: Sandbox, names: Map<string, string>) {
    return {
      sandboxID: s.id,
      templateID: templateIdOf(s, names),
      alias: templateIdOf(s, names),
      clientID: 'nestbox',
      envdVersion: ENVD_VERSION,
      ...(await envdTokens(principal, s)),
      domain: options.publicDomain ?? null,
      // Not E2B's; unknown fields are ignored by the SDK. Says whether a resume kept memory.
      memoryRestored: s.memoryRestored,
    };
  }

  /** ListedSandbox (list) and, with `detail`, SandboxDetail (get) — e2b.md (b). */
  async function listedSandbox(principal: Principal, s: Sandbox, names: Map<string, string>, detail: boolean) {
    const listed = {
      sandboxID: s.id,
      templateID: templateIdOf(s, names),
      alias: templateIdOf(s, names),
      clientID: 'nestbox',
      startedAt: (s.startedAt ?? s.createdAt).toISOString(),
      endAt: (s.expiresAt ?? s.stoppedAt ?? s.pausedAt ?? new Date(8.64e15)).toISOString(),
      state: e2bState(s.state),
      cpuCount: s.cpu,
      memoryMB: s.memoryMiB,
      diskSizeMB: (s.diskGiB ?? 0) * 1024,
      envdVersion: ENVD_VERSION,
      metadata: s.labels,
      volumeMounts: (s.volumeMounts ?? []).map((m) => ({ name: m.name, path: m.mountPath })),
    };
    if (!detail) return listed;
    return {
      ...listed,
      domain: options.publicDomain ?? null,
      envdAccessToken: (await envdTokens(principal, s)).envdAccessToken,
      lifecycle: { onTimeout: s.autoDeleteSeconds === 0 ? 'kill' : 'pause', autoResume: false },
      memoryRestored: s.memoryRestored,
      resumeReason: s.resumeReason,
      ...e2bNetworkInfo(s.egress),
    };
  }

  function publicTrafficOf(b: Record<string, unknown>): boolean {
    const network = b.network && typeof b.network === 'object' ? (b.network as Record<string, unknown>) : {};
    const value = network.allowPublicTraffic;
    if (value === undefined || value === null) return true;
    if (typeof value !== 'boolean') throw errors.validation('network.allowPublicTraffic', 'must be a boolean');
    return value;
  }

  const create: Handler = async (req, res, principal) => {
    const b = body(req);
    const source = await templateSource(principal, b.templateID);
    if (b.mcp !== undefined && b.mcp !== null) throw notSupported('mcp');
    // A timeout keeps the disk (core stops the sandbox), never the memory; and only connect
    // brings a sandbox its timeout paused back. Asking for more is refused, not ignored.
    if (b.autoPauseMemory === true) throw notSupported('lifecycle.onTimeout keepMemory (a timeout keeps the disk, not the memory: mode "filesystem")');
    const autoResume = b.autoResume as { enabled?: unknown } | undefined | null;
    if (autoResume && typeof autoResume === 'object' && autoResume.enabled === true) throw notSupported('lifecycle.autoResume (a sandbox its timeout paused comes back with connect only)');
    const egress = e2bEgressPolicy(b);
    const requested = timeoutOf(b);
    // envVars values `${e2b.secrets.<name>}` (Secret.fill) are the organisation's secrets (secrets.ts).
    const envVars = e2bSecretEnv(stringMap(b, 'envVars'));
    let sandbox = await core.sandboxes.create(principal, {
      ...source,
      ...(egress ? { egress } : {}),
      // E2B: every port the sandbox listens on is reachable at <port>-<id>.<domain> (or by the
      // E2b-Sandbox-Id/-Port headers), by anyone unless allowPublicTraffic is false, then with
      // the sandbox's traffic token (e2b-traffic-access-token).
      everyPort: { public: publicTrafficOf(b) },
      // E2B's 0 is a lifetime of nothing (the sandbox ends at once), Nestbox's 0 is "never":
      // the sandbox gets the default and its timeout is ended right after the create.
      timeoutSeconds: Math.min(requested || DEFAULT_TIMEOUT_SECONDS, deps.maxTimeoutSeconds),
      env: envVars.env,
      ...(envVars.secrets.length ? { secrets: envVars.secrets } : {}),
      labels: stringMap(b, 'metadata'),
      // E2B kills a sandbox at its timeout unless autoPause asks to keep it. Core stops it at
      // its timeout; deleting right after that stop is E2B's kill. With autoPause the stopped
      // sandbox stays and lists as paused (connect resumes it, without its memory).
      autoDeleteSeconds: b.autoPause === true ? null : 0,
      // e2b-wave2 §2.3: volumes by name, read-write.
      ...(volumeMountsOf(b.volumeMounts)?.length ? { volumes: volumeMountsOf(b.volumeMounts) } : {}),
    });
    if (requested === 0) sandbox = await core.sandboxes.expireNow(principal, sandbox.id);
    res.status(201).json(await sandboxResponse(principal, sandbox, await templateNames(principal, [sandbox])));
  };

  /** A sandbox in the middle of a stop or pause is waited for: E2B shows it as paused already. */
  async function settled(principal: Principal, sandboxId: string): Promise<Sandbox> {
    const deadline = Date.now() + SETTLE_WAIT_MS;
    let sandbox = await core.sandboxes.get(principal, sandboxId);
    while (isTransitional(sandbox.state) && sandbox.state !== 'deleting' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
      sandbox = await core.sandboxes.get(principal, sandboxId);
    }
    return sandbox;
  }

  /**
   * Connect (e2b.md (b)): 200 when it was running, 201 when it had to be resumed. A paused
   * sandbox is unpaused (memory kept); a stopped one is started from its disk.
   *
   * Its timeout: v2 defaults to 300 s when the body names none. A running
   * sandbox's deadline only ever moves later ("For running sandboxes, the timeout will update
   * only if the new timeout is longer than the existing one", the SDKs' docs); a resumed one
   * gets exactly this timeout, counted from now. It is written before the resume, so the
   * resumed sandbox never runs with the old (possibly past) deadline.
   */
  const connect = (v2: boolean): Handler => async (req, res, principal) => {
    const b = body(req);
    const given = timeoutOf(b);
    const timeout = Math.min(given ?? DEFAULT_TIMEOUT_SECONDS, deps.maxTimeoutSeconds);
    let sandbox = await settled(principal, id(req));
    const wasRunning = sandbox.state === 'running';
    if (wasRunning) {
      // 0 extends nothing; v1 connect without a timeout leaves it alone as well. A key that may
      // not operate the sandbox (a read-only one: E2B has no such keys) still connects for its
      // tokens; v2's implicit 300 s is then not applied, while a timeout it names is a 403.
      const implicit = given === undefined;
      const mayExtend = !implicit || principal.scopes.has('sandboxes:operate');
      if (timeout > 0 && (v2 || !implicit) && mayExtend) sandbox = await core.sandboxes.update(principal, sandbox.id, { timeoutSeconds: timeout, timeoutMode: 'extend' });
    } else {
      if (given === 0) throw errors.validation('timeout', 'must be greater than 0');
      await core.sandboxes.update(principal, sandbox.id, { timeoutSeconds: timeout });
      sandbox = await core.sandboxes.resume(principal, sandbox.id);
    }
    res.status(wasRunning ? 200 : 201).json(await sandboxResponse(principal, sandbox, await templateNames(principal, [sandbox])));
  };

  /** 2.0–2.5 resume: 201 when resumed, body code 409 when it was not paused. */
  const legacyResume: Handler = async (req, res, principal) => {
    const b = body(req);
    const timeout = positiveTimeoutOf(b);
    const current = await settled(principal, id(req));
    if (e2bState(current.state) === 'running') throw new NestboxError('conflict', `sandbox ${current.id} is not paused`);
    if (timeout !== undefined) await core.sandboxes.update(principal, current.id, { timeoutSeconds: Math.min(timeout, deps.maxTimeoutSeconds) });
    const sandbox = await core.sandboxes.resume(principal, current.id);
    res.status(201).json(await sandboxResponse(principal, sandbox, await templateNames(principal, [sandbox])));
  };

  /**
   * The `template` filter: the default templates are sandboxes of the built-in image; a template
   * built here is an image (matched on the page by image id: core's list filters snapshots only,
   * so such a page may hold fewer than `limit` sandboxes while more follow); else a snapshot
   * name (or id).
   */
  async function templateFilter(principal: Principal, template: unknown): Promise<{ sourceSnapshotId?: string | null; imageId?: string | null }> {
    if (template === undefined || template === '') return {};
    if (typeof template !== 'string') throw errors.validation('template', 'must be a template id');
    if (CODE_INTERPRETER_TEMPLATES.has(template)) return { imageId: CODE_INTERPRETER_IMAGE };
    if (DEFAULT_TEMPLATES.has(template)) return { sourceSnapshotId: null, imageId: null };
    const image = await findTemplateImage(deps, principal, template, 'template').catch(() => undefined);
    if (image) return image.id === 'default' ? { sourceSnapshotId: null, imageId: null } : { imageId: image.id };
    try {
      return { sourceSnapshotId: (await core.snapshots.get(principal, template)).id };
    } catch (err) {
      // Not a snapshot name this key can see: taken as a snapshot id (no match lists nothing).
      if (err instanceof NestboxError && (err.code === 'not_found' || err.code === 'forbidden')) return { sourceSnapshotId: template };
      throw err;
    }
  }

  const list = (v2: boolean): Handler => async (req, res, principal) => {
    const q = req.query;
    const stateParam = typeof q.state === 'string' ? q.state : Array.isArray(q.state) ? q.state.join(',') : v2 ? 'running,paused' : 'running';
    const states: SandboxState[] = [];
    for (const s of stateParam.split(',').filter(Boolean)) {
      const mapped = CORE_STATES[s];
      if (!mapped) throw errors.validation('state', 'must be running and/or paused');
      states.push(...mapped);
    }
    const limit = q.limit === undefined ? DEFAULT_LIST_LIMIT : Number(q.limit);
    // Sorted by start time across the whole result (E2B: `order`, default newest first), so
    // paging with nextToken walks that order.
    const order = q.order === undefined || q.order === '' ? 'desc' : q.order;
    if (order !== 'asc' && order !== 'desc') throw errors.validation('order', 'must be "asc" or "desc"');
    const filter = await templateFilter(principal, q.template);
    const page = await core.sandboxes.list(principal, {
      labels: parseMetadataFilter(q.metadata),
      states,
      limit,
      cursor: typeof q.nextToken === 'string' && q.nextToken ? q.nextToken : undefined,
      startedAfter: instantOf(q.startedAfter, 'startedAfter'),
      startedBefore: instantOf(q.startedBefore, 'startedBefore'),
      sourceSnapshotId: filter.sourceSnapshotId,
      sort: { key: 'startedAt', order },
    }).catch((err: unknown) => {
      // The SDK's name for the cursor.
      if (err instanceof NestboxError && err.details?.field === 'cursor') throw errors.validation('nextToken', err.message.replace(/^cursor:?\s*/, ''));
      throw err;
    });
    const matching = filter.imageId === undefined ? page.items : page.items.filter((s) => (s.imageId ?? null) === filter.imageId);
    const names = await templateNames(principal, matching);
    const items = await Promise.all(matching.map((s) => listedSandbox(principal, s, names, false)));
    // An empty or missing header ends the SDK's paging (e2b.md (b) "Pagination").
    if (page.nextCursor) res.setHeader('x-next-token', page.nextCursor);
    res.status(200).json(items);
  };

  const pause: Handler = async (req, res, principal) => {
    const current = await core.sandboxes.get(principal, id(req));
    // Already paused → body code 409 → the SDK's pause() returns false.
    if (e2bState(current.state) === 'paused') throw new NestboxError('conflict', `sandbox ${current.id} is already paused`);
    await core.sandboxes.pause(principal, current.id);
    // A paused E2B sandbox is kept until resumed or killed: if its timeout stops it, it is not deleted.
    await core.sandboxes.update(principal, current.id, { autoDeleteSeconds: null });
    res.status(204).end();
  };

  router.post('/sandboxes', route(create));
  router.post('/v2/sandboxes', route(create));
  router.get('/sandboxes', route(list(false)));
  router.get('/v2/sandboxes', route(list(true)));
  // Latest sample of each sandbox named (e2b-wave2.md §4.1); ones without a sample (or not the
  // caller's) are left out of the map.
  router.get('/sandboxes/metrics', route(async (req, res, principal) => {
    const latest = await core.usage.latestMany(principal, sandboxIdsOf(req.query.sandbox_ids));
    res.status(200).json({ sandboxes: Object.fromEntries([...latest].map(([sandboxId, point]) => [sandboxId, e2bMetric(point)])) });
  }));
  router.get('/sandboxes/:sandboxID', route(async (req, res, principal) => {
    const sandbox = await core.sandboxes.get(principal, id(req));
    res.status(200).json(await listedSandbox(principal, sandbox, await templateNames(principal, [sandbox]), true));
  }));
  router.delete('/sandboxes/:sandboxID', route(async (req, res, principal) => {
    // A stop or pause in progress (E2B already lists it as paused) is waited for, then killed.
    const sandbox = await settled(principal, id(req));
    await core.sandboxes.delete(principal, sandbox.id);
    res.status(204).end();
  }));
  // setTimeout sets the deadline exactly (shorter too). E2B reads 0 (and below) as "now": the
  // sandbox's timeout ends at once, where Nestbox's 0 would mean "never".
  router.post('/sandboxes/:sandboxID/timeout', route(async (req, res, principal) => {
    const value = body(req).timeout;
    if (value === undefined || value === null) throw errors.validation('timeout', 'required');
    if (typeof value !== 'number' || !Number.isFinite(value)) throw errors.validation('timeout', 'must be a number of seconds');
    if (value <= 0) await core.sandboxes.expireNow(principal, id(req));
    else await core.sandboxes.update(principal, id(req), { timeoutSeconds: Math.min(Math.ceil(value), deps.maxTimeoutSeconds) });
    res.status(204).end();
  }));
  router.post('/sandboxes/:sandboxID/refreshes', route(async (req, res, principal) => {
    await core.sandboxes.keepAlive(principal, id(req));
    res.status(204).end();
  }));
  router.post('/sandboxes/:sandboxID/pause', route(pause));
  router.post('/sandboxes/:sandboxID/resume', route(legacyResume));
  router.post('/sandboxes/:sandboxID/connect', route(connect(false)));
  router.post('/v2/sandboxes/:sandboxID/connect', route(connect(true)));
  // Samples from `start` (default: when the sandbox started) to `end` (default: now), unix seconds.
  router.get('/sandboxes/:sandboxID/metrics', route(async (req, res, principal) => {
    const start = unixSecondsOf(req.query.start, 'start');
    const end = unixSecondsOf(req.query.end, 'end');
    const { points } = await core.usage.range(principal, id(req), { start, end, maxPoints: E2B_METRICS_MAX_POINTS });
    res.status(200).json(points.map(e2bMetric));
  }));
  // Sandbox logs: what the platform did to the sandbox, from core's durable lifecycle events.
  router.get('/sandboxes/:sandboxID/logs', route(async (req, res, principal) => {
    const start = msQuery(req.query.start, 'start');
    const limit = intQuery(req.query.limit, 'limit', 1, 10_000) ?? 1000;
    const entries = await core.events.sandboxLogs(principal, id(req), { ...(start !== undefined ? { since: new Date(start) } : {}), limit });
    res.status(200).json({
      logs: entries.map((e) => ({ timestamp: e.timestamp.toISOString(), line: e.message })),
      logEntries: entries.map(renderE2bLogEntry),
    });
  }));
  router.get('/v2/sandboxes/:sandboxID/logs', route(async (req, res, principal) => {
    const cursor = msQuery(req.query.cursor, 'cursor');
    const limit = intQuery(req.query.limit, 'limit', 0, 1000) ?? 1000;
    const direction = req.query.direction ?? 'forward';
    if (direction !== 'forward' && direction !== 'backward') throw errors.validation('direction', 'must be forward or backward');
    const level = req.query.level;
    if (level !== undefined && !E2B_LEVELS.includes(level as string)) throw errors.validation('level', `must be one of ${E2B_LEVELS.join(', ')}`);
    const search = req.query.search;
    if (search !== undefined && (typeof search !== 'string' || search.length > 256)) throw errors.validation('search', 'must be a string of at most 256 characters');
    if (limit === 0) {
      await core.events.sandboxLogs(principal, id(req), { limit: 1 });
      res.status(200).json({ logs: [] });
      return;
    }
    const at = cursor === undefined ? undefined : new Date(cursor);
    const entries = await core.events.sandboxLogs(principal, id(req), {
      limit,
      direction,
      ...(at ? (direction === 'forward' ? { since: at } : { until: at }) : {}),
      // debug is below every level core writes: no filter.
      ...(level && level !== 'debug' ? { minLevel: level as 'info' | 'warn' | 'error' } : {}),
      ...(search ? { search: search as string } : {}),
    });
    res.status(200).json({ logs: entries.map(renderE2bLogEntry) });
  }));
  // sbx.updateNetwork() (e2b.md (b)): onto core's egress policy, applied live by the host.
  router.put('/sandboxes/:sandboxID/network', route(async (req, res, principal) => {
    const egress = e2bEgressPolicy(body(req)) ?? { mode: 'allow-all' as const };
    await core.sandboxes.update(principal, id(req), { egress });
    res.status(204).end();
  }));

  // Snapshots: a sandbox's disk under a name, usable as a templateID.
  router.post('/sandboxes/:sandboxID/snapshots', route(async (req, res, principal) => {
    const b = body(req);
    const name = typeof b.name === 'string' && b.name ? b.name : `${id(req)}-${Date.now().toString(36)}`;
    const snapshot = await core.snapshots.create(principal, { sandboxId: id(req), name });
    res.status(201).json({ snapshotID: snapshot.name, names: [snapshot.name] });
  }));
  // Sandbox.listSnapshots(): filters `sandboxID` and `name`, pages of `limit` (default and
  // maximum 100) with `nextToken` / x-next-token, newest first.
  router.get('/snapshots', route(async (req, res, principal) => {
    const q = req.query;
    const limit = q.limit === undefined ? DEFAULT_SNAPSHOT_LIST_LIMIT : Number(q.limit);
    if (!Number.isInteger(limit) || limit < 1 || limit > DEFAULT_SNAPSHOT_LIST_LIMIT) throw errors.validation('limit', `must be an integer from 1 to ${DEFAULT_SNAPSHOT_LIST_LIMIT}`);
    const position = (s: Snapshot) => `${s.createdAt.toISOString()}|${s.id}`;
    let items = (await core.snapshots.list(principal)).sort((a, b) => (position(a) < position(b) ? 1 : position(a) > position(b) ? -1 : 0));
    if (typeof q.sandboxID === 'string') items = items.filter((s) => s.sourceSandboxId === q.sandboxID);
    if (typeof q.name === 'string') items = items.filter((s) => s.name === q.name);
    if (typeof q.nextToken === 'string' && q.nextToken) {
      const after = Buffer.from(q.nextToken, 'base64url').toString('utf8');
      if (!/^\d{4}-\d\d-\d\dT[\d:.]+Z\|\S+$/.test(after)) throw errors.validation('nextToken', 'is not a token returned by this API');
      items = items.filter((s) => position(s) < after);
    }
    const page = items.slice(0, limit);
    if (items.length > limit) res.setHeader('x-next-token', Buffer.from(position(page[page.length - 1])).toString('base64url'));
    res.status(200).json(page.map((s) => ({ snapshotID: s.name, names: [s.name] })));
  }));
  // Templates: images built from E2B's Template builder, their tags; and named snapshots.
  registerTemplateRoutes(router, deps, route);
  router.post('/sandboxes/:sandboxID/fork', route(async (req, res, principal) => {
    const b = body(req);
    const timeout = positiveTimeoutOf(b);
    const result = await core.sandboxes.fork(principal, id(req), {
      count: typeof b.count === 'number' ? b.count : undefined,
      timeoutSeconds: timeout === undefined ? undefined : Math.min(timeout, deps.maxTimeoutSeconds),
    });
    const names = await templateNames(principal, result.sandboxes);
    res.status(201).json(await Promise.all(result.sandboxes.map(async (s) => ({ sandbox: await sandboxResponse(principal, s, names) }))));
  }));
  // Lifecycle events and webhooks (events.ts), over core's events and webhooks.
  registerEventRoutes(router, deps, route, async (principal, ids) => {
    const sandboxes = ids.length ? await core.sandboxes.getMany(principal, ids) : [];
    const names = await templateNames(principal, sandboxes);
    return new Map(sandboxes.map((s) => [s.id, templateIdOf(s, names)]));
  });

  // Template routes the SDK never calls (listing, getting, updating templates; the v1 build
  // start, the paged build logs): not there yet. Volumes have no Nestbox counterpart.
  router.all(['/templates', '/templates/*rest', '/v2/templates', '/v2/templates/*rest', '/v3/templates', '/v3/templates/*rest'], route(async (req) => {
    throw notSupported(`${req.method} ${req.path} (of E2B's template API, Nestbox serves what the SDKs call: build, status, exists, tags, delete)`);
  }));
  registerVolumeRoutes(router, deps, route, options.publicDomain);
  registerSecretRoutes(router, deps, route);

  router.use((req: Request, res: Response) => {
    renderControlPlaneError(res, new NestboxError('not_found', `no E2B route ${req.method} ${req.path}`));
  });
  // Malformed JSON, an unknown charset and the like: E2B's error shape, never the native one
  // (core's toNestboxError gives each its 4xx).
  router.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    renderControlPlaneError(res, err, deps.log);
  });
  return router;
}
