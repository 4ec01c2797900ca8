// Build-on-demand sandboxes (`daytona.create({image})`, daytona-wave2.md §1.4) and the plain-text
// build-log streams of both kinds of build (§1.3).
//
// A Daytona create with `buildInfo` answers at once with a sandbox in `pending_build`; the SDK
// polls it by id, streams its build log, then waits for `started`. Core has no sandbox before
// the image exists, so until then the sandbox is a pending record of this layer, kept in memory:
// its id (`pnd-…`, or the caller's `name`) becomes the real sandbox's name when the build is
// done, so `GET /sandbox/{that id}` reaches the real sandbox, whose DTO gives the SDK the real id,
// and the toolbox (whose base URL the SDKs fixed with the first id) accepts that name too
// (`toolboxSandboxId`).
// Pending records live in the control-plane process that took the create: a restart during a
// build loses the pending sandbox (the build itself is failed by core and is not tagged).
import type { Response } from 'express';
import { NestboxError, toNestboxError } from '../../core/errors.js';
import { randomId } from '../../core/ids.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { CreateSandboxInput } from '../../core/services/sandboxes.js';
import { FINISHED_BUILD_STATES, type ImageBuild } from '../../core/images/types.js';
import type { Principal, Sandbox } from '../../core/types.js';
import type { Log } from './context.js';
import { buildFailureReason } from './images.js';
import { SANDBOX_USER } from './sandbox-dto.js';

type Core = Pick<CompatPort, 'builds' | 'sandboxes'>;

export interface PendingSandbox {
  id: string;
  organizationId: string;
  buildId: string;
  /** `daytona-<hex>:daytona`: the image the sandbox starts from once built. */
  snapshotRef: string;
  contextHashes: string[];
  dockerfileContent: string;
  input: CreateSandboxInput;
  /** Where it is: the build runs, the sandbox is being created, it failed, or the caller deleted it. */
  phase: 'build' | 'creating' | 'build_failed' | 'error' | 'deleted' | 'created';
  errorReason?: string;
  buildState?: ImageBuild['state'];
  sandboxId?: string;
  createdAt: Date;
  updatedAt: Date;
  region: string;
}

/** How long a finished pending record is kept (its logs URL and its failure stay readable). */
const KEEP_FINISHED_MS = 60 * 60 * 1000;
const MAX_PENDING = 10_000;

export class PendingBuildSandboxes {
  private readonly records = new Map<string, PendingSandbox>();

  constructor(
    private readonly core: Core,
    private readonly log: Log,
  ) {}

  /** Records are per organisation: names are unique within one. */
  private key(organizationId: string, id: string): string {
    return `${organizationId}/${id}`;
  }

  /**
   * Whether a pending sandbox of the organisation holds this id (its future name): while it is
   * built and created, and after a failure until it is deleted (as a failed Daytona sandbox
   * keeps its name). A created one's name is the real sandbox's.
   */
  has(organizationId: string, idOrName: string): boolean {
    const r = this.records.get(this.key(organizationId, idOrName));
    return !!r && r.phase !== 'deleted' && r.phase !== 'created';
  }

  get(principal: Principal, idOrName: string): PendingSandbox | undefined {
    return this.records.get(this.key(principal.organizationId, idOrName));
  }

  /** Starts waiting for the build; the sandbox is created from `snapshotRef` when it succeeds. */
  start(principal: Principal, init: Omit<PendingSandbox, 'id' | 'organizationId' | 'phase' | 'createdAt' | 'updatedAt'> & { name?: string }): PendingSandbox {
    this.prune();
    // A `-` keeps it apart from core's ids (20 lower-case letters and digits).
    const id = init.name ?? `pnd-${randomId(17)}`;
    if (this.has(principal.organizationId, id)) throw new NestboxError('conflict', `name: a sandbox named "${id}" is already being built`, { field: 'name' });
    const now = new Date();
    const record: PendingSandbox = { ...init, id, organizationId: principal.organizationId, phase: 'build', createdAt: now, updatedAt: now };
    this.records.set(this.key(record.organizationId, id), record);
    void this.run(principal, record);
    return record;
  }

  /** The caller deleted it: no sandbox is made (the build finishes for the cache, or is gone already). */
  async delete(principal: Principal, record: PendingSandbox): Promise<void> {
    const wasCreated = record.sandboxId;
    record.phase = 'deleted';
    record.updatedAt = new Date();
    if (wasCreated) await this.core.sandboxes.delete(principal, wasCreated).catch(() => undefined);
  }

  private async run(principal: Principal, record: PendingSandbox): Promise<void> {
    try {
      const build = await this.waitForBuild(principal, record);
      if (record.phase === 'deleted') return;
      if (build.state !== 'succeeded') {
        record.phase = build.state === 'failed' ? 'build_failed' : 'error';
        record.errorReason = build.state === 'failed' ? buildFailureReason(build) : (build.error?.message ?? 'the build was cancelled');
        record.updatedAt = new Date();
        return;
      }
      record.phase = 'creating';
      record.updatedAt = new Date();
      const sandbox: Sandbox = await this.core.sandboxes.create(principal, { ...record.input, name: record.id, image: record.snapshotRef });
      record.sandboxId = sandbox.id;
      // Deleted while it was being created: it goes at once.
      if ((record.phase as PendingSandbox['phase']) === 'deleted') await this.core.sandboxes.delete(principal, sandbox.id).catch(() => undefined);
      else record.phase = 'created';
    } catch (err) {
      const e = toNestboxError(err);
      if (record.phase !== 'deleted') {
        record.phase = 'error';
        record.errorReason = e.message;
      }
      this.log.warn({ sandbox: record.id, buildId: record.buildId, err: e.message }, 'daytona: a sandbox built on demand could not be created');
    }
    record.updatedAt = new Date();
  }

  private async waitForBuild(principal: Principal, record: PendingSandbox): Promise<ImageBuild> {
    for (;;) {
      const build = await this.core.builds.get(principal, record.buildId);
      record.buildState = build.state;
      if (FINISHED_BUILD_STATES.includes(build.state) || record.phase === 'deleted') return build;
      // waitFor wakes on the build's own changes (and polls each second otherwise).
      const waited = new AbortController();
      const timer = setTimeout(() => waited.abort(), 2000);
      await this.core.builds.waitFor(principal, record.buildId, waited.signal).catch(() => undefined);
      clearTimeout(timer);
    }
  }

  private prune(): void {
    const cutoff = Date.now() - KEEP_FINISHED_MS;
    for (const [key, r] of this.records) {
      if (r.phase !== 'build' && r.phase !== 'creating' && r.updatedAt.getTime() < cutoff) this.records.delete(key);
    }
    if (this.records.size >= MAX_PENDING) throw new NestboxError('rate_limited', 'too many sandboxes are being built at once; try again later');
  }
}

const SANDBOX_ID = /^[a-z0-9]{20}$/;

/**
 * The sandbox id a toolbox path names: an id as it is, else a sandbox name (a sandbox built on
 * demand keeps the pending id as its name, and the SDKs address the toolbox by that first id).
 * Visibility only: the operation's own scope is checked by core's toolbox.
 */
export async function toolboxSandboxId(sandboxes: Pick<CompatPort['sandboxes'], 'getByIdOrName'>, principal: Principal, idOrName: string): Promise<string> {
  if (SANDBOX_ID.test(idOrName)) return idOrName;
  return (await sandboxes.getByIdOrName({ ...principal, scopes: new Set(['sandboxes:read']) }, idOrName)).id;
}

/** Daytona's sandbox state of a pending record (§1.4: pending_build → building_snapshot → …). */
export function pendingState(r: PendingSandbox): string {
  switch (r.phase) {
    case 'build':
      return r.buildState === 'running' ? 'building_snapshot' : 'pending_build';
    case 'creating':
    case 'created':
      return 'creating';
    case 'build_failed':
      return 'build_failed';
    case 'error':
      return 'error';
    case 'deleted':
      return 'destroyed';
  }
}

/** The Sandbox DTO of a sandbox still being built (the SDK reads id, state, errorReason and buildInfo). */
export function renderPendingSandbox(r: PendingSandbox, toolboxUrl: string): Record<string, unknown> {
  const i = r.input;
  return {
    id: r.id,
    organizationId: r.organizationId,
    name: r.id,
    user: SANDBOX_USER,
    labels: i.labels ?? {},
    env: i.env ?? {},
    public: false,
    networkBlockAll: i.egress?.mode === 'deny-all',
    kvm: false,
    target: r.region,
    cpu: i.cpu ?? 0,
    gpu: 0,
    memory: i.memoryMiB === undefined ? 0 : i.memoryMiB / 1024,
    disk: i.diskGiB ?? 0,
    state: pendingState(r),
    desiredState: r.phase === 'deleted' ? 'destroyed' : 'started',
    errorReason: r.errorReason,
    recoverable: false,
    backupState: 'None',
    buildInfo: { dockerfileContent: r.dockerfileContent, contextHashes: r.contextHashes, snapshotRef: r.snapshotRef, createdAt: r.createdAt.toISOString(), updatedAt: r.updatedAt.toISOString() },
    autoStopInterval: 0,
    autoArchiveInterval: 0,
    autoDeleteInterval: -1,
    volumes: [],
    createdAt: r.createdAt.toISOString(),
    updatedAt: r.updatedAt.toISOString(),
    toolboxProxyUrl: toolboxUrl,
    daemonVersion: 'nestbox',
  };
}

/**
 * A build's log as plain text (one line per log line). With `follow`, lines are written and
 * flushed as the build prints them and the response ends when the build ends; without, the log
 * so far. The SDK prints whatever body it gets, so this always answers 200.
 */
export async function streamBuildLog(core: Pick<CompatPort, 'builds'>, principal: Principal, buildId: string, follow: boolean, res: Response): Promise<void> {
  res.status(200).setHeader('content-type', 'text/plain; charset=utf-8');
  res.setHeader('cache-control', 'no-store');
  res.flushHeaders();
  const closed = new AbortController();
  res.on('close', () => closed.abort());
  if (!follow) {
    let offset = 0;
    for (let page = 0; page < 1000; page++) {
      const { lines } = await core.builds.logs(principal, buildId, offset, 1000);
      if (!lines.length) break;
      res.write(lines.map((l) => `${l.text}\n`).join(''));
      offset = lines[lines.length - 1].offset + 1;
    }
    res.end();
    return;
  }
  try {
    for await (const item of core.builds.follow(principal, buildId, 0, closed.signal)) {
      if ('line' in item) res.write(`${item.line.text}\n`);
      else break;
    }
  } catch (err) {
    if (!closed.signal.aborted) res.write(`error: ${toNestboxError(err).message}\n`);
  }
  res.end();
}
