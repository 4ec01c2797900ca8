// The cloud-hypervisor process of one sandbox (host-runtime.md §1 "Process-level behaviour",
// §6 "Launching CH inside the slot"): spawned inside the slot's network namespace (so `tap0`
// is the slot's TAP) and a private mount namespace, detached so it outlives the host agent;
// its pid and start time go to a pidfile so a restarted host agent can adopt it (the start time
// guards against pid reuse, the API ping proves it is really our VMM).
import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { isProcessAlive, processStartTime, waitForProcessExit } from '../../util/process.js';
import { ChApi, type VmmPingResponse } from './api.js';

export interface VmmPaths {
  apiSocket: string;
  eventMonitor: string;
  logFile: string;
  /** stdout/stderr of the process (CH logs to --log-file; this catches what happens before). */
  stdioLog: string;
  pidFile: string;
}

export interface LaunchOptions {
  binary: string;
  paths: VmmPaths;
  /** `/run/netns/<name>`; absent = the host's namespace (only for tests of this module). */
  netns?: string;
  /** Extra arguments, e.g. `-v`. */
  extraArgs?: string[];
  readyTimeoutMs?: number;
  env?: NodeJS.ProcessEnv;
}

export interface VmmProcess {
  pid: number;
  startTime: string;
  version: string;
}

export interface PidFile {
  pid: number;
  startTime: string;
  binary: string;
  apiSocket: string;
}

/** The argv that runs CH in the slot's netns and a fresh private mount namespace. */
export function launchCommand(options: LaunchOptions): { file: string; args: string[] } {
  const chArgs = [
    options.binary,
    '--api-socket',
    `path=${options.paths.apiSocket}`,
    '--event-monitor',
    `path=${options.paths.eventMonitor}`,
    '--log-file',
    options.paths.logFile,
    ...(options.extraArgs ?? []),
  ];
  // `unshare -m` makes mount changes (none today; fixed-path bind mounts later) private to this
  // VMM. Both `ip netns exec` and `unshare` exec in place, so the child pid is CH's own pid.
  // `ip netns exec` also remounts /sys for the namespace, so CH's /sys/class/net/<tap> check
  // sees the slot's devices.
  const inMountNs = ['unshare', '--mount', '--propagation', 'private', '--', ...chArgs];
  if (!options.netns) return { file: inMountNs[0], args: inMountNs.slice(1) };
  const name = options.netns.replace(/^\/run\/netns\//, '');
  return { file: 'ip', args: ['netns', 'exec', name, ...inMountNs] };
}

/**
 * Starts the VMM and resolves once `vmm.ping` answers. Throws (after killing it) if it exits
 * or stays silent; the stdio log tail is in the message.
 */
export async function launchVmm(options: LaunchOptions): Promise<VmmProcess> {
  const { paths } = options;
  for (const stale of [paths.apiSocket, paths.eventMonitor]) await rm(stale, { force: true });
  const { file, args } = launchCommand(options);
  const logFd = openSync(paths.stdioLog, 'a', 0o600);
  let exitNote: string | undefined;
  let child;
  try {
    child = spawn(file, args, { detached: true, stdio: ['ignore', logFd, logFd], env: options.env ?? process.env });
  } finally {
    closeSync(logFd);
  }
  child.once('exit', (code, signal) => {
    exitNote = signal ? `killed by ${signal}` : `exit ${code}`;
  });
  child.once('error', (error) => {
    exitNote = error.message;
  });
  child.unref();
  const pid = child.pid;
  if (!pid) throw new Error(`could not start ${options.binary}: ${exitNote ?? 'no pid'}`);
  const startTime = processStartTime(pid) ?? '';
  const pidFile: PidFile = { pid, startTime, binary: options.binary, apiSocket: paths.apiSocket };
  await writeFile(paths.pidFile, `${JSON.stringify(pidFile)}\n`, { mode: 0o600 });

  const api = new ChApi(paths.apiSocket, { timeoutMs: 1_000 });
  const deadline = Date.now() + (options.readyTimeoutMs ?? 10_000);
  let last = 'no attempt';
  // Kata polls every 10 ms; the API socket exists as soon as the VMM has parsed its arguments.
  for (;;) {
    if (exitNote) break;
    try {
      const ping: VmmPingResponse = await api.ping(1_000);
      return { pid, startTime, version: ping.version };
    } catch (error) {
      last = (error as Error).message;
    }
    if (Date.now() > deadline) break;
    await sleep(10);
  }
  await killProcess(pid, startTime, 2_000).catch(() => {});
  const tail = await readTail(paths.stdioLog);
  throw new Error(`cloud-hypervisor did not come up (${exitNote ?? `no ping answer: ${last}`})\n--- vmm output (tail) ---\n${tail}`);
}

export async function readPidFile(path: string): Promise<PidFile | undefined> {
  try {
    const parsed = JSON.parse(await readFile(path, 'utf8')) as PidFile;
    return Number.isInteger(parsed.pid) && parsed.pid > 0 ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Adoption after a host-agent restart: the pidfile's process must still be the same process
 * (start time) and answer on its API socket.
 */
export async function adoptVmm(pidFilePath: string): Promise<(VmmProcess & { api: ChApi }) | undefined> {
  const pidFile = await readPidFile(pidFilePath);
  if (!pidFile || !isProcessAlive(pidFile.pid, pidFile.startTime)) return undefined;
  const api = new ChApi(pidFile.apiSocket, { timeoutMs: 2_000 });
  try {
    const ping = await api.ping(2_000);
    return { pid: pidFile.pid, startTime: pidFile.startTime, version: ping.version, api };
  } catch {
    return undefined;
  }
}

/** SIGTERM, then SIGKILL after the grace period. Resolves once the process is gone. */
export async function killProcess(pid: number, startTime: string, graceMs: number): Promise<void> {
  if (!isProcessAlive(pid, startTime)) return;
  signal(pid, 'SIGTERM');
  if (await waitForProcessExit(pid, startTime, graceMs)) return;
  signal(pid, 'SIGKILL');
  if (!(await waitForProcessExit(pid, startTime, 5_000))) throw new Error(`cloud-hypervisor ${pid} survived SIGKILL`);
}

/**
 * Graceful then forced: `vmm.shutdown` (CH shuts the VM down and exits), then signals. The VM's
 * disk is consistent either way only if the caller paused/snapshotted first; this is teardown.
 */
export async function stopVmm(api: ChApi, pid: number, startTime: string, options: { graceMs?: number } = {}): Promise<'api' | 'signal'> {
  if (!isProcessAlive(pid, startTime)) return 'signal';
  const graceMs = options.graceMs ?? 3_000;
  try {
    await api.shutdownVmm();
    if (await waitForProcessExit(pid, startTime, graceMs)) return 'api';
  } catch {
    // Not answering (or already exiting): fall through to signals.
  }
  await killProcess(pid, startTime, graceMs);
  return 'signal';
}

function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // Gone already.
  }
}

export async function readTail(path: string, bytes = 4_000): Promise<string> {
  try {
    const text = await readFile(path, 'utf8');
    return text.slice(-bytes) || '(empty)';
  } catch {
    return '(none)';
  }
}

// ---- event monitor ---------------------------------------------------------------------------

export interface ChEvent {
  timestamp?: { secs: number; nanos: number };
  source: string;
  event: string;
  properties?: Record<string, unknown> | null;
}

/**
 * Splits CH's event-monitor stream — concatenated *pretty-printed* JSON objects, so one event
 * spans many lines — into objects. Feed it chunks as they arrive; it keeps the unfinished tail.
 * Braces inside strings (and escaped quotes) do not count.
 */
export class EventStreamParser {
  private pending = '';
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** Index in `pending` where the current object started, or -1 between objects. */
  private start = -1;
  private scanned = 0;

  push(chunk: string): ChEvent[] {
    this.pending += chunk;
    const events: ChEvent[] = [];
    for (let i = this.scanned; i < this.pending.length; i++) {
      const char = this.pending[i];
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (char === '\\') this.escaped = true;
        else if (char === '"') this.inString = false;
        continue;
      }
      if (char === '"') this.inString = this.start >= 0;
      else if (char === '{') {
        if (this.depth === 0) this.start = i;
        this.depth++;
      } else if (char === '}' && this.depth > 0) {
        this.depth--;
        if (this.depth === 0) {
          const text = this.pending.slice(this.start, i + 1);
          this.start = -1;
          try {
            const parsed = JSON.parse(text) as ChEvent;
            if (parsed && typeof parsed.event === 'string') events.push(parsed);
          } catch {
            // A corrupt object (a VMM killed mid-write): skip it, keep going.
          }
        }
      }
    }
    // Drop everything consumed; keep an unfinished object.
    if (this.start >= 0) {
      this.pending = this.pending.slice(this.start);
      this.start = 0;
    } else {
      this.pending = '';
    }
    this.scanned = this.pending.length;
    return events;
  }
}

/** Reads new events from the event-monitor file since the last call. */
export class EventFileReader {
  private offset = 0;
  private readonly parser = new EventStreamParser();

  constructor(readonly path: string) {}

  async readNew(): Promise<ChEvent[]> {
    let data: Buffer;
    try {
      data = await readFile(this.path);
    } catch {
      return [];
    }
    if (data.length < this.offset) this.offset = 0; // a new VMM started a fresh file
    const fresh = data.subarray(this.offset);
    this.offset = data.length;
    return fresh.length ? this.parser.push(fresh.toString('utf8')) : [];
  }
}
