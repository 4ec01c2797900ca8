// How a local sandbox runs: launch (slot from the pool, egress rules, cgroups, id range, agent
// key, the launcher, the agent's first answer), teardown back to a disk only, destroy, the
// egress rules of its slot and their refresh, and the watch for sandboxes that die on their own.
import type { ChildProcess } from 'node:child_process';
import { constants as fsConstants, existsSync } from 'node:fs';
import { lstat, mkdir, open, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../../../core/logger.js';
import { AgentClient } from '../../agent-protocol/client.js';
import { newAgentKey } from '../../agent-protocol/auth.js';
import { removeAgentKeyFile, writeAgentKeyFile } from '../../agent-protocol/key-file.js';
import { egressRulesKey, resolveEgress, systemResolver } from '../../network/egress.js';
import { applyNftRuleset, renderSlotEgress } from '../../network/nft.js';
import { teardownSlot, VETH_PREFIX } from '../../network/slots.js';
import { removeTree } from '../../util/fs.js';
import { mountPointsUnder } from '../../util/mounts.js';
import { isProcessAlive, processStartTime, waitForProcessExit } from '../../util/process.js';
import { DriverError } from '../errors.js';
import { readTail } from './file-view.js';
import { readRecord, writeRecord, type SandboxRecord } from './records.js';
import { DEFAULT_EGRESS_REFRESH_MS, DEFAULT_PIDS_MAX, isLive, LocalSandboxes, MOUNT_OPTIONS_MAX, type SandboxImage } from './sandboxes.js';
import { launchSandbox, overlayLowerOption, SANDBOX_PATH } from './spawn.js';
import { LXCFS_FILES } from './lxcfs.js';

export abstract class LocalRuntime extends LocalSandboxes {
  /** What each live sandbox's allow list resolved to, to notice when a refresh changes it. */
  protected readonly egressApplied = new Map<string, { rulesKey: string; unresolved: string[]; hasDomains: boolean }>();
  protected egressTimer?: NodeJS.Timeout;
  /** Launchers started by this process: their exit tells us at once that a sandbox died. */
  protected readonly children = new Map<string, ChildProcess>();
  protected watchTimer?: NodeJS.Timeout;

  // ---- launch ---------------------------------------------------------------------------------

  /** Slot, cgroups, process, agent: everything a running sandbox has beyond its disk. */
  protected async launch(record: SandboxRecord, image: SandboxImage, onProgress?: (line: string) => void): Promise<void> {
    const { id } = record.spec;
    const lowerDir = image.rootfs;
    const dir = this.sandboxDir(id);
    const cgroups = this.requireCgroups();
    const layerDirs = await this.layerDirsOf(record);
    assertOverlayOptionsFit(lowerDir, layerDirs, this.upperDirOf(record), this.workDirOf(record));
    await writeSandboxEtc(this.upperDirOf(record), id, this.dnsServers, this.log);

    const taken = await this.pool.take(id);
    const slot = taken.slot;
    record.slot = { ...slot };
    await writeRecord(dir, record);
    // Before any process runs: the sandbox never has a moment under the default policy.
    await this.applyEgress(record);
    onProgress?.(`network slot ${slot.index} (${taken.pooled ? 'from the pool' : 'built now'}): ${slot.sandboxAddress} via ${slot.hostAddress}`);

    const { group, agent, work } = await cgroups.createSandbox(this.cgroupPath(id), {
      memoryBytes: record.spec.memoryMiB * 1024 * 1024,
      cpus: record.spec.cpu,
      pidsMax: this.options.pidsMax ?? DEFAULT_PIDS_MAX,
      // As many CPUs as vCPUs (rounded up), so nproc inside shows them (resize.ts).
      cpusetCpus: cgroups.hasCpuset ? await cgroups.pickCpus(Math.ceil(record.spec.cpu), [], this.cgroupPath(id)) : undefined,
    });
    record.cgroup = { version: group.version, paths: group.paths };
    await writeRecord(dir, record);
    record.idRange = await this.idRanges.claim(this.options.ownerId, id);
    await writeRecord(dir, record);

    await rm(record.agentSocket, { force: true });
    // A fresh key per boot (create, start, fork child): stored before the agent exists, so a
    // host agent that dies from here on finds it when it adopts the sandbox.
    const agentKey = newAgentKey();
    await writeAgentKeyFile(dir, agentKey);
    this.agentKeys.set(id, agentKey);
    await appendLog(join(dir, 'sandbox.log'), `--- nestbox: starting ${id} at ${new Date().toISOString()} ---\n`);
    // Volumes are mounted on the host (again after a reboot) before the launcher binds them in.
    for (const volume of record.spec.volumes ?? []) await this.volumes.ensure(volume.volumeId);
    const child = launchSandbox({
      volumes: (record.spec.volumes ?? []).map((volume) => ({ source: this.volumes.dataDir(volume.volumeId), subpath: volume.subpath, mountPath: volume.mountPath, readOnly: volume.readOnly })),
      netnsPath: `/run/netns/${slot.netns}`,
      cgroupProcsFiles: cgroups.procsFiles(agent),
      workProcsFiles: cgroups.procsFiles(work),
      enterHelperBinary: this.enterHelperBinary,
      rootfsHelperBinary: this.rootfsHelperBinary,
      seccompHelperBinary: this.seccompHelperBinary,
      hostLoader: this.hostLoader,
      idRange: record.idRange,
      lowerDir,
      layerDirs,
      upperDir: this.upperDirOf(record),
      workDir: this.workDirOf(record),
      rootDir: join(dir, 'rootfs'),
      runDir: join(dir, 'run'),
      nodeBinary: this.nodeBinary,
      tiniBinary: this.tiniBinary,
      ptyHelperBinary: this.ptyHelperBinary,
      guestAgentBundle: this.agentBundle,
      hostname: id,
      env: { HOME: '/root', PATH: SANDBOX_PATH, ...image.env, ...record.spec.env, HOSTNAME: id },
      logFile: join(dir, 'sandbox.log'),
      lastCapability: this.lastCap,
      agentKey,
      lxcfs: this.lxcfs ? { mountPoint: this.lxcfs.mountPoint, files: LXCFS_FILES } : undefined,
    });
    const exited = new Promise<never>((_, reject) => {
      child.once('exit', (code, signal) => reject(new Error(`sandbox ${id} exited during start (${signal ?? `exit ${code}`})`)));
      child.once('error', reject);
    });
    exited.catch(() => {});
    if (!child.pid) throw new Error(`could not spawn the launcher for sandbox ${id}`);
    record.pid = child.pid;
    record.pidStartTime = processStartTime(child.pid);
    await writeRecord(dir, record);

    try {
      const client = new AgentClient(record.agentSocket, { proofKey: agentKey });
      try {
        await Promise.race([this.waitReadySafely(client, record.agentSocket), exited]);
      } finally {
        client.close();
      }
    } catch (error) {
      const tail = await readTail(join(dir, 'sandbox.log'));
      throw new Error(`sandbox ${id} did not become ready: ${(error as Error).message}\n--- sandbox log (tail) ---\n${tail}`);
    }
    record.status = 'running';
    await writeRecord(dir, record);
    this.watchChild(id, child);
  }

  protected async waitReadySafely(client: AgentClient, socketPath: string): Promise<void> {
    await client.waitReady({ timeoutMs: this.options.readyTimeoutMs ?? 20_000, intervalMs: 25 });
    await assertAgentSocket(socketPath);
  }


  // ---- teardown -------------------------------------------------------------------------------

  /** Kills the processes and releases the slot and cgroups; the disk (upper/) stays. */
  protected async teardownRuntime(id: string, record: SandboxRecord | undefined): Promise<void> {
    const cgroups = this.requireCgroups();
    const group = this.cgroupGroup(id);
    this.children.get(id)?.removeAllListeners('exit');
    this.children.delete(id);
    await cgroups.killAll(group);
    // Belt and braces: a launcher killed before it joined the cgroups is found by pid.
    if (record?.pid && record.pidStartTime && isProcessAlive(record.pid, record.pidStartTime)) {
      try {
        process.kill(record.pid, 'SIGKILL');
      } catch {
        // Gone meanwhile.
      }
      if (!(await waitForProcessExit(record.pid, record.pidStartTime, 5_000, 20))) throw new Error(`process ${record.pid} did not exit within 5000 ms`);
    }
    for (const { slot, claimed } of await this.slots.heldBy(this.options.ownerId, id, record?.slot)) {
      // A slot we hold the claim of is scrubbed back into the pool; one nobody claims (a crash
      // between teardown and record write) is only taken apart, never claimed again by us.
      if (claimed) await this.pool.release(slot);
      else await teardownSlot(slot);
    }
    this.egressApplied.delete(id);
    this.agentKeys.delete(id);
    await removeAgentKeyFile(this.sandboxDir(id));
    await cgroups.remove(group);
    // The id range goes last: no process of the sandbox is left that could still use it.
    for (const claim of await this.idRanges.claims()) {
      if (claim.owner === this.options.ownerId && claim.holder === id) await this.idRanges.release(claim.index, claim.owner, claim.holder);
    }
    if (record) {
      record.idRange = undefined;
      record.slot = undefined;
      record.cgroup = undefined;
      record.pid = undefined;
      record.pidStartTime = undefined;
      await rm(record.agentSocket, { force: true });
    }
  }

  protected async destroyUnlocked(id: string): Promise<void> {
    const dir = this.sandboxDir(id);
    const record = this.records.get(id) ?? (await readRecord(dir));
    await this.teardownRuntime(id, record);
    // The disk goes first and the record last, so a crash in between leaves a record to retry from.
    await this.removeDiskDirs(id, record);
    // Mounts live in the sandbox's own namespace; anything on the host here is a leftover.
    const leftovers = mountPointsUnder(dir);
    await removeTree(dir);
    if (existsSync(dir)) throw new Error(`could not remove ${dir} (mounts: ${leftovers.join(', ') || 'none'})`);
    this.records.delete(id);
  }

  // ---- egress -----------------------------------------------------------------------------------

  /** Renders the sandbox's policy into its slot's chain (one atomic nft transaction). */
  protected async applyEgress(record: SandboxRecord): Promise<{ addresses: string[]; denied: string[]; unresolved: string[] }> {
    if (!record.slot) throw new Error(`sandbox ${record.id} has no network slot`);
    const resolved = await resolveEgress(record.spec.egress, this.options.egressResolver ?? systemResolver);
    await applyNftRuleset(renderSlotEgress(record.slot.index, VETH_PREFIX, resolved.rules));
    if (resolved.unresolved.length) this.log.warn({ sandboxId: record.id }, `egress: ${resolved.unresolved.join(', ')} resolved to nothing (retried at the next refresh)`);
    this.egressApplied.set(record.id, { rulesKey: egressRulesKey(resolved.rules), unresolved: resolved.unresolved, hasDomains: resolved.hasDomains });
    this.startEgressRefresh();
    return { addresses: resolved.rules.addresses, denied: resolved.rules.denied ?? [], unresolved: resolved.unresolved };
  }

  /**
   * applyEgress, skipped when the rules `record`'s policy resolves to are those in force already
   * (a warm-pool member claimed with the policy it was started with: no nft transaction).
   */
  protected async applyEgressIfChanged(record: SandboxRecord): Promise<void> {
    if (!record.slot) throw new Error(`sandbox ${record.id} has no network slot`);
    const applied = this.egressApplied.get(record.id);
    const resolved = await resolveEgress(record.spec.egress, this.options.egressResolver ?? systemResolver);
    if (applied && !resolved.hasDomains && egressRulesKey(resolved.rules) === applied.rulesKey) return;
    await this.applyEgress(record);
  }

  /** Resolves the domains of every live allow and deny list again; applies those whose addresses changed. */
  async refreshEgress(): Promise<number> {
    let changed = 0;
    for (const [id, applied] of [...this.egressApplied]) {
      if (!applied.hasDomains) continue;
      await this.withLock(id, async () => {
        const record = this.records.get(id);
        if (!record || !isLive(record) || !record.slot) return;
        const resolved = await resolveEgress(record.spec.egress, this.options.egressResolver ?? systemResolver);
        if (egressRulesKey(resolved.rules) === applied.rulesKey) return;
        await applyNftRuleset(renderSlotEgress(record.slot.index, VETH_PREFIX, resolved.rules));
        this.egressApplied.set(id, { rulesKey: egressRulesKey(resolved.rules), unresolved: resolved.unresolved, hasDomains: true });
        this.log.info({ sandboxId: id }, `egress: allow list now resolves to ${resolved.rules.addresses.join(', ') || 'nothing'}, deny list to ${resolved.rules.denied?.join(', ') || 'nothing'}`);
        changed++;
      }).catch((error) => this.log.warn({ sandboxId: id }, `egress refresh: ${String(error)}`));
    }
    return changed;
  }

  protected startEgressRefresh(): void {
    if (this.egressTimer) return;
    this.egressTimer = setInterval(() => void this.refreshEgress(), this.options.egressRefreshMs ?? DEFAULT_EGRESS_REFRESH_MS);
    this.egressTimer.unref();
  }

  // ---- watching -------------------------------------------------------------------------------

  protected watchChild(id: string, child: ChildProcess): void {
    this.children.set(id, child);
    child.once('exit', () => {
      if (this.children.get(id) === child) void this.checkStillRunning(id);
    });
  }

  protected startWatching(): void {
    const interval = this.options.watchIntervalMs ?? 5_000;
    this.watchTimer = setInterval(() => {
      for (const record of this.records.values()) if (isLive(record)) void this.checkStillRunning(record.id);
    }, interval);
    this.watchTimer.unref();
  }

  /** A sandbox whose launcher died on its own (OOM of PID 1, external kill) becomes stopped. */
  protected async checkStillRunning(id: string): Promise<void> {
    await this.withLock(id, async () => {
      const record = this.records.get(id);
      if (!record || !isLive(record)) return;
      if (isProcessAlive(record.pid, record.pidStartTime)) return;
      this.log.warn({ sandboxId: id }, 'sandbox exited on its own; releasing its runtime');
      await this.teardownRuntime(id, record);
      record.status = 'stopped';
      await writeRecord(this.sandboxDir(id), record);
    }).catch((error) => this.log.warn({ sandboxId: id }, `watch: ${String(error)}`));
  }
}

// ---- free functions -----------------------------------------------------------------------------

/**
 * Defence in depth: the launcher binds the agent socket in run/, a host directory the sandbox
 * never sees (the agent inherits only the descriptor), so nothing inside can replace it. Should
 * that ever change, a symlink planted there would point the host agent, as root, at some other
 * host socket; refuse anything that is not a socket.
 */
export async function assertAgentSocket(path: string): Promise<void> {
  const info = await lstat(path);
  if (!info.isSocket()) throw new Error(`${path} is not a Unix socket (${info.isSymbolicLink() ? 'a symlink' : 'another file type'}); refusing to connect`);
}


function assertOverlayOptionsFit(lowerDir: string, layerDirs: string[], upperDir: string, workDir: string): void {
  const options = `lowerdir=${overlayLowerOption({ lowerDir, layerDirs })},upperdir=${upperDir},workdir=${workDir}`;
  if (Buffer.byteLength(options) > MOUNT_OPTIONS_MAX) {
    throw new DriverError('validation_failed', `the snapshot chain is too long to mount (${layerDirs.length} layers, ${Buffer.byteLength(options)} bytes of overlay options)`);
  }
}


/**
 * /etc/hostname, /etc/hosts and /etc/resolv.conf go straight into the upper layer before launch.
 * The sandbox owns that directory, so nothing here may follow a symlink it planted.
 */
async function writeSandboxEtc(upperDir: string, id: string, dnsServers: string[], log: Logger): Promise<void> {
  const etc = join(upperDir, 'etc');
  const etcStat = await lstat(etc).catch(() => undefined);
  if (!etcStat) await mkdir(etc, { mode: 0o755 });
  else if (!etcStat.isDirectory()) {
    log.warn({ sandboxId: id }, '/etc in the upper layer is not a directory; leaving it alone');
    return;
  }
  await writeNoFollow(join(etc, 'hostname'), `${id}\n`);
  await writeNoFollow(join(etc, 'hosts'), `127.0.0.1\tlocalhost\n127.0.1.1\t${id}\n::1\tlocalhost ip6-localhost ip6-loopback\n`);
  await writeNoFollow(join(etc, 'resolv.conf'), dnsServers.map((server) => `nameserver ${server}\n`).join(''));
}


async function writeNoFollow(path: string, content: string): Promise<void> {
  const existing = await lstat(path).catch(() => undefined);
  if (existing && !existing.isFile()) await rm(path, { recursive: true, force: true });
  const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_TRUNC | fsConstants.O_NOFOLLOW, 0o644);
  try {
    await handle.writeFile(content);
  } finally {
    await handle.close();
  }
}


async function appendLog(path: string, line: string): Promise<void> {
  const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_APPEND | fsConstants.O_NOFOLLOW, 0o600);
  try {
    await handle.writeFile(line);
  } finally {
    await handle.close();
  }
}
