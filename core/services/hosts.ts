import { createHmac, timingSafeEqual } from 'node:crypto';
import type { Db } from '../store/db.js';
import { hostRepository } from '../store/repositories/hosts.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors, NestboxError } from '../errors.js';
import { applyEvent, applyEventOnHost } from '../lifecycle.js';
import type { DbOrTx } from '../store/db.js';
import { requireScope } from './auth.js';
import type { SandboxStateEvents } from '../sandbox-events.js';
import { EVENTS } from '../state-machine.js';
import type { HostClient, HostClientFactory, HostSandboxRuntime } from '../host-client.js';
import { silentLogger, type Logger } from '../logger.js';
import type { HostAdminState, HostRecord, HostResources, Principal } from '../types.js';
import type { PlacementFailureReason } from '../metrics.js';

/**
 * Per-host secrets are derived from one master secret (HMAC of the host id), so the control
 * plane stores no host credential at all and any replica can authenticate any host.
 */
export function deriveHostSecret(masterSecret: string, hostId: string): string {
  return createHmac('sha256', masterSecret).update(`nestbox-host:${hostId}`).digest('base64url');
}

export function hostSecretMatches(masterSecret: string, hostId: string, presented: string): boolean {
  const expected = Buffer.from(deriveHostSecret(masterSecret, hostId));
  const given = Buffer.from(presented);
  return expected.length === given.length && timingSafeEqual(expected, given);
}

const HOST_RECORD_CACHE_MS = 1_000;

export interface HeartbeatInput {
  hostId: string;
  url: string;
  driver: string;
  capabilities: Record<string, unknown>;
  sandboxes: HostSandboxRuntime[];
  capacity?: HostResources;
  labels?: Record<string, string>;
  version?: string;
  allocated?: HostResources & { sandboxes: number };
}

/** The operator's placement settings (src/config.ts `placement`), and the region of unlabelled hosts. */
export interface PlacementPolicy {
  cpuOvercommit: number;
  memoryOvercommit: number;
  diskOvercommit: number;
  reserveCpu: number;
  reserveMemoryMiB: number;
  /** A host silent for this long is lost (its sandboxes become error, host_lost). */
  hostLostAfterMs: number;
  /** Retry-After of a 503 capacity_exhausted. */
  retryAfterSeconds: number;
  /** What a host without a `region` label is in (NESTBOX_REGION). */
  defaultRegion: string;
  /** Disk counted for sandboxes from before disk sizes. */
  defaultDiskGiB: number;
}

/** Room for anything (unit tests, and until the composition root says otherwise). */
const UNLIMITED_POLICY: PlacementPolicy = { cpuOvercommit: 1e6, memoryOvercommit: 1e6, diskOvercommit: 1e6, reserveCpu: 0, reserveMemoryMiB: 0, hostLostAfterMs: 30_000, retryAfterSeconds: 15, defaultRegion: 'local', defaultDiskGiB: 10 };

/** Where a sandbox may go: a region (the host's `region` label), labels the host must carry, or (operators) one host. */
export interface PlacementConstraints {
  region?: string;
  labels?: Record<string, string>;
  hostId?: string;
  /** How the request named the region, for messages: `placement.region` natively, `target` for Daytona. */
  regionField?: string;
}

export interface PlacementRequest {
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
  constraints?: PlacementConstraints;
  /**
   * The sandbox must go to this host: where its snapshot, image layers or source disk live, or
   * where it already is (a start). `what` says why, for messages; `existing` = a start of a
   * sandbox already placed there (a cordon does not refuse it, and its own row is not counted).
   */
  fixed?: { hostId: string; what: string; existing?: string };
  /**
   * Hosts that hold what the sandbox starts from (a snapshot's layers): one of them is taken if
   * it is ready, matches and has room; otherwise any host is, and the caller copies the layers
   * there (host-transfer.ts). Ignored with `fixed`.
   */
  preferred?: { hostIds: string[] };
  /** Never these hosts (a move's source). */
  excludeHostIds?: string[];
}

export type HostState = HostAdminState | 'lost';

/** A host as operators see it: what it offers, what is placed on it (the database's count), what it says it holds. */
export interface HostView {
  host: HostRecord;
  state: HostState;
  region: string;
  /** capacity × overcommit − reserve; null when the host reports no capacity. */
  allocatable: HostResources | null;
  allocated: HostResources & { sandboxes: number };
}

const LABEL_KEY = /^[a-z0-9][a-z0-9._/-]{0,62}$/;
const LABEL_VALUE = /^[A-Za-z0-9._-]{0,63}$/;

export class HostService {
  private readonly clients = new Map<string, { url: string; client: HostClient }>();
  private readonly records = new Map<string, { at: number; host: HostRecord }>();
  /** Told of every placement that found no host (the metrics' placement failures); set by the composition root. */
  onPlacementFailure?: (reason: PlacementFailureReason) => void;
  /**
   * Told of the sandboxes each heartbeat reports, to destroy those that moved away from the host
   * while it could not be reached (host-transfer.ts); set by the composition root.
   */
  onReportedSandboxes?: (hostId: string, sandboxIds: string[]) => Promise<void>;

  constructor(
    private readonly db: Db,
    private readonly clientFactory: HostClientFactory,
    /** A host that has not heartbeated for this long is not offered new sandboxes. */
    private readonly hostTimeoutMs: number,
    private readonly logger: Logger = silentLogger,
    /** Where a sandbox found gone from its host is published as an `error` state. */
    private readonly events?: SandboxStateEvents,
    private readonly policy: PlacementPolicy = UNLIMITED_POLICY,
  ) {}

  /** Live = heartbeated within the timeout and within the lost grace period, and not marked lost. */
  get liveWithinMs(): number {
    return Math.min(this.hostTimeoutMs, this.policy.hostLostAfterMs);
  }

  async heartbeat(input: HeartbeatInput): Promise<HostRecord> {
    const previous = await hostRepository(this.db).findById(input.hostId);
    const host = await hostRepository(this.db).upsertHeartbeat({
      id: input.hostId,
      url: input.url,
      driver: input.driver,
      capabilities: input.capabilities,
      capacity: input.capacity,
      labels: input.labels,
      version: input.version,
      allocated: input.allocated,
    });
    this.records.set(host.id, { at: Date.now(), host });
    if (!previous || previous.url !== input.url) this.logger.info({ hostId: input.hostId, url: input.url }, `host ${input.hostId} (${input.driver}) registered at ${input.url}`);
    // The row as this heartbeat left it says whether the host had been declared lost.
    if (host.lostAt) return this.hostReturned(host, input.sandboxes);
    if (previous) await this.noticeVanishedSandboxes(input.hostId, input.sandboxes, previous.lastHeartbeatAt);
    await this.onReportedSandboxes?.(input.hostId, input.sandboxes.map((s) => s.id)).catch((err: unknown) => this.logger.warn({ hostId: input.hostId, err: String(err) }, 'cleaning sandboxes moved away from the host failed'));
    return host;
  }

  /**
   * A host declared lost heartbeats again. Its sandboxes that `host_lost` put in error and that
   * it still runs (or keeps paused) are adopted back, their timeout counted from now; those it
   * still has that the database calls deleted (deleted while it was away) are destroyed on it;
   * the rest stay `error`, and a resume starts them from their disk if the host still has it.
   */
  private async hostReturned(host: HostRecord, reported: HostSandboxRuntime[]): Promise<HostRecord> {
    const byId = new Map(reported.map((s) => [s.id, s.status]));
    const repo = sandboxRepository(this.db);
    const returned = await this.db.transaction(async (tx) => {
      const cleared = await hostRepository(tx).clearLost(host.id);
      if (!cleared) return undefined; // another replica took this return
      for (const sandbox of await sandboxRepository(tx).findByHost(host.id, ['error'])) {
        if (sandbox.stopReason !== 'host_lost') continue;
        const status = byId.get(sandbox.id);
        if (status === 'running') await applyEvent(tx, sandbox, EVENTS.hostReturnedRunning, {}, this.events);
        else if (status === 'paused') await applyEvent(tx, sandbox, EVENTS.hostReturnedPaused, {}, this.events);
      }
      return cleared;
    });
    if (!returned) return host;
    this.logger.info({ hostId: host.id }, `host ${host.id}, declared lost, heartbeats again; adopting the sandboxes it still runs`);
    for (const s of reported) {
      if ((await repo.findById(s.id))?.state !== 'deleted') continue;
      this.logger.info({ hostId: host.id, sandboxId: s.id }, `sandbox ${s.id} was deleted while its host was lost; destroying it there`);
      await this.clientForRecord(returned).destroySandbox(s.id).catch((err: unknown) => this.logger.warn({ hostId: host.id, sandboxId: s.id, err: String(err) }, 'could not destroy a sandbox deleted while its host was lost'));
    }
    return returned;
  }

  /**
   * The background pass (every replica runs it): hosts whose last heartbeat is older than the
   * grace period, on the database's clock, are marked lost and, in the same transaction and
   * with one UPDATE per host, every sandbox running, paused or in an operation there becomes
   * `error` with stopReason `host_lost`. Returns the hosts it marked.
   */
  async markLostHosts(): Promise<{ hostId: string; sandboxes: number }[]> {
    const marked = await this.db.transaction(async (tx) => {
      const lost = await hostRepository(tx).markLost(this.policy.hostLostAfterMs);
      const out: { hostId: string; sandboxes: number }[] = [];
      for (const host of lost) {
        const errorMessage = `host_lost: its host ${host.id} stopped heartbeating (last heartbeat ${host.lastHeartbeatAt.toISOString()}); the sandbox is adopted back if the host returns with it running, otherwise resume it to start again from its disk once the host is back, or delete it`;
        const changed = await applyEventOnHost(tx, host.id, EVENTS.hostLost, { errorMessage, stopReason: 'host_lost' }, this.events);
        out.push({ hostId: host.id, sandboxes: changed.length });
      }
      return out;
    });
    for (const m of marked) {
      this.records.delete(m.hostId);
      this.logger.warn({ hostId: m.hostId, sandboxes: m.sandboxes }, `host ${m.hostId} missed its heartbeats for ${this.policy.hostLostAfterMs} ms: marked lost, ${m.sandboxes} sandboxes are now error (host_lost)`);
    }
    return marked;
  }

  /**
   * A sandbox the database calls running but the host no longer runs (its processes died, or
   * the host agent restarted and could not adopt it) becomes `error` with the reason, so users
   * see the truth and can resume it from its disk.
   *
   * Why only sandboxes started before the previous heartbeat arrived: the host takes its list
   * and posts it a moment later, so a create or resume that completes in between is missing
   * from a list that predates it. The host agent sends one heartbeat at a time and takes each
   * list after the previous post was answered, so a sandbox that was running when the previous
   * heartbeat arrived is in the current list unless it really vanished. A newer one is judged
   * by the next heartbeat. (Both times come from control-plane clocks; replicas are expected to
   * be NTP-synchronised, far tighter than the heartbeat interval.)
   */
  private async noticeVanishedSandboxes(hostId: string, reported: HostSandboxRuntime[], previousHeartbeatAt: Date): Promise<void> {
    const live = new Set(reported.filter((s) => s.status !== 'stopped').map((s) => s.id));
    const repo = sandboxRepository(this.db);
    for (const sandbox of await repo.findByHost(hostId, ['running', 'paused'])) {
      if (live.has(sandbox.id)) continue;
      if (!sandbox.startedAt || sandbox.startedAt.getTime() >= previousHeartbeatAt.getTime()) continue;
      this.logger.warn({ hostId, sandboxId: sandbox.id }, `sandbox ${sandbox.state} in the database is gone from its host; marking it error`);
      await applyEvent(this.db, sandbox, EVENTS.vanished, { errorMessage: 'the sandbox stopped running on its host unexpectedly; resume it to start again from its disk' }, this.events);
    }
  }

  async countAlive(): Promise<number> {
    return (await hostRepository(this.db).listAlive(this.liveWithinMs)).length;
  }

  /** A live host that takes new sandboxes, the one with most free memory (image builds; their sandboxes are then placed there with the capacity check). */
  async pickHost(): Promise<HostRecord> {
    const alive = await hostRepository(this.db).listAlive(this.liveWithinMs);
    if (alive.length === 0) {
      this.onPlacementFailure?.('no_host_alive');
      throw new NestboxError('host_unavailable', 'no sandbox host is available right now; try again shortly');
    }
    const ready = alive.filter((h) => h.adminState === 'ready');
    if (ready.length === 0) throw this.exhausted('every live host is cordoned or draining; uncordon one or add a host');
    const allocations = await sandboxRepository(this.db).allocationsByHost(ready.map((h) => h.id), this.policy.defaultDiskGiB);
    return this.bySpread(ready, allocations)[0];
  }

  /** A specific host (where a snapshot lives), if it is alive. */
  async aliveHost(hostId: string): Promise<HostRecord> {
    const host = (await hostRepository(this.db).listAlive(this.liveWithinMs)).find((h) => h.id === hostId);
    if (!host) {
      this.onPlacementFailure?.('source_host_unavailable');
      throw new NestboxError('host_unavailable', `host ${hostId}, which holds the snapshot, is not available right now`);
    }
    return host;
  }

  /** Ids of the live hosts (heartbeating and not lost), whatever their admin state: where data can be read from. */
  async liveHostIds(): Promise<Set<string>> {
    return new Set((await hostRepository(this.db).listAlive(this.liveWithinMs)).map((h) => h.id));
  }

  /** Whether `hostId` is marked lost (a delete then needs no word from it: it is destroyed there when the host returns). */
  async isLost(hostId: string): Promise<boolean> {
    return Boolean((await hostRepository(this.db).findById(hostId))?.lostAt);
  }

  /**
   * The region of each of these hosts (what Daytona reports as its sandboxes' `target`), read
   * through the same short cache as host clients: one query for the hosts not seen within it. A
   * sandbox without a host, or a host unknown here, is in the server's region.
   */
  async regionsOf(hostIds: (string | null)[]): Promise<Map<string | null, string>> {
    const out = new Map<string | null, string>([[null, this.policy.defaultRegion]]);
    const missing: string[] = [];
    for (const id of new Set(hostIds)) {
      if (id === null) continue;
      const cached = this.records.get(id);
      if (cached && Date.now() - cached.at < HOST_RECORD_CACHE_MS) out.set(id, this.regionOf(cached.host));
      else missing.push(id);
    }
    for (const host of await hostRepository(this.db).findByIds(missing)) {
      this.records.set(host.id, { at: Date.now(), host });
      out.set(host.id, this.regionOf(host));
    }
    for (const id of missing) if (!out.has(id)) out.set(id, this.policy.defaultRegion);
    return out;
  }

  /** A host's region: its `region` label, else the server's region. */
  regionOf(host: HostRecord): string {
    return host.labels.region ?? this.policy.defaultRegion;
  }

  /** capacity × overcommit − reserve: what placement may hand out on `host` (null: it reports no capacity). */
  allocatableOf(host: HostRecord): HostResources | null {
    const c = host.capacity;
    if (!c) return null;
    const p = this.policy;
    return {
      cpu: Math.max(0, c.cpu * p.cpuOvercommit - p.reserveCpu),
      memoryMiB: Math.max(0, Math.floor(c.memoryMiB * p.memoryOvercommit - p.reserveMemoryMiB)),
      diskGiB: Math.max(0, Math.floor(c.diskGiB * p.diskOvercommit)),
    };
  }

  /** Most free memory first (spread), then fewest sandboxes, then id; hosts that report no capacity last. */
  private bySpread(hosts: HostRecord[], allocations: Map<string, { memoryMiB: number; sandboxes: number }>): HostRecord[] {
    const free = (h: HostRecord) => {
      const a = this.allocatableOf(h);
      return a ? a.memoryMiB - (allocations.get(h.id)?.memoryMiB ?? 0) : -Infinity;
    };
    return [...hosts].sort((x, y) => free(y) - free(x) || (allocations.get(x.id)?.sandboxes ?? 0) - (allocations.get(y.id)?.sandboxes ?? 0) || x.id.localeCompare(y.id));
  }

  /** What does not fit on `host` for `req` (empty when it fits), given what is placed there. */
  private shortfall(host: HostRecord, req: PlacementRequest, used: HostResources | undefined): string[] {
    const a = this.allocatableOf(host);
    if (!a) return []; // an older host agent that reports no capacity: placed on by spread alone
    const u = used ?? { cpu: 0, memoryMiB: 0, diskGiB: 0 };
    const out: string[] = [];
    if (u.cpu + req.cpu > a.cpu) out.push(`${req.cpu} vCPU (${Math.max(0, a.cpu - u.cpu)} of ${a.cpu} free)`);
    if (u.memoryMiB + req.memoryMiB > a.memoryMiB) out.push(`${req.memoryMiB} MiB memory (${Math.max(0, a.memoryMiB - u.memoryMiB)} of ${a.memoryMiB} free)`);
    if (u.diskGiB + req.diskGiB > a.diskGiB) out.push(`${req.diskGiB} GiB disk (${Math.max(0, a.diskGiB - u.diskGiB)} of ${a.diskGiB} free)`);
    return out;
  }

  private exhausted(message: string, details: Record<string, unknown> = {}): NestboxError {
    this.onPlacementFailure?.('capacity_exhausted');
    return new NestboxError('capacity_exhausted', message, { ...details, retryAfterSeconds: this.policy.retryAfterSeconds });
  }

  /** Checks the shape of a request's constraints (the native field and Daytona's target arrive here alike). */
  validateConstraints(principal: Principal, c: PlacementConstraints | undefined): PlacementConstraints | undefined {
    if (c === undefined) return undefined;
    const regionField = c.regionField ?? 'placement.region';
    if (c.region !== undefined && (typeof c.region !== 'string' || !LABEL_VALUE.test(c.region) || c.region === '')) throw errors.validation(regionField, 'must be a region name (letters, digits, ".", "-", "_")');
    for (const [k, v] of Object.entries(c.labels ?? {})) {
      if (!LABEL_KEY.test(k)) throw errors.validation(`placement.labels.${k.slice(0, 64)}`, 'is not a label key (lowercase letters, digits, ".", "-", "_", "/")');
      if (typeof v !== 'string' || !LABEL_VALUE.test(v)) throw errors.validation(`placement.labels.${k}`, 'must be a label value (letters, digits, ".", "-", "_")');
    }
    if (c.hostId !== undefined && !principal.scopes.has('platform:hosts')) throw errors.forbidden('placement.hostId: choosing a host needs the platform:hosts scope (operators)');
    return c;
  }

  /**
   * The live, ready hosts that satisfy `c` (the warm pool's claim takes a member only there, so a
   * pooled create honours its placement as a cold one would).
   */
  async hostsSatisfying(c: PlacementConstraints): Promise<string[]> {
    return (await hostRepository(this.db).listAlive(this.liveWithinMs)).filter((h) => h.adminState === 'ready' && this.unmet(h, c) === undefined).map((h) => h.id);
  }

  /** Which constraint `host` fails, if any. */
  private unmet(host: HostRecord, c: PlacementConstraints | undefined): string | undefined {
    if (!c) return undefined;
    if (c.hostId !== undefined && host.id !== c.hostId) return `placement.hostId=${c.hostId}`;
    if (c.region !== undefined && this.regionOf(host) !== c.region) return `${c.regionField ?? 'placement.region'}=${c.region}`;
    for (const [k, v] of Object.entries(c.labels ?? {})) if (host.labels[k] !== v) return `placement.labels.${k}=${v}`;
    return undefined;
  }

  /**
   * Picks the host of a new sandbox (or checks the host of a start) inside the caller's
   * transaction, which has locked the organisation's row: the candidate hosts are locked FOR
   * UPDATE in id order and their allocations counted from the sandboxes table, so two creates
   * cannot both take the last room (the second waits for the first's row, then counts it).
   * Nothing waits for a host agent here.
   */
  async place(tx: DbOrTx, req: PlacementRequest): Promise<HostRecord> {
    const repo = hostRepository(tx);
    if (req.fixed) return this.placeOnFixed(tx, req, req.fixed);
    const alive = await repo.lockAlive(this.liveWithinMs);
    if (alive.length === 0) {
      this.onPlacementFailure?.('no_host_alive');
      throw new NestboxError('host_unavailable', 'no sandbox host is available right now; try again shortly');
    }
    const candidates = req.excludeHostIds?.length ? alive.filter((h) => !req.excludeHostIds!.includes(h.id)) : alive;
    if (candidates.length === 0) {
      this.onPlacementFailure?.('no_host_alive');
      throw new NestboxError('host_unavailable', `no other live host than ${req.excludeHostIds!.join(', ')} is available right now; add a host or try again shortly`);
    }
    const matching = candidates.filter((h) => this.unmet(h, req.constraints) === undefined);
    if (matching.length === 0) {
      this.onPlacementFailure?.('constraint_unsatisfied');
      const unmet = this.unmet(candidates[0], req.constraints)!;
      const field = unmet.slice(0, unmet.indexOf('='));
      const regions = [...new Set(candidates.map((h) => this.regionOf(h)))].sort();
      throw new NestboxError('validation_failed', `${field}: no live host satisfies ${unmet} (live hosts' regions: ${regions.join(', ')})`, { field });
    }
    const ready = matching.filter((h) => h.adminState === 'ready');
    const what = req.constraints && (req.constraints.region || req.constraints.labels || req.constraints.hostId) ? ' matching the placement' : '';
    if (ready.length === 0) throw this.exhausted(`every live host${what} is cordoned or draining (${matching.map((h) => `${h.id}: ${h.adminState}`).join(', ')}); no new sandboxes are placed there`);
    const allocations = await sandboxRepository(tx).allocationsByHost(ready.map((h) => h.id), this.policy.defaultDiskGiB);
    return this.pickWithRoom(ready, allocations, req, what);
  }

  /** The preferred hosts with room first (no copy needed), then any by spread (host-transfer.ts copies what is needed). */
  private pickWithRoom(ready: HostRecord[], allocations: Map<string, HostResources & { sandboxes: number }>, req: PlacementRequest, what: string): HostRecord {
    const ordered = this.bySpread(ready, allocations);
    const preferred = new Set(req.preferred?.hostIds ?? []);
    for (const host of [...ordered.filter((h) => preferred.has(h.id)), ...ordered.filter((h) => !preferred.has(h.id))]) if (this.shortfall(host, req, allocations.get(host.id)).length === 0) return host;
    const worst = ready.map((h) => `${h.id} lacks ${this.shortfall(h, req, allocations.get(h.id)).join(' and ')}`);
    throw this.exhausted(`no host${what} has room for ${req.cpu} vCPU, ${req.memoryMiB} MiB memory and ${req.diskGiB} GiB disk right now (${worst.join('; ')}); try again later or ask for less`, { cpu: req.cpu, memoryMiB: req.memoryMiB, diskGiB: req.diskGiB });
  }

  /**
   * Resize: the host of a sandbox must have room for what the sandbox grows by (under the same
   * host row locks as placements, inside the caller's transaction); a shrink always fits.
   */
  async assertRoomToGrow(tx: DbOrTx, hostId: string, sandboxId: string, grow: { cpu: number; memoryMiB: number; diskGiB: number }): Promise<void> {
    const ask = { cpu: Math.max(0, grow.cpu), memoryMiB: Math.max(0, grow.memoryMiB), diskGiB: Math.max(0, grow.diskGiB) };
    if (ask.cpu === 0 && ask.memoryMiB === 0 && ask.diskGiB === 0) return;
    const [host] = await hostRepository(tx).lockAlive(this.liveWithinMs, [hostId]);
    if (!host) throw new NestboxError('host_unavailable', `host ${hostId}, which holds sandbox ${sandboxId}, is not available right now`, { hostId });
    const used = (await sandboxRepository(tx).allocationsByHost([host.id], this.policy.defaultDiskGiB)).get(host.id);
    const lacking = this.shortfall(host, ask, used);
    if (lacking.length) throw this.exhausted(`host ${host.id}, which holds sandbox ${sandboxId}, has no room to grow it (it lacks ${lacking.join(' and ')}); ask for less, or stop other sandboxes there`, { hostId: host.id });
  }

  private async placeOnFixed(tx: DbOrTx, req: PlacementRequest, fixed: NonNullable<PlacementRequest['fixed']>): Promise<HostRecord> {
    const [host] = await hostRepository(tx).lockAlive(this.liveWithinMs, [fixed.hostId]);
    if (!host) {
      this.onPlacementFailure?.('source_host_unavailable');
      const known = await hostRepository(tx).findById(fixed.hostId);
      const why = known?.lostAt ? `was lost (no heartbeat since ${known.lastHeartbeatAt.toISOString()}; host_lost)` : 'is not available right now';
      throw new NestboxError('host_unavailable', `host ${fixed.hostId}, which holds ${fixed.what}, ${why}`, { hostId: fixed.hostId, ...(known?.lostAt ? { reason: 'host_lost' } : {}) });
    }
    const unmet = this.unmet(host, req.constraints);
    if (unmet) {
      const field = unmet.slice(0, unmet.indexOf('='));
      throw new NestboxError('validation_failed', `${field}: ${fixed.what} is on host ${host.id} (region ${this.regionOf(host)}), which does not satisfy ${unmet}; sandboxes from it run there`, { field });
    }
    if (!fixed.existing && host.adminState !== 'ready') {
      this.onPlacementFailure?.('source_host_unavailable');
      throw new NestboxError('host_unavailable', `host ${host.id}, which holds ${fixed.what}, is ${host.adminState}: no new sandboxes are placed there (an operator can uncordon it)`, { hostId: host.id, hostState: host.adminState });
    }
    const allocations = await sandboxRepository(tx).allocationsByHost([host.id], this.policy.defaultDiskGiB);
    const used = allocations.get(host.id);
    // A start's own row is counted already (its disk) or must not be (its vCPUs and memory, while stopped it holds none).
    const ask = fixed.existing ? { ...req, diskGiB: 0 } : req;
    const lacking = this.shortfall(host, ask, used);
    if (lacking.length) throw this.exhausted(`host ${host.id}, which holds ${fixed.what}, has no room for it right now (it lacks ${lacking.join(' and ')}); try again later`, { hostId: host.id });
    return host;
  }

  /** Every registered host with its capacity, allocations and state (operators: platform:hosts). */
  async list(principal: Principal): Promise<HostView[]> {
    requireScope(principal, 'platform:hosts');
    const hosts = await hostRepository(this.db).list();
    const allocations = await sandboxRepository(this.db).allocationsByHost(hosts.map((h) => h.id), this.policy.defaultDiskGiB);
    return hosts.map((h) => this.viewOf(h, allocations.get(h.id)));
  }

  async get(principal: Principal, hostId: string): Promise<HostView> {
    requireScope(principal, 'platform:hosts');
    const host = await hostRepository(this.db).findById(hostId);
    if (!host) throw errors.notFound('host', hostId);
    const allocations = await sandboxRepository(this.db).allocationsByHost([host.id], this.policy.defaultDiskGiB);
    return this.viewOf(host, allocations.get(host.id));
  }

  /**
   * cordon: no new sandboxes (its running ones carry on; starts of its stopped ones still go
   * there). drain: cordoned and marked draining (moving its stopped sandboxes elsewhere is not
   * built yet). uncordon: ready again.
   */
  async setAdminState(principal: Principal, hostId: string, action: 'cordon' | 'uncordon' | 'drain'): Promise<HostView> {
    requireScope(principal, 'platform:hosts');
    const state: HostAdminState = action === 'cordon' ? 'cordoned' : action === 'drain' ? 'draining' : 'ready';
    const host = await hostRepository(this.db).setAdminState(hostId, state);
    if (!host) throw errors.notFound('host', hostId);
    this.logger.info({ hostId, state }, `host ${hostId} is now ${state} (${action})`);
    return this.get(principal, hostId);
  }

  private viewOf(host: HostRecord, allocated: (HostResources & { sandboxes: number }) | undefined): HostView {
    return {
      host,
      state: host.lostAt ? 'lost' : host.adminState,
      region: this.regionOf(host),
      allocatable: this.allocatableOf(host),
      allocated: allocated ?? { cpu: 0, memoryMiB: 0, diskGiB: 0, sandboxes: 0 },
    };
  }

  /**
   * Every sandbox call resolves its host; the record (its URL) changes only when a host agent
   * restarts, so it is read at most once per second per host.
   */
  async clientFor(hostId: string): Promise<HostClient> {
    const cached = this.records.get(hostId);
    if (cached && Date.now() - cached.at < HOST_RECORD_CACHE_MS) return this.clientForRecord(cached.host);
    const host = await hostRepository(this.db).findById(hostId);
    if (!host) throw new NestboxError('host_unavailable', `host ${hostId} is not registered`);
    this.records.set(hostId, { at: Date.now(), host });
    return this.clientForRecord(host);
  }

  clientForRecord(host: HostRecord): HostClient {
    const cached = this.clients.get(host.id);
    if (cached && cached.url === host.url) return cached.client;
    const client = this.clientFactory(host);
    this.clients.set(host.id, { url: host.url, client });
    return client;
  }
}
