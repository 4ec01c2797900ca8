// The warm pool (issue 20): sandboxes each host runs before anyone asks, per (image, size), so a
// create can be answered by one that is already up instead of a cold launch.
//
// Where it lives: a member is a real sandbox on its host (the host agent launched it like any
// create, with `warm: true`: no environment beyond the image's, the default egress) and a row in
// `warm_pool_sandboxes`, never in `sandboxes`. It belongs to no organisation until claimed, so
// no list, usage sample, quota, event or bill can see it; placement does (allocationsByHost
// adds the pool's rows), so the pool never hides load.
//
// Claim: a create's quota transaction deletes one ready row (FOR UPDATE SKIP LOCKED: two
// creates, on one replica or two, never get the same member) and inserts the `sandboxes` row
// under the member's id, in `creating`, owned by the create. Both or neither commit: a kill -9
// before the commit leaves a pool member, after it a claimed sandbox in `creating`. The host
// is then told the create's spec (POST /v1/sandboxes/{id}/claim: environment, egress policy);
// until it has applied them the host reports the member `warm`, and a takeover of the create
// (background.ts) claims it again before it settles, so no half-claimed sandbox ever runs.
//
// Refill and shrink: a loop of its own (not the background tick, which must stay quick) keeps
// each live, ready host at the target of every configured key: the configured size while the
// key is asked for, growing with demand (creates of the key in the last minute, up to `max`),
// back to `idleSize` after `idleSeconds` without one. Members older than `maxAgeSeconds` are
// replaced (a member's uptime is the one thing of its pool era a user could read, see
// ARCHITECTURE.md "Warm pool"). Two replicas filling at once serialise on the host's row
// (placement's lock), so they never overshoot a target or the host's capacity. A member
// whose filler died while it was warming is removed by the next pass of any replica.
//
// Organisation pools (Daytona's `daytona.warmPool`, organization-warm-pools.ts): rows of
// `organization_warm_pools`, each a desired count of members of one image and size for one
// organisation. Their members are rows here with `pool_id` set: the operator's claim never takes
// them and an organisation's claim takes only its own pools' members (claimForOrganization).
// Unlike a configured key, an organisation pool's count is over all hosts, not per host: its
// members are placed like creates (any host with room, the image's host for built images).
import type { Db, DbOrTx } from '../store/db.js';
import { controlPlaneInstanceRepository } from '../store/repositories/control-plane-instances.js';
import { hostRepository } from '../store/repositories/hosts.js';
import { warmPoolRepository, type OrganizationPoolRow, type WarmPoolRow as Row } from '../store/repositories/warm-pool.js';
import { newSandboxId } from '../ids.js';
import { NestboxError, toNestboxError, errors } from '../errors.js';
import type { Logger } from '../logger.js';
import type { HostRecord, Principal } from '../types.js';
import type { HostService } from './hosts.js';
import { requireScope } from './auth.js';

export type { OrganizationPoolRow } from '../store/repositories/warm-pool.js';

/** What a create must ask for to be answered by a member: the image and the whole size. */
export interface WarmPoolKey {
  image: string;
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
}

export interface WarmPoolTarget extends WarmPoolKey {
  /** Ready members each host keeps while the key is asked for. */
  size: number;
}

export interface WarmPoolOptions {
  targets: WarmPoolTarget[];
  /** The most members of one key a host keeps when demand grows. */
  max: number;
  /** No create of a key for this long: its target drops to idleSize (0 = never idle). */
  idleSeconds: number;
  idleSize: number;
  /** Members older than this are replaced (0 = never). */
  maxAgeSeconds: number;
  /** How often the pool is looked at (a claim also triggers a pass at once). */
  intervalMs: number;
  /** Members one pass starts at most, in parallel (each is a full launch on its host). */
  batch: number;
  /** Inode limit of a member's disk per GiB (the same as any sandbox's). */
  diskInodesPerGiB: number;
  /** Warm sandboxes one organisation may ask for over all its pools (0 = no organisation pools). */
  organizationMax?: number;
}

/** The hosts members run on (placement's notion of a live host), and when a replica is dead. */
export interface WarmPoolHosts {
  hosts: HostService;
  instanceTimeoutMs: number;
}


export interface WarmPoolMember extends WarmPoolKey {
  id: string;
  hostId: string;
  /** The organisation pool it belongs to (undefined: the operator's). */
  poolId?: string;
}

/** How an organisation pool's member is launched (its image may be a built one: a base and layers on a host). */
interface MemberLaunch {
  hostImage: string;
  layersSnapshotId: string | null;
  env: Record<string, string>;
}

export interface WarmPoolKeyStats extends WarmPoolKey {
  hostId: string;
  target: number;
  ready: number;
  warming: number;
}

export interface WarmPoolStats {
  keys: WarmPoolKeyStats[];
  /** Claims answered from the pool and creates of a configured key that found none, since this replica started. */
  hits: number;
  misses: number;
}

/** Counters the metrics module reads (core/metrics.ts). */
export interface WarmPoolCounters {
  onClaim?: (result: 'hit' | 'miss') => void;
}

const keyOf = (k: WarmPoolKey) => `${k.image}|${k.cpu}|${k.memoryMiB}|${k.diskGiB}`;
const DEMAND_WINDOW_MS = 60_000;

export class WarmPoolService {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;
  /** Creates of each key on this replica (claims and misses), for the demand and idle rules. */
  private readonly asked = new Map<string, number[]>();
  private readonly startedAt = Date.now();
  /** Hosts whose driver keeps no warm pool (501 on a warm create): not asked again by this replica. */
  private readonly unsupportedHosts = new Set<string>();
  hits = 0;
  misses = 0;
  counters: WarmPoolCounters = {};

  constructor(
    private readonly db: Db,
    private readonly where: WarmPoolHosts,
    private readonly instanceId: string,
    private readonly options: WarmPoolOptions,
    private readonly logger: Logger,
  ) {}

  get enabled(): boolean {
    return this.options.targets.some((t) => t.size > 0 || this.options.max > 0);
  }

  /** Warm sandboxes one organisation may ask for over all its pools. */
  get organizationMax(): number {
    return this.options.organizationMax ?? 0;
  }

  /** Whether creates of `key` are pooled at all (a configured key). */
  serves(key: WarmPoolKey): boolean {
    return this.options.targets.some((t) => keyOf(t) === keyOf(key));
  }

  /**
   * Starts (or, after stop(), restarts) the refill loop: at once for configured keys, and for
   * organisation pools when there is one (a server without either runs no loop at all; creating
   * an organisation pool calls this again).
   */
  start(): void {
    if (this.timer) return;
    if (!this.enabled) {
      if (this.organizationMax <= 0) return;
      this.stopped = false;
      void warmPoolRepository(this.db).anyOrganizationPool().then(
        (any) => { if (any && !this.timer && !this.stopped) this.startLoop(); },
        (err) => this.logger.warn({ err: toNestboxError(err).message }, 'warm pool: organisation pools could not be read'),
      );
      return;
    }
    this.startLoop();
  }

  private startLoop(): void {
    this.stopped = false;
    this.timer = setInterval(() => this.kick(), this.options.intervalMs);
    this.timer.unref();
    this.kick();
  }

  /** Stops refilling; members stay on their hosts (a restart adopts them). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  /** Runs a pass now, or right after the one running (a claim calls this). */
  kick(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = (async () => {
      try {
        do {
          this.again = false;
          await this.pass().catch((err) => this.logger.warn({ err: toNestboxError(err).message }, 'warm pool: a pass failed'));
        } while (this.again && !this.stopped);
      } finally {
        this.running = undefined;
      }
    })();
  }

  /** One refill and shrink pass, awaited (tests, the loop). */
  async refill(): Promise<void> {
    while (this.running) await this.running;
    await this.pass();
  }

  private noteAsked(key: WarmPoolKey): void {
    const k = keyOf(key);
    const now = Date.now();
    const times = (this.asked.get(k) ?? []).filter((t) => now - t < Math.max(DEMAND_WINDOW_MS, this.options.idleSeconds * 1000));
    times.push(now);
    this.asked.set(k, times.slice(-1000));
  }

  /** How many ready members of `t` each host should keep now. */
  targetOf(t: WarmPoolTarget): number {
    const now = Date.now();
    const times = this.asked.get(keyOf(t)) ?? [];
    const last = times.length ? times[times.length - 1] : this.startedAt;
    if (this.options.idleSeconds > 0 && now - last > this.options.idleSeconds * 1000) return Math.min(t.size, this.options.idleSize);
    const recent = times.filter((x) => now - x < DEMAND_WINDOW_MS).length;
    return Math.max(t.size, Math.min(this.options.max, recent));
  }

  /**
   * A create's claim, inside its quota transaction: one ready member of `key` on a live, ready
   * host (one of `onHosts` when given: those satisfying its placement), removed from the pool (the caller inserts the `sandboxes` row under its id in the same
   * transaction). Undefined when there is none: the create goes cold. Counted as a hit or miss.
   */
  async claim(tx: DbOrTx, key: WarmPoolKey, onHosts?: string[]): Promise<WarmPoolMember | undefined> {
    if (!this.serves(key)) return undefined;
    this.noteAsked(key);
    if (onHosts && onHosts.length === 0) return undefined;
    const row = await warmPoolRepository(tx).claimOperatorMember(key, this.where.hosts.liveWithinMs / 1000, onHosts);
    if (!row) return undefined;
    return { id: row.id, hostId: row.host_id, image: row.image, cpu: row.cpu, memoryMiB: row.memory_mib, diskGiB: row.disk_gib };
  }

  /**
   * The organisation's pools that answer a create of `key` (`image` is the image's row id, or a
   * built-in image's name): read before the create's transaction (PGlite has one connection).
   */
  async organizationPoolsFor(organizationId: string, key: WarmPoolKey): Promise<string[]> {
    if (this.organizationMax <= 0) return [];
    return warmPoolRepository(this.db).organizationPoolIdsFor(organizationId, key);
  }

  /** claim() for an organisation's own pools (`poolIds` from organizationPoolsFor): nobody else's members. */
  async claimForOrganization(tx: DbOrTx, poolIds: string[], onHosts?: string[]): Promise<WarmPoolMember | undefined> {
    if (poolIds.length === 0 || (onHosts && onHosts.length === 0)) return undefined;
    const row = await warmPoolRepository(tx).claimPoolMember(poolIds, this.where.hosts.liveWithinMs / 1000, onHosts);
    if (!row) return undefined;
    return { id: row.id, hostId: row.host_id, image: row.image, cpu: row.cpu, memoryMiB: row.memory_mib, diskGiB: row.disk_gib, poolId: row.pool_id ?? undefined };
  }

  /** Ready members of each of `poolIds` (Daytona's currentSize). */
  async readyOf(poolIds: string[]): Promise<Map<string, number>> {
    return warmPoolRepository(this.db).readyCountsOf(poolIds);
  }

  /** Counts a claim's result once its transaction committed (a rolled-back claim counts nothing). */
  counted(member: WarmPoolMember | undefined): void {
    if (member) this.hits++;
    else this.misses++;
    this.counters.onClaim?.(member ? 'hit' : 'miss');
    // A claim takes a member away, and a miss is demand: either way the pool has work now.
    this.kick();
  }

  /** Operators (platform:hosts): every host's members per key, and this replica's hits and misses. */
  async stats(principal: Principal, hostId?: string): Promise<WarmPoolStats> {
    requireScope(principal, 'platform:hosts');
    if (hostId !== undefined && !(await hostRepository(this.db).findById(hostId))) throw errors.notFound('host', hostId);
    return { keys: await this.levels(hostId), hits: this.hits, misses: this.misses };
  }

  /** Members per host and key (with each configured key's target on every live host). */
  async levels(hostId?: string): Promise<WarmPoolKeyStats[]> {
    // The operator's keys only: organisations' pools are theirs to read (organization-warm-pools.ts).
    const rows = await warmPoolRepository(this.db).operatorLevels(hostId);
    const out = new Map<string, WarmPoolKeyStats>();
    const entry = (h: string, k: WarmPoolKey) => {
      const id = `${h}|${keyOf(k)}`;
      let e = out.get(id);
      if (!e) {
        const t = this.options.targets.find((x) => keyOf(x) === keyOf(k));
        e = { hostId: h, ...k, target: t ? this.targetOf(t) : 0, ready: 0, warming: 0 };
        out.set(id, e);
      }
      return e;
    };
    const live = await hostRepository(this.db).listAlive(this.where.hosts.liveWithinMs);
    for (const h of live) if (!hostId || h.id === hostId) for (const t of this.options.targets) entry(h.id, t);
    for (const r of rows) {
      const e = entry(r.host_id, { image: r.image, cpu: r.cpu, memoryMiB: r.memory_mib, diskGiB: r.disk_gib });
      e[r.state] += Number(r.count);
    }
    return [...out.values()].sort((a, b) => a.hostId.localeCompare(b.hostId) || keyOf(a).localeCompare(keyOf(b)));
  }

  /**
   * Removes every member (on every host, or one host's): operators before taking a host away,
   * tests before they end. Members being claimed are not members any more and stay.
   */
  async drain(hostId?: string): Promise<number> {
    const rows = await warmPoolRepository(this.db).removeAll(hostId);
    await this.destroyAll(rows, 'drained');
    return rows.length;
  }

  private async pass(): Promise<void> {
    await this.reap();
    if (this.stopped) return;
    await this.fill();
  }

  /** Members nobody can finish (their filler died while warming), too old, on a fenced host, or beyond the target. */
  private async reap(): Promise<void> {
    const alive = [...new Set([...(await controlPlaneInstanceRepository(this.db).aliveWithin(this.where.instanceTimeoutMs)), this.instanceId])];
    const pool = warmPoolRepository(this.db);
    await this.destroyAll(await pool.removeOrphanedWarming(alive), 'its filler died while it was warming');
    if (this.options.maxAgeSeconds > 0) {
      await this.destroyAll(await pool.removeReadyOlderThan(this.options.maxAgeSeconds), `older than ${this.options.maxAgeSeconds} s`);
    }
    // A cordoned or draining host takes no new sandboxes, so its members would never be claimed: they go.
    await this.destroyAll(await pool.removeReadyOnFencedHosts(), 'their host is cordoned or draining');
    // Shrink: ready members beyond the key's target now (idle keys, or keys no longer configured), newest first.
    const ready = await pool.readyOperatorMembers();
    const byHostKey = new Map<string, Row[]>();
    for (const r of ready) {
      const id = `${r.host_id}|${keyOf({ image: r.image, cpu: r.cpu, memoryMiB: r.memory_mib, diskGiB: r.disk_gib })}`;
      byHostKey.set(id, [...(byHostKey.get(id) ?? []), r]);
    }
    for (const rows of byHostKey.values()) {
      const r0 = rows[0];
      const t = this.options.targets.find((x) => keyOf(x) === keyOf({ image: r0.image, cpu: r0.cpu, memoryMiB: r0.memory_mib, diskGiB: r0.disk_gib }));
      const excess = rows.length - (t ? this.targetOf(t) : 0);
      if (excess <= 0) continue;
      const ids = rows.slice(0, excess).map((r) => r.id);
      await this.destroyAll(await pool.removeReady(ids), 'the pool shrank (idle)');
    }
    await this.reapOrganizationPools();
  }

  /** Members of deleted organisation pools (any state: a warming one's launch then finds no row), and ready ones beyond their pool's count. */
  private async reapOrganizationPools(): Promise<void> {
    const pool = warmPoolRepository(this.db);
    await this.destroyAll(await pool.removeOfDeletedPools(), 'their organisation pool was deleted');
    // Newest first beyond the count (`pool: 0` drains all of them).
    await this.destroyAll(await pool.removeBeyondPoolCounts(), 'their organisation pool shrank');
  }

  private async fill(): Promise<void> {
    const hosts = (await hostRepository(this.db).listAlive(this.where.hosts.liveWithinMs)).filter((h) => h.adminState === 'ready' && !this.unsupportedHosts.has(h.id));
    const started: { row: WarmPoolMember; host: HostRecord }[] = [];
    for (const host of hosts) {
      for (const t of this.options.targets) {
        if (started.length >= this.options.batch) break;
        const target = this.targetOf(t);
        if (target <= 0) continue;
        const rows = await this.reserve(host, t, Math.min(this.options.batch - started.length, target)).catch((err) => {
          // No room on this host (its capacity counts the pool): the pool waits, creates come first.
          if (err instanceof NestboxError && (err.code === 'capacity_exhausted' || err.code === 'host_unavailable')) return [];
          throw err;
        });
        for (const row of rows) started.push({ row, host });
      }
    }
    const organization = started.length < this.options.batch && this.organizationMax > 0 ? await this.reserveForOrganizations(this.options.batch - started.length) : [];
    await Promise.all([...started.map(({ row, host }) => this.launch(row, host)), ...organization.map(({ row, host, launch }) => this.launch(row, host, launch))]);
  }

  /**
   * Members organisation pools lack, up to `upTo` in all: each pool's reservation holds its own
   * row (two fillers of one pool serialise there and count each other's rows) and places each
   * member like a create (hosts.place: the host's lock and room; the image's host for a built one).
   */
  private async reserveForOrganizations(upTo: number): Promise<{ row: WarmPoolMember; host: HostRecord; launch: MemberLaunch }[]> {
    const pools = await warmPoolRepository(this.db).poolsMissingMembers();
    const out: { row: WarmPoolMember; host: HostRecord; launch: MemberLaunch }[] = [];
    for (const candidate of pools) {
      if (out.length >= upTo) break;
      if (candidate.missing <= 0) continue;
      try {
        out.push(...(await this.db.transaction(async (tx) => {
          const members = warmPoolRepository(tx);
          const pool = await members.lockOrganizationPool(candidate.id);
          if (!pool) return [];
          const have = await members.countOfPool(pool.id);
          const n = Math.min(upTo - out.length, pool.pool - have);
          const rows: { row: WarmPoolMember; host: HostRecord; launch: MemberLaunch }[] = [];
          for (let i = 0; i < n; i++) {
            // In the pool's region (Daytona's target), as a create with that target would be.
            const host = await this.where.hosts.place(tx, { cpu: pool.cpu, memoryMiB: pool.memory_mib, diskGiB: pool.disk_gib, constraints: { region: pool.region }, ...(pool.host_id ? { fixed: { hostId: pool.host_id, what: `the layers of image ${pool.snapshot}` } } : {}) });
            const row = { id: newSandboxId(), hostId: host.id, image: pool.image, cpu: pool.cpu, memoryMiB: pool.memory_mib, diskGiB: pool.disk_gib, poolId: pool.id };
            await members.insertWarming({ ...row, ownerInstanceId: this.instanceId });
            const env = typeof pool.env === 'string' ? (JSON.parse(pool.env) as Record<string, string>) : pool.env;
            rows.push({ row, host, launch: { hostImage: pool.host_image ?? pool.image, layersSnapshotId: pool.layers_snapshot_id, env } });
          }
          return rows;
        })));
      } catch (err) {
        // No room (or the image's host is gone): the pool says so (Daytona's errorReason) and waits.
        const e = toNestboxError(err);
        if (e.code !== 'capacity_exhausted' && e.code !== 'host_unavailable') throw err;
        await this.poolFailed(candidate.id, e.message);
      }
    }
    return out;
  }

  private async poolFailed(poolId: string, reason: string): Promise<void> {
    await warmPoolRepository(this.db).setPoolError(poolId, reason);
  }

  /**
   * Inserts `warming` rows for what `t` lacks on `host`, up to `upTo`, in one transaction that
   * holds the host's row (placement's lock, which also checks the host has room for them).
   */
  private async reserve(host: HostRecord, t: WarmPoolTarget, upTo: number): Promise<WarmPoolMember[]> {
    return this.db.transaction(async (tx) => {
      // The host's row first: a second filler (this replica's next pass, another replica) waits here and then counts these rows.
      await hostRepository(tx).lockAlive(this.where.hosts.liveWithinMs, [host.id]);
      const members = warmPoolRepository(tx);
      const have = await members.countOnHost(host.id, t);
      const n = Math.min(upTo, this.targetOf(t) - have);
      if (n <= 0) return [];
      await this.where.hosts.place(tx, { cpu: t.cpu * n, memoryMiB: t.memoryMiB * n, diskGiB: t.diskGiB * n, fixed: { hostId: host.id, what: 'the warm pool' } });
      const rows: WarmPoolMember[] = [];
      for (let i = 0; i < n; i++) {
        const row = { id: newSandboxId(), hostId: host.id, image: t.image, cpu: t.cpu, memoryMiB: t.memoryMiB, diskGiB: t.diskGiB };
        await members.insertWarming({ ...row, ownerInstanceId: this.instanceId });
        rows.push(row);
      }
      return rows;
    });
  }

  private async launch(row: WarmPoolMember, host: HostRecord, organization?: MemberLaunch): Promise<void> {
    const client = this.where.hosts.clientForRecord(host);
    try {
      await client.createSandbox({
        id: row.id,
        image: organization?.hostImage ?? row.image,
        ...(organization?.layersSnapshotId ? { snapshot: organization.layersSnapshotId } : {}),
        cpu: row.cpu,
        memoryMiB: row.memoryMiB,
        env: organization?.env ?? {},
        // The default create's policy, so claiming it for a default create changes no rule (the
        // host skips the nft transaction). Nothing of anyone's runs in it before a claim, and the
        // claim puts the create's own policy in force before the create answers.
        egress: { mode: 'allow-all' },
        diskGiB: row.diskGiB,
        diskInodes: Math.max(1024, row.diskGiB * this.options.diskInodesPerGiB),
        warm: true,
      } as Parameters<typeof client.createSandbox>[0]);
    } catch (err) {
      const e = toNestboxError(err);
      if (e.code === 'not_supported') this.unsupportedHosts.add(host.id);
      this.logger.warn({ hostId: host.id, sandboxId: row.id, err: e.message }, 'warm pool: a member could not be started');
      if (row.poolId) await this.poolFailed(row.poolId, `a warm sandbox could not be started: ${e.message}`);
      await warmPoolRepository(this.db).removeWarming(row.id);
      await client.destroySandbox(row.id).catch(() => undefined);
      return;
    }
    // Its row went meanwhile (a drain, or another replica took it for orphaned): nobody will claim it.
    if (!(await warmPoolRepository(this.db).markReady(row.id))) await client.destroySandbox(row.id).catch(() => undefined);
    else if (row.poolId) await warmPoolRepository(this.db).clearPoolError(row.poolId);
  }

  private async destroyAll(rows: Row[], why: string): Promise<void> {
    if (rows.length === 0) return;
    this.logger.info({ count: rows.length }, `warm pool: removing ${rows.length} member(s): ${why}`);
    await Promise.all(rows.map(async (r) => {
      try {
        await (await this.where.hosts.clientFor(r.host_id)).destroySandbox(r.id);
      } catch (err) {
        this.logger.warn({ hostId: r.host_id, sandboxId: r.id, err: toNestboxError(err).message }, 'warm pool: could not remove a member from its host');
      }
    }));
  }
}
