// The image build engine (issue 14). A build is a BuildSpec (core/images/build-spec.ts) run
// step by step in build sandboxes — ordinary sandboxes of kind `build`, with the sandbox's
// isolation, the build's own size, timeout and egress policy — on one host:
//
// - FROM resolves to a stage start: an earlier stage, one of the organisation's images, the
//   built-in `default`, or an OCI image the host pulls (HostClient.pullImage).
// - Metadata steps (ENV, ARG, USER, LABEL, CMD, …) change the config only: no sandbox, no layer.
// - RUN, COPY/ADD and a trailing WORKDIR change the tree: they run in the stage's build sandbox
//   (created from the stage's current layer at the first such step) and then the sandbox is
//   snapshotted into a `layer` snapshot — the step's layer. Each layer is cached under a key of
//   (the parent's key, the instruction, its inputs), per organisation and host, so an unchanged
//   rebuild creates no sandbox at all.
// - The last stage's layer, base and config become the image, tagged in one transaction; its
//   start command (if any) must pass its readiness check first (the `finalize` step).
//
// Builds run in the control-plane instance that accepted them, at most `maxConcurrent` at a
// time (the rest wait as `queued`). A build whose instance died is failed by any replica's
// background pass; its sandboxes are deleted with it (they are ordinary sandboxes with a
// timeout, so even a lost cleanup ends). Nothing half-built is ever tagged.
import type { ControlPlaneMetrics } from '../metrics.js';
import { createHash } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import type { Db } from '../store/db.js';
import { buildCacheRepository, buildRepository } from '../store/repositories/images.js';
import { snapshotRepository } from '../store/repositories/snapshots.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import { randomId } from '../ids.js';
import type { Logger } from '../logger.js';
import type { EgressPolicy, Principal, Sandbox, Scope } from '../types.js';
import type { GuestClient } from '../guest.js';
import type { HostClient, HostImage, HostRegistryCredentials } from '../host-client.js';
import type { ObjectStore } from '../object-store.js';
import { validateEgress } from '../egress.js';
import { BuildSpecError, type BuildSpec, type BuildStage, type BuildStep, type CommandForm } from '../images/build-spec.js';
import { DEFAULT_SHELL, emptyImageConfig, FINISHED_BUILD_STATES, type BuildError, type BuildHistoryEntry, type BuildLogLine, type BuildOptions, type BuildState, type Image, type ImageBuild, type ImageConfig } from '../images/types.js';
import { requireScope } from './auth.js';
import type { HostService } from './hosts.js';
import { BUILTIN_IMAGES, DEFAULT_TAG, IMAGE_NAME, IMAGE_TAG, type ImageService } from './images.js';
import { envRecord, runStartCommand } from './image-start.js';
import type { SandboxService } from './sandboxes.js';

/** What the engine needs of the inputs side (core/images/dockerfile.ts, copy-archive.ts). */
export interface BuildInputTools {
  /** Docker's `$VAR` / `${VAR:-x}` substitution (a bad word is a BuildSpecError naming the line). */
  expandWords(text: string, vars: Record<string, string>, options?: { line?: number }): string;
  /** The tar a COPY unpacks at `/` of the build sandbox. */
  composeCopyArchive(input: {
    inputs: Array<() => Promise<Readable>>;
    sources: string[];
    dest: string;
    ignore?: string[];
    extractArchives?: boolean;
    /** `dest` is a directory that exists in the stage (COPY a.txt /app puts it inside /app). */
    destIsDirectory?: boolean;
    /** COPY --chmod, for the copied entries only. */
    chmod?: number;
    tmpDir: string;
    signal?: AbortSignal;
    at?: { field?: string; line?: number };
  }): Promise<{ stream: Readable; entries: number; bytes: number; cleanup(): Promise<void> }>;
  /** The leading directory of a glob pattern without magic characters. */
  globBase(pattern: string): string;
  /** A COPY destination against the WORKDIR (a trailing `/` or `.` keeps it a directory). */
  resolveCopyDest(dest: string, workdir: string): string;
}

export interface BuildLimits {
  maxConcurrent: number;
  maxLogLines: number;
  /** Scratch space for COPY archives (under the data dir). */
  tmpDir: string;
  defaultCpu: number;
  defaultMemoryMiB: number;
  defaultDiskGiB: number;
  maxCpu: number;
  maxMemoryMiB: number;
  maxDiskGiB: number;
  defaultTimeoutSeconds: number;
  maxTimeoutSeconds: number;
  defaultReadyTimeoutSeconds: number;
}

export interface CreateBuildInput {
  /** Repository name of the image, e.g. `my-app`. */
  name: string;
  /** Default `latest`. */
  tags?: string[];
  spec: BuildSpec;
  noCache?: boolean;
  cpu?: number;
  memoryMiB?: number;
  diskGiB?: number;
  timeoutSeconds?: number;
  egress?: EgressPolicy;
  readyTimeoutSeconds?: number;
  /** For FROM images of private registries: held in memory while the build runs, never stored. */
  credentials?: HostRegistryCredentials;
}

/** The principal a build acts as: its organisation, only what a build does. */
function buildPrincipal(organizationId: string, buildId: string): Principal {
  const scopes: Scope[] = ['sandboxes:read', 'sandboxes:create', 'sandboxes:operate', 'sandboxes:delete', 'sandboxes:exec', 'files:read', 'files:write'];
  return { organizationId, keyId: `build:${buildId}`, scopes: new Set(scopes), sandboxIds: null };
}

/** A failure of one step: ends the build with this error. */
class StepFailure extends Error {
  constructor(readonly error: BuildError) {
    super(error.message);
  }
}

interface StageState {
  base: string;
  snapshotId: string | null;
  config: ImageConfig;
  key: string;
  /** ARG values in scope (not persisted into the image). */
  args: Record<string, string>;
  /** WORKDIR set since the last tree-changing step: made by the next one, or at the stage's end. */
  workdirPending: boolean;
  sandbox?: Sandbox;
  /** Describes where the stage came from (the image's `source.from`). */
  from: string;
  /** Index of the stage (history entries name it). */
  stage: number;
  /** Unpacked bytes of a pulled base (null when unknown: `default`, an image of ours). */
  baseSize: number | null;
}

interface RunContext {
  build: ImageBuild;
  principal: Principal;
  host: HostClient;
  hostId: string;
  signal: AbortSignal;
  credentials?: HostRegistryCredentials;
  stepNo: number;
  sandboxes: Sandbox[];
  log: (text: string, stream?: BuildLogLine['stream']) => void;
  tail: string[];
  noCacheFromHere: boolean;
  /** What each step of the last stage did (the image's history, Docker's `history`). */
  history: BuildHistoryEntry[];
  /** Set by a tree step: whether it came from the cache. */
  lastCached?: boolean;
}

/**
 * Cache keys hash a canonical JSON (object keys sorted): a config read back from the database
 * (jsonb reorders keys) must hash like the one the build holds in memory.
 */
const hash = (...parts: unknown[]): string => createHash('sha256').update(canonicalJson(parts)).digest('hex');

function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.keys(value as object)
      .filter((k) => (value as Record<string, unknown>)[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value ?? null);
}
const BUILD_ID = /^bld[a-z0-9]{17}$/;
const LOG_FLUSH_MS = 200;
const LOG_LINE_MAX = 8192;

export class ImageBuildService {
  private active = 0;
  private readonly queue: { id: string; credentials?: HostRegistryCredentials }[] = [];
  /** Builds this instance runs: their abort controllers (cancel reaches them at once). */
  private readonly running = new Map<string, AbortController>();
  /** Woken when a build of this instance writes logs or ends (followers poll otherwise). */
  private readonly waiters = new Map<string, Set<() => void>>();
  private stopped = false;
  /** Where builds and pulls are counted and timed; set by the composition root. */
  metrics?: Pick<ControlPlaneMetrics, 'builds' | 'buildDuration' | 'pulls' | 'pullDuration'>;

  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly sandboxes: SandboxService,
    private readonly images: ImageService,
    private readonly objects: ObjectStore,
    private readonly tools: BuildInputTools,
    private readonly logger: Logger,
    private readonly instanceId: string,
    private readonly limits: BuildLimits,
  ) {}

  // ---- API ----------------------------------------------------------------------------------

  async create(principal: Principal, input: CreateBuildInput): Promise<ImageBuild> {
    requireScope(principal, 'images:write');
    if (principal.sandboxIds !== null) throw errors.forbidden('this API key is limited to given sandboxes and cannot build images');
    if (typeof input.name !== 'string' || !IMAGE_NAME.test(input.name) || (BUILTIN_IMAGES as readonly string[]).includes(input.name)) throw errors.validation('name', `must be 1-128 letters, digits, ".", "_", "-" or "/", starting with a letter or digit, and not a built-in image's name (${BUILTIN_IMAGES.join(', ')})`);
    const tags = input.tags?.length ? [...new Set(input.tags)] : [DEFAULT_TAG];
    for (const [i, tag] of tags.entries()) if (typeof tag !== 'string' || !IMAGE_TAG.test(tag)) throw errors.validation(`tags[${i}]`, 'a tag is 1-128 letters, digits, ".", "_" or "-"');
    if (tags.length > 32) throw errors.validation('tags', 'at most 32 tags');
    const options = this.validateOptions(input);
    const spec = input.spec;
    if (!spec?.stages?.length) throw errors.validation('spec', 'a build needs at least one stage (a FROM)');
    // Contexts must be there now: a build that would fail at its first COPY is refused at once.
    const keys = new Set<string>([...spec.contexts, ...spec.stages.flatMap((s) => s.steps.flatMap((st) => (st.kind === 'copy' ? (st.contexts ?? []) : [])))]);
    for (const key of keys) {
      if (!(await this.objects.head(principal.organizationId, key))) throw errors.validation('contexts', `no uploaded build context "${key.slice(0, 200)}" in this organisation (upload it first)`);
    }
    // Refused now rather than after the work when the image would not fit the organisation's
    // limit; the image's registration checks again, atomically (ImageService.register).
    await this.db.transaction((tx) => this.images.checkImageLimit(tx, principal.organizationId, input.name, tags[0]));
    const totalSteps = spec.stages.reduce((n, s) => n + s.steps.length, 0);
    const build = await buildRepository(this.db).insert({
      id: `bld${randomId(17)}`,
      organizationId: principal.organizationId,
      name: input.name,
      tags,
      spec,
      options,
      ownerInstanceId: this.instanceId,
      totalSteps,
    });
    this.queue.push({ id: build.id, credentials: input.credentials });
    this.pump();
    return build;
  }

  async get(principal: Principal, id: string): Promise<ImageBuild> {
    requireScope(principal, 'images:read');
    const build = BUILD_ID.test(id) ? await buildRepository(this.db).findById(principal.organizationId, id) : undefined;
    if (!build) throw errors.notFound('build', id);
    return build;
  }

  async list(principal: Principal, input: { name?: string; states?: BuildState[]; limit?: number }): Promise<ImageBuild[]> {
    requireScope(principal, 'images:read');
    const limit = input.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw errors.validation('limit', 'must be an integer from 1 to 1000');
    return buildRepository(this.db).list(principal.organizationId, { ...input, limit });
  }

  async logs(principal: Principal, id: string, offset = 0, limit = 1000): Promise<{ build: ImageBuild; lines: BuildLogLine[] }> {
    const build = await this.get(principal, id);
    if (!Number.isInteger(offset) || offset < 0) throw errors.validation('offset', 'must be a non-negative integer');
    if (!Number.isInteger(limit) || limit < 1 || limit > 10_000) throw errors.validation('limit', 'must be an integer from 1 to 10000');
    return { build, lines: await buildRepository(this.db).logs(id, offset, limit) };
  }

  /**
   * The build's log from `offset` as it is written, ending after the build finished and every
   * line was given; the last item is the finished build. Stops when `signal` aborts.
   */
  async *follow(principal: Principal, id: string, offset: number, signal: AbortSignal): AsyncGenerator<{ line: BuildLogLine } | { done: ImageBuild }> {
    let build = await this.get(principal, id);
    let next = offset;
    while (!signal.aborted) {
      const lines = await buildRepository(this.db).logs(id, next, 500);
      for (const line of lines) yield { line };
      if (lines.length) next = lines[lines.length - 1].offset + 1;
      if (lines.length === 500) continue;
      if (FINISHED_BUILD_STATES.includes(build.state)) {
        // A last read after the end: lines flushed with the final state are all there now.
        const rest = await buildRepository(this.db).logs(id, next, 10_000);
        for (const line of rest) yield { line };
        yield { done: build };
        return;
      }
      await this.waitForChange(id, 1000, signal);
      build = await this.get(principal, id);
    }
  }

  /** Resolves with the finished build (Daytona's build-on-create waits on it). */
  async waitFor(principal: Principal, id: string, signal?: AbortSignal): Promise<ImageBuild> {
    for (;;) {
      const build = await this.get(principal, id);
      if (FINISHED_BUILD_STATES.includes(build.state)) return build;
      if (signal?.aborted) throw new NestboxError('timeout', `stopped waiting for build ${id}`);
      await this.waitForChange(id, 1000, signal);
    }
  }

  async cancel(principal: Principal, id: string): Promise<ImageBuild> {
    requireScope(principal, 'images:write');
    const build = await this.get(principal, id);
    if (FINISHED_BUILD_STATES.includes(build.state)) return build; // retry-safe
    await buildRepository(this.db).requestCancel(id);
    // Queued here: it never starts. Running here: its steps are aborted now. Elsewhere: that
    // instance sees the request within a second.
    const queued = this.queue.findIndex((q) => q.id === id);
    if (queued >= 0) {
      this.queue.splice(queued, 1);
      await this.finish(build, 'cancelled', { message: 'cancelled before it started' });
    }
    this.running.get(id)?.abort(new NestboxError('invalid_state', 'cancelled'));
    return this.waitFor(principal, id);
  }

  /** Fails builds whose instance stopped heartbeating (run by every replica's background pass). */
  async failOrphans(instanceTimeoutMs: number): Promise<number> {
    const orphans = await buildRepository(this.db).orphaned(instanceTimeoutMs);
    for (const build of orphans) {
      if (this.running.has(build.id) || build.ownerInstanceId === this.instanceId) continue;
      await this.finish(build, 'failed', { message: 'the control plane running this build stopped; start the build again (finished steps are cached)', code: 'host_unavailable' }, ['queued', 'running']);
      await this.removeBuildSandboxes(build).catch(() => undefined);
    }
    return orphans.length;
  }

  /** Queued builds of this instance left by a crash of this very process are failed too, at start. */
  async failOwnLeftovers(): Promise<void> {
    const mine = (await this.db('image_builds').whereIn('state', ['queued', 'running']).andWhere({ owner_instance_id: this.instanceId }).select('id', 'organization_id')) as { id: string; organization_id: string }[];
    for (const row of mine) {
      const build = await buildRepository(this.db).findById(row.organization_id, row.id);
      if (build && !this.running.has(build.id)) await this.finish(build, 'failed', { message: 'the control plane restarted during this build; start it again (finished steps are cached)' }, ['queued', 'running']);
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const controller of this.running.values()) controller.abort(new NestboxError('host_unavailable', 'the control plane is shutting down'));
  }

  // ---- scheduling ---------------------------------------------------------------------------

  private pump(): void {
    while (!this.stopped && this.active < this.limits.maxConcurrent && this.queue.length) {
      const next = this.queue.shift()!;
      this.active++;
      void this.run(next.id, next.credentials).finally(() => {
        this.active--;
        this.pump();
      });
    }
  }

  private notify(id: string): void {
    for (const wake of this.waiters.get(id) ?? []) wake();
  }

  private waitForChange(id: string, ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const set = this.waiters.get(id) ?? new Set();
      this.waiters.set(id, set);
      const done = () => {
        clearTimeout(timer);
        set.delete(done);
        if (!set.size) this.waiters.delete(id);
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      set.add(done);
      signal?.addEventListener('abort', done, { once: true });
    });
  }

  private validateOptions(input: CreateBuildInput): BuildOptions {
    const l = this.limits;
    const int = (field: string, value: number | undefined, fallback: number, min: number, max: number): number => {
      const v = value ?? fallback;
      if (!Number.isInteger(v) || v < min || v > max) throw errors.validation(field, `must be an integer from ${min} to ${max}`);
      return v;
    };
    if (input.noCache !== undefined && typeof input.noCache !== 'boolean') throw errors.validation('noCache', 'must be true or false');
    if (input.credentials !== undefined && (typeof input.credentials?.username !== 'string' || typeof input.credentials?.password !== 'string' || !input.credentials.username)) {
      throw errors.validation('credentials', 'needs a username and a password');
    }
    return {
      noCache: input.noCache ?? false,
      cpu: int('cpu', input.cpu, l.defaultCpu, 1, l.maxCpu),
      memoryMiB: int('memoryMiB', input.memoryMiB, l.defaultMemoryMiB, 128, l.maxMemoryMiB),
      diskGiB: int('diskGiB', input.diskGiB, l.defaultDiskGiB, 1, l.maxDiskGiB),
      timeoutSeconds: int('timeoutSeconds', input.timeoutSeconds, l.defaultTimeoutSeconds, 1, l.maxTimeoutSeconds),
      readyTimeoutSeconds: int('readyTimeoutSeconds', input.readyTimeoutSeconds, l.defaultReadyTimeoutSeconds, 1, 3600),
      egress: input.egress === undefined ? { mode: 'allow-all' } : validateEgress(input.egress),
      hasCredentials: input.credentials !== undefined,
    };
  }

  // ---- running ------------------------------------------------------------------------------

  private async run(id: string, credentials?: HostRegistryCredentials): Promise<void> {
    const row = (await this.db('image_builds').where({ id }).first('organization_id')) as { organization_id: string } | undefined;
    const build = row ? await buildRepository(this.db).findById(row.organization_id, id) : undefined;
    if (!build || build.state !== 'queued') return;
    if (build.cancelRequested) return void (await this.finish(build, 'cancelled', { message: 'cancelled before it started' }));
    const controller = new AbortController();
    this.running.set(id, controller);
    const timeout = setTimeout(() => controller.abort(new NestboxError('timeout', `the build took longer than its timeout of ${build.options.timeoutSeconds} s`)), build.options.timeoutSeconds * 1000);
    // Cancels requested through another replica reach this one through the database.
    const cancelPoll = setInterval(() => {
      void buildRepository(this.db).cancelRequested(id).then((yes) => {
        if (yes) controller.abort(new NestboxError('invalid_state', 'cancelled'));
      }, () => undefined);
    }, 1000);
    cancelPoll.unref();

    const pending: Omit<BuildLogLine, 'offset'>[] = [];
    let flushing: Promise<void> = Promise.resolve();
    const flush = (): Promise<void> => {
      flushing = flushing.then(async () => {
        if (!pending.length) return;
        const lines = pending.splice(0, pending.length);
        await buildRepository(this.db).appendLogs(id, lines, this.limits.maxLogLines).catch((err) => this.logger.warn({ buildId: id, err: toNestboxError(err).message }, 'build log lines were lost'));
        this.notify(id);
      });
      return flushing;
    };
    const flushTimer = setInterval(() => void flush(), LOG_FLUSH_MS);
    flushTimer.unref();
    const ctx: RunContext = {
      build,
      principal: buildPrincipal(build.organizationId, build.id),
      host: undefined as unknown as HostClient,
      hostId: '',
      signal: controller.signal,
      credentials,
      stepNo: 0,
      sandboxes: [],
      tail: [],
      history: [],
      noCacheFromHere: build.options.noCache,
      log: (text, stream = 'system') => {
        for (const raw of text.split('\n')) {
          const line = raw.length > LOG_LINE_MAX ? `${raw.slice(0, LOG_LINE_MAX)}…` : raw;
          pending.push({ at: new Date(), stream, text: line, step: ctx.stepNo || undefined });
          if (stream !== 'system') {
            ctx.tail.push(line);
            if (ctx.tail.length > 20) ctx.tail.shift();
          }
        }
        if (pending.length >= 200) void flush();
      },
    };
    let outcome: { state: BuildState; error?: BuildError; imageId?: string } = { state: 'failed' };
    try {
      if (!(await buildRepository(this.db).transition(id, ['queued'], { state: 'running', startedAt: new Date() }))) return;
      this.notify(id);
      const image = await this.execute(ctx);
      outcome = { state: 'succeeded', imageId: image.id };
      ctx.log(`Successfully built ${build.name}:${build.tags.join(', ')} (${image.id})`);
    } catch (err) {
      const reason = controller.signal.reason as unknown;
      if (controller.signal.aborted && reason instanceof NestboxError && reason.message === 'cancelled') {
        outcome = { state: 'cancelled', error: { message: 'the build was cancelled', step: ctx.stepNo || undefined } };
      } else if (err instanceof StepFailure) {
        outcome = { state: 'failed', error: err.error };
      } else {
        const e = controller.signal.aborted && reason instanceof NestboxError ? reason : err instanceof BuildSpecError ? new NestboxError('validation_failed', err.message, { field: err.field }) : toNestboxError(err);
        outcome = { state: 'failed', error: { message: e.message, code: e.code, step: ctx.stepNo || undefined, logTail: ctx.tail.length ? [...ctx.tail] : undefined } };
      }
      ctx.log(outcome.state === 'cancelled' ? 'Build cancelled' : `Build failed: ${outcome.error?.message}`);
    } finally {
      clearTimeout(timeout);
      clearInterval(cancelPoll);
      // Sandboxes first: nothing of a finished build keeps running.
      await Promise.all(ctx.sandboxes.map((s) => this.sandboxes.delete(ctx.principal, s.id).catch((err) => this.logger.warn({ buildId: id, sandboxId: s.id, err: toNestboxError(err).message }, 'a build sandbox could not be deleted (its timeout will end it)'))));
      clearInterval(flushTimer);
      await flush();
      this.running.delete(id);
    }
    const fresh = (await buildRepository(this.db).findById(build.organizationId, id)) ?? build;
    await this.finish(fresh, outcome.state, outcome.error ?? null, ['running'], outcome.imageId);
  }

  private async finish(build: ImageBuild, state: BuildState, error: BuildError | null, from: BuildState[] = ['queued'], imageId?: string): Promise<void> {
    const finishedAt = new Date();
    const written = await buildRepository(this.db).transition(build.id, from, { state, error, finishedAt, ...(imageId ? { imageId } : {}) });
    if (written && this.metrics) {
      this.metrics.builds.inc({ outcome: state });
      if (build.startedAt) this.metrics.buildDuration.observe({ outcome: state }, (finishedAt.getTime() - build.startedAt.getTime()) / 1000);
    }
    this.notify(build.id);
    this.logger.info({ buildId: build.id, operation: 'build', outcome: state, imageId }, `build ${build.id} of ${build.name} ${state}${error ? `: ${error.message}` : ''}`);
  }

  private async removeBuildSandboxes(build: ImageBuild): Promise<void> {
    const rows = (await this.db('sandboxes').where({ organization_id: build.organizationId, kind: 'build' }).whereNot({ state: 'deleted' }).whereRaw(`labels->>'nestbox.build' = ?`, [build.id]).select('id')) as { id: string }[];
    const principal = buildPrincipal(build.organizationId, build.id);
    for (const row of rows) await this.sandboxes.delete(principal, row.id).catch(() => undefined);
  }

  /** Runs every stage; answers the registered image. */
  private async execute(ctx: RunContext): Promise<Image> {
    const { build } = ctx;
    const spec = build.spec;
    const total = build.totalSteps ?? spec.stages.reduce((n, s) => n + s.steps.length, 0);
    const globalArgs: Record<string, string> = { ...spec.args };
    const states: StageState[] = [];
    for (const stage of spec.stages) {
      ctx.log(`Stage ${stage.index + 1}/${spec.stages.length}${stage.name ? ` (${stage.name})` : ''}: FROM ${stage.from.reference}`);
      const state = await this.resolveFrom(ctx, stage, states, globalArgs);
      states.push(state);
      for (const step of stage.steps) {
        ctx.stepNo++;
        if (ctx.signal.aborted) throw ctx.signal.reason;
        await buildRepository(this.db).transition(build.id, ['running'], { currentStep: ctx.stepNo });
        ctx.log(`Step ${ctx.stepNo}/${total} : ${step.at.text}`);
        if (step.noCache) ctx.noCacheFromHere = true;
        const layerBefore = state.snapshotId;
        ctx.lastCached = undefined;
        try {
          await this.runStep(ctx, stage, state, step, states);
          ctx.history.push({ step: ctx.stepNo, stage: stage.index, instruction: step.at.text.slice(0, 1000), layer: state.snapshotId !== layerBefore ? state.snapshotId : null, ...(ctx.lastCached !== undefined ? { cached: ctx.lastCached } : {}) });
        } catch (err) {
          if (err instanceof StepFailure || ctx.signal.aborted) throw err;
          const e = err instanceof BuildSpecError ? new NestboxError('validation_failed', err.message, { field: err.field }) : toNestboxError(err);
          throw new StepFailure({ message: `step ${ctx.stepNo} (${step.at.text.slice(0, 200)}): ${e.message}`, step: ctx.stepNo, line: step.at.line, code: e.code, logTail: ctx.tail.length ? [...ctx.tail] : undefined });
        }
      }
      if (state.workdirPending) await this.treeStep(ctx, state, { kind: 'mkdir', path: state.config.workdir }, async () => {});
    }
    const final = states[states.length - 1];
    if (final.config.start) {
      ctx.log('Finalize: checking the start command');
      const sandbox = await this.sandboxFor(ctx, final);
      try {
        await runStartCommand(ctx.host.guest(sandbox.id), final.config, { timeoutMs: build.options.readyTimeoutSeconds * 1000, signal: ctx.signal, onLine: (t) => ctx.log(t) });
      } catch (err) {
        if (ctx.signal.aborted) throw err;
        throw new StepFailure({ message: `the start command did not get ready: ${toNestboxError(err).message}`, step: 'finalize', logTail: ctx.tail.length ? [...ctx.tail] : undefined });
      }
    }
    // Its layers (each snapshot holds what changed since the one below it), plus the pulled
    // base at the bottom when its size is known (not for `default`).
    let layerBytes = 0;
    let next = final.snapshotId;
    for (let depth = 0; next && depth < 1000; depth++) {
      const layer = await snapshotRepository(this.db).findById(next);
      layerBytes += layer?.sizeBytes ?? 0;
      next = layer?.parentSnapshotId ?? null;
    }
    const size = final.baseSize === null && !final.snapshotId ? null : (final.baseSize ?? 0) + layerBytes;
    const { image } = await this.db.transaction((tx) =>
      this.images.register(tx, {
        organizationId: build.organizationId,
        name: build.name,
        tags: build.tags,
        hostId: ctx.hostId,
        base: final.base,
        snapshotId: final.snapshotId,
        config: final.config,
        source: { kind: 'build', buildId: build.id, from: states.map((s) => s.from), history: ctx.history.filter((h) => h.stage === final.stage) },
        buildId: build.id,
        sizeBytes: size,
      }),
    );
    // Tags moved off older images: those nothing uses any more go now.
    await this.images.collectGarbage().catch(() => undefined);
    return image;
  }

  private async resolveFrom(ctx: RunContext, stage: BuildStage, states: StageState[], globalArgs: Record<string, string>): Promise<StageState> {
    const reference = this.tools.expandWords(stage.from.reference, globalArgs).trim();
    const fresh = (s: Omit<StageState, 'args' | 'workdirPending' | 'stage' | 'baseSize'> & { baseSize?: number | null }): StageState => ({ baseSize: null, ...s, args: {}, workdirPending: false, stage: stage.index });
    if (stage.from.stage !== undefined) {
      const earlier = states[stage.from.stage];
      if (!earlier) throw new BuildSpecError('dockerfile', stage.at.line, `FROM ${reference}: no such earlier stage`);
      return fresh({ base: earlier.base, snapshotId: earlier.snapshotId, config: structuredClone(earlier.config), key: earlier.key, from: earlier.from, baseSize: earlier.baseSize });
    }
    if (!reference) throw new BuildSpecError('dockerfile', stage.at.line, 'FROM needs an image');
    let own: Image | undefined;
    try {
      // `scratch` is Docker's reserved empty image, whatever the organisation named its own.
      own = reference === 'scratch' ? undefined : await this.images.find(ctx.build.organizationId, reference, 'from');
    } catch {
      own = undefined; // not a Nestbox name (e.g. `ghcr.io/x/y@sha256:…`): an OCI reference
    }
    if (own) {
      if (own.hostId) await this.useHost(ctx, own.hostId);
      else await this.useHost(ctx);
      ctx.log(`FROM ${reference}: Nestbox image ${own.id}`);
      return fresh({ base: own.base, snapshotId: own.snapshotId, config: structuredClone(own.config), key: hash('image', own.id), from: own.source.kind === 'builtin' ? own.id : `${own.name}@${own.id}`, baseSize: own.sizeBytes === null ? null : own.sizeBytes - (await this.images.layersOf(own)).reduce((n, l) => n + (l.sizeBytes ?? 0), 0) });
    }
    await this.useHost(ctx);
    ctx.log(`FROM ${reference}: pulling`);
    let pulled: HostImage;
    const pullStarted = Date.now();
    const pullEnded = (outcome: 'succeeded' | 'failed' | 'cancelled') => {
      this.metrics?.pulls.inc({ outcome });
      this.metrics?.pullDuration.observe({ outcome }, (Date.now() - pullStarted) / 1000);
    };
    try {
      pulled = await ctx.host.pullImage(reference, { credentials: ctx.credentials, signal: ctx.signal, onProgress: (line) => ctx.log(line) });
      pullEnded('succeeded');
    } catch (err) {
      pullEnded(ctx.signal.aborted ? 'cancelled' : 'failed');
      if (ctx.signal.aborted) throw ctx.signal.reason;
      const e = toNestboxError(err);
      throw new StepFailure({ message: `FROM ${reference}: ${e.message}`, step: ctx.stepNo || 0, line: stage.at.line, code: e.code });
    }
    ctx.log(`FROM ${reference}: ${pulled.id}`);
    return fresh({ base: pulled.id, snapshotId: null, config: configOfOci(pulled), key: hash('oci', pulled.id), from: `${pulled.reference}@${pulled.id}`, baseSize: pulled.sizeBytes });
  }

  /** All of a build's stages run on one host (its layers must be where the next step reads them). */
  private async useHost(ctx: RunContext, hostId?: string): Promise<void> {
    if (ctx.hostId) {
      if (hostId && hostId !== ctx.hostId) throw new NestboxError('not_supported', `the build's images live on different hosts (${ctx.hostId} and ${hostId}); build them on one host`);
      return;
    }
    const host = hostId ? await this.hosts.aliveHost(hostId) : await this.hosts.pickHost();
    ctx.hostId = host.id;
    ctx.host = this.hosts.clientForRecord(host);
    await buildRepository(this.db).transition(ctx.build.id, ['running'], { hostId: host.id });
  }

  private async runStep(ctx: RunContext, stage: BuildStage, state: StageState, step: BuildStep, states: StageState[]): Promise<void> {
    const vars = { ...state.args, ...envRecord(state.config) };
    const x = (text: string) => this.tools.expandWords(text, vars, { line: step.at.line });
    const c = state.config;
    switch (step.kind) {
      case 'env':
        for (const [k, v] of step.vars) {
          const value = this.tools.expandWords(v, { ...state.args, ...envRecord(c) }, { line: step.at.line });
          c.env = [...c.env.filter(([name]) => name !== k), [k, value]];
        }
        return this.metadata(state, step);
      case 'arg': {
        const value = ctx.build.spec.args[step.name] ?? (step.default === undefined ? undefined : x(step.default));
        state.args[step.name] = value ?? '';
        state.key = hash(state.key, 'arg', step.name, value ?? null);
        return;
      }
      case 'workdir': {
        const path = x(step.path);
        c.workdir = posix.resolve(c.workdir || '/', path);
        state.workdirPending = true;
        return this.metadata(state, step);
      }
      case 'user':
        c.user = x(step.user);
        return this.metadata(state, step);
      case 'shell':
        c.shell = [...step.argv];
        return this.metadata(state, step);
      case 'label':
        for (const [k, v] of step.labels) c.labels[x(k)] = x(v);
        return this.metadata(state, step);
      case 'expose':
        c.exposedPorts = [...new Set([...c.exposedPorts, ...step.ports.map(x)])];
        return this.metadata(state, step);
      case 'volume':
        c.volumes = [...new Set([...c.volumes, ...step.paths.map(x)])];
        return this.metadata(state, step);
      case 'stopsignal':
        c.stopSignal = x(step.signal);
        return this.metadata(state, step);
      case 'cmd':
        c.cmd = argvOf(step.command, c.shell);
        return this.metadata(state, step);
      case 'entrypoint':
        c.entrypoint = argvOf(step.command, c.shell);
        // Docker: a new ENTRYPOINT resets a CMD inherited from the base image.
        c.cmd = null;
        return this.metadata(state, step);
      case 'start':
        c.start = { command: step.command, ready: step.ready ?? (step.command ? undefined : undefined) };
        return this.metadata(state, step);
      case 'run':
        return this.runCommand(ctx, state, step);
      case 'copy':
        return this.copy(ctx, stage, state, step, states);
    }
  }

  private metadata(state: StageState, step: BuildStep): void {
    state.key = hash(state.key, stepIdentity(step), state.config);
  }

  /**
   * A tree-changing step: answered from the cache when its key is there (no sandbox), else run
   * in the stage's sandbox and snapshotted as a layer, which is then cached.
   */
  private async treeStep(ctx: RunContext, state: StageState, identity: unknown, work: (guest: GuestClient, sandbox: Sandbox) => Promise<void>): Promise<void> {
    const key = hash(state.key, identity, state.config, state.workdirPending ? state.config.workdir : null);
    const cache = buildCacheRepository(this.db);
    if (!ctx.noCacheFromHere) {
      const hit = await cache.get(ctx.build.organizationId, ctx.hostId, key);
      const layerOk = hit && (!hit.snapshotId || (await snapshotRepository(this.db).findById(hit.snapshotId))?.state === 'ready');
      if (hit && layerOk) {
        ctx.log(' ---> Using cache');
        ctx.lastCached = true;
        // The stage's sandbox (if any) is behind the cached layer now: the next miss makes a new one.
        if (state.sandbox) await this.dropSandbox(ctx, state.sandbox);
        state.sandbox = undefined;
        Object.assign(state, { snapshotId: hit.snapshotId, key, workdirPending: false });
        state.config = hit.config;
        return;
      }
    }
    const sandbox = await this.sandboxFor(ctx, state);
    const guest = ctx.host.guest(sandbox.id);
    if (state.config.workdir && state.workdirPending) await guest.makeDirectory({ path: state.config.workdir }, { signal: ctx.signal });
    const started = Date.now();
    await work(guest, sandbox);
    const layer = await this.takeLayer(ctx, sandbox);
    ctx.lastCached = false;
    ctx.log(` ---> layer ${layer.id} (${layer.sizeBytes} bytes, ${Date.now() - started} ms)`);
    Object.assign(state, { snapshotId: layer.id, key, workdirPending: false });
    await cache.put(ctx.build.organizationId, ctx.hostId, { key, base: state.base, snapshotId: layer.id, config: state.config });
  }

  private async runCommand(ctx: RunContext, state: StageState, step: Extract<BuildStep, { kind: 'run' }>): Promise<void> {
    const c = state.config;
    const argv = 'shell' in step.command ? [...(c.shell.length ? c.shell : DEFAULT_SHELL), step.command.shell] : step.command.argv;
    const user = step.user ?? c.user;
    // ARGs are the command's environment (not the image's), ENV wins over an ARG of the same name.
    const env = { ...state.args, ...envRecord(c) };
    await this.treeStep(ctx, state, { run: argv, user, args: state.args }, async (guest) => {
      const remaining = Math.max(1000, (ctx.build.options.timeoutSeconds * 1000) - (Date.now() - (ctx.build.startedAt?.getTime() ?? Date.now())));
      const info = await guest.startProcess({ argv, env, user: user || undefined, cwd: c.workdir || '/', timeoutMs: remaining }, { signal: ctx.signal });
      const events = await guest.processEvents(info.processId, {}, { signal: ctx.signal });
      const partial: Record<'stdout' | 'stderr', string> = { stdout: '', stderr: '' };
      // Output chunks are base64 of raw bytes; a character may straddle two chunks.
      const decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
      let exit: { exitCode: number | null; signal: string | null; timedOut: boolean } | undefined;
      try {
        for await (const event of events.events()) {
          if (event.type === 'stdout' || event.type === 'stderr') {
            const text = partial[event.type] + decoders[event.type].write(Buffer.from(event.data, 'base64'));
            const lines = text.split('\n');
            partial[event.type] = lines.pop() ?? '';
            if (partial[event.type].length > LOG_LINE_MAX) {
              lines.push(partial[event.type]);
              partial[event.type] = '';
            }
            if (lines.length) ctx.log(lines.join('\n'), event.type);
          } else if (event.type === 'exit') {
            exit = event;
            break;
          }
        }
      } finally {
        events.body.destroy();
      }
      for (const stream of ['stdout', 'stderr'] as const) if (partial[stream]) ctx.log(partial[stream], stream);
      if (ctx.signal.aborted) {
        await guest.killProcess(info.processId).catch(() => undefined);
        throw ctx.signal.reason;
      }
      if (!exit) throw new NestboxError('agent_unavailable', 'the command\'s output ended without an exit status');
      if (exit.exitCode !== 0) {
        const how = exit.timedOut ? 'timed out' : exit.exitCode === null ? `was killed by ${exit.signal}` : `returned a non-zero code: ${exit.exitCode}`;
        throw new StepFailure({ message: `step ${ctx.stepNo} (${step.at.text.slice(0, 200)}) ${how}`, step: ctx.stepNo, line: step.at.line, exitCode: exit.exitCode ?? undefined, logTail: [...ctx.tail] });
      }
    });
  }

  private async copy(ctx: RunContext, stage: BuildStage, state: StageState, step: Extract<BuildStep, { kind: 'copy' }>, states: StageState[]): Promise<void> {
    const vars = { ...state.args, ...envRecord(state.config) };
    const x = (t: string) => this.tools.expandWords(t, vars, { line: step.at.line });
    const sources = step.sources.map(x);
    const dest = this.tools.resolveCopyDest(x(step.dest), state.config.workdir || '/');
    const chown = step.chown === undefined ? undefined : x(step.chown);
    let inputs: Array<() => Promise<Readable>>;
    let inputIdentity: unknown;
    let fromRoot = false;
    if (step.fromStage !== undefined || step.fromImage !== undefined) {
      fromRoot = true;
      const from = step.fromStage !== undefined ? states[step.fromStage] : await this.resolveFrom(ctx, { index: -1, from: { reference: step.fromImage! }, at: step.at, steps: [] }, states, ctx.build.spec.args);
      if (!from) throw new BuildSpecError('dockerfile', step.at.line, `COPY --from: no such earlier stage`);
      inputIdentity = { from: from.key };
      const bases = [...new Set(sources.map((s) => this.tools.globBase(s.replace(/^\/+/, ''))))];
      inputs = bases.map((base) => async () => {
        const sandbox = await this.sandboxFor(ctx, from);
        return (await ctx.host.guest(sandbox.id).createArchive({ path: `/${base}` }, { signal: ctx.signal })).body;
      });
    } else {
      const keys = step.contexts ?? ctx.build.spec.contexts;
      if (!keys.length) throw new BuildSpecError('dockerfile', step.at.line, 'COPY needs a build context, and this build has none (upload one with the build)');
      const digests: string[] = [];
      for (const key of keys) {
        const object = await this.objects.head(ctx.build.organizationId, key);
        if (!object) throw new BuildSpecError('contexts', step.at.line, `the build context "${key}" is gone`);
        digests.push(object.sha256);
      }
      inputIdentity = { contexts: digests, ignore: ctx.build.spec.ignore };
      inputs = keys.map((key) => () => this.objects.read(ctx.build.organizationId, key));
    }
    const identity = { copy: sources, dest, chown: chown ?? null, chmod: step.chmod ?? null, extract: step.extractArchives ?? false, inputs: inputIdentity };
    await this.treeStep(ctx, state, identity, async (guest) => {
      // Docker: `COPY a.txt /app` puts it in /app when /app is a directory of the stage.
      const destIsDirectory = dest.endsWith('/') ? true : await guest.statFile(dest, { signal: ctx.signal }).then((info) => info.type === 'dir' || info.symlinkResolved?.type === 'dir', () => false);
      await mkdir(this.limits.tmpDir, { recursive: true, mode: 0o700 });
      const archive = await this.tools.composeCopyArchive({
        destIsDirectory,
        chmod: step.chmod === undefined ? undefined : parseInt(step.chmod, 8),
        at: { field: 'dockerfile', line: step.at.line },
        inputs,
        sources: fromRoot ? sources.map((s) => s.replace(/^\/+/, '')) : sources,
        dest,
        ignore: fromRoot ? undefined : ctx.build.spec.ignore,
        extractArchives: step.extractArchives,
        tmpDir: this.limits.tmpDir,
        signal: ctx.signal,
      });
      try {
        const result = await guest.extractArchive({ path: '/', owner: chown, body: archive.stream }, { signal: ctx.signal });
        ctx.log(`copied ${result.entries} entries, ${result.bytes} bytes`);
      } finally {
        await archive.cleanup();
      }
    });
  }

  /** The stage's build sandbox, created from its current layer at the first tree-changing step. */
  private async sandboxFor(ctx: RunContext, state: StageState): Promise<Sandbox> {
    if (state.sandbox) return state.sandbox;
    if (ctx.signal.aborted) throw ctx.signal.reason;
    const o = ctx.build.options;
    const sandbox = await this.sandboxes.create(ctx.principal, {
      internal: { kind: 'build', hostImage: state.base, snapshotId: state.snapshotId, hostId: ctx.hostId, imageLabel: `build:${ctx.build.id}` },
      cpu: o.cpu,
      memoryMiB: o.memoryMiB,
      diskGiB: o.diskGiB,
      labels: { 'nestbox.build': ctx.build.id },
      // Ends on its own if this process dies and no one cleans up.
      timeoutSeconds: o.timeoutSeconds + 300,
      egress: o.egress,
    });
    ctx.sandboxes.push(sandbox);
    state.sandbox = sandbox;
    ctx.log(`build sandbox ${sandbox.id} (from ${state.snapshotId ?? state.base})`);
    return sandbox;
  }

  private async dropSandbox(ctx: RunContext, sandbox: Sandbox): Promise<void> {
    ctx.sandboxes = ctx.sandboxes.filter((s) => s.id !== sandbox.id);
    await this.sandboxes.delete(ctx.principal, sandbox.id).catch(() => undefined);
  }

  /** Snapshots the build sandbox into a `layer` snapshot (hidden from the user's snapshots). */
  private async takeLayer(ctx: RunContext, sandbox: Sandbox): Promise<{ id: string; sizeBytes: number }> {
    const repo = snapshotRepository(this.db);
    const id = `snp${randomId(17)}`;
    const current = await this.sandboxes.get(ctx.principal, sandbox.id);
    await repo.insertCreating({ id, organizationId: ctx.build.organizationId, name: id, hostId: ctx.hostId, sourceSandboxId: sandbox.id, parentSnapshotId: current.sourceSnapshotId, kind: 'layer' });
    try {
      const result = await ctx.host.snapshotSandbox(sandbox.id, id);
      await repo.update(id, { state: 'ready', sizeBytes: result.sizeBytes });
      return { id, sizeBytes: result.sizeBytes };
    } catch (err) {
      await repo.update(id, { state: 'error', errorMessage: toNestboxError(err).message, deletedAt: new Date() });
      throw err;
    }
  }
}

/** What a step is for the cache key: everything but where it was written. */
function stepIdentity(step: BuildStep): unknown {
  const { at: _at, noCache: _noCache, ...rest } = step;
  return rest;
}

function argvOf(command: CommandForm, shell: string[]): string[] {
  return 'argv' in command ? [...command.argv] : [...(shell.length ? shell : DEFAULT_SHELL), command.shell];
}

/** An OCI image's config as the engine keeps it. */
export function configOfOci(image: Pick<HostImage, 'config'>): ImageConfig {
  const c = emptyImageConfig();
  for (const line of image.config.env) {
    const eq = line.indexOf('=');
    if (eq > 0) c.env.push([line.slice(0, eq), line.slice(eq + 1)]);
  }
  c.workdir = image.config.workingDir || '';
  c.user = image.config.user || '';
  c.cmd = image.config.cmd;
  c.entrypoint = image.config.entrypoint;
  c.exposedPorts = [...image.config.exposedPorts];
  c.labels = { ...image.config.labels };
  return c;
}
