// A restarted host agent takes over what the previous one left (init): VMMs that still run and
// answer are adopted (an interrupted stop whose snapshot completed is finished), the rest are
// stopped or, half-created, removed; orphaned slots are released. The watcher turns a VMM that
// exited on its own into a stopped sandbox.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { readAgentKeyFile } from '../../agent-protocol/key-file.js';
import { slotFor, teardownSlot } from '../../network/slots.js';
import { isProcessAlive } from '../../util/process.js';
import { observeState, runtimeStatusFor } from './lifecycle.js';
import { adoptVmm, readTail } from './process.js';
import { writeChRecord, type ChRecord } from './records.js';
import { ChVms } from './vm.js';

export abstract class ChRecovery extends ChVms {
  // ---- adoption and watching -------------------------------------------------------------------------

  protected async adoptAll(): Promise<void> {
    for (const { id, record } of await this.ownSandboxesOnDisk(this.options.ownerId)) {
      await this.withLock(id, () => this.adoptOne(id, record)).catch((error) => this.log(`init: ${id}: ${String(error)}`));
    }
  }

  protected async adoptOne(id: string, record: ChRecord | undefined): Promise<void> {
    if (!record || record.status === 'creating') {
      this.log(`init: removing half-created VM ${id}`);
      await this.destroyUnlocked(id);
      return;
    }
    this.records.set(id, record);
    const vmm = await adoptVmm(this.vmmPaths(id).pidFile);
    if (vmm && vmm.pid === record.pid) {
      const state = await observeState(vmm.api);
      if (state === 'Running' || state === 'Paused') {
        await this.attach(record);
        const key = await readAgentKeyFile(this.sandboxDir(id));
        if (key) this.agentKeys.set(id, key);
        // Without its key (lost, or a VM booted before keys existed), a running VM's agent gets
        // a new one now; a paused one at its unpause.
        else if (state === 'Running') await this.handOverAgentKey(record, undefined).catch((error) => this.log(`init: ${String(error)}`));
        // An interrupted stop whose snapshot completed can simply be finished.
        if (record.operation?.kind === 'stop' && record.memorySnapshot) {
          await this.teardownRuntime(record);
          record.status = 'stopped';
        } else {
          record.status = runtimeStatusFor(state);
        }
        record.operation = undefined;
        await writeChRecord(this.sandboxDir(id), record);
        this.log(`init: adopted ${record.status} VM ${id} (pid ${vmm.pid}, ${vmm.version})`);
        return;
      }
    }
    if (record.status !== 'stopped') this.log(`init: VM ${id} is no longer running; marking it stopped`);
    await this.teardownRuntime(record);
    // A stop that died before snapshot.json was written has no usable memory snapshot.
    if (record.memorySnapshot && !existsSync(join(record.memorySnapshot.dir, 'snapshot.json'))) record.memorySnapshot = undefined;
    record.status = 'stopped';
    record.operation = undefined;
    await writeChRecord(this.sandboxDir(id), record);
  }

  protected async reclaimOrphanSlots(): Promise<void> {
    const live = new Set([...this.records.values()].filter((record) => record.slot).map((record) => record.id));
    for (const claim of await this.slots.claims()) {
      if (claim.owner !== this.options.ownerId || live.has(claim.sandboxId)) continue;
      this.log(`init: releasing orphaned network slot ${claim.index} (sandbox ${claim.sandboxId})`);
      await teardownSlot(slotFor(this.subnet, claim.index));
      await this.slots.release(claim.index);
    }
  }

  /** A VMM that exited on its own (crash, guest poweroff, OOM kill) leaves a stopped sandbox. */
  protected async watchAll(): Promise<void> {
    for (const record of this.records.values()) {
      if (!record.pid || this.locks.busy(record.id)) continue;
      const vm = this.live.get(record.id);
      const events = (await vm?.events.readNew().catch(() => [])) ?? [];
      for (const event of events) if (event.event === 'panic' || event.source === 'guest') this.log(`sandbox ${record.id}: guest event ${event.source}/${event.event}`);
      if (isProcessAlive(record.pid, record.pidStartTime)) continue;
      await this.withLock(record.id, () => this.handleVmmExit(record)).catch((error) => this.log(`watch ${record.id}: ${String(error)}`));
    }
  }

  /** Checks now whether the VMM is still there (the watcher does this periodically). */
  async checkAlive(id: string): Promise<boolean> {
    const record = this.requireRecord(id);
    if (!record.pid || isProcessAlive(record.pid, record.pidStartTime)) return !!record.pid;
    await this.withLock(id, () => this.handleVmmExit(record));
    return false;
  }

  protected async handleVmmExit(record: ChRecord): Promise<void> {
    if (!record.pid || isProcessAlive(record.pid, record.pidStartTime)) return;
    const tail = await readTail(this.vmmPaths(record.id).stdioLog, 1_000);
    this.log(`sandbox ${record.id}: cloud-hypervisor ${record.pid} exited on its own; releasing its runtime`);
    record.lastError = { operation: 'watch', message: 'cloud-hypervisor exited unexpectedly', chain: ['cloud-hypervisor exited unexpectedly', tail.trim()], observedState: 'unreachable', at: new Date().toISOString() };
    await this.teardownRuntime(record);
    record.status = 'stopped';
    await writeChRecord(this.sandboxDir(record.id), record);
  }
}
