// E2B's template routes (e2b-wave2.md §1) onto Nestbox images and image builds. A template is an
// image: its templateID is the image's name, its tags are the image's tags (E2B's default tag is
// `default`, where the native API's is `latest`), and a build is a core build.
//
// E2B builds in four calls: request (names the template, gets a buildID), one upload link per
// COPY step (GET …/files/{hash}, then a PUT to that link without the API key), start (the steps),
// and status polling. Core builds start with their whole spec, so the request is kept as a small
// record in the organisation's object store (`e2b/builds/<buildID>.json`) until the start turns it
// into a core build; the record then names that build. The buildID is a UUID, as upstream's; the
// status route also takes a core build id (`bld…`), which getTags and assignTags report.
//
// Upload links carry their own authorization: a random token whose hash is stored beside the
// files (`e2b/upload-tokens/<sha256>.json`, naming the one object it may write, until it
// expires), so any replica sharing the object store accepts the PUT.
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import type { NextFunction, Request, Response, Router } from 'express';
import { errors, NestboxError } from '../../core/errors.js';
import type { Image, ImageBuild, BuildLogLine } from '../../core/images/types.js';
import { IMAGE_NAME, IMAGE_TAG } from '../../core/services/images.js';
import type { EgressPolicy, Principal } from '../../core/types.js';
import { parseEgressEntry } from '../../core/egress.js';
import type { E2bDeps } from './deps.js';
import { notSupported, renderControlPlaneError } from './errors.js';
import { baseOf, CODE_INTERPRETER_IMAGE, CODE_INTERPRETER_TEMPLATES, DEFAULT_TEMPLATES, E2B_BASE_IMAGE, e2bStepOf, FILES_HASH, filesObjectKey, isNestboxError, templateBuildRequest, type TemplateBase } from './template-spec.js';

/** E2B's tag when a name has none. */
export const E2B_DEFAULT_TAG = 'default';
/** The native API's default tag: images built natively are found by their bare name too. */
const NATIVE_DEFAULT_TAG = 'latest';
/** At most this many log entries per status call (upstream's limit, and its maximum). */
const STATUS_PAGE_MAX = 100;
/** How long an upload link works (the SDK's own upload timeout is an hour). */
const UPLOAD_LINK_SECONDS = 3600;
/** The upload PUT's path under the E2B mount (outside the key-authenticated routes). */
const UPLOAD_PATH = /^\/template-files\/([A-Za-z0-9_-]{1,64})\/([0-9a-f]{64})$/;
/**
 * Not E2B's: E2B's build has no egress setting (its builds reach the internet). A caller may
 * limit a build's outbound network with this header on the build request (the SDK sends it from
 * `apiHeaders`): `deny-all`, or a comma-separated allow-list of domains, addresses and CIDRs.
 */
export const BUILD_EGRESS_HEADER = 'x-nestbox-build-egress';

type Handler = (req: Request, res: Response, principal: Principal) => Promise<void>;
type Route = (handler: Handler) => (req: Request, res: Response) => Promise<void>;

interface BuildRecord {
  buildID: string;
  name: string;
  tags: string[];
  cpu?: number;
  memoryMiB?: number;
  egress?: EgressPolicy;
  createdAt: string;
  /** Set once the start call created the core build. */
  coreBuildId?: string;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const CORE_BUILD_ID = /^bld[a-z0-9]{17}$/;
const recordKey = (buildID: string) => `e2b/builds/${buildID}.json`;
const tokenKey = (token: string) => `e2b/upload-tokens/${createHash('sha256').update(token).digest('hex')}.json`;

async function readAll(stream: Readable, max = 1024 * 1024): Promise<string> {
  let out = '';
  for await (const chunk of stream) {
    out += String(chunk);
    if (out.length > max) throw new NestboxError('internal', 'a stored E2B record is too large');
  }
  return out;
}

/** `name` or `name:tag` as E2B writes it (a tag never contains `/`). */
export function splitTemplateName(value: string, field: string): { name: string; tag?: string } {
  const colon = value.lastIndexOf(':');
  const hasTag = colon > 0 && !value.slice(colon).includes('/');
  const name = hasTag ? value.slice(0, colon) : value;
  const tag = hasTag ? value.slice(colon + 1) : undefined;
  if (!IMAGE_NAME.test(name)) throw errors.validation(field, `"${value.slice(0, 200)}": a template name is 1-128 letters, digits, ".", "_", "-" or "/", starting with a letter or digit`);
  if (tag !== undefined && !IMAGE_TAG.test(tag)) throw errors.validation(field, `"${value.slice(0, 200)}": a tag is 1-128 letters, digits, ".", "_" or "-"`);
  return { name, ...(tag !== undefined ? { tag } : {}) };
}

/**
 * The organisation's image a template name means: `name:tag` exactly; a bare name is its
 * `default` tag (E2B's), else its `latest` (an image built through the native API).
 */
export async function findTemplateImage(deps: E2bDeps, principal: Principal, value: string, field = 'templateID'): Promise<Image | undefined> {
  const { name, tag } = splitTemplateName(value, field);
  const images = deps.core.images;
  if (tag !== undefined) return images.find(principal.organizationId, `${name}:${tag}`, field);
  return (await images.find(principal.organizationId, `${name}:${E2B_DEFAULT_TAG}`, field)) ?? (await images.find(principal.organizationId, `${name}:${NATIVE_DEFAULT_TAG}`, field));
}

function stringList(value: unknown, field: string, max = 32): string[] {
  if (!Array.isArray(value) || value.some((v) => typeof v !== 'string')) throw errors.validation(field, 'must be a list of strings');
  if (value.length > max) throw errors.validation(field, `at most ${max} entries`);
  return value as string[];
}

function positiveInt(value: unknown, field: string, min: number): number | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min) throw errors.validation(field, `must be an integer of at least ${min}`);
  return value;
}

function egressOfHeader(req: Request): EgressPolicy | undefined {
  const raw = req.get(BUILD_EGRESS_HEADER);
  if (raw === undefined) return undefined;
  const value = raw.trim();
  if (value === 'deny-all') return { mode: 'deny-all' };
  if (value === 'allow-all') return { mode: 'allow-all' };
  const allow = value.split(',').map((s) => s.trim()).filter(Boolean);
  if (!allow.length) throw errors.validation(BUILD_EGRESS_HEADER, 'must be deny-all, allow-all or a comma-separated allow-list');
  allow.forEach((entry, i) => parseEgressEntry(entry, `${BUILD_EGRESS_HEADER}[${i}]`, 'addresses-and-domains'));
  return { mode: 'allow-list', allow };
}

/** TemplateBuildInfo's status from the core build's state (§1.6). */
function statusOf(build: ImageBuild | undefined): 'waiting' | 'building' | 'ready' | 'error' {
  if (!build || build.state === 'queued') return 'waiting';
  if (build.state === 'running') return 'building';
  return build.state === 'succeeded' ? 'ready' : 'error';
}

function logEntryOf(line: BuildLogLine) {
  return { timestamp: line.at.toISOString(), level: line.stream === 'stderr' ? 'error' : 'info', message: line.text };
}

/**
 * The PUT of an upload link (§1.5): no API key, the link's token instead. Served ahead of the
 * control plane's key check, as a middleware of the E2B mount rather than one of its routes (it
 * is authorised by the link, not by a key scope).
 */
export function templateUploadMiddleware(deps: E2bDeps) {
  return (req: Request, res: Response, next: NextFunction) => {
    const match = UPLOAD_PATH.exec(req.path);
    if (!match) return next();
    if (req.method !== 'PUT') return renderControlPlaneError(res, new NestboxError('method_not_allowed', 'upload links take PUT'));
    const [, organizationId, hash] = match;
    void (async () => {
      const token = typeof req.query.token === 'string' ? req.query.token : '';
      const refused = new NestboxError('unauthorized', 'this upload link is not valid (ask for a new one: GET /templates/{templateID}/files/{hash})');
      if (!/^[A-Za-z0-9_-]{43}$/.test(token)) throw refused;
      const objects = deps.core.objects;
      const grant = await objects.head(organizationId, tokenKey(token));
      if (!grant) throw refused;
      const stored = JSON.parse(await readAll(await objects.read(organizationId, tokenKey(token)))) as { key: string; expiresAt: string };
      if (stored.key !== filesObjectKey(hash) || Date.parse(stored.expiresAt) < Date.now()) throw refused;
      await objects.put(organizationId, stored.key, req, { maxBytes: deps.maxUploadBytes });
      await objects.delete(organizationId, tokenKey(token)).catch(() => undefined);
      res.status(200).end();
    })().catch((err) => renderControlPlaneError(res, err, deps.log));
  };
}

/** Registers the template routes on the control-plane router (order as in scopes.ts). */
export function registerTemplateRoutes(router: Router, deps: E2bDeps, route: Route): void {
  const core = deps.core;
  const objects = core.objects;
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' && !Array.isArray(req.body) ? (req.body as Record<string, unknown>) : {});

  async function readRecord(principal: Principal, buildID: string): Promise<BuildRecord | undefined> {
    if (!UUID.test(buildID)) return undefined;
    if (!(await objects.head(principal.organizationId, recordKey(buildID)))) return undefined;
    return JSON.parse(await readAll(await objects.read(principal.organizationId, recordKey(buildID)))) as BuildRecord;
  }

  async function writeRecord(principal: Principal, record: BuildRecord): Promise<void> {
    await objects.put(principal.organizationId, recordKey(record.buildID), Readable.from([JSON.stringify(record)]));
  }

  /** The build a templateID/buildID pair names: a request record (maybe not started yet), or a core build id. */
  async function buildOf(principal: Principal, templateID: string, buildID: string): Promise<{ record?: BuildRecord; build?: ImageBuild }> {
    if (CORE_BUILD_ID.test(buildID)) {
      const build = await core.builds.get(principal, buildID);
      if (build.name !== templateID) throw errors.notFound('build', buildID);
      return { build };
    }
    const record = await readRecord(principal, buildID);
    // Upstream answers 400 for a malformed or unknown build.
    if (!record || record.name !== templateID) throw errors.validation('buildID', `no build ${buildID.slice(0, 100)} of template ${templateID.slice(0, 200)}`);
    return { record, build: record.coreBuildId ? await core.builds.get(principal, record.coreBuildId) : undefined };
  }

  /**
   * Links nobody used (a file already there, an SDK that gave up) would pile up: each link
   * handed out first removes a batch of expired ones.
   */
  async function sweepExpiredLinks(organizationId: string): Promise<void> {
    const before = Date.now() - UPLOAD_LINK_SECONDS * 1000;
    const grants = await objects.list(organizationId, 'e2b/upload-tokens/', { limit: 200 }).catch(() => []);
    for (const grant of grants) if (grant.createdAt.getTime() < before) await objects.delete(organizationId, grant.key).catch(() => undefined);
  }

  /** Step 1: POST /v3/templates {name, tags?, cpuCount?, memoryMB?} (and 2.0–2.5's POST /v2/templates {alias}). */
  const requestBuild = (legacy: boolean): Handler => async (req, res, principal) => {
    const b = body(req);
    // `alias`: what 2.0-2.6 send (to /v2/templates, then to /v3/templates up to about 2.6).
    const fieldName = b.name === undefined || b.name === null ? 'alias' : 'name';
    const raw = b[fieldName];
    if (typeof raw !== 'string' || raw === '') throw errors.validation('name', 'required: the template name, `name` or `name:tag`');
    const { name, tag } = splitTemplateName(raw, fieldName);
    if (DEFAULT_TEMPLATES.has(name) || name === E2B_BASE_IMAGE) throw errors.validation('name', `"${name}" is the built-in base template; choose another name`);
    const extra = b.tags === undefined || b.tags === null ? [] : stringList(b.tags, 'tags');
    extra.forEach((t, i) => {
      if (!IMAGE_TAG.test(t)) throw errors.validation(`tags[${i}]`, 'a tag is 1-128 letters, digits, ".", "_" or "-"');
    });
    // Upstream: a tag in the name goes first; no tag at all is `default`.
    const tags = [...new Set([...(tag !== undefined ? [tag] : []), ...extra])];
    if (!tags.length) tags.push(E2B_DEFAULT_TAG);
    if (b.minFreeDiskMb !== undefined && b.minFreeDiskMb !== null && (typeof b.minFreeDiskMb !== 'number' || !Number.isFinite(b.minFreeDiskMb) || b.minFreeDiskMb < 0)) throw errors.validation('minFreeDiskMb', 'must be a number of MiB, 0 or more');
    // 0 asks for no growth, which is what Nestbox does; a sandbox's disk size is its create's.
    if (typeof b.minFreeDiskMb === 'number' && b.minFreeDiskMb > 0) throw notSupported('minFreeDiskMb (a sandbox gets the disk size its create asks for, whatever the template holds)');
    const record: BuildRecord = {
      buildID: randomUUID(),
      name,
      tags,
      cpu: positiveInt(b.cpuCount, 'cpuCount', 1),
      memoryMiB: positiveInt(b.memoryMB, 'memoryMB', 128),
      egress: egressOfHeader(req),
      createdAt: new Date().toISOString(),
    };
    await writeRecord(principal, record);
    if (legacy) {
      res.status(202).json({ templateID: name, buildID: record.buildID, public: false, aliases: [name], names: [name], cpuCount: record.cpu ?? null, memoryMB: record.memoryMiB ?? null });
      return;
    }
    res.status(202).json({ templateID: name, buildID: record.buildID, tags, names: [name], aliases: [name], public: false });
  };

  /** Step 2: GET /templates/{templateID}/files/{hash}: is it uploaded, and where to PUT it. */
  const uploadLink: Handler = async (req, res, principal) => {
    splitTemplateName(String(req.params.templateID), 'templateID');
    const hash = String(req.params.hash);
    if (!FILES_HASH.test(hash)) throw errors.validation('hash', 'must be 64 lower-case hex digits (the files hash)');
    const present = Boolean(await objects.head(principal.organizationId, filesObjectKey(hash)));
    await sweepExpiredLinks(principal.organizationId);
    const token = randomBytes(32).toString('base64url');
    const grant = { key: filesObjectKey(hash), expiresAt: new Date(Date.now() + UPLOAD_LINK_SECONDS * 1000).toISOString() };
    await objects.put(principal.organizationId, tokenKey(token), Readable.from([JSON.stringify(grant)]));
    // The link is on the origin the SDK called (the E2B mount), so it works wherever that does.
    const url = `${req.protocol}://${req.get('host')}${req.baseUrl}/template-files/${encodeURIComponent(principal.organizationId)}/${hash}?token=${token}`;
    res.status(201).json({ present, url });
  };

  /** Step 4: POST /v2/templates/{templateID}/builds/{buildID}: the steps; the core build starts. */
  const startBuild: Handler = async (req, res, principal) => {
    const templateID = String(req.params.templateID);
    const { record } = await buildOf(principal, templateID, String(req.params.buildID));
    if (!record) throw errors.validation('buildID', 'a build is started with the buildID of POST /v3/templates');
    if (record.coreBuildId) throw new NestboxError('conflict', `build ${record.buildID} was already started`);
    const b = body(req);
    const { fromImage, fromTemplate } = baseOf(b);
    let base: TemplateBase;
    if (fromTemplate !== undefined) {
      if (CODE_INTERPRETER_TEMPLATES.has(fromTemplate)) {
        // Upstream's code-interpreter template as a base: the built-in code-interpreter image.
        const image = await core.images.find(principal.organizationId, CODE_INTERPRETER_IMAGE, 'fromTemplate');
        if (!image) throw new NestboxError('not_found', `template ${fromTemplate} not found (this server has no code-interpreter image)`);
        base = { kind: 'image', reference: image.id, user: image.config.user };
      } else if (DEFAULT_TEMPLATES.has(fromTemplate)) base = { kind: 'builtin' };
      else {
        const image = await findTemplateImage(deps, principal, fromTemplate, 'fromTemplate');
        if (!image) throw new NestboxError('not_found', `template ${fromTemplate.slice(0, 200)} not found (fromTemplate names a template built here, or "base")`);
        base = image.id === 'default' ? { kind: 'builtin' } : { kind: 'image', reference: image.id, user: image.config.user };
      }
    } else if (fromImage === E2B_BASE_IMAGE || fromImage === `${E2B_BASE_IMAGE}:latest`) {
      // E2B's own base image is Nestbox's built-in one (it has the `user` account, python, node).
      base = { kind: 'builtin' };
    } else base = { kind: 'oci', reference: fromImage! };
    const request = templateBuildRequest(b, base);
    const build = await core.builds
      .create(principal, {
        name: record.name,
        tags: record.tags,
        spec: request.spec,
        noCache: request.noCache,
        ...(record.cpu !== undefined ? { cpu: record.cpu } : {}),
        ...(record.memoryMiB !== undefined ? { memoryMiB: record.memoryMiB } : {}),
        ...(record.egress ? { egress: record.egress } : {}),
        ...(request.credentials ? { credentials: request.credentials } : {}),
      })
      .catch((err: unknown) => {
        // The build's size limits, under the names E2B gave them.
        const field = err instanceof NestboxError ? err.details?.field : undefined;
        const e2bField = field === 'cpu' ? 'cpuCount' : field === 'memoryMiB' ? 'memoryMB' : undefined;
        if (e2bField && err instanceof NestboxError) throw errors.validation(e2bField, err.message.replace(/^[^:]+:\s*/, ''));
        throw err;
      });
    await writeRecord(principal, { ...record, coreBuildId: build.id });
    res.status(202).end();
  };

  /** Step 5 and getBuildStatus: GET /templates/{templateID}/builds/{buildID}/status?logsOffset=. */
  const buildStatus: Handler = async (req, res, principal) => {
    const templateID = String(req.params.templateID);
    const buildID = String(req.params.buildID);
    const offset = req.query.logsOffset === undefined ? 0 : Number(req.query.logsOffset);
    if (!Number.isInteger(offset) || offset < 0) throw errors.validation('logsOffset', 'must be a non-negative integer');
    const limit = req.query.limit === undefined ? STATUS_PAGE_MAX : Number(req.query.limit);
    if (!Number.isInteger(limit) || limit < 0 || limit > STATUS_PAGE_MAX) throw errors.validation('limit', `must be an integer from 0 to ${STATUS_PAGE_MAX}`);
    // Offsets count every line: a level filter would need them counted per level (the SDKs never send one).
    if (req.query.level !== undefined) throw notSupported('the level filter of build status (the status pages every line; filter the entries yourself)');
    const { build } = await buildOf(principal, templateID, buildID);
    let lines: BuildLogLine[] = [];
    let current = build;
    if (build && limit > 0) {
      const page = await core.builds.logs(principal, build.id, offset, limit);
      lines = page.lines;
      current = page.build;
    }
    const entries = lines.map(logEntryOf);
    const status = statusOf(current);
    const failure = current?.error;
    res.status(200).json({
      templateID,
      buildID,
      status,
      logEntries: entries,
      logs: [],
      ...(status === 'error'
        ? {
            reason: {
              message: failure?.message ?? 'the build failed',
              ...(current && e2bStepOf(current.spec, failure?.step) !== undefined ? { step: e2bStepOf(current.spec, failure?.step) } : {}),
              logEntries: (failure?.logTail ?? []).map((text) => ({ timestamp: (current?.finishedAt ?? new Date()).toISOString(), level: 'error', message: text })),
            },
          }
        : {}),
    });
  };

  /** Template.exists(name): 200 with a body when the name (or name:tag) is a template here, else 404 (§1.7). */
  const aliasExists: Handler = async (req, res, principal) => {
    const alias = String(req.params.alias);
    const { name } = splitTemplateName(alias, 'alias');
    if (DEFAULT_TEMPLATES.has(name)) return void res.status(200).json({ templateID: name, public: true });
    const image = await findTemplateImage(deps, principal, alias, 'alias');
    if (image) return void res.status(200).json({ templateID: image.name, public: false });
    // Named snapshots are templates too (Sandbox.createSnapshot).
    const snapshot = await core.snapshots.get(principal, alias).catch((err: unknown) => {
      if (isNestboxError(err, 'not_found') || isNestboxError(err, 'forbidden') || isNestboxError(err, 'validation_failed')) return undefined;
      throw err;
    });
    if (snapshot) return void res.status(200).json({ templateID: snapshot.name, public: false });
    throw new NestboxError('not_found', `template ${alias.slice(0, 200)} not found`);
  };

  /** Template.assignTags('name:tag', tags): more tags on the image `name:tag` names. */
  const assignTags: Handler = async (req, res, principal) => {
    const b = body(req);
    if (typeof b.target !== 'string' || !b.target) throw errors.validation('target', 'required: `name:tag` of the build to tag');
    const tags = stringList(b.tags, 'tags');
    if (!tags.length) throw errors.validation('tags', 'at least one tag');
    const { name } = splitTemplateName(b.target, 'target');
    const image = await findTemplateImage(deps, principal, b.target, 'target');
    if (!image || image.id === 'default') throw new NestboxError('not_found', `template ${b.target.slice(0, 200)} not found`);
    const tagged = await core.images.addTags(principal, image.id, name, tags);
    res.status(201).json({ buildID: tagged.buildId ?? tagged.id, tags });
  };

  /** Template.removeTags(name, tags): DELETE with a body. The last tag of an image removes it. */
  const removeTags: Handler = async (req, res, principal) => {
    const b = body(req);
    if (typeof b.name !== 'string' || !b.name) throw errors.validation('name', 'required: the template name');
    const { name } = splitTemplateName(b.name, 'name');
    const tags = stringList(b.tags, 'tags');
    if (!tags.length) throw errors.validation('tags', 'at least one tag');
    for (const [i, tag] of tags.entries()) {
      if (!IMAGE_TAG.test(tag)) throw errors.validation(`tags[${i}]`, 'a tag is 1-128 letters, digits, ".", "_" or "-"');
      await core.images.delete(principal, `${name}:${tag}`);
    }
    res.status(204).end();
  };

  /** Template.getTags(name): every tag of the name, with the build that made its image. */
  const getTags: Handler = async (req, res, principal) => {
    const templateID = String(req.params.templateID);
    const { name } = splitTemplateName(templateID, 'templateID');
    const tags = await core.images.tagsOf(principal, name);
    if (!tags.length) throw new NestboxError('not_found', `template ${templateID.slice(0, 200)} not found`);
    res.status(200).json(tags.map((t) => ({ tag: t.tag, buildID: t.buildId ?? t.imageId, createdAt: t.createdAt.toISOString() })));
  };

  /**
   * DELETE /templates/{templateID} (Sandbox.deleteSnapshot, `e2b template delete`): a named
   * snapshot, else every tag of the image name (`name:tag`: that tag only).
   */
  const deleteTemplate: Handler = async (req, res, principal) => {
    const templateID = String(req.params.templateID);
    try {
      await core.snapshots.delete(principal, templateID);
      return void res.status(204).end();
    } catch (err) {
      if (!isNestboxError(err, 'not_found') && !isNestboxError(err, 'forbidden')) throw err;
    }
    const { name, tag } = splitTemplateName(templateID, 'templateID');
    const tags = tag !== undefined ? [tag] : (await core.images.tagsOf(principal, name)).map((t) => t.tag);
    if (!tags.length) throw new NestboxError('not_found', `template ${templateID.slice(0, 200)} not found`);
    for (const t of tags) await core.images.delete(principal, `${name}:${t}`);
    res.status(204).end();
  };

  router.post('/v3/templates', route(requestBuild(false)));
  router.post('/v2/templates', route(requestBuild(true)));
  router.get('/templates/aliases/:alias', route(aliasExists));
  router.post('/templates/tags', route(assignTags));
  router.delete('/templates/tags', route(removeTags));
  router.get('/templates/:templateID/files/:hash', route(uploadLink));
  router.post('/v2/templates/:templateID/builds/:buildID', route(startBuild));
  router.get('/templates/:templateID/builds/:buildID/status', route(buildStatus));
  router.get('/templates/:templateID/tags', route(getTags));
  router.delete('/templates/:templateID', route(deleteTemplate));
}
