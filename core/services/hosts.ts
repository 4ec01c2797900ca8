import { createHmac, timingSafeEqual } from 'node:crypto';
import type { Db } from '../store/db.js';
import { hostRepository } from '../store/repositories/hosts.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { NestboxError } from '../errors.js';
import { applyEvent } from '../lifecycle.js';
import type { SandboxStateEvents } from '../sandbox-events.js';
import { EVENTS } from '../state-machine.js';
import type { HostClient, HostClientFactory, HostSandboxRuntime } from '../host-client.js';
import { silentLogger, type Logger } from '../logger.js';
import type { HostRecord } from '../types.js';
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
}

export class HostService {
  private readonly clients = new Map<string, { url: string; client: HostClient }>();
  private readonly records = new Map<string, { at: number; host: HostRecord }>();
  /** Told of every placement that found no host (the metrics' placement failures); set by the composition root. */
  onPlacementFailure?: (reason: PlacementFailureReason) => void;

  constructor(
    private readonly db: Db,
    private readonly clientFactory: HostClientFactory,
    /** A host that has not heartbeated for this long is not offered new sandboxes. */
    private readonly hostTimeoutMs: number,
    private readonly logger: Logger = silentLogger,
    /** Where a sandbox found gone from its host is published as an `error` state. */
    private readonly events?: SandboxStateEvents,
  ) {}

  async heartbeat(input: HeartbeatInput): Promise<HostRecord> {
    const previous = await hostRepository(this.db).findById(input.hostId);
    const host = await hostRepository(this.db).upsertHeartbeat({ id: input.hostId, url: input.url, driver: input.driver, capabilities: input.capabilities }, new Date());
    this.records.set(host.id, { at: Date.now(), host });
    if (!previous || previous.url !== input.url) this.logger.info({ hostId: input.hostId, url: input.url }, `host ${input.hostId} (${input.driver}) registered at ${input.url}`);
    if (previous) await this.noticeVanishedSandboxes(input.hostId, input.sandboxes, previous.lastHeartbeatAt);
    return host;
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
    return (await hostRepository(this.db).listAlive(new Date(Date.now() - this.hostTimeoutMs))).length;
  }

  /** Least-loaded live host. */
  async pickHost(): Promise<HostRecord> {
    const alive = await hostRepository(this.db).listAlive(new Date(Date.now() - this.hostTimeoutMs));
    if (alive.length === 0) {
      this.onPlacementFailure?.('no_host_alive');
      throw new NestboxError('host_unavailable', 'no sandbox host is available right now; try again shortly');
    }
    const load = await sandboxRepository(this.db).countActiveByHost();
    return alive.reduce((best, h) => ((load.get(h.id) ?? 0) < (load.get(best.id) ?? 0) ? h : best));
  }

  /** A specific host (where a snapshot lives), if it is alive. */
  async aliveHost(hostId: string): Promise<HostRecord> {
    const host = await hostRepository(this.db).findById(hostId);
    if (!host || host.lastHeartbeatAt.getTime() < Date.now() - this.hostTimeoutMs) {
      this.onPlacementFailure?.('source_host_unavailable');
      throw new NestboxError('host_unavailable', `host ${hostId}, which holds the snapshot, is not available right now`);
    }
    return host;
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
