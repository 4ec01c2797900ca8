// A restarted host agent takes over what the previous one left (init): sandboxes whose launcher
// lives and whose agent proves this boot's key are adopted (a pause, unpause or copy it died in
// is finished or undone), the rest are stopped or, half-created, removed; then this owner's
// slots, cgroups, id ranges and disks that no live sandbox accounts for are reclaimed.
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentClient } from '../../agent-protocol/client.js';
import { readAgentKeyFile } from '../../agent-protocol/key-file.js';
import { mountDiskImage } from '../../storage/disk-quota.js';
import { removeTree } from '../../util/fs.js';
import { isProcessAlive } from '../../util/process.js';
import { removeRecordTempFiles } from '../base/records.js';
import { SANDBOX_ID } from '../base/driver-base.js';
import { writeRecord, type SandboxRecord } from './records.js';
import { assertAgentSocket, LocalRuntime } from './runtime.js';
import { DEFAULT_PIDS_MAX, HEALTH_TIMEOUT_MS, isLive } from './sandboxes.js';
import { applyRecordSizes } from './resize.js';

export abstract class LocalRecovery extends LocalRuntime {
  // ---- adoption and reclaim -------------------------------------------------------------------

  protected async adoptAll(): Promise<void> {
    const found = await this.ownSandboxesOnDisk(this.options.ownerId, removeRecordTempFiles);
    for (const { id, record } of found) {
      // After a reboot the sandbox's disk is a file again; mount it (a no-op when it still is).
      if (record?.disk && record.status !== 'creating') {
        await mountDiskImage(this.diskDirOf(record)).catch((error) => this.log.warn({ sandboxId: id, operation: 'init' }, `init: mounting its disk failed: ${String(error)}`));
      }
      await this.withLock(id, () => this.adoptOne(id, record));
    }
  }

  private async adoptOne(id: string, record: SandboxRecord | undefined): Promise<void> {
    if (!record || record.status === 'creating') {
      this.log.info({ sandboxId: id, operation: 'init' }, 'init: removing half-created sandbox');
      await this.destroyUnlocked(id);
      return;
    }
    this.records.set(id, record);
    const launcherAlive = isProcessAlive(record.pid, record.pidStartTime);
    // A resize the previous host agent died in: the record holds the target, put it in force.
    if (record.operation?.kind === 'resize') await this.finishResize(record, launcherAlive);
    if (launcherAlive && (record.status === 'running' || record.status === 'paused')) {
      // Finish a pause or unpause the previous host agent was in the middle of, and undo the
      // freeze of an interrupted fork/snapshot copy; with no operation, the status decides.
      const operation = record.operation?.kind;
      const paused = operation === 'pause' ? true : operation === 'unpause' || operation === 'copy' ? false : record.status === 'paused';
      const settled = await this.requireCgroups()
        .setFrozenAndWait(this.cgroupGroup(id), paused)
        .then(() => true)
        .catch((error) => {
          this.log.warn({ sandboxId: id, operation: 'init' }, `init: could not ${paused ? 'freeze' : 'thaw'} it: ${String(error)}`);
          return false;
        });
      if (settled) {
        record.operation = undefined;
        record.status = paused ? 'paused' : 'running';
        // A frozen agent cannot answer; the live launcher and the frozen cgroup are the evidence
        // (its key is checked on every answer once it is thawed).
        if (paused ? await this.loadAgentKey(record) : await this.isAlive(record)) {
          await writeRecord(this.sandboxDir(id), record);
          this.log.info({ sandboxId: id, operation: 'init', pid: record.pid }, `init: adopted ${record.status} sandbox (pid ${record.pid})`);
          return;
        }
      }
    }
    if (record.status !== 'stopped') this.log.info({ sandboxId: id, operation: 'init' }, 'init: sandbox is no longer running; marking it stopped');
    await this.teardownRuntime(id, record);
    record.status = 'stopped';
    record.operation = undefined;
    await writeRecord(this.sandboxDir(id), record);
  }

  private async finishResize(record: SandboxRecord, launcherAlive: boolean): Promise<void> {
    const ctx = { cgroups: this.requireCgroups(), cgroupPath: this.cgroupPath(record.id), sandboxDir: this.sandboxDir(record.id), diskDir: this.diskDirOf(record), pidsMax: this.options.pidsMax ?? DEFAULT_PIDS_MAX };
    const live = launcherAlive && (record.status === 'running' || record.status === 'paused');
    await applyRecordSizes(ctx, { ...record, status: live ? record.status : 'stopped' }, undefined, !live)
      .then(() => this.log.info({ sandboxId: record.id, operation: 'init' }, 'init: finished an interrupted resize'))
      .catch((error) => this.log.warn({ sandboxId: record.id, operation: 'init' }, `init: finishing an interrupted resize failed: ${String(error)}`));
    record.operation = undefined;
    await writeRecord(this.sandboxDir(record.id), record);
  }

  private async loadAgentKey(record: SandboxRecord): Promise<boolean> {
    const key = await readAgentKeyFile(this.sandboxDir(record.id));
    if (key) this.agentKeys.set(record.id, key);
    else this.log.warn({ sandboxId: record.id, operation: 'init' }, 'init: no readable agent key; not adopting it');
    return !!key;
  }

  private async isAlive(record: SandboxRecord): Promise<boolean> {
    if (!isProcessAlive(record.pid, record.pidStartTime)) return false;
    const key = await readAgentKeyFile(this.sandboxDir(record.id));
    // Only an agent that proves it holds this boot's key is adopted: without the key (lost or
    // never written) a forged agent could not be told from the real one.
    if (!key) {
      this.log.warn({ sandboxId: record.id, operation: 'init' }, 'init: no readable agent key; not adopting it');
      return false;
    }
    const client = new AgentClient(record.agentSocket, { proofKey: key });
    try {
      await assertAgentSocket(record.agentSocket);
      await client.health({ timeoutMs: HEALTH_TIMEOUT_MS });
      this.agentKeys.set(record.id, key);
      return true;
    } catch (error) {
      this.log.warn({ sandboxId: record.id, operation: 'init' }, `init: its agent did not answer as itself: ${(error as Error).message}`);
      return false;
    } finally {
      client.close();
    }
  }

  /** Slots and cgroups of this owner that no running sandbox accounts for. */
  protected async reclaimOrphans(): Promise<void> {
    const running = new Set([...this.records.values()].filter((record) => isLive(record)).map((record) => record.id));
    // Our claims whose sandbox is not live (and our pool of a previous run) are scrubbed into
    // the pool or taken apart; the claims of live sandboxes stay theirs.
    const liveSlots = new Map<number, string>();
    for (const record of this.records.values()) if (isLive(record) && record.slot) liveSlots.set(record.slot.index, record.id);
    await this.pool.reclaim(liveSlots);
    const cgroups = this.requireCgroups();
    // File views (`<id>-view`) are never adopted, so theirs go here too.
    for (const name of await cgroups.children(join('nestbox', this.ownerKey))) {
      if (running.has(name)) continue;
      this.log.info({ operation: 'init', cgroup: name }, `init: removing orphaned cgroup ${name}`);
      const group = this.cgroupGroup(name);
      await cgroups.killAll(group);
      await cgroups.remove(group);
    }
    for (const record of this.records.values()) await removeTree(join(this.sandboxDir(record.id), 'view'));
    // Id ranges of ours that no live sandbox holds (views included: they were just killed).
    for (const claim of await this.idRanges.claims()) {
      if (claim.owner === this.options.ownerId && !running.has(claim.holder)) await this.idRanges.release(claim.index, claim.owner, claim.holder);
    }
    // Disks in the reflink store whose sandbox dir is gone: a destroy that crashed half-way.
    const store = this.requireDiskStore();
    if (store.root !== this.dataDir) {
      for (const id of await readdir(join(store.root, 'sandboxes')).catch(() => [] as string[])) {
        if (!SANDBOX_ID.test(id) || existsSync(this.sandboxDir(id))) continue;
        this.log.info({ sandboxId: id, operation: 'init' }, 'init: removing orphaned disk');
        await removeTree(join(store.root, 'sandboxes', id));
      }
    }
  }
}
