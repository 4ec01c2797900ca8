// Sandboxes a front door has promised but cannot create yet (their image is being built):
// Daytona's create with `buildInfo` answers at once with a sandbox in `pending_build`. The
// replica that took the create waits for the build and creates the sandbox; every replica
// reads and deletes the pending record here, so no request needs to reach that one replica
// (no sticky sessions). `record` is the front door's own JSON (core does not interpret it);
// `phase` says where the create is, and `ownerAlive` whether the replica waiting for the build
// still heartbeats (by the database's clock, as every liveness check).
import type { Db } from '../store/db.js';
import { NestboxError } from '../errors.js';

export type PendingPhase = 'build' | 'creating' | 'build_failed' | 'error' | 'deleted' | 'created';
/** Phases in which the owner still has work to do. */
const ACTIVE: readonly PendingPhase[] = ['build', 'creating'];
/** Phases after which the id is free again (a created sandbox is found by its name instead). */
const FREED: readonly PendingPhase[] = ['deleted', 'created'];

export interface PendingSandboxRow<R> {
  organizationId: string;
  id: string;
  phase: PendingPhase;
  record: R;
  /** Whether the replica that took the create still heartbeats (it alone finishes it). */
  ownerAlive: boolean;
  createdAt: Date;
  updatedAt: Date;
}

interface Row {
  organization_id: string;
  id: string;
  phase: PendingPhase;
  owner_instance_id: string;
  record: unknown;
  created_at: Date | string;
  updated_at: Date | string;
  owner_alive: boolean;
}

export class PendingSandboxService {
  constructor(
    private readonly db: Db,
    private readonly instanceId: string,
    /** NESTBOX_INSTANCE_TIMEOUT_MS (0 with PGlite: only this process exists). */
    private readonly instanceTimeoutMs: number,
  ) {}

  private select(organizationId: string, id: string) {
    return this.db('pending_sandboxes as p')
      .where({ 'p.organization_id': organizationId, 'p.id': id })
      .select('p.*', this.db.raw(
        `(p.owner_instance_id = ? OR EXISTS (SELECT 1 FROM control_plane_instances c WHERE c.id = p.owner_instance_id AND c.last_seen_at >= now() - make_interval(secs => ?))) AS owner_alive`,
        [this.instanceId, this.instanceTimeoutMs / 1000],
      ));
  }

  private rowOf<R>(r: Row): PendingSandboxRow<R> {
    return { organizationId: r.organization_id, id: r.id, phase: r.phase, record: r.record as R, ownerAlive: !!r.owner_alive, createdAt: new Date(r.created_at), updatedAt: new Date(r.updated_at) };
  }

  /** Records a pending sandbox owned by this replica; `conflict` (field `name`) while the id is pending. */
  async insert<R>(organizationId: string, id: string, record: R): Promise<void> {
    const written = (await this.db.raw(
      `INSERT INTO pending_sandboxes (organization_id, id, phase, owner_instance_id, record, created_at, updated_at)
       VALUES (?, ?, 'build', ?, ?::jsonb, now(), now())
       ON CONFLICT (organization_id, id) DO UPDATE SET phase = 'build', owner_instance_id = EXCLUDED.owner_instance_id, record = EXCLUDED.record, created_at = now(), updated_at = now()
       WHERE pending_sandboxes.phase IN (${FREED.map((p) => `'${p}'`).join(', ')})
       RETURNING id`,
      [organizationId, id, this.instanceId, JSON.stringify(record)],
    )) as { rows: unknown[] };
    if (written.rows.length === 0) throw new NestboxError('conflict', `name: a sandbox named "${id}" is already being built`, { field: 'name' });
  }

  async get<R>(organizationId: string, id: string): Promise<PendingSandboxRow<R> | undefined> {
    const row = (await this.select(organizationId, id).first()) as Row | undefined;
    return row && this.rowOf<R>(row);
  }

  /** Whether the id is held by a pending sandbox (being built, or failed and not yet deleted). */
  async holds(organizationId: string, id: string): Promise<boolean> {
    const row = await this.get(organizationId, id);
    return !!row && !FREED.includes(row.phase);
  }

  /**
   * Moves it to `phase` with `record`, unless it is in one of `unlessIn` (by default: deleted,
   * which another replica may have written meanwhile). Answers whether it was written.
   */
  async update<R>(organizationId: string, id: string, phase: PendingPhase, record: R, unlessIn: readonly PendingPhase[] = ['deleted']): Promise<boolean> {
    const n = await this.db('pending_sandboxes')
      .where({ organization_id: organizationId, id })
      .whereNotIn('phase', unlessIn as PendingPhase[])
      .update({ phase, record: JSON.stringify(record), updated_at: this.db.fn.now() });
    return n > 0;
  }

  /** Finished records older than `keepMs` go; too many unfinished ones refuse a new create. */
  async prune(keepMs: number, maxActive: number): Promise<void> {
    await this.db('pending_sandboxes').whereNotIn('phase', ACTIVE as PendingPhase[]).whereRaw(`updated_at < now() - make_interval(secs => ?)`, [keepMs / 1000]).delete();
    const active = Number(((await this.db('pending_sandboxes').whereIn('phase', ACTIVE as PendingPhase[]).count<{ count: string }[]>('* as count'))[0]).count);
    if (active >= maxActive) throw new NestboxError('rate_limited', 'too many sandboxes are being built at once; try again later');
  }
}
