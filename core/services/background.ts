import type { Db } from '../store/db.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { controlPlaneInstanceRepository } from '../store/repositories/control-plane-instances.js';
import { errors, toNestboxError } from '../errors.js';
import { hostViewOf, Lifecycle } from '../lifecycle.js';
import { OPERATIONS, TRANSITIONAL_STATES, type HostView } from '../state-machine.js';
import type { Sandbox } from '../types.js';
import type { SandboxStateEvents } from '../sandbox-events.js';
import type { Logger } from '../logger.js';
import type { Knex } from 'knex';
import type { IdempotencyService } from './idempotency.js';
import type { HostService } from './hosts.js';
import type { SandboxService } from './sandboxes.js';
import type { ControlPlaneMetrics } from '../metrics.js';

export interface BackgroundOptions {
  instanceId: string;
  /** How often this instance says it is alive, sweeps timeouts and reconciles. */
  intervalMs: number;
  /** An instance silent for this long (database clock) is dead; its in-flight operations are taken over. */
  instanceTimeoutMs: number;
  /** Lines about one sandbox carry `sandboxId` and the `operation` the pass runs on it. */
  logger: Logger;
  /** Where claims and takeovers publish the states they write (the server's one bus). */
  events?: SandboxStateEvents;
  /** More duties, each run at most every `everyMs` (image builds' orphans, garbage collection). */
  passes?: { name: string; everyMs: number; run: () => Promise<unknown> }[];
  /** Where each step's duration and failures are recorded (nestbox_background_pass_*). */
  metrics?: Pick<ControlPlaneMetrics, 'passDuration' | 'passFailures'>;
}

/** Node's timers take at most 2^31-1 ms; a later deadline is re-armed by the periodic pass long before. */
const MAX_TIMER_MS = 2 ** 31 - 1;
/**
 * How soon the deadline timer tries again when the earliest deadline has already passed but its
 * row could not be claimed (another replica holds it and is acting on it): soon, not in a loop.
 */
const PAST_DEADLINE_RETRY_MS = 100;

/**
 * The control plane's background duties. All coordination goes through the database, so any
 * number of replicas can run this loop: timeouts are claimed with SKIP LOCKED and orphaned
 * operations are taken over with a compare-and-set on their operation id.
 *
 * Deadlines (a running sandbox's timeout, a stopped one's auto-delete) are not left to the
 * periodic pass, which would honour them up to an interval late: each replica keeps one timer at
 * the earliest deadline it knows. The sandbox service reports every deadline this process sets
 * (create, start, setTimeout, keep-alive); the periodic pass and every expiry re-read the
 * earliest one from the database, so deadlines another replica set are picked up within an
 * interval. Whichever replica's timer fires first claims the rows (SKIP LOCKED plus the state
 * compare-and-set), so two replicas never act on the same sandbox.
 */
export class BackgroundJobs {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  /** When the deadline timer fires (ms since the epoch), if armed. */
  private deadlineArmedAt: number | undefined;
  private expiring: Promise<void> | undefined;
  /** A deadline that fell due while an expiry pass ran: run another one after it. */
  private expireAgain = false;
  private stopped = false;
  private readonly passRanAt = new Map<string, number>();
  /** Claims and takeovers write through the engine, like every other state change. */
  private readonly lifecycle: Lifecycle;

  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly sandboxes: SandboxService,
    private readonly idempotency: IdempotencyService,
    private readonly opts: BackgroundOptions,
  ) {
    this.lifecycle = new Lifecycle(db, opts.instanceId, opts.events);
    sandboxes.onDeadline((at) => this.noteDeadline(at));
  }

  async start(): Promise<void> {
    await this.tick();
    this.timer = setInterval(() => void this.tick(), this.opts.intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.disarm();
    await this.running;
    await this.expiring;
    await controlPlaneInstanceRepository(this.db).remove(this.opts.instanceId).catch(() => undefined);
  }

  /** One pass; never overlaps with itself and never throws. */
  tick(): Promise<void> {
    if (this.running) return this.running;
    this.running = (async () => {
      try {
        await this.timed('heartbeat', () => controlPlaneInstanceRepository(this.db).heartbeat(this.opts.instanceId));
        await this.timed('reconcile', () => this.reconcileOrphans());
        await this.timed('expire', () => this.expireDue());
        await this.timed('idle', () => this.applyIdlePolicy());
        await this.timed('suspended', () => this.stopSuspended());
        await this.timed('idempotency', () => this.idempotency.removeExpired());
        for (const pass of this.opts.passes ?? []) {
          if (Date.now() - (this.passRanAt.get(pass.name) ?? 0) < pass.everyMs) continue;
          this.passRanAt.set(pass.name, Date.now());
          await this.timed(pass.name, pass.run).catch((err) => this.opts.logger.warn({ pass: pass.name, err: toNestboxError(err).message }, `background pass ${pass.name} failed`));
        }
        // Deadlines set by other replicas (and any this process missed) are found here.
        this.armAt(await sandboxRepository(this.db).nextDeadline());
      } catch (err) {
        this.opts.logger.error(`background pass failed: ${toNestboxError(err).message}`);
      } finally {
        this.running = undefined;
      }
    })();
    return this.running;
  }

  /** Runs one step of the loop, timing it (and counting its failure) in the metrics when there are any. */
  private async timed<T>(pass: string, step: () => Promise<T>): Promise<T> {
    const metrics = this.opts.metrics;
    if (!metrics) return step();
    const started = performance.now();
    try {
      return await step();
    } catch (err) {
      metrics.passFailures.inc({ pass });
      throw err;
    } finally {
      metrics.passDuration.observe({ pass }, (performance.now() - started) / 1000);
    }
  }

  /**
   * A deadline this process just set: the timer fires at it unless it is already armed earlier.
   * A deadline moved later leaves the timer where it was; it then fires, finds nothing due and
   * re-arms at the next one.
   */
  noteDeadline(at: Date | null): void {
    if (at === null || this.stopped) return;
    if (this.deadlineArmedAt === undefined || at.getTime() < this.deadlineArmedAt) this.armAt(at);
  }

  /**
   * Arm the one timer at `at`, unless it already fires earlier. Never disarmed for lack of a
   * deadline (null): a read may predate a deadline this process just noted, and a timer that
   * fires with nothing due only re-arms.
   */
  private armAt(at: Date | null): void {
    if (this.stopped || at === null) return;
    if (this.deadlineArmedAt !== undefined && this.deadlineArmedAt <= at.getTime()) return;
    this.disarm();
    const delay = Math.min(MAX_TIMER_MS, Math.max(0, at.getTime() - Date.now()));
    this.deadlineArmedAt = Date.now() + delay;
    this.deadlineTimer = setTimeout(() => void this.onDeadline(), delay);
    this.deadlineTimer.unref();
  }

  private disarm(): void {
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    this.deadlineTimer = undefined;
    this.deadlineArmedAt = undefined;
  }

  /** The timer fired: act on what is due, then arm at the next deadline the database has. */
  private async onDeadline(): Promise<void> {
    this.deadlineTimer = undefined;
    this.deadlineArmedAt = undefined;
    if (this.expiring) {
      this.expireAgain = true;
      return;
    }
    this.expiring = (async () => {
      try {
        do {
          this.expireAgain = false;
          await this.expireDue();
        } while (this.expireAgain && !this.stopped);
        const next = await sandboxRepository(this.db).nextDeadline();
        // Still due after a pass: another replica holds those rows (and acts on them); look again soon.
        this.armAt(next && next.getTime() <= Date.now() ? new Date(Date.now() + PAST_DEADLINE_RETRY_MS) : next);
      } catch (err) {
        this.opts.logger.error(`deadline pass failed: ${toNestboxError(err).message}`);
        // The periodic pass re-arms the timer from the database.
      } finally {
        this.expiring = undefined;
      }
    })();
    await this.expiring;
  }

  /** Everything whose deadline passed: timeouts (kill or stop) and auto-deletes. */
  async expireDue(): Promise<void> {
    await this.deleteExpired();
    await this.stopExpired();
    await this.deleteAfterStop();
  }

  /** Sandboxes deleted as soon as they stop (auto-delete 0) are deleted at their timeout, in one step. */
  async deleteExpired(): Promise<number> {
    const claimed = await this.lifecycle.claim(OPERATIONS.delete, 'running', (patch, db) => sandboxRepository(db).claimExpired(new Date(), 20, patch, 'at-once'), 'timeout');
    for (const sandbox of claimed) {
      const log = this.opts.logger.child({ sandboxId: sandbox.id, operation: 'delete' });
      log.info('reached its timeout; deleting it (auto-delete when stopped: 0 s)');
      await this.sandboxes.finishDelete(sandbox, sandbox.operationId!).catch((err) => {
        log.error(`timeout delete failed: ${toNestboxError(err).message}`);
      });
    }
    return claimed.length;
  }

  async stopExpired(): Promise<number> {
    const claimed = await this.lifecycle.claim(OPERATIONS.stop, 'running', (patch, db) => sandboxRepository(db).claimExpired(new Date(), 20, patch), 'timeout');
    for (const sandbox of claimed) {
      const log = this.opts.logger.child({ sandboxId: sandbox.id, operation: 'stop' });
      log.info('reached its timeout; stopping it');
      await this.sandboxes.finishStop(sandbox, sandbox.operationId!, 'timeout').catch((err) => {
        log.error(`timeout stop failed: ${toNestboxError(err).message}`);
      });
    }
    return claimed.length;
  }

  /** Running sandboxes without activity for their idle timeout are paused (or stopped). */
  async applyIdlePolicy(): Promise<number> {
    const now = Date.now();
    // The idle timeout is per sandbox, so the cut-off is computed in SQL.
    const idle = (action: 'pause' | 'stop') => ({
      state: 'running' as const,
      where: (q: Knex.QueryBuilder) =>
        q.where('idle_timeout_seconds', '>', 0).where({ idle_action: action }).whereRaw(`last_activity_at + make_interval(secs => idle_timeout_seconds) <= ?`, [new Date(now)]),
    });
    const toPause = await this.lifecycle.claim(OPERATIONS.pause, 'running', (patch, db) => sandboxRepository(db).claim(idle('pause'), 20, patch), 'idle');
    for (const sandbox of toPause) {
      const log = this.opts.logger.child({ sandboxId: sandbox.id, operation: 'pause' });
      log.info(`idle for ${sandbox.idleTimeoutSeconds} s; pausing it`);
      await this.sandboxes.finishPause(sandbox, sandbox.operationId!, 'idle').catch((err) => log.error(`idle pause failed: ${toNestboxError(err).message}`));
    }
    const toStop = await this.lifecycle.claim(OPERATIONS.stop, 'running', (patch, db) => sandboxRepository(db).claim(idle('stop'), 20, patch), 'idle');
    for (const sandbox of toStop) {
      const log = this.opts.logger.child({ sandboxId: sandbox.id, operation: 'stop' });
      log.info(`idle for ${sandbox.idleTimeoutSeconds} s; stopping it`);
      await this.sandboxes.finishStop(sandbox, sandbox.operationId!, 'idle').catch((err) => log.error(`idle stop failed: ${toNestboxError(err).message}`));
    }
    return toPause.length + toStop.length;
  }

  /**
   * Running and paused sandboxes of suspended organisations are stopped (disk kept, reason
   * `suspended`); run when an organisation is suspended and on every pass, so one that a
   * replica missed (or that was mid-operation then) is stopped soon after. `organizationId`
   * limits it to one organisation. Bounded: at most `rounds` claims of 20.
   */
  async stopSuspended(organizationId?: string, rounds = 5): Promise<number> {
    let stopped = 0;
    for (let round = 0; round < rounds; round++) {
      let claimedThisRound = 0;
      for (const from of ['running', 'paused'] as const) {
        const claimed = await this.lifecycle.claim(OPERATIONS.stop, from, (patch, db) => sandboxRepository(db).claim(
          {
            state: from,
            where: (q) => {
              q.whereIn('organization_id', (this.db as Knex)('organizations').select('id').whereNotNull('suspended_at'));
              if (organizationId) q.where({ organization_id: organizationId });
            },
          },
          20,
          patch,
        ), 'suspended');
        claimedThisRound += claimed.length;
        for (const sandbox of claimed) {
          const log = this.opts.logger.child({ sandboxId: sandbox.id, operation: 'stop' });
          log.info('its organisation is suspended; stopping it');
          await this.sandboxes.finishStop(sandbox, sandbox.operationId!, 'suspended').catch((err) => log.error(`stop of a suspended organisation's sandbox failed: ${toNestboxError(err).message}`));
        }
      }
      stopped += claimedThisRound;
      if (claimedThisRound === 0) break;
    }
    return stopped;
  }

  /** Stopped sandboxes with an auto-delete delay that has passed are deleted. */
  async deleteAfterStop(): Promise<number> {
    const claimed = await this.lifecycle.claim(OPERATIONS.delete, 'stopped', (patch, db) => sandboxRepository(db).claim(
      {
        state: 'stopped',
        where: (q) => q.whereNotNull('auto_delete_seconds').whereNotNull('stopped_at').whereRaw(`stopped_at + make_interval(secs => auto_delete_seconds) <= ?`, [new Date()]),
      },
      20,
      patch,
    ), 'auto-delete');
    for (const sandbox of claimed) {
      const log = this.opts.logger.child({ sandboxId: sandbox.id, operation: 'delete' });
      log.info(`stopped ${sandbox.autoDeleteSeconds} s ago; deleting it (auto-delete)`);
      await this.sandboxes.finishDelete(sandbox, sandbox.operationId!).catch((err) => log.error(`auto-delete failed: ${toNestboxError(err).message}`));
    }
    return claimed.length;
  }

  /** Finish or fail operations whose owner died (kill -9 of a control plane mid-request). */
  async reconcileOrphans(): Promise<number> {
    // Judged by the database's clock (see the repository): replicas' clocks may differ.
    const others = await controlPlaneInstanceRepository(this.db).aliveWithin(this.opts.instanceTimeoutMs);
    // This instance is alive by definition, whatever its last recorded heartbeat says.
    const alive = [...new Set([...others, this.opts.instanceId])];
    const orphans = await sandboxRepository(this.db).findOrphanedOperations(TRANSITIONAL_STATES, alive, 50);
    for (const sandbox of orphans) {
      await this.takeOver(sandbox).catch((err) => this.opts.logger.error({ sandboxId: sandbox.id }, `reconcile failed: ${toNestboxError(err).message}`));
    }
    return orphans.length;
  }

  /**
   * Take over one orphaned operation. What it becomes is the takeover column of the state table:
   * stops and deletes are run again; the others settle by what the host reports.
   */
  private async takeOver(orphan: Sandbox): Promise<void> {
    // Claim it first, so two reconcilers never act on the same orphan.
    const adopted = await this.lifecycle.adopt(orphan);
    if (!adopted) return;
    const { sandbox, operation, operationId } = adopted;
    const name = sandbox.operation ?? operation.name;
    this.opts.logger.info({ sandboxId: sandbox.id, operation: name }, `taking over interrupted ${name}`);
    if (operation.takeover === 'finish') {
      // The reason of an interrupted stop is written with its outcome, so it is not known here.
      if (operation.name === 'stop') await this.sandboxes.finishStop(sandbox, operationId, 'user');
      else if (operation.name === 'delete') await this.sandboxes.finishDelete(sandbox, operationId);
      else throw errors.internal(`no way to finish an interrupted ${operation.name} again`);
      return;
    }
    let view: HostView;
    let interrupted = `the ${name} operation was interrupted by a control-plane restart`;
    try {
      const client = sandbox.hostId ? await this.hosts.clientFor(sandbox.hostId) : undefined;
      let runtime = client ? await client.getSandbox(sandbox.id) : undefined;
      // A create that claimed a warm-pool member and died before the host applied its spec:
      // the member is still warm there, so it is claimed again now (warm-pool.ts), never left
      // running with the pool's environment and egress policy.
      if (client && runtime?.warm && operation.name === 'create') runtime = await client.claimWarm(this.sandboxes.hostSpec(sandbox));
      view = hostViewOf(runtime);
    } catch (err) {
      view = 'unreachable';
      interrupted = `interrupted ${sandbox.state} and the host is unreachable: ${toNestboxError(err).message}`;
    }
    // A create, fork or start cut off after the host started it: its secrets may never have
    // been handed over (they go to the guest after the host call), so they are now.
    if (view === 'running' && (operation.name === 'create' || operation.name === 'fork' || operation.name === 'start')) {
      await this.sandboxes.deliverSecrets(sandbox).catch((err) => this.opts.logger.warn({ sandboxId: sandbox.id }, `could not hand over the secrets of a taken-over ${name}: ${toNestboxError(err).message}`));
    }
    await this.lifecycle.settle(sandbox, operation, view, operationId, interrupted);
  }
}
