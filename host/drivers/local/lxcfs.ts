// LXCFS: the sandbox's own limits in /proc. One `lxcfs` daemon per host agent (data dir) serves a
// FUSE file system at `<dataDir>/lxcfs`; every sandbox gets read-only bind mounts of its
// proc/{meminfo,cpuinfo,stat,uptime,loadavg,diskstats,swaps} and sys/devices/system/cpu/online
// over its own (spawn.ts, stage 2). LXCFS answers each read from the reading process's cgroups
// (memory limit, cpuset and CFS quota) and pid namespace (uptime), so `free`, `top`, `uptime`
// and `/proc/cpuinfo` inside a sandbox show the sandbox, not the machine.
//
// Lifetime: the daemon runs detached (own session) with a pid file, so it outlives a host agent
// restart like the sandboxes do; the next host agent adopts it when its pid (and start time)
// still runs and the mount answers. A supervisor loop restarts it on the same mount point when
// it dies (a dead FUSE mount is lazily unmounted first). What running sandboxes see when it
// dies: their bind mounts belong to the dead connection, so those files fail with ENOTCONN until
// the sandbox's next start (a new mount is a new file system; binding it into a running
// sandbox's mount namespace is not done). close() stops it when no sandbox uses it any more.
import { spawn } from 'node:child_process';
import { existsSync, openSync, closeSync } from 'node:fs';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from '../../../core/logger.js';
import { readMountinfo } from '../../util/mounts.js';
import { isProcessAlive, processStartTime, waitForProcessExit } from '../../util/process.js';
import { runCommand } from '../../util/run.js';

export const LXCFS_BINARY = '/usr/bin/lxcfs';
/** Files of the LXCFS mount bound over the sandbox's own (relative to the mount point). */
export const LXCFS_FILES = ['proc/meminfo', 'proc/cpuinfo', 'proc/stat', 'proc/uptime', 'proc/loadavg', 'proc/diskstats', 'proc/swaps', 'sys/devices/system/cpu/online'] as const;
const SUPERVISE_MS = 5_000;
const READY_TIMEOUT_MS = 10_000;

/** Whether this machine can run LXCFS at all (binary and /dev/fuse). */
export function lxcfsAvailable(binary = LXCFS_BINARY): boolean {
  return existsSync(binary) && existsSync('/dev/fuse');
}

export class LxcfsDaemon {
  readonly mountPoint: string;
  private readonly pidFile: string;
  private readonly stateFile: string;
  private timer?: NodeJS.Timeout;
  private pid?: number;
  private startTime?: string;
  private restarting?: Promise<void>;

  constructor(
    dir: string,
    private readonly log: Logger,
    private readonly binary = LXCFS_BINARY,
  ) {
    this.mountPoint = join(dir, 'mnt');
    this.pidFile = join(dir, 'lxcfs.pid');
    this.stateFile = join(dir, 'state.json');
  }

  /** Adopts a daemon a previous host agent left running, or starts one; then supervises it. */
  async start(): Promise<void> {
    await mkdir(this.mountPoint, { recursive: true, mode: 0o755 });
    if (!(await this.adopt())) await this.launch();
    this.timer = setInterval(() => void this.check(), SUPERVISE_MS);
    this.timer.unref();
  }

  /** Whether the mount is served right now (a read of its meminfo succeeds). */
  async healthy(): Promise<boolean> {
    if (!isProcessAlive(this.pid, this.startTime)) return false;
    return readFile(join(this.mountPoint, 'proc/meminfo'), 'utf8').then((text) => text.startsWith('MemTotal'), () => false);
  }

  /** The daemon's pid (tests). */
  get daemonPid(): number | undefined {
    return this.pid;
  }

  /** Restarts a dead daemon on the same mount point (the supervisor does this every few seconds). */
  async check(): Promise<void> {
    if (this.restarting) return this.restarting;
    if (await this.healthy()) return;
    this.restarting = (async () => {
      this.log.warn({ mountPoint: this.mountPoint }, 'lxcfs: the daemon is gone or its mount does not answer; restarting it (running sandboxes see ENOTCONN in their /proc files until their next start)');
      await this.kill();
      await this.launch();
    })()
      .catch((error) => this.log.warn({ mountPoint: this.mountPoint }, `lxcfs: restart failed: ${String(error)}`))
      .finally(() => {
        this.restarting = undefined;
      });
    return this.restarting;
  }

  /** Stops supervising; `stopDaemon` also ends the daemon and unmounts (nothing uses it any more). */
  async close(stopDaemon: boolean): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.restarting;
    if (stopDaemon) {
      await this.kill();
      await rm(this.stateFile, { force: true });
    }
  }

  private async adopt(): Promise<boolean> {
    const state = await readFile(this.stateFile, 'utf8').then((text) => JSON.parse(text) as { pid: number; startTime: string }, () => undefined);
    if (!state) return false;
    this.pid = state.pid;
    this.startTime = state.startTime;
    if (await this.healthy()) {
      this.log.info({ mountPoint: this.mountPoint, pid: state.pid }, `lxcfs: adopted the running daemon (pid ${state.pid})`);
      return true;
    }
    await this.kill();
    return false;
  }

  private async launch(): Promise<void> {
    await this.unmountStale();
    await rm(this.pidFile, { force: true });
    const logFd = openSync(join(this.mountPoint, '..', 'lxcfs.log'), 'a', 0o600);
    try {
      // -f: stays our child's pid (the pid file and start time identify it for adoption);
      // -l: per-sandbox load average; --enable-cfs: the CFS quota counts in cpuinfo/stat.
      const child = spawn(this.binary, ['-f', '-l', '--enable-cfs', '--pidfile', this.pidFile, this.mountPoint], { detached: true, stdio: ['ignore', logFd, logFd], cwd: '/' });
      child.on('error', () => {});
      child.unref();
      if (!child.pid) throw new Error(`could not start ${this.binary}`);
      this.pid = child.pid;
      this.startTime = processStartTime(child.pid);
    } finally {
      closeSync(logFd);
    }
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (!(await this.healthy())) {
      if (Date.now() > deadline || !isProcessAlive(this.pid, this.startTime)) {
        const tail = await readFile(join(this.mountPoint, '..', 'lxcfs.log'), 'utf8').catch(() => '');
        throw new Error(`lxcfs did not serve ${this.mountPoint} within ${READY_TIMEOUT_MS} ms: ${tail.split('\n').slice(-5).join(' | ')}`);
      }
      await sleep(20);
    }
    await writeFile(this.stateFile, JSON.stringify({ pid: this.pid, startTime: this.startTime }), { mode: 0o600 });
    this.log.info({ mountPoint: this.mountPoint, pid: this.pid }, `lxcfs: serving ${this.mountPoint} (pid ${this.pid})`);
  }

  private async kill(): Promise<void> {
    if (this.pid && this.startTime && isProcessAlive(this.pid, this.startTime)) {
      // SIGTERM: lxcfs unmounts on its way out.
      try {
        process.kill(this.pid, 'SIGTERM');
      } catch {
        // Gone meanwhile.
      }
      if (!(await waitForProcessExit(this.pid, this.startTime, 3_000, 20))) {
        try {
          process.kill(this.pid, 'SIGKILL');
        } catch {
          // Gone meanwhile.
        }
        await waitForProcessExit(this.pid, this.startTime, 3_000, 20);
      }
    }
    this.pid = undefined;
    this.startTime = undefined;
    await this.unmountStale();
  }

  /** A FUSE mount whose daemon died stays as "Transport endpoint is not connected": detach it. */
  private async unmountStale(): Promise<void> {
    for (let i = 0; i < 4 && readMountinfo().some((entry) => entry.mountPoint === this.mountPoint); i++) {
      await runCommand('umount', ['-l', '--', this.mountPoint], { timeoutMs: 10_000 }).catch(() => {});
    }
  }
}
