// File views: reading the files of a STOPPED sandbox without resuming it. A throwaway set of
// namespaces is launched exactly like a sandbox (same launcher, same guest agent, so paths and
// symlinks resolve inside the sandbox's own root), except that:
//   - the overlay is mounted read-only: `lowerdir=<upper>:<snapshot layers…>:<base>`, no upper
//     dir, so nothing in the view can change the sandbox's disk;
//   - it gets a new, empty network namespace instead of a slot (no network at all);
//   - it runs in its own small cgroup (`<id>-view`: 256 MiB, 1 CPU, 64 tasks);
//   - its agent listens on `<sandboxDir>/view/agent.sock`.
// A view is reused while requests come, stopped after `idleMs` without use, and always before
// the sandbox is started, forked, snapshotted or destroyed. Views are never adopted: after a
// host-agent restart the driver's orphan reclaim kills them with their cgroup.
import type { ChildProcess } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { lstat, mkdir, open, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentClient } from '../../agent-protocol/client.js';
import { newAgentKey } from '../../agent-protocol/auth.js';
import { removeTree } from '../../util/fs.js';
import { processStartTime } from '../../util/process.js';
import type { FileView } from '../types.js';
import type { Cgroups, CgroupGroup } from './cgroups.js';
import type { IdRangeAllocator } from './id-ranges.js';
import { launchSandbox, SANDBOX_PATH } from './spawn.js';

const VIEW_LIMITS = { memoryBytes: 256 * 1024 * 1024, cpus: 1, pidsMax: 64 };
const SUN_PATH_MAX = 107;

export interface FileViewDeps {
  cgroups: Cgroups;
  /** The cgroup path (relative to the controller roots) for a group name. */
  cgroupPath: (name: string) => string;
  nodeBinary: string;
  tiniBinary: string;
  guestAgentBundle: string;
  rootfsHelperBinary: string;
  seccompHelperBinary: string;
  hostLoader?: { loader: string; libs: { soname: string; path: string }[] };
  enterHelperBinary: string;
  /** A view gets a user namespace of its own, like any running sandbox. */
  idRanges: IdRangeAllocator;
  owner: string;
  lastCapability: number;
  readyTimeoutMs: number;
  idleMs: number;
  /** Called (outside any lock) for each view idle for longer than idleMs; it should close it. */
  onIdle: (sandboxId: string) => void;
  log: (message: string) => void;
}

export interface FileViewLaunch {
  sandboxId: string;
  sandboxDir: string;
  /** The sandbox's upper dir, then its snapshot layers: topmost first. */
  layerDirs: string[];
  baseRootfs: string;
  env: Record<string, string>;
}

interface LiveView {
  viewId: string;
  agentSocket: string;
  agentKey: Buffer;
  pid: number;
  pidStartTime?: string;
  child: ChildProcess;
  lastUsed: number;
}

export function viewCgroupName(sandboxId: string): string {
  // Sandbox ids are [a-z0-9], so `<id>-view` can never be another sandbox's group.
  return `${sandboxId}-view`;
}

export class FileViews {
  private readonly views = new Map<string, LiveView>();
  private readonly timer: NodeJS.Timeout;

  constructor(private readonly deps: FileViewDeps) {
    this.timer = setInterval(() => this.sweep(), Math.max(250, Math.min(10_000, deps.idleMs / 4)));
    this.timer.unref();
  }

  /** The live view of a sandbox, started if needed. The caller holds the sandbox's lock. */
  async open(launch: FileViewLaunch): Promise<FileView> {
    const live = this.views.get(launch.sandboxId);
    if (live && processStartTime(live.pid) === live.pidStartTime) {
      live.lastUsed = Date.now();
      return { agentSocket: live.agentSocket, viewId: live.viewId, agentProofKey: live.agentKey };
    }
    await this.close(launch.sandboxId, launch.sandboxDir);
    return this.start(launch);
  }

  touch(sandboxId: string): void {
    const live = this.views.get(sandboxId);
    if (live) live.lastUsed = Date.now();
  }

  isOpen(sandboxId: string): boolean {
    return this.views.has(sandboxId);
  }

  /** Whether the view's launcher still runs (it may have died on its own, e.g. OOM). */
  isRunning(sandboxId: string): boolean {
    const live = this.views.get(sandboxId);
    return !!live && processStartTime(live.pid) === live.pidStartTime;
  }

  /** Whether the view exists and has not been used for idleMs. */
  isIdle(sandboxId: string): boolean {
    const live = this.views.get(sandboxId);
    return !!live && Date.now() - live.lastUsed >= this.deps.idleMs;
  }

  /**
   * Stops the view and removes everything it had (processes, cgroup, view dir). Also cleans up
   * after a view this process does not know about (started before a restart). Idempotent.
   */
  async close(sandboxId: string, sandboxDir: string): Promise<void> {
    const live = this.views.get(sandboxId);
    this.views.delete(sandboxId);
    live?.child.removeAllListeners('exit');
    const group = this.group(sandboxId);
    await this.deps.cgroups.killAll(group);
    if (live && live.pidStartTime && processStartTime(live.pid) === live.pidStartTime) {
      try {
        process.kill(live.pid, 'SIGKILL');
      } catch {
        // Gone meanwhile.
      }
    }
    await this.deps.cgroups.remove(group);
    const holder = viewCgroupName(sandboxId);
    for (const claim of await this.deps.idRanges.claims()) {
      if (claim.owner === this.deps.owner && claim.holder === holder) await this.deps.idRanges.release(claim.index, claim.owner, claim.holder);
    }
    await removeTree(join(sandboxDir, 'view'));
  }

  /** Stops the timer and every view (views never outlive the driver instance that made them). */
  async closeAll(sandboxDirOf: (sandboxId: string) => string): Promise<void> {
    clearInterval(this.timer);
    for (const sandboxId of [...this.views.keys()]) {
      await this.close(sandboxId, sandboxDirOf(sandboxId)).catch((error) => this.deps.log(`file view ${sandboxId}: close failed: ${String(error)}`));
    }
  }

  private sweep(): void {
    for (const sandboxId of this.views.keys()) if (this.isIdle(sandboxId)) this.deps.onIdle(sandboxId);
  }

  private group(sandboxId: string): CgroupGroup {
    return this.deps.cgroups.groupFor(this.deps.cgroupPath(viewCgroupName(sandboxId)));
  }

  private async start(launch: FileViewLaunch): Promise<FileView> {
    const started = Date.now();
    const { sandboxId, sandboxDir } = launch;
    const viewDir = join(sandboxDir, 'view');
    const agentSocket = join(viewDir, 'agent.sock');
    if (Buffer.byteLength(agentSocket) > SUN_PATH_MAX) throw new Error(`file view socket path ${agentSocket} is over the ${SUN_PATH_MAX}-byte Unix socket limit`);
    await mkdir(viewDir, { mode: 0o700 });
    await mkdir(join(viewDir, 'root'), { mode: 0o755 });
    const logFile = join(viewDir, 'view.log');
    const group = await this.deps.cgroups.create(this.deps.cgroupPath(viewCgroupName(sandboxId)), VIEW_LIMITS);
    // Views are short-lived and never adopted after a restart, so their key stays in memory.
    const agentKey = newAgentKey();
    const idRange = await this.deps.idRanges.claim(this.deps.owner, viewCgroupName(sandboxId));
    const child = launchSandbox({
      rootfsHelperBinary: this.deps.rootfsHelperBinary,
      seccompHelperBinary: this.deps.seccompHelperBinary,
      // Its workloads (exec in a view) go through nestbox-enter too, below the agent (spawn.ts AGENT_UID).
      enterHelperBinary: this.deps.enterHelperBinary,
      hostLoader: this.deps.hostLoader,
      idRange,
      netnsPath: '',
      cgroupProcsFiles: this.deps.cgroups.procsFiles(group),
      lowerDir: launch.baseRootfs,
      layerDirs: launch.layerDirs,
      upperDir: '',
      workDir: '',
      rootDir: join(viewDir, 'root'),
      runDir: viewDir,
      nodeBinary: this.deps.nodeBinary,
      tiniBinary: this.deps.tiniBinary,
      guestAgentBundle: this.deps.guestAgentBundle,
      hostname: sandboxId,
      env: { HOME: '/root', PATH: SANDBOX_PATH, ...launch.env, HOSTNAME: sandboxId },
      logFile,
      lastCapability: this.deps.lastCapability,
      agentKey,
    });
    const exited = new Promise<never>((_, reject) => {
      child.once('exit', (code, signal) => reject(new Error(`file view of ${sandboxId} exited during start (${signal ?? `exit ${code}`})`)));
      child.once('error', reject);
    });
    exited.catch(() => {});
    try {
      if (!child.pid) throw new Error(`could not spawn the file view launcher for ${sandboxId}`);
      const client = new AgentClient(agentSocket, { proofKey: agentKey });
      try {
        await Promise.race([client.waitReady({ timeoutMs: this.deps.readyTimeoutMs, intervalMs: 20 }), exited]);
      } finally {
        client.close();
      }
      const info = await lstat(agentSocket);
      if (!info.isSocket()) throw new Error(`${agentSocket} is not a Unix socket; refusing to use it`);
    } catch (error) {
      const tail = await readTail(logFile);
      await this.close(sandboxId, sandboxDir).catch(() => {});
      throw new Error(`file view of ${sandboxId} did not become ready: ${(error as Error).message}\n--- view log (tail) ---\n${tail}`);
    }
    const live: LiveView = {
      viewId: `${child.pid}-${started}`,
      agentSocket,
      agentKey,
      pid: child.pid,
      pidStartTime: processStartTime(child.pid),
      child,
      lastUsed: Date.now(),
    };
    this.views.set(sandboxId, live);
    child.once('exit', () => {
      if (this.views.get(sandboxId) === live) this.deps.onIdle(sandboxId);
    });
    this.deps.log(`file view of ${sandboxId}: ready in ${Date.now() - started} ms`);
    return { agentSocket, viewId: live.viewId, agentProofKey: agentKey };
  }
}

/** The end of a log file (never following a symlink the sandbox could have planted). */
export async function readTail(path: string, bytes = 4_000): Promise<string> {
  try {
    const size = (await stat(path)).size;
    const handle = await open(path, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
    try {
      const length = Math.min(size, bytes);
      const buffer = Buffer.alloc(length);
      await handle.read(buffer, 0, length, size - length);
      return buffer.toString('utf8');
    } finally {
      await handle.close();
    }
  } catch {
    return '(no log)';
  }
}
