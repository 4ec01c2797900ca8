// Daytona's declarative images and image snapshots (daytona-wave2.md §1) over core's images and
// builds. What Daytona calls a snapshot is, here, one of two things:
//
// - a Nestbox named snapshot of a sandbox (core.snapshots, `sandbox.createSnapshot`), or
// - an image (core.images): snapshot name `n` is image `n:latest`, and `n:t` is image `n:t`.
//   `snapshot.create({name, image})` is a build of that image (core.builds); the snapshot's id
//   is the build's id (`bld…`, stable from the POST to after it is active), or the image's id
//   for an image no build made (the built-in `default`, pulls of the native API).
//
// `create({image})` builds on demand under Daytona's own dedupe key, `snapshotRef`
// "daytona-" + sha256(dockerfileContent + sorted(contextHashes).join("")) + ":daytona", which is
// image `daytona-<hex>` tag `daytona`: the same Dockerfile and contexts never build twice.
// Context hashes name the tars the SDK uploaded through the S3 endpoint (object-storage.ts): key
// `<hash>/context.tar` of the organisation. The build engine merges them into one tree in order
// (core/images/copy-archive.ts), so `COPY ctx /app` and `COPY /tmp/w/ctx /app` resolve as
// Docker resolves them against one context root.
import { createHash } from 'node:crypto';
import { errors, NestboxError } from '../../core/errors.js';
import { BuildSpecError, type BuildSpec } from '../../core/images/build-spec.js';
import { parseDockerfile } from '../../core/images/dockerfile.js';
import { DEFAULT_TAG, parseImageName } from '../../core/services/images.js';
import { FINISHED_BUILD_STATES, type Image, type ImageBuild } from '../../core/images/types.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { Principal } from '../../core/types.js';
import { daytonaContextObjectKey } from './object-storage.js';

/** Daytona's BuildInfo as the SDK sends it. */
export interface DaytonaBuildInfo {
  dockerfileContent?: string;
  contextHashes?: string[];
}

/** The tag of on-demand builds' images (the `:daytona` of snapshotRef). */
export const DAYTONA_REF_TAG = 'daytona';
/** Image labels a snapshot's `resources` are kept in: the defaults of sandboxes created from it. */
export const RESOURCE_LABELS = { cpu: 'io.daytona.snapshot.cpu', memory: 'io.daytona.snapshot.memory', disk: 'io.daytona.snapshot.disk' } as const;

/** A context hash is the SDK's hex MD5; anything usable as one path segment of a key is accepted. */
const CONTEXT_HASH = /^[A-Za-z0-9_-]{1,128}$/;

function dockerfileOf(info: DaytonaBuildInfo): string {
  const text = info.dockerfileContent;
  if (typeof text !== 'string' || !text.trim()) throw errors.validation('buildInfo.dockerfileContent', 'is required: the Dockerfile of the image');
  return text;
}

function hashesOf(info: DaytonaBuildInfo): string[] {
  const hashes = info.contextHashes ?? [];
  hashes.forEach((h, i) => {
    if (typeof h !== 'string' || !CONTEXT_HASH.test(h)) throw errors.validation(`buildInfo.contextHashes[${i}]`, 'must be the hash of an uploaded context (letters, digits, "_" or "-")');
  });
  return hashes;
}

/** Daytona's dedupe key of a build, as its server computes it (wave2 §1.4). */
export function snapshotRefOf(info: DaytonaBuildInfo): string {
  const hex = createHash('sha256').update(dockerfileOf(info) + [...hashesOf(info)].sort().join('')).digest('hex');
  return `daytona-${hex}:${DAYTONA_REF_TAG}`;
}

/**
 * The build spec of a BuildInfo: the Dockerfile over the uploaded contexts. A line Nestbox cannot
 * honour is a 400 naming `buildInfo.dockerfileContent` and the line.
 */
export function buildSpecOf(info: DaytonaBuildInfo, labels: [string, string][] = []): BuildSpec {
  const dockerfile = dockerfileOf(info);
  const contexts = hashesOf(info).map(daytonaContextObjectKey);
  let spec: BuildSpec;
  try {
    spec = parseDockerfile(dockerfile, { contexts });
  } catch (err) {
    if (err instanceof BuildSpecError) throw new NestboxError('validation_failed', `buildInfo.dockerfileContent: ${err.message}`, { field: 'buildInfo.dockerfileContent', ...(err.line !== undefined ? { line: err.line } : {}) });
    throw err;
  }
  const last = spec.stages[spec.stages.length - 1];
  if (last && labels.length) last.steps.push({ kind: 'label', labels, at: { line: last.steps.length + 1, text: `LABEL ${labels.map(([k, v]) => `${k}=${v}`).join(' ')}` } });
  const entrypoint = last ? entrypointCommand(last.steps) : undefined;
  // Daytona's daemon runs the image's ENTRYPOINT/CMD in the background of every sandbox: here
  // that is the image's start command (run detached at each start, no readiness check).
  if (last && entrypoint) last.steps.push({ kind: 'start', command: entrypoint, at: { line: last.steps.length + 1, text: `(entrypoint) ${entrypoint.slice(0, 200)}` } });
  return spec;
}

const shellQuote = (word: string) => (/^[A-Za-z0-9_./:=@%+-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`);

/**
 * The shell command of the last ENTRYPOINT and CMD the Dockerfile's final stage sets, combined as
 * Docker combines them (a shell-form ENTRYPOINT ignores CMD); undefined when it sets neither.
 */
export function entrypointCommand(steps: BuildSpec['stages'][number]['steps']): string | undefined {
  let entrypoint: { shell: string } | { argv: string[] } | undefined;
  let cmd: { shell: string } | { argv: string[] } | undefined;
  for (const step of steps) {
    if (step.kind === 'entrypoint') {
      entrypoint = step.command;
      cmd = undefined;
    } else if (step.kind === 'cmd') cmd = step.command;
  }
  const text = (c: { shell: string } | { argv: string[] }) => ('shell' in c ? c.shell : c.argv.map(shellQuote).join(' '));
  if (entrypoint && 'shell' in entrypoint) return entrypoint.shell || undefined;
  const parts = [entrypoint && text(entrypoint), cmd && text(cmd)].filter((p): p is string => !!p);
  return parts.length ? parts.join(' ') : undefined;
}

/** Snapshot name → image reference (`n` is `n:latest`); a 400 naming `field` otherwise. */
export function imageOfSnapshotName(name: string, field = 'name'): { name: string; tag: string; reference: string } {
  const ref = parseImageName(name, field, DEFAULT_TAG);
  return { ...ref, reference: `${ref.name}:${ref.tag}` };
}

/** Image reference → snapshot name (the tag is left out when it is `latest`). */
export function snapshotNameOf(name: string, tag: string): string {
  return tag === DEFAULT_TAG ? name : `${name}:${tag}`;
}

/** What an image snapshot is now: its build (while it runs, or when it failed) and/or its image. */
export interface ImageSnapshot {
  /** The snapshot's name (`n` or `n:tag`). */
  name: string;
  image?: Image;
  /** The build that made it, or is making it. */
  build?: ImageBuild;
}

export const BUILD_ID = /^bld[a-z0-9]{17}$/;
const IMAGE_ID = /^img[a-z0-9]{17}$/;

type Core = Pick<CompatPort, 'images' | 'builds'>;

/** The latest build of `name:tag`, if any. */
async function latestBuild(core: Core, principal: Principal, name: string, tag: string): Promise<ImageBuild | undefined> {
  const builds = await core.builds.list(principal, { name, limit: 20 });
  return builds.find((b) => b.tags.includes(tag));
}

/** The image snapshot a name or id means; undefined when there is none. */
export async function findImageSnapshot(core: Core, principal: Principal, idOrName: string): Promise<ImageSnapshot | undefined> {
  // A key limited to some sandboxes sees only the snapshots that concern them: no image is one.
  if (principal.sandboxIds !== null || !principal.scopes.has('images:read')) return undefined;
  const notFound = (err: unknown) => {
    if (err instanceof NestboxError && (err.code === 'not_found' || err.code === 'validation_failed')) return undefined;
    throw err;
  };
  if (BUILD_ID.test(idOrName)) {
    const build = await core.builds.get(principal, idOrName).catch(notFound);
    if (!build) return undefined;
    const tag = build.tags[0] ?? DEFAULT_TAG;
    // Core tags the image a moment before it marks the build succeeded (and records its image id).
    const tagged = build.imageId ? undefined : await core.images.get(principal, `${build.name}:${tag}`).catch(notFound);
    const image = build.imageId ? await core.images.get(principal, build.imageId).catch(notFound) : tagged?.buildId === build.id ? tagged : undefined;
    if (!image && !countsWithoutImage(build)) return undefined;
    return { name: snapshotNameOf(build.name, tag), build, image };
  }
  if (IMAGE_ID.test(idOrName)) {
    const image = await core.images.get(principal, idOrName).catch(notFound);
    if (!image) return undefined;
    const build = image.buildId ? await core.builds.get(principal, image.buildId).catch(notFound) : undefined;
    return { name: snapshotNameOf(image.name, image.tags.includes(DEFAULT_TAG) ? DEFAULT_TAG : (image.tags[0] ?? DEFAULT_TAG)), build, image };
  }
  let ref;
  try {
    ref = imageOfSnapshotName(idOrName);
  } catch {
    return undefined;
  }
  const image = await core.images.get(principal, ref.reference).catch(notFound);
  const build = await latestBuild(core, principal, ref.name, ref.tag);
  // A build newer than the image (a rebuild) decides while it runs; without an image, a build
  // decides while it runs or when it failed (build_failed until the snapshot is deleted).
  const current = build && (image ? image.buildId === build.id || (!FINISHED_BUILD_STATES.includes(build.state) && build.createdAt > image.createdAt) : countsWithoutImage(build)) ? build : undefined;
  if (!image && !current) return undefined;
  return { name: snapshotNameOf(ref.name, ref.tag), image, build: current ?? (image?.buildId ? await core.builds.get(principal, image.buildId).catch(notFound) : undefined) };
}

/**
 * Failed builds whose snapshot was deleted (core keeps every build's record): hidden from then
 * on. Kept in this process only: after a restart a deleted build_failed snapshot shows again
 * until its name is built again or deleted again.
 */
const hiddenBuilds = new Set<string>();

export function hideBuild(id: string): void {
  if (hiddenBuilds.size >= 100_000) hiddenBuilds.clear();
  hiddenBuilds.add(id);
}

/** A build that is a snapshot of its own, with no image: running, or failed (and not deleted). */
export function countsWithoutImage(b: ImageBuild): boolean {
  if (hiddenBuilds.has(b.id)) return false;
  return !FINISHED_BUILD_STATES.includes(b.state) || b.state === 'failed';
}

/** Daytona's snapshot state of an image snapshot (the SDK waits for active, error or build_failed). */
export function imageSnapshotState(s: ImageSnapshot): { state: string; errorReason: string | null } {
  const b = s.build;
  if (b && !FINISHED_BUILD_STATES.includes(b.state) && (!s.image || s.image.buildId !== b.id)) return { state: b.state === 'queued' ? 'pending' : 'building', errorReason: null };
  if (s.image) return { state: s.image.state === 'deleting' ? 'removing' : 'active', errorReason: null };
  if (b?.state === 'failed') return { state: 'build_failed', errorReason: buildFailureReason(b) };
  return { state: 'error', errorReason: b?.error?.message ?? 'the build was cancelled' };
}

/** A failed build's reason as the SDK prints it: the error, then the last lines the step printed. */
export function buildFailureReason(b: ImageBuild): string {
  const e = b.error;
  if (!e) return 'the build failed';
  const tail = e.logTail?.length ? `\n${e.logTail.slice(-10).join('\n')}` : '';
  return `${e.message}${tail}`;
}

/** The image a snapshot of `imageName` was made from: its build is that one FROM (and an entrypoint). */
function imageNameOfBuild(b: ImageBuild | undefined): string | undefined {
  const stages = b?.spec.stages;
  if (stages?.length !== 1 || !stages[0].steps.every((st) => ['entrypoint', 'cmd', 'start', 'label'].includes(st.kind))) return undefined;
  return stages[0].from.reference;
}

const iso = (d: Date | null | undefined) => (d ? d.toISOString() : null);

/** SnapshotDto of an image snapshot. */
export function renderImageSnapshot(s: ImageSnapshot, organizationId: string): Record<string, unknown> {
  const { state, errorReason } = imageSnapshotState(s);
  const labels = s.image?.config.labels ?? {};
  const num = (k: string) => (labels[k] === undefined ? 0 : Number(labels[k]) || 0);
  const hashes = s.build?.spec.contexts.map((k) => k.replace(/\/context\.tar$/, '')) ?? [];
  const created = s.build?.createdAt ?? s.image?.createdAt ?? new Date(0);
  const updated = s.build?.finishedAt ?? s.build?.startedAt ?? created;
  const source = s.image?.source;
  return {
    id: s.build?.id ?? s.image?.id,
    organizationId,
    // The built-in image is every organisation's: Daytona's "general" snapshots.
    general: s.image?.id === 'default',
    name: s.name,
    imageName: source?.kind === 'pull' ? source.reference : imageNameOfBuild(s.build) ?? (s.image ? `${s.image.name}:${s.image.tags.includes(DEFAULT_TAG) ? DEFAULT_TAG : (s.image.tags[0] ?? '')}` : null),
    state,
    size: s.image?.sizeBytes == null ? null : s.image.sizeBytes / 1024 ** 3,
    entrypoint: s.image?.config.entrypoint ?? null,
    cpu: num(RESOURCE_LABELS.cpu),
    gpu: 0,
    mem: num(RESOURCE_LABELS.memory),
    disk: num(RESOURCE_LABELS.disk),
    errorReason,
    createdAt: created.toISOString(),
    updatedAt: (updated ?? created).toISOString(),
    lastUsedAt: null,
    // Images are not taken from a sandbox (the Python SDK's model requires the key).
    sourceSandboxId: null,
    ...(s.build ? { buildInfo: { contextHashes: hashes, snapshotRef: s.image ? `${s.image.name}:${s.image.tags[0] ?? ''}` : `${s.build.name}:${s.build.tags[0] ?? ''}`, createdAt: iso(s.build.createdAt), updatedAt: iso(s.build.finishedAt ?? s.build.createdAt) } } : {}),
  };
}
