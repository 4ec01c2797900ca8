// Host-to-host transfers (issue 16): a snapshot's layers copied to the host a create was placed
// on, and an operator's move of a stopped sandbox to another host. The control plane moves no
// bytes itself: it asks the RECEIVING host agent to pull from the source host agent, handing it
// a token signed with the source host's own secret (core/transfer-token.ts) that reads only that
// snapshot chain or that sandbox's disk, for a few minutes (host/agent/transfer.ts).
//
// A move, as a state machine on the sandbox row (the sandbox stays `stopped` throughout, on its
// source host, until the one UPDATE that commits it):
//   claim    moving_to_host_id = target, move_lease_until = now + lease   (row locked, state stopped)
//   copy     snapshot layers the target lacks, then the disk (the target's import is all or
//            nothing: a failure or a kill -9 of its host agent leaves nothing there), the lease
//            renewed while it runs
//   commit   host_id = target, moved_from_host_id = source, moving_* cleared  (only if still ours
//            and still stopped: a delete or start meanwhile wins, and the target copy is removed)
//   cleanup  the source copy destroyed, moved_from_host_id cleared (retried by the source host's
//            heartbeats if the source was unreachable: HostService.heartbeat)
// A replica killed mid-move leaves a claim whose lease runs out: the sandbox is still on its
// source, intact; a start clears the stale claim, and a retried move takes it over, destroying
// whatever the dead attempt left on its target before copying again.
import type { Db } from '../store/db.js';
import { hostRepository } from '../store/repositories/hosts.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { snapshotRepository } from '../store/repositories/snapshots.js';
import { errors, NestboxError } from '../errors.js';
import { mintTransferToken, type TransferKind } from '../transfer-token.js';
import { requireScope } from './auth.js';
import type { HostService } from './hosts.js';
import type { HostSandboxSpec } from '../host-client.js';
import { silentLogger, type Logger } from '../logger.js';
import type { HostRecord, Principal, Sandbox, Snapshot } from '../types.js';

/** How long a transfer token may be used (the receiving agent fetches with it right away). */
const TOKEN_TTL_MS = 5 * 60_000;
/** A move's claim lasts this long unless renewed; renewed every third of it while bytes flow. */
export const MOVE_LEASE_MS = 30_000;

export interface MoveInput {
  /** The target host (any ready host with room otherwise). */
  hostId?: string;
}

export interface MoveResult {
  sandbox: Sandbox;
  fromHostId: string;
  toHostId: string;
  /** Snapshot layers copied to the target ahead of the disk. */
  layersCopied: string[];
  ms: number;
}

/** Whether a claim on a move is still held: pure, for the state checks and their unit tests. */
export function moveClaimHeld(claim: { movingToHostId: string | null; moveLeaseUntil: Date | null }, now: Date): boolean {
  return claim.movingToHostId !== null && claim.moveLeaseUntil !== null && claim.moveLeaseUntil.getTime() > now.getTime();
}

interface MoveColumns {
  moving_to_host_id: string | null;
  move_lease_until: Date | null;
  moved_from_host_id: string | null;
}

export class HostTransferService {
  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    /** The host secret of a host (deriveHostSecret of the master secret): tokens are signed with the source's. */
    private readonly hostSecretOf: (hostId: string) => string,
    /** The host-agent spec of a sandbox (SandboxService.hostSpec), for the target's record. */
    private readonly hostSpecOf: (sandbox: Sandbox) => HostSandboxSpec,
    private readonly logger: Logger = silentLogger,
  ) {}

  private token(source: HostRecord, kind: TransferKind, id: string): { url: string; token: string } {
    return { url: source.url, token: mintTransferToken(this.hostSecretOf(source.id), { host: source.id, kind, id, exp: Date.now() + TOKEN_TTL_MS }) };
  }

  // ---- snapshots -------------------------------------------------------------------------------

  /** Every host holding the snapshot's layers: its own host first, then the copies. */
  async holdersOf(snapshot: Snapshot): Promise<string[]> {
    const rows = (await this.db('snapshot_hosts').select('host_id').where({ snapshot_id: snapshot.id }).orderBy('created_at')) as { host_id: string }[];
    return [snapshot.hostId, ...rows.map((r) => r.host_id).filter((h) => h !== snapshot.hostId)];
  }

  /**
   * Makes sure `target` holds the snapshot (and its parents): copied from a live holder if not.
   * Idempotent; the copies made are recorded in snapshot_hosts.
   */
  async ensureSnapshotOn(snapshot: Snapshot, target: HostRecord, from?: HostRecord): Promise<string[]> {
    const holders = await this.holdersOf(snapshot);
    if (holders.includes(target.id) && !from) return [];
    let source = from;
    if (!source) {
      const live = await this.hosts.liveHostIds();
      const id = holders.find((h) => live.has(h));
      if (!id) throw new NestboxError('host_unavailable', `no host holding snapshot ${snapshot.name ?? snapshot.id} (${holders.join(', ')}) is live, so its layers cannot be copied to host ${target.id}; try again once one is back`, { hostIds: holders });
      source = (await hostRepository(this.db).findById(id))!;
    }
    const started = Date.now();
    const result = await this.hosts.clientForRecord(target).importSnapshot(snapshot.id, this.token(source, 'snapshot', snapshot.id));
    const copied = result.snapshotIds;
    for (const id of new Set([snapshot.id, ...copied])) {
      await this.db('snapshot_hosts').insert({ snapshot_id: id, host_id: target.id }).onConflict(['snapshot_id', 'host_id']).ignore();
    }
    if (copied.length) this.logger.info({ snapshotId: snapshot.id, fromHostId: source.id, toHostId: target.id, ms: Date.now() - started }, `snapshot ${snapshot.id}: layers ${copied.join(', ')} copied from host ${source.id} to host ${target.id} in ${Date.now() - started} ms`);
    return copied;
  }

  /** The hosts holding copies (not the snapshot's own host), for its delete. */
  async copyHostsOf(snapshotId: string): Promise<string[]> {
    return ((await this.db('snapshot_hosts').select('host_id').where({ snapshot_id: snapshotId })) as { host_id: string }[]).map((r) => r.host_id);
  }

  /** Deletes the snapshot's copies on other hosts (best effort: a host that refuses keeps its row, a later delete retries). */
  async dropCopies(snapshotId: string): Promise<void> {
    for (const hostId of await this.copyHostsOf(snapshotId)) {
      try {
        await (await this.hosts.clientFor(hostId)).deleteSnapshot(snapshotId);
        await this.db('snapshot_hosts').where({ snapshot_id: snapshotId, host_id: hostId }).delete();
      } catch (err) {
        this.logger.warn({ snapshotId, hostId, err: String(err) }, `snapshot ${snapshotId}: its copy on host ${hostId} could not be deleted`);
      }
    }
  }

  // ---- moves -----------------------------------------------------------------------------------

  /**
   * A start must not run while a move copies the disk (the copy would miss what the start
   * writes). A stale claim (its replica died) is cleared here and its target cleaned.
   */
  async assertNotMoving(sandboxId: string): Promise<void> {
    const row = (await this.db('sandboxes').select('moving_to_host_id', 'move_lease_until').where({ id: sandboxId }).first()) as MoveColumns | undefined;
    if (!row?.moving_to_host_id) return;
    if (moveClaimHeld({ movingToHostId: row.moving_to_host_id, moveLeaseUntil: row.move_lease_until }, new Date())) {
      throw new NestboxError('conflict', `sandbox ${sandboxId} is being moved to host ${row.moving_to_host_id}; start it once the move is done`, { movingToHostId: row.moving_to_host_id });
    }
    const cleared = await this.db('sandboxes').where({ id: sandboxId, moving_to_host_id: row.moving_to_host_id }).update({ moving_to_host_id: null, move_lease_until: null });
    if (cleared) await this.destroyQuietly(row.moving_to_host_id, sandboxId, 'an abandoned move');
  }

  /** Moves a stopped sandbox to another host (operators: platform:hosts). Safe to retry. */
  async move(principal: Principal, sandboxId: string, input: MoveInput): Promise<MoveResult> {
    requireScope(principal, 'platform:hosts');
    const started = Date.now();
    const repo = sandboxRepository(this.db);
    const found = await repo.findById(sandboxId);
    if (!found || found.state === 'deleted') throw errors.notFound('sandbox', sandboxId);
    if (found.state !== 'stopped') throw errors.invalidState('sandbox', sandboxId, found.state, ['stopped'], 'move (stop it first)');
    if (found.volumeMounts?.length) throw new NestboxError('conflict', `sandbox ${sandboxId} mounts volumes (${found.volumeMounts.map((m) => m.name).join(', ')}) that live on its host; it cannot be moved`, { field: 'volumes' });
    const fromHostId = found.hostId!;
    if (input.hostId !== undefined) await this.checkTarget(input.hostId, fromHostId, sandboxId);
    const source = await hostRepository(this.db).findById(fromHostId);
    if (!source || source.lostAt) throw new NestboxError('host_unavailable', `sandbox ${sandboxId}'s host ${fromHostId} is ${source ? 'lost' : 'not registered'}: its disk cannot be read to move it`, { hostId: fromHostId, ...(source?.lostAt ? { reason: 'host_lost' } : {}) });

    // claim (and place), in one transaction with the row locked
    const { target, staleTarget } = await this.db.transaction(async (tx) => {
      const row = (await tx('sandboxes').select('state', 'host_id', 'moving_to_host_id', 'move_lease_until').where({ id: sandboxId }).forUpdate().first()) as (MoveColumns & { state: string; host_id: string }) | undefined;
      if (!row || row.state !== 'stopped' || row.host_id !== fromHostId) throw errors.invalidState('sandbox', sandboxId, row?.state ?? 'deleted', ['stopped'], 'move');
      if (moveClaimHeld({ movingToHostId: row.moving_to_host_id, moveLeaseUntil: row.move_lease_until }, new Date())) {
        throw new NestboxError('conflict', `sandbox ${sandboxId} is already being moved to host ${row.moving_to_host_id}; retry once that move is done or its claim runs out (${MOVE_LEASE_MS / 1000} s after its replica stops renewing it)`, { movingToHostId: row.moving_to_host_id });
      }
      let placed: HostRecord;
      try {
        placed = await this.hosts.place(tx, { cpu: found.cpu, memoryMiB: found.memoryMiB, diskGiB: found.diskGiB ?? 0, constraints: input.hostId ? { hostId: input.hostId } : undefined, excludeHostIds: [fromHostId] });
      } catch (err) {
        // A named target that cannot take it is the operator's choice to revisit, not a wait.
        if (input.hostId && err instanceof NestboxError && (err.code === 'capacity_exhausted' || err.code === 'validation_failed')) throw new NestboxError('conflict', `host ${input.hostId} cannot take sandbox ${sandboxId}: ${err.message}`, { hostId: input.hostId });
        throw err;
      }
      await tx('sandboxes').where({ id: sandboxId }).update({ moving_to_host_id: placed.id, move_lease_until: new Date(Date.now() + MOVE_LEASE_MS) });
      return { target: placed, staleTarget: row.moving_to_host_id };
    });
    // A takeover: what the dead attempt may have left on its target goes first.
    if (staleTarget) await this.destroyQuietly(staleTarget, sandboxId, 'an abandoned move');

    const renew = setInterval(() => {
      void this.db('sandboxes')
        .where({ id: sandboxId, moving_to_host_id: target.id })
        .update({ move_lease_until: new Date(Date.now() + MOVE_LEASE_MS) })
        .catch((err: unknown) => this.logger.warn({ sandboxId, err: String(err) }, 'move: renewing the claim failed'));
    }, MOVE_LEASE_MS / 3);
    renew.unref();
    let layersCopied: string[] = [];
    try {
      const snapshot = found.sourceSnapshotId ? await snapshotRepository(this.db).findById(found.sourceSnapshotId) : undefined;
      // The source holds every layer its sandbox mounts: copy the chain from there.
      if (snapshot) layersCopied = await this.ensureSnapshotOn(snapshot, target, source);
      await this.hosts.clientForRecord(target).importSandbox(this.hostSpecOf(found), this.token(source, 'sandbox', sandboxId));
    } catch (err) {
      clearInterval(renew);
      await this.destroyQuietly(target.id, sandboxId, 'a failed move');
      await this.db('sandboxes').where({ id: sandboxId, moving_to_host_id: target.id }).update({ moving_to_host_id: null, move_lease_until: null });
      throw err;
    }
    clearInterval(renew);

    // commit: the one write that moves it
    const committed = await this.db('sandboxes')
      .where({ id: sandboxId, moving_to_host_id: target.id, state: 'stopped', host_id: fromHostId })
      .update({ host_id: target.id, moved_from_host_id: fromHostId, moving_to_host_id: null, move_lease_until: null, updated_at: new Date() });
    if (!committed) {
      await this.destroyQuietly(target.id, sandboxId, 'a move overtaken by a delete or start');
      const now = await repo.findById(sandboxId);
      throw errors.invalidState('sandbox', sandboxId, now?.state ?? 'deleted', ['stopped'], 'finish moving');
    }
    await this.cleanUpSource(sandboxId, fromHostId);
    const moved = (await repo.findById(sandboxId))!;
    const ms = Date.now() - started;
    this.logger.info({ sandboxId, fromHostId, toHostId: target.id, ms }, `sandbox ${sandboxId} moved from host ${fromHostId} to host ${target.id} in ${ms} ms`);
    return { sandbox: moved, fromHostId, toHostId: target.id, layersCopied, ms };
  }

  /** Moves every stopped sandbox off a cordoned or draining host, one at a time; reports each outcome. */
  async evacuate(principal: Principal, hostId: string, input: MoveInput = {}): Promise<{ moved: MoveResult[]; failed: { sandboxId: string; code: string; message: string }[]; skipped: { sandboxId: string; state: string }[] }> {
    requireScope(principal, 'platform:hosts');
    const host = await hostRepository(this.db).findById(hostId);
    if (!host) throw errors.notFound('host', hostId);
    if (host.adminState === 'ready') throw new NestboxError('conflict', `host ${hostId} is ready; cordon or drain it before moving its sandboxes away`, { hostId });
    const moved: MoveResult[] = [];
    const failed: { sandboxId: string; code: string; message: string }[] = [];
    const skipped: { sandboxId: string; state: string }[] = [];
    const all = await sandboxRepository(this.db).findByHost(hostId, ['stopped', 'running', 'paused', 'error']);
    for (const sandbox of all.slice(0, 10_000)) {
      if (sandbox.state !== 'stopped') {
        skipped.push({ sandboxId: sandbox.id, state: sandbox.state });
        continue;
      }
      try {
        moved.push(await this.move(principal, sandbox.id, input));
      } catch (err) {
        const e = err instanceof NestboxError ? err : new NestboxError('internal', String(err));
        failed.push({ sandboxId: sandbox.id, code: e.code, message: e.message });
      }
    }
    return { moved, failed, skipped };
  }

  /** The copy a committed move left on its source: destroyed, and the marker cleared once it is. */
  async cleanUpSource(sandboxId: string, fromHostId: string): Promise<void> {
    try {
      await (await this.hosts.clientFor(fromHostId)).destroySandbox(sandboxId);
      await this.db('sandboxes').where({ id: sandboxId, moved_from_host_id: fromHostId }).update({ moved_from_host_id: null });
    } catch (err) {
      this.logger.warn({ sandboxId, hostId: fromHostId, err: String(err) }, `sandbox ${sandboxId} moved, but its old copy on host ${fromHostId} could not be destroyed yet; retried when that host heartbeats`);
    }
  }

  /** The sandboxes a host still holds that moved away from it (for its heartbeat to clean). */
  async movedAwayFrom(hostId: string, reported: string[]): Promise<string[]> {
    if (reported.length === 0) return [];
    const rows = (await this.db('sandboxes').select('id').where({ moved_from_host_id: hostId }).whereNot({ host_id: hostId }).whereIn('id', reported)) as { id: string }[];
    return rows.map((r) => r.id);
  }

  private async checkTarget(hostId: string, fromHostId: string, sandboxId: string): Promise<void> {
    if (hostId === fromHostId) throw new NestboxError('conflict', `sandbox ${sandboxId} is already on host ${hostId}`, { hostId });
    const host = await hostRepository(this.db).findById(hostId);
    if (!host) throw errors.notFound('host', hostId);
    if (host.lostAt) throw new NestboxError('conflict', `host ${hostId} is lost (no heartbeat since ${host.lastHeartbeatAt.toISOString()}); a sandbox is not moved onto it`, { hostId, hostState: 'lost' });
    if (host.adminState !== 'ready') throw new NestboxError('conflict', `host ${hostId} is ${host.adminState}: no sandboxes are moved onto it (uncordon it, or pick another host)`, { hostId, hostState: host.adminState });
  }

  private async destroyQuietly(hostId: string, sandboxId: string, what: string): Promise<void> {
    try {
      await (await this.hosts.clientFor(hostId)).destroySandbox(sandboxId);
    } catch (err) {
      this.logger.warn({ sandboxId, hostId, err: String(err) }, `sandbox ${sandboxId}: removing what ${what} left on host ${hostId} failed`);
    }
  }
}
