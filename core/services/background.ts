import type { Db } from '../store/db.js';
import { sandboxRepository, type SandboxPatch } from '../store/repositories/sandboxes.js';
import { controlPlaneInstanceRepository } from '../store/repositories/control-plane-instances.js';
import { toNestboxError } from '../errors.js';
import { newOperationId } from '../ids.js';
import { TRANSITIONAL_STATES } from '../state-machine.js';
import type { Sandbox } from '../types.js';
import type { Knex } from 'knex';
import type { IdempotencyService } from './idempotency.js';
import type { HostService } from './hosts.js';
import type { SandboxService } from './sandboxes.js';

export interface BackgroundOptions {
  instanceId: string;
  /** How often this instance says it is alive, sweeps timeouts and reconciles. */
  intervalMs: number;
  /** An instance silent for this long is dead; its in-flight operations are taken over. */
  instanceTimeoutMs: number;
  log: (message: string) => void;
}

const CLEARED: SandboxPatch = { operation: null, operationId: null, operationOwner: null, operationStartedAt: null };

/**
 * The control plane's background duties. All coordination goes through the database, so any
 * number of replicas can run this loop: timeouts are claimed with SKIP LOCKED and orphaned
 * operations are taken over with a compare-and-set on their operation id.
 */
export class BackgroundJobs {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly sandboxes: SandboxService,
    private readonly idempotency: IdempotencyService,
    private readonly opts: BackgroundOptions,
  ) {}

  async start(): Promise<void> {
    await this.tick();
    this.timer = setInterval(() => void this.tick(), this.opts.intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.running;
    await controlPlaneInstanceRepository(this.db).remove(this.opts.instanceId).catch(() => undefined);
  }

  /** One pass; never overlaps with itself and never throws. */
  tick(): Promise<void> {
    if (this.running) return this.running;
    this.running = (async () => {
      try {
        await controlPlaneInstanceRepository(this.db).heartbeat(this.opts.instanceId, new Date());
        await this.reconcileOrphans();
        await this.stopExpired();
        await this.applyIdlePolicy();
        await this.deleteAfterStop();
        await this.idempotency.removeExpired();
      } catch (err) {
        this.opts.log(`background pass failed: ${toNestboxError(err).message}`);
      } finally {
        this.running = undefined;
      }
    })();
    return this.running;
  }

  async stopExpired(): Promise<number> {
    const claimed = await sandboxRepository(this.db).claimExpired(new Date(), 20, () => ({
      operation: 'stop',
      operationId: newOperationId(),
      operationOwner: this.opts.instanceId,
      operationStartedAt: new Date(),
    }));
    for (const sandbox of claimed) {
      this.opts.log(`sandbox ${sandbox.id} reached its timeout; stopping it`);
      await this.sandboxes.finishStop(sandbox, sandbox.operationId!, 'timeout').catch((err) => {
        this.opts.log(`timeout stop of ${sandbox.id} failed: ${toNestboxError(err).message}`);
      });
    }
    return claimed.length;
  }

  private claimPatch(operation: string, state: SandboxPatch['state']): () => SandboxPatch {
    return () => ({ state, operation, operationId: newOperationId(), operationOwner: this.opts.instanceId, operationStartedAt: new Date() });
  }

  /** Running sandboxes without activity for their idle timeout are paused (or stopped). */
  async applyIdlePolicy(): Promise<number> {
    const now = Date.now();
    const repo = sandboxRepository(this.db);
    // The idle timeout is per sandbox, so the cut-off is computed in SQL.
    const idle = (action: 'pause' | 'stop') => ({
      state: 'running' as const,
      where: (q: Knex.QueryBuilder) =>
        q.where('idle_timeout_seconds', '>', 0).where({ idle_action: action }).whereRaw(`last_activity_at + make_interval(secs => idle_timeout_seconds) <= ?`, [new Date(now)]),
    });
    const toPause = await repo.claim(idle('pause'), 20, this.claimPatch('pause', 'pausing'));
    for (const sandbox of toPause) {
      this.opts.log(`sandbox ${sandbox.id} idle for ${sandbox.idleTimeoutSeconds} s; pausing it`);
      await this.sandboxes.finishPause(sandbox, sandbox.operationId!, 'idle').catch((err) => this.opts.log(`idle pause of ${sandbox.id} failed: ${toNestboxError(err).message}`));
    }
    const toStop = await repo.claim(idle('stop'), 20, this.claimPatch('stop', 'stopping'));
    for (const sandbox of toStop) {
      this.opts.log(`sandbox ${sandbox.id} idle for ${sandbox.idleTimeoutSeconds} s; stopping it`);
      await this.sandboxes.finishStop(sandbox, sandbox.operationId!, 'idle').catch((err) => this.opts.log(`idle stop of ${sandbox.id} failed: ${toNestboxError(err).message}`));
    }
    return toPause.length + toStop.length;
  }

  /** Stopped sandboxes with an auto-delete delay that has passed are deleted. */
  async deleteAfterStop(): Promise<number> {
    const claimed = await sandboxRepository(this.db).claim(
      {
        state: 'stopped',
        where: (q) => q.whereNotNull('auto_delete_seconds').whereNotNull('stopped_at').whereRaw(`stopped_at + make_interval(secs => auto_delete_seconds) <= ?`, [new Date()]),
      },
      20,
      this.claimPatch('delete', 'deleting'),
    );
    for (const sandbox of claimed) {
      this.opts.log(`sandbox ${sandbox.id} stopped ${sandbox.autoDeleteSeconds} s ago; deleting it (auto-delete)`);
      await this.sandboxes.finishDelete(sandbox, sandbox.operationId!).catch((err) => this.opts.log(`auto-delete of ${sandbox.id} failed: ${toNestboxError(err).message}`));
    }
    return claimed.length;
  }

  /** Finish or fail operations whose owner died (kill -9 of a control plane mid-request). */
  async reconcileOrphans(): Promise<number> {
    const others = await controlPlaneInstanceRepository(this.db).aliveSince(new Date(Date.now() - this.opts.instanceTimeoutMs));
    // This instance is alive by definition, whatever its last recorded heartbeat says.
    const alive = [...new Set([...others, this.opts.instanceId])];
    const orphans = await sandboxRepository(this.db).findOrphanedOperations(TRANSITIONAL_STATES, alive, 50);
    for (const sandbox of orphans) {
      await this.takeOver(sandbox).catch((err) => this.opts.log(`reconcile of ${sandbox.id} failed: ${toNestboxError(err).message}`));
    }
    return orphans.length;
  }

  private async takeOver(orphan: Sandbox): Promise<void> {
    const repo = sandboxRepository(this.db);
    // Claim it first, so two reconcilers never act on the same orphan.
    const operationId = newOperationId();
    const sandbox = await repo.transition(orphan.id, [orphan.state], { operationId, operationOwner: this.opts.instanceId }, orphan.operationId ?? undefined);
    if (!sandbox) return;
    this.opts.log(`taking over interrupted ${sandbox.operation ?? sandbox.state} of sandbox ${sandbox.id}`);
    if (sandbox.state === 'stopping') {
      await this.sandboxes.finishStop(sandbox, operationId, 'user');
      return;
    }
    if (sandbox.state === 'deleting') {
      await this.sandboxes.finishDelete(sandbox, operationId);
      return;
    }
    // creating / starting / pausing / resuming: adopt when the host runs it, otherwise fail it.
    let runtime;
    try {
      runtime = sandbox.hostId ? await (await this.hosts.clientFor(sandbox.hostId)).getSandbox(sandbox.id) : undefined;
    } catch (err) {
      await repo.transition(sandbox.id, [sandbox.state], { state: 'error', ...CLEARED, errorMessage: `interrupted ${sandbox.state} and the host is unreachable: ${toNestboxError(err).message}` }, operationId);
      return;
    }
    if (runtime?.status === 'paused') {
      await repo.transition(sandbox.id, [sandbox.state], { state: 'paused', ...CLEARED, pausedAt: new Date(), pauseReason: sandbox.pauseReason ?? 'user' }, operationId);
      return;
    }
    if (runtime?.status === 'running') {
      const now = new Date();
      await repo.transition(sandbox.id, [sandbox.state], {
        state: 'running',
        ...CLEARED,
        startedAt: now,
        expiresAt: sandbox.timeoutSeconds === 0 ? null : new Date(now.getTime() + sandbox.timeoutSeconds * 1000),
      }, operationId);
      return;
    }
    const fallback = sandbox.state === 'starting' && runtime ? 'stopped' : 'error';
    await repo.transition(sandbox.id, [sandbox.state], { state: fallback, ...CLEARED, errorMessage: `the ${sandbox.operation ?? sandbox.state} operation was interrupted by a control-plane restart` }, operationId);
  }
}
