import type { Db } from '../store/db.js';
import { snapshotRepository } from '../store/repositories/snapshots.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import { randomId } from '../ids.js';
import type { Principal, Snapshot } from '../types.js';
import { requireScope } from './auth.js';
import type { HostTransferService } from './host-transfer.js';
import type { HostService } from './hosts.js';
import type { SandboxService } from './sandboxes.js';
import { checkWithinLimits, NO_ORGANIZATION_LIMITS, type OrganizationLimits } from './org-limits.js';

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;

/**
 * Named snapshots (templates): a sandbox's disk saved under a name, to create sandboxes from.
 * A snapshot outlives its source; it cannot be deleted while a sandbox or another snapshot
 * still builds on it (the database counts the users; the host refuses too, as a second check).
 */
export class SnapshotService {
  /** Copies of snapshots on other hosts (host-transfer.ts), deleted with them; set by the composition root. */
  transfer?: HostTransferService;

  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly sandboxes: SandboxService,
    /** The server's default organisation limits (snapshots are counted against `maxSnapshots`). */
    private readonly orgLimits: OrganizationLimits = NO_ORGANIZATION_LIMITS,
  ) {}

  async create(principal: Principal, input: { sandboxId: string; name: string }): Promise<Snapshot> {
    requireScope(principal, 'snapshots:write');
    if (!NAME.test(input.name)) throw errors.validation('name', 'must be 1-128 letters, digits, "_", ".", ":" or "-", starting with a letter or digit');
    const source = await this.sandboxes.get(principal, input.sandboxId);
    if (!['running', 'paused', 'stopped'].includes(source.state)) {
      throw errors.invalidState('sandbox', source.id, source.state, ['running', 'paused', 'stopped'], 'snapshot');
    }
    const repo = snapshotRepository(this.db);
    let snapshot: Snapshot;
    try {
      // The new row counts at once (a snapshot being made holds its name and its place), so the
      // limit is checked and the row inserted under the organisation's lock.
      snapshot = await this.db.transaction(async (tx) => {
        await checkWithinLimits(tx, principal.organizationId, { snapshots: 1 }, this.orgLimits);
        return snapshotRepository(tx).insertCreating({
          id: `snp${randomId(17)}`,
          organizationId: principal.organizationId,
          name: input.name,
          hostId: source.hostId!,
          sourceSandboxId: source.id,
          parentSnapshotId: source.sourceSnapshotId,
        });
      });
    } catch (err) {
      if (/unique|duplicate/i.test(String((err as Error).message))) throw new NestboxError('conflict', `name: a snapshot named "${input.name}" already exists`, { field: 'name' });
      throw err;
    }
    try {
      const result = await (await this.hosts.clientFor(snapshot.hostId)).snapshotSandbox(source.id, snapshot.id);
      return (await repo.update(snapshot.id, { state: 'ready', sizeBytes: result.sizeBytes }))!;
    } catch (err) {
      const e = toNestboxError(err);
      // A failed snapshot frees its name at once; the host removed whatever it had written.
      await repo.update(snapshot.id, { state: 'error', errorMessage: e.message, deletedAt: new Date() });
      throw e;
    }
  }

  async list(principal: Principal): Promise<Snapshot[]> {
    requireScope(principal, 'snapshots:read');
    const all = await snapshotRepository(this.db).listLive(principal.organizationId);
    const visible = await this.visibility(principal);
    return visible ? all.filter(visible) : all;
  }

  async get(principal: Principal, name: string): Promise<Snapshot> {
    requireScope(principal, 'snapshots:read');
    const snapshot = await snapshotRepository(this.db).findLiveByName(principal.organizationId, name);
    const visible = snapshot ? await this.visibility(principal) : undefined;
    if (!snapshot || (visible && !visible(snapshot))) throw errors.notFound('snapshot', name);
    return snapshot;
  }

  /**
   * A key limited to some sandboxes sees only the snapshots that concern them (issue 11): those
   * taken from them, and those they were created from (with the layers under those). The rest of
   * the organisation's snapshots are absent (404), like another organisation's. Undefined: no limit.
   */
  private async visibility(principal: Principal): Promise<((s: Snapshot) => boolean) | undefined> {
    if (principal.sandboxIds === null) return undefined;
    const sources = new Set<string>();
    for (const id of principal.sandboxIds) {
      const sandbox = await sandboxRepository(this.db).findById(id);
      if (sandbox && sandbox.organizationId === principal.organizationId && sandbox.sourceSnapshotId) sources.add(sandbox.sourceSnapshotId);
    }
    // Walk down each source's parents: a snapshot of a sandbox made from a snapshot stacks on it.
    const repo = snapshotRepository(this.db);
    const pending = [...sources];
    for (let i = 0; i < pending.length && i < 1000; i++) {
      const parent = (await repo.findById(pending[i]))?.parentSnapshotId;
      if (parent && !sources.has(parent)) {
        sources.add(parent);
        pending.push(parent);
      }
    }
    const sandboxIds = principal.sandboxIds;
    return (s) => (s.sourceSandboxId !== null && sandboxIds.has(s.sourceSandboxId)) || sources.has(s.id);
  }

  async delete(principal: Principal, name: string): Promise<void> {
    requireScope(principal, 'snapshots:write');
    const snapshot = await this.get(principal, name);
    const sandboxes = await sandboxRepository(this.db).countUsingSnapshot(snapshot.id);
    const children = await snapshotRepository(this.db).countChildren(snapshot.id);
    if (sandboxes + children > 0) {
      throw new NestboxError('conflict', `snapshot ${name} is still in use by ${sandboxes} sandbox(es) and ${children} snapshot(s) built on it; delete those first`, { sandboxes, snapshots: children });
    }
    const repo = snapshotRepository(this.db);
    if (!(await repo.transition(snapshot.id, 'ready', 'deleting')) && snapshot.state !== 'error') {
      throw errors.invalidState('snapshot', name, snapshot.state, ['ready'], 'delete');
    }
    try {
      await (await this.hosts.clientFor(snapshot.hostId)).deleteSnapshot(snapshot.id);
    } catch (err) {
      await repo.update(snapshot.id, { state: 'ready' });
      throw toNestboxError(err);
    }
    await this.transfer?.dropCopies(snapshot.id);
    await repo.update(snapshot.id, { deletedAt: new Date() });
  }
}
