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
// Pending records are kept in core (PendingSandboxService, a table every replica reads), so a
// poll, a log stream or a delete may reach any replica; the replica that took the create waits
// for the build and creates the sandbox. If that replica dies first, the build is failed by
// core and readers see the pending sandbox as `error` (its owner stopped heartbeating).
import type { Response } from 'express';
import { toNestboxError } from '../../core/errors.js';
import { randomId } from '../../core/ids.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { CreateSandboxInput } from '../../core/services/sandboxes.js';
import { FINISHED_BUILD_STATES, type ImageBuild } from '../../core/images/types.js';
import type { Principal, Sandbox } from '../../core/types.js';
import type { PendingPhase } from '../../core/services/pending-sandboxes.js';
import type { Log } from './context.js';
import { buildFailureReason } from './images.js';
import { SANDBOX_USER } from './sandbox-dto.js';

type Core = Pick<CompatPort, 'builds' | 'sandboxes' | 'pendingSandboxes'>;

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
  phase: PendingPhase;
  errorReason?: string;
  buildState?: ImageBuild['state'];
  sandboxId?: string;
  createdAt: Date;
  updatedAt: Date;
  region: string;
}

/** What is stored of a pending sandbox beside its id, phase and times (JSON). */
type StoredRecord = Omit<PendingSandbox, 'id' | 'organizationId' | 'phase' | 'createdAt' | 'updatedAt'>;

/** How long a finished pending record is kept (its logs URL and its failure stay readable). */
const KEEP_FINISHED_MS = 60 * 60 * 1000;
const MAX_PENDING = 10_000;

function stored(r: PendingSandbox): StoredRecord {
  const { id: _id, organizationId: _org, phase: _phase, createdAt: _c, updatedAt: _u, ...rest } = r;
  return rest;
}

export class PendingBuildSandboxes {
  constructor(
    private readonly core: Core,
    private readonly log: Log,
  ) {}

  /**
   * Whether a pending sandbox of the organisation holds this id (its future name): while it is
   * built and created, and after a failure until it is deleted (as a failed Daytona sandbox
   * keeps its name). A created one's name is the real sandbox's.
   */
  has(organizationId: string, idOrName: string): Promise<boolean> {
    return this.core.pendingSandboxes.holds(organizationId, idOrName);
  }

  /**
   * The pending sandbox as any replica sees it. One still in the works whose owner stopped
   * heartbeating will never be finished by anyone: it reads as `error`.
   */
  async get(principal: Principal, idOrName: string): Promise<PendingSandbox | undefined> {
    const row = await this.core.pendingSandboxes.get<StoredRecord>(principal.organizationId, idOrName);
    if (!row) return undefined;
    const record: PendingSandbox = { ...row.record, id: row.id, organizationId: row.organizationId, phase: row.phase, createdAt: row.createdAt, updatedAt: row.updatedAt };
    if (record.phase === 'build') {
      // The build's state is read live: it may run on any replica.
      record.buildState = await this.core.builds.get(principal, record.buildId).then((b) => b.state, () => record.buildState);
    }
    if ((record.phase === 'build' || record.phase === 'creating') && !row.ownerAlive) {
      record.phase = 'error';
      record.errorReason = 'the control plane that took this create stopped before the sandbox was made; create it again (finished build steps are cached)';
    }
    return record;
  }

  /** Starts waiting for the build; the sandbox is created from `snapshotRef` when it succeeds. */
  async start(principal: Principal, init: Omit<PendingSandbox, 'id' | 'organizationId' | 'phase' | 'createdAt' | 'updatedAt'> & { name?: string }): Promise<PendingSandbox> {
    await this.core.pendingSandboxes.prune(KEEP_FINISHED_MS, MAX_PENDING);
    // A `-` keeps it apart from core's ids (20 lower-case letters and digits).
    const { name, ...rest } = init;
    const id = name ?? `pnd-${randomId(17)}`;
    const now = new Date();
    const record: PendingSandbox = { ...rest, id, organizationId: principal.organizationId, phase: 'build', createdAt: now, updatedAt: now };
    await this.core.pendingSandboxes.insert(principal.organizationId, id, stored(record));
    void this.run(principal, record);
    return record;
  }

  /** The caller deleted it (through any replica): no sandbox is made (the build finishes for the cache, or is gone already). */
  async delete(principal: Principal, record: PendingSandbox): Promise<void> {
    record.phase = 'deleted';
    record.updatedAt = new Date();
    await this.core.pendingSandboxes.update(principal.organizationId, record.id, 'deleted', stored(record), []);
    if (record.sandboxId) await this.core.sandboxes.delete(principal, record.sandboxId).catch(() => undefined);
  }

  /** Writes the record's phase unless another replica deleted it meanwhile; answers whether it is still wanted. */
  private async save(record: PendingSandbox): Promise<boolean> {
    record.updatedAt = new Date();
    const written = await this.core.pendingSandboxes.update(record.organizationId, record.id, record.phase, stored(record));
    if (!written) record.phase = 'deleted';
    return written;
  }

  private async run(principal: Principal, record: PendingSandbox): Promise<void> {
    try {
      const build = await this.waitForBuild(principal, record);
      if (record.phase === 'deleted') return;
      if (build.state !== 'succeeded') {
        record.phase = build.state === 'failed' ? 'build_failed' : 'error';
        record.errorReason = build.state === 'failed' ? buildFailureReason(build) : (build.error?.message ?? 'the build was cancelled');
        await this.save(record);
        return;
      }
      record.phase = 'creating';
      if (!(await this.save(record))) return;
      const sandbox: Sandbox = await this.core.sandboxes.create(principal, { ...record.input, name: record.id, image: record.snapshotRef });
      record.sandboxId = sandbox.id;
      record.phase = 'created';
      // Deleted while it was being created (through any replica): it goes at once.
      if (!(await this.save(record))) await this.core.sandboxes.delete(principal, sandbox.id).catch(() => undefined);
    } catch (err) {
      const e = toNestboxError(err);
      if (record.phase !== 'deleted') {
        record.phase = 'error';
        record.errorReason = e.message;
        await this.save(record).catch(() => undefined);
      }
      this.log.warn({ sandbox: record.id, buildId: record.buildId, err: e.message }, 'daytona: a sandbox built on demand could not be created');
    }
  }

  private async waitForBuild(principal: Principal, record: PendingSandbox): Promise<ImageBuild> {
    for (;;) {
      const build = await this.core.builds.get(principal, record.buildId);
      record.buildState = build.state;
      if (FINISHED_BUILD_STATES.includes(build.state)) return build;
      // A delete through another replica is seen here too.
      if ((await this.core.pendingSandboxes.get(record.organizationId, record.id))?.phase === 'deleted') {
        record.phase = 'deleted';
        return build;
      }
      // waitFor wakes on the build's own changes (and polls each second otherwise).
      const waited = new AbortController();
      const timer = setTimeout(() => waited.abort(), 2000);
      await this.core.builds.waitFor(principal, record.buildId, waited.signal).catch(() => undefined);
      clearTimeout(timer);
    }
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
