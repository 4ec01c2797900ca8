import type { Knex } from 'knex';
import type { DbOrTx } from '../db.js';
import type { Sandbox } from '../../types.js';
import { canTransition, statesLeadingTo, type SandboxState } from '../../state-machine.js';
import { errors } from '../../errors.js';

interface SandboxRow {
  id: string;
  organization_id: string;
  host_id: string | null;
  state: string;
  image: string;
  cpu: number;
  memory_mib: number;
  env: Record<string, string>;
  labels: Record<string, string>;
  timeout_seconds: number;
  expires_at: Date | string | null;
  operation: string | null;
  operation_id: string | null;
  operation_owner: string | null;
  operation_started_at: Date | string | null;
  error_message: string | null;
  memory_restored: boolean | null;
  resume_reason: string | null;
  created_at: Date | string;
  updated_at: Date | string;
  started_at: Date | string | null;
  stopped_at: Date | string | null;
  deleted_at: Date | string | null;
  stop_reason: string | null;
  pause_reason: string | null;
  paused_at: Date | string | null;
  last_activity_at: Date | string | null;
  idle_timeout_seconds: number;
  idle_action: string;
  auto_delete_seconds: number | null;
  source_snapshot_id: string | null;
  forked_from: string | null;
  egress: unknown;
  name: string | null;
  disk_gib: number | null;
  kind: string | null;
  image_id: string | null;
  host_image: string | null;
  volume_mounts?: unknown;
}

/**
 * Operation names rows may carry from older releases, read as today's: `resume` was the name of
 * `start` (a `starting` row an older control plane left behind is still taken over).
 */
const LEGACY_OPERATION_NAMES: Readonly<Record<string, string>> = { resume: 'start' };

/** Refuses a write of `to` over `from` unless the state table has that transition (a bug, not a race). */
function assertTransition(id: string, from: SandboxState, to: SandboxState): void {
  if (from !== to && !canTransition(from, to)) throw errors.internal(`state table: sandbox ${id} cannot go ${from} → ${to}`);
}

const date = (v: Date | string | null): Date | null => (v === null ? null : v instanceof Date ? v : new Date(v));
// PGlite returns jsonb already parsed; pg too. A string means a driver returned raw text.
const json = <T>(v: unknown): T => (typeof v === 'string' ? (JSON.parse(v) as T) : (v as T));

function fromRow(r: SandboxRow): Sandbox {
  return {
    id: r.id,
    organizationId: r.organization_id,
    hostId: r.host_id,
    state: r.state as SandboxState,
    image: r.image,
    cpu: r.cpu,
    memoryMiB: r.memory_mib,
    env: json(r.env),
    labels: json(r.labels),
    timeoutSeconds: r.timeout_seconds,
    expiresAt: date(r.expires_at),
    operation: r.operation === null ? null : (LEGACY_OPERATION_NAMES[r.operation] ?? r.operation),
    operationId: r.operation_id,
    operationOwner: r.operation_owner,
    operationStartedAt: date(r.operation_started_at),
    errorMessage: r.error_message,
    memoryRestored: r.memory_restored,
    resumeReason: r.resume_reason,
    createdAt: date(r.created_at)!,
    updatedAt: date(r.updated_at)!,
    startedAt: date(r.started_at),
    stoppedAt: date(r.stopped_at),
    deletedAt: date(r.deleted_at),
    stopReason: r.stop_reason,
    pauseReason: r.pause_reason,
    pausedAt: date(r.paused_at),
    lastActivityAt: date(r.last_activity_at),
    idleTimeoutSeconds: r.idle_timeout_seconds,
    idleAction: r.idle_action === 'stop' ? 'stop' : 'pause',
    autoDeleteSeconds: r.auto_delete_seconds,
    sourceSnapshotId: r.source_snapshot_id,
    forkedFrom: r.forked_from,
    egress: r.egress ? json<Sandbox['egress']>(r.egress) : { mode: 'allow-all' },
    name: r.name ?? null,
    diskGiB: r.disk_gib ?? null,
    kind: r.kind === 'build' ? 'build' : 'user',
    imageId: r.image_id ?? null,
    hostImage: r.host_image ?? null,
    ...(r.volume_mounts ? { volumeMounts: json<NonNullable<Sandbox['volumeMounts']>>(r.volume_mounts) } : {}),
  };
}

export type SandboxPatch = Partial<{
  hostId: string | null;
  state: SandboxState;
  labels: Record<string, string>;
  timeoutSeconds: number;
  expiresAt: Date | null;
  operation: string | null;
  operationId: string | null;
  operationOwner: string | null;
  operationStartedAt: Date | null;
  errorMessage: string | null;
  memoryRestored: boolean | null;
  resumeReason: string | null;
  startedAt: Date | null;
  stoppedAt: Date | null;
  deletedAt: Date | null;
  stopReason: string | null;
  pauseReason: string | null;
  pausedAt: Date | null;
  lastActivityAt: Date | null;
  idleTimeoutSeconds: number;
  idleAction: 'pause' | 'stop';
  autoDeleteSeconds: number | null;
  egress: Sandbox['egress'];
  /** Resize (sandbox-resize.ts). */
  cpu: number;
  memoryMiB: number;
  diskGiB: number | null;
}>;

const COLUMN: Record<keyof SandboxPatch, string> = {
  hostId: 'host_id',
  state: 'state',
  labels: 'labels',
  timeoutSeconds: 'timeout_seconds',
  expiresAt: 'expires_at',
  operation: 'operation',
  operationId: 'operation_id',
  operationOwner: 'operation_owner',
  operationStartedAt: 'operation_started_at',
  errorMessage: 'error_message',
  memoryRestored: 'memory_restored',
  resumeReason: 'resume_reason',
  startedAt: 'started_at',
  stoppedAt: 'stopped_at',
  deletedAt: 'deleted_at',
  stopReason: 'stop_reason',
  pauseReason: 'pause_reason',
  pausedAt: 'paused_at',
  lastActivityAt: 'last_activity_at',
  idleTimeoutSeconds: 'idle_timeout_seconds',
  idleAction: 'idle_action',
  autoDeleteSeconds: 'auto_delete_seconds',
  egress: 'egress',
  cpu: 'cpu',
  memoryMiB: 'memory_mib',
  diskGiB: 'disk_gib',
};

function toColumns(patch: SandboxPatch): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(patch)) {
    const column = COLUMN[key as keyof SandboxPatch];
    out[column] = key === 'labels' || key === 'egress' ? JSON.stringify(value) : value;
  }
  return out;
}

export interface NewSandbox {
  id: string;
  organizationId: string;
  hostId: string;
  image: string;
  cpu: number;
  memoryMiB: number;
  env: Record<string, string>;
  labels: Record<string, string>;
  timeoutSeconds: number;
  operationId: string;
  operationOwner: string;
  operation?: 'create' | 'fork';
  idleTimeoutSeconds?: number;
  idleAction?: 'pause' | 'stop';
  autoDeleteSeconds?: number | null;
  sourceSnapshotId?: string | null;
  forkedFrom?: string | null;
  egress?: Sandbox['egress'];
  /** Unique per organisation among sandboxes that are not deleted (Daytona addresses sandboxes by name). */
  name?: string | null;
  diskGiB: number;
  kind?: Sandbox['kind'];
  imageId?: string | null;
  hostImage?: string | null;
  /** Volumes mounted at every start (core/services/volumes.ts). */
  volumeMounts?: Sandbox['volumeMounts'];
}

export interface ListFilter {
  organizationId: string;
  labels?: Record<string, string>;
  states?: SandboxState[];
  ids?: string[];
  limit: number;
  /** Exclusive position from the previous page: items older than this (created_at desc, id desc). */
  after?: { createdAt: Date; id: string };
  /** Prefix filters (Daytona's list `id`/`name`). */
  idPrefix?: string;
  namePrefix?: string;
  /** Started (or, never started, created) at or after / before this moment. */
  startedAfter?: Date;
  startedBefore?: Date;
  /** Created from this snapshot (its id); null: from the image, no snapshot. */
  sourceSnapshotId?: string | null;
  /** Another order than created_at desc; paging then uses `sortAfter` (value of the sort key, id). */
  sort?: { key: SandboxSortKey; order: 'asc' | 'desc' };
  sortAfter?: { value: string | number; id: string };
}

export const SANDBOX_SORT_KEYS = ['createdAt', 'startedAt', 'name', 'cpu', 'memoryMiB', 'lastActivityAt'] as const;
export type SandboxSortKey = (typeof SANDBOX_SORT_KEYS)[number];

/** Sort expressions never yield NULL, so keyset paging over (expression, id) is total. */
const SORT_EXPRESSION: Record<SandboxSortKey, string> = {
  createdAt: 'created_at',
  startedAt: 'coalesce(started_at, created_at)',
  name: 'coalesce(name, id)',
  cpu: 'cpu',
  memoryMiB: 'memory_mib',
  lastActivityAt: 'coalesce(last_activity_at, created_at)',
};

/** The value of a sort key for `s`, as it is stored in a cursor. */
export function sortValueOf(s: Sandbox, key: SandboxSortKey): string | number {
  switch (key) {
    case 'createdAt': return s.createdAt.toISOString();
    case 'startedAt': return (s.startedAt ?? s.createdAt).toISOString();
    case 'name': return s.name ?? s.id;
    case 'cpu': return s.cpu;
    case 'memoryMiB': return s.memoryMiB;
    case 'lastActivityAt': return (s.lastActivityAt ?? s.createdAt).toISOString();
  }
}

export interface ClaimQuery {
  state: SandboxState;
  where: (q: import('knex').Knex.QueryBuilder) => void;
}

export function sandboxRepository(db: DbOrTx) {
  return {
    async insertCreating(s: NewSandbox): Promise<Sandbox> {
      const [row] = await db<SandboxRow>('sandboxes')
        .insert({
          id: s.id,
          organization_id: s.organizationId,
          host_id: s.hostId,
          state: 'creating',
          image: s.image,
          cpu: s.cpu,
          memory_mib: s.memoryMiB,
          env: JSON.stringify(s.env) as unknown as Record<string, string>,
          labels: JSON.stringify(s.labels) as unknown as Record<string, string>,
          timeout_seconds: s.timeoutSeconds,
          operation: s.operation ?? 'create',
          operation_id: s.operationId,
          operation_owner: s.operationOwner,
          operation_started_at: new Date(),
          idle_timeout_seconds: s.idleTimeoutSeconds ?? 0,
          idle_action: s.idleAction ?? 'pause',
          auto_delete_seconds: s.autoDeleteSeconds ?? null,
          source_snapshot_id: s.sourceSnapshotId ?? null,
          forked_from: s.forkedFrom ?? null,
          egress: s.egress ? JSON.stringify(s.egress) : null,
          name: s.name ?? null,
          disk_gib: s.diskGiB,
          kind: s.kind ?? 'user',
          image_id: s.imageId ?? null,
          host_image: s.hostImage ?? null,
          ...(s.volumeMounts?.length ? { volume_mounts: JSON.stringify(s.volumeMounts) } : {}),
          last_activity_at: new Date(),
          // Set here, not by the column's now(): PostgreSQL keeps microseconds, a paging cursor
          // carries a JS Date (milliseconds), and rows created within the same millisecond
          // would otherwise fall between two pages.
          created_at: new Date(),
        })
        .returning('*');
      return fromRow(row as SandboxRow);
    },

    /** Visible sandboxes only: deleted rows are kept for the record but never returned here. */
    async findVisible(id: string, organizationId: string): Promise<Sandbox | undefined> {
      const row = await db<SandboxRow>('sandboxes')
        .where({ id, organization_id: organizationId })
        .whereNot({ state: 'deleted' })
        .first();
      return row ? fromRow(row as SandboxRow) : undefined;
    },

    async findVisibleByName(name: string, organizationId: string): Promise<Sandbox | undefined> {
      const row = await db<SandboxRow>('sandboxes')
        .where({ name, organization_id: organizationId })
        .whereNot({ state: 'deleted' })
        .first();
      return row ? fromRow(row as SandboxRow) : undefined;
    },

    async findById(id: string): Promise<Sandbox | undefined> {
      const row = await db<SandboxRow>('sandboxes').where({ id }).first();
      return row ? fromRow(row as SandboxRow) : undefined;
    },

    async list(filter: ListFilter): Promise<Sandbox[]> {
      // A build's sandboxes are the build's business: no list shows them.
      const q = db<SandboxRow>('sandboxes')
        .where({ organization_id: filter.organizationId, kind: 'user' })
        .whereNot({ state: 'deleted' })
        .limit(filter.limit);
      if (filter.sort) {
        const expr = SORT_EXPRESSION[filter.sort.key];
        const dir = filter.sort.order === 'asc' ? 'asc' : 'desc';
        q.orderByRaw(`${expr} ${dir}, id ${dir}`);
        if (filter.sortAfter) {
          const op = dir === 'asc' ? '>' : '<';
          const cast = filter.sort.key === 'createdAt' || filter.sort.key === 'startedAt' || filter.sort.key === 'lastActivityAt' ? '::timestamptz' : '';
          q.whereRaw(`(${expr}, id) ${op} (?${cast}, ?)`, [filter.sortAfter.value, filter.sortAfter.id]);
        }
      } else {
        q.orderBy([
          { column: 'created_at', order: 'desc' },
          { column: 'id', order: 'desc' },
        ]);
      }
      // LIKE wildcards in a prefix are matched literally.
      const likePrefix = (p: string) => `${p.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
      if (filter.idPrefix) q.whereRaw(`id LIKE ?`, [likePrefix(filter.idPrefix)]);
      if (filter.namePrefix) q.whereRaw(`coalesce(name, id) LIKE ?`, [likePrefix(filter.namePrefix)]);
      if (filter.labels && Object.keys(filter.labels).length > 0) {
        q.whereRaw('labels @> ?::jsonb', [JSON.stringify(filter.labels)]);
      }
      if (filter.states?.length) q.whereIn('state', filter.states);
      if (filter.startedAfter) q.whereRaw('coalesce(started_at, created_at) >= ?', [filter.startedAfter]);
      if (filter.startedBefore) q.whereRaw('coalesce(started_at, created_at) <= ?', [filter.startedBefore]);
      if (filter.sourceSnapshotId === null) q.whereNull('source_snapshot_id');
      else if (filter.sourceSnapshotId !== undefined) q.where('source_snapshot_id', filter.sourceSnapshotId);
      if (filter.ids) q.whereIn('id', filter.ids);
      if (filter.after) {
        const { createdAt, id } = filter.after;
        q.where((w) => w.where('created_at', '<', createdAt).orWhere((w2) => w2.where('created_at', '=', createdAt).andWhere('id', '<', id)));
      }
      return ((await q) as SandboxRow[]).map(fromRow);
    },

    /**
     * Compare-and-set: apply `patch` only if the row is still in one of `fromStates` (and, when
     * given, still carries `operationId`). Returns the updated row, or undefined when another
     * request won the race; callers then re-read and report the real state. A new state the
     * table does not allow from each of `fromStates` is refused before anything is written.
     */
    async transition(id: string, fromStates: readonly SandboxState[], patch: SandboxPatch, operationId?: string): Promise<Sandbox | undefined> {
      if (patch.state !== undefined) for (const from of fromStates) assertTransition(id, from, patch.state);
      const q = db<SandboxRow>('sandboxes')
        .where({ id })
        .whereIn('state', fromStates as SandboxState[])
        .update({ ...toColumns(patch), updated_at: new Date() } as Partial<SandboxRow>)
        .returning('*');
      if (operationId) q.andWhere({ operation_id: operationId });
      const [row] = await q;
      return row ? fromRow(row as SandboxRow) : undefined;
    },

    /**
     * The same compare-and-set for every sandbox of one host in one of `fromStates`, as ONE
     * UPDATE (a lost host's sandboxes all change together, not one by one). Returns the rows
     * written, each with the state it had before (from the same statement).
     */
    async transitionOnHost(hostId: string, fromStates: readonly SandboxState[], patch: SandboxPatch): Promise<{ sandbox: Sandbox; from: SandboxState }[]> {
      if (patch.state !== undefined) for (const from of fromStates) assertTransition(hostId, from, patch.state);
      // UPDATE … FROM a self-join on the locked old rows hands back each row's previous state.
      const columns = { ...toColumns(patch), updated_at: new Date() } as Record<string, unknown>;
      const sets = Object.keys(columns).map((c) => `"${c}" = ?`).join(', ');
      const result = await db.raw(
        `UPDATE sandboxes AS s SET ${sets} FROM (SELECT id, state FROM sandboxes WHERE host_id = ? AND state IN (${fromStates.map(() => '?').join(', ')}) FOR UPDATE) AS old WHERE s.id = old.id RETURNING s.*, old.state AS previous_state`,
        [...Object.values(columns), hostId, ...fromStates] as Knex.RawBinding[],
      );
      const rows = (result.rows ?? result) as (SandboxRow & { previous_state: SandboxState })[];
      return rows.map((r) => ({ sandbox: fromRow(r), from: r.previous_state }));
    },

    /**
     * Columns other than the state as they are; a new state only over a state the table lets
     * lead to it (guarded in the UPDATE, so a row in any other state is refused, not overwritten).
     */
    async update(id: string, patch: SandboxPatch): Promise<Sandbox | undefined> {
      const q = db<SandboxRow>('sandboxes').where({ id });
      if (patch.state !== undefined) q.whereIn('state', [...statesLeadingTo(patch.state), patch.state]);
      const [row] = await q.update({ ...toColumns(patch), updated_at: new Date() } as Partial<SandboxRow>).returning('*');
      if (!row && patch.state !== undefined) {
        const current = await this.findById(id);
        if (current) assertTransition(id, current.state, patch.state);
      }
      return row ? fromRow(row as SandboxRow) : undefined;
    },

    /**
     * The sandbox's default environment changed in one UPDATE: `unset` removed, then `set`
     * merged over (so two concurrent changes both land). The env as it now is; undefined if
     * the organisation has no such sandbox.
     */
    async changeEnv(id: string, organizationId: string, change: { set: Record<string, string>; unset: string[] }): Promise<Record<string, string> | undefined> {
      const [row] = (await db('sandboxes')
        .where({ id, organization_id: organizationId })
        .update({ env: db.raw('(env - ?::text[]) || ?::jsonb', [change.unset, JSON.stringify(change.set)]), updated_at: new Date() })
        .returning(['env'])) as { env: Record<string, string> | string }[];
      return row ? json(row.env) : undefined;
    },

    /**
     * Claim up to `limit` sandboxes that `due` selects, moving each to `patch(id)` (a
     * transitional state) in the same transaction. SKIP LOCKED lets several control-plane
     * replicas sweep at once without two of them claiming the same sandbox; the state check in
     * the UPDATE makes a claim that lost a race a no-op.
     */
    async claim(due: ClaimQuery, limit: number, patch: (id: string) => SandboxPatch): Promise<Sandbox[]> {
      return (db as import('knex').Knex).transaction(async (tx) => {
        // Checked before the claim's first write, so an illegal claim leaves every row untouched.
        const patches = new Map<string, SandboxPatch>();
        const q = tx('sandboxes').select('id').where({ state: due.state }).limit(limit).forUpdate().skipLocked();
        due.where(q);
        const ids = (await q) as { id: string }[];
        for (const { id } of ids) {
          const p = patch(id);
          if (p.state !== undefined) assertTransition(id, due.state, p.state);
          patches.set(id, p);
        }
        const claimed: Sandbox[] = [];
        for (const { id } of ids) {
          const [row] = await tx('sandboxes')
            .where({ id, state: due.state })
            .update({ ...toColumns(patches.get(id)!), updated_at: new Date() })
            .returning('*');
          if (row) claimed.push(fromRow(row as SandboxRow));
        }
        return claimed;
      });
    },

    /**
     * Running sandboxes whose deadline passed. `autoDelete: 'at-once'` takes those deleted as
     * soon as they stop (auto_delete_seconds 0: E2B's kill at timeout), which go straight to
     * `deleting` (one host call instead of a stop and a delete); `'later'` takes the others,
     * into `stopping`.
     */
    claimExpired(now: Date, limit: number, patch: (id: string) => SandboxPatch, autoDelete: 'at-once' | 'later' = 'later'): Promise<Sandbox[]> {
      return this.claim(
        {
          state: 'running',
          where: (q) => {
            q.whereNotNull('expires_at').where('expires_at', '<=', now).orderBy('expires_at');
            if (autoDelete === 'at-once') q.where('auto_delete_seconds', 0);
            else q.where((w) => w.whereNull('auto_delete_seconds').orWhere('auto_delete_seconds', '>', 0));
          },
        },
        limit,
        (id) => ({ state: autoDelete === 'at-once' ? 'deleting' : 'stopping', ...patch(id) }),
      );
    },

    /**
     * The earliest moment a sweeper has something to do: a running sandbox's deadline, or the
     * end of a stopped one's auto-delete delay. Null when nothing is scheduled.
     */
    async nextDeadline(): Promise<Date | null> {
      const result = await db.raw(
        `SELECT least(
           (SELECT min(expires_at) FROM sandboxes WHERE state = 'running' AND expires_at IS NOT NULL),
           (SELECT min(stopped_at + make_interval(secs => auto_delete_seconds)) FROM sandboxes WHERE state = 'stopped' AND auto_delete_seconds IS NOT NULL AND stopped_at IS NOT NULL)
         ) AS at`,
      );
      const rows = ((result as { rows?: { at: Date | string | null }[] }).rows ?? []) as { at: Date | string | null }[];
      return date(rows[0]?.at ?? null);
    },

    /**
     * Move a live sandbox's deadline to `deadline` only if that is later than the one it has (a
     * sandbox without a deadline keeps none), in one statement so two concurrent extensions
     * cannot shorten each other. Undefined when nothing changed.
     */
    async extendDeadline(id: string, deadline: Date, timeoutSeconds: number): Promise<Sandbox | undefined> {
      const [row] = await db<SandboxRow>('sandboxes')
        .where({ id })
        .whereIn('state', ['running', 'paused'])
        .whereNotNull('expires_at')
        .where('expires_at', '<', deadline)
        .update({ expires_at: deadline, timeout_seconds: timeoutSeconds, updated_at: new Date() } as Partial<SandboxRow>)
        .returning('*');
      return row ? fromRow(row as SandboxRow) : undefined;
    },

    /**
     * Record activity, at most every `granularityMs` per sandbox: activity is read in seconds
     * (idle timeouts), so writing it on every call would only add load.
     */
    async touchActivity(id: string, now: Date, granularityMs: number): Promise<void> {
      await db('sandboxes')
        .where({ id })
        .where((w) => w.whereNull('last_activity_at').orWhere('last_activity_at', '<', new Date(now.getTime() - granularityMs)))
        .update({ last_activity_at: now });
    },

    /**
     * What an organisation holds now: sandboxes that are neither stopped nor deleted (they may
     * hold a runtime: running, paused, in an operation, or error), and their vCPUs and memory.
     * Callers take the organisation's row lock first (SandboxService.withinQuota).
     */
    async usageOf(organizationId: string, excludeId?: string): Promise<{ sandboxes: number; cpu: number; memoryMiB: number }> {
      const q = db('sandboxes')
        .where({ organization_id: organizationId })
        .whereNotIn('state', ['stopped', 'deleted'])
        .select(db.raw('count(*) as sandboxes'), db.raw('coalesce(sum(cpu), 0) as cpu'), db.raw('coalesce(sum(memory_mib), 0) as memory_mib'));
      if (excludeId) q.whereNot({ id: excludeId });
      const [row] = (await q) as { sandboxes: string | number; cpu: string | number; memory_mib: string | number }[];
      return { sandboxes: Number(row.sandboxes), cpu: Number(row.cpu), memoryMiB: Number(row.memory_mib) };
    },

    async countUsingSnapshot(snapshotId: string): Promise<number> {
      const [{ count }] = (await db('sandboxes').count<{ count: string | number }[]>('* as count').where({ source_snapshot_id: snapshotId }).whereNot({ state: 'deleted' })) as { count: string | number }[];
      return Number(count);
    },

    /** Rows left in a transitional state by an owner that is no longer alive. */
    async findOrphanedOperations(transitional: readonly SandboxState[], liveOwners: string[], limit: number): Promise<Sandbox[]> {
      const q = db<SandboxRow>('sandboxes').whereIn('state', transitional as SandboxState[]).limit(limit);
      if (liveOwners.length) q.where((w) => w.whereNull('operation_owner').orWhereNotIn('operation_owner', liveOwners));
      return ((await q) as SandboxRow[]).map(fromRow);
    },

    async findByHost(hostId: string, states: readonly SandboxState[]): Promise<Sandbox[]> {
      const rows = await db<SandboxRow>('sandboxes').where({ host_id: hostId }).whereIn('state', states as SandboxState[]);
      return (rows as SandboxRow[]).map(fromRow);
    },

    /**
     * What the sandboxes placed on each of `hostIds` hold: vCPUs and memory of those that may
     * run (not stopped, error or deleted), disk of every one not deleted (a stopped sandbox
     * keeps its disk on its host). `defaultDiskGiB` counts rows from before disk sizes.
     */
    async allocationsByHost(hostIds: readonly string[], defaultDiskGiB: number): Promise<Map<string, { cpu: number; memoryMiB: number; diskGiB: number; sandboxes: number }>> {
      if (hostIds.length === 0) return new Map();
      const rows = (await db('sandboxes')
        .select('host_id')
        .select(db.raw(`coalesce(sum(case when state in ('stopped', 'error') then 0 else cpu end), 0) as cpu`))
        .select(db.raw(`coalesce(sum(case when state in ('stopped', 'error') then 0 else memory_mib end), 0) as memory_mib`))
        .select(db.raw(`coalesce(sum(coalesce(disk_gib, ?)), 0) as disk_gib`, [defaultDiskGiB]))
        .select(db.raw(`count(*) as sandboxes`))
        .whereIn('host_id', hostIds as string[])
        .whereNot('state', 'deleted')
        .groupBy('host_id')) as { host_id: string; cpu: string | number; memory_mib: string | number; disk_gib: string | number; sandboxes: string | number }[];
      const out = new Map(rows.map((r) => [r.host_id, { cpu: Number(r.cpu), memoryMiB: Number(r.memory_mib), diskGiB: Number(r.disk_gib), sandboxes: Number(r.sandboxes) }]));
      // Warm-pool members (core/services/warm-pool.ts) run and hold their vCPUs, memory and disk
      // like any sandbox, so placement counts them: the pool never hides load from it.
      const pooled = (await db('warm_pool_sandboxes')
        .select('host_id')
        .select(db.raw('coalesce(sum(cpu), 0) as cpu'), db.raw('coalesce(sum(memory_mib), 0) as memory_mib'), db.raw('coalesce(sum(disk_gib), 0) as disk_gib'), db.raw('count(*) as sandboxes'))
        .whereIn('host_id', hostIds as string[])
        .groupBy('host_id')) as { host_id: string; cpu: string | number; memory_mib: string | number; disk_gib: string | number; sandboxes: string | number }[];
      for (const r of pooled) {
        const a = out.get(r.host_id) ?? { cpu: 0, memoryMiB: 0, diskGiB: 0, sandboxes: 0 };
        out.set(r.host_id, { cpu: a.cpu + Number(r.cpu), memoryMiB: a.memoryMiB + Number(r.memory_mib), diskGiB: a.diskGiB + Number(r.disk_gib), sandboxes: a.sandboxes + Number(r.sandboxes) });
      }
      return out;
    },

    async countActiveByHost(): Promise<Map<string, number>> {
      const rows = (await db('sandboxes')
        .select('host_id')
        .count<{ host_id: string; count: string | number }[]>('* as count')
        .whereNotIn('state', ['deleted', 'stopped', 'error'])
        .whereNotNull('host_id')
        .groupBy('host_id')) as { host_id: string; count: string | number }[];
      return new Map(rows.map((r) => [r.host_id, Number(r.count)]));
    },
  };
}

export type SandboxRepository = ReturnType<typeof sandboxRepository>;
