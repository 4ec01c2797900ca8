// `nestbox server` as the user starts it: a small supervisor that runs the control plane (HTTP
// server, database, background jobs, local host agent) in a child process — the worker — and
// starts a new one with backoff if it dies. The supervisor opens nothing itself: with PGlite the
// database directory may be open in one process only, so exactly one worker exists at a time
// and a new one starts only after the previous one (and its host agent) has exited.
//
// Request handlers answer their own errors (per-request error handling in every front door); the
// supervisor is the last line for what no handler can catch (a native crash, an exception in an
// event callback, running out of memory): the API is back within seconds and sandboxes keep
// running throughout — the new worker's host agent adopts them.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from './config.js';
import type { Logger } from '../core/logger.js';
import { createLogger } from './logger.js';
import { CLI_ENTRY } from './paths.js';

/** The worker's exit code for "restarting will not help" (bad configuration): EX_CONFIG. */
export const WORKER_FATAL_EXIT_CODE = 78;
/** The argument that makes `nestbox server` the worker rather than the supervisor. */
export const WORKER_FLAG = '--worker';
/** A worker that ran this long was healthy: the next crash starts the backoff from the beginning. */
const STABLE_RUN_MS = 60_000;
/** How long a dead worker's host agent may take to notice and exit before we start anyway. */
const HOST_AGENT_EXIT_WAIT_MS = 30_000;

/** Where the local host agent's pid is kept while it runs (written by local-host-agent.ts). */
export function hostAgentPidFile(config: Config): string {
  return join(config.dataDir, 'host-agent.pid');
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The previous worker's host agent, if it still runs (it exits by itself once its parent is gone). */
function leftoverHostAgent(config: Config): number | undefined {
  try {
    const pid = Number(readFileSync(hostAgentPidFile(config), 'utf8').trim());
    if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return undefined;
    // A recycled pid belongs to some other program: only a host agent counts.
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('host-agent') ? pid : undefined;
  } catch {
    return undefined;
  }
}

export interface Supervisor {
  /** The running worker's pid, if one runs. */
  workerPid(): number | undefined;
  stop(): Promise<void>;
}

/** `logger` defaults to JSON lines on stdout at NESTBOX_LOG_LEVEL; the worker writes its own to the same stdout. */
export function superviseServer(config: Config, logger: Logger = createLogger({ level: config.logLevel })): Supervisor {
  const log = logger.child({ component: 'supervisor' });
  let child: ChildProcess | undefined;
  let stopping = false;
  let failures = 0;
  let restartTimer: NodeJS.Timeout | undefined;

  const start = async () => {
    // Two control planes on one database directory (PGlite) or two host agents on one data dir
    // must never overlap: wait for the dead worker's host agent to leave first.
    const deadline = Date.now() + HOST_AGENT_EXIT_WAIT_MS;
    while (leftoverHostAgent(config) !== undefined && Date.now() < deadline && !stopping) await new Promise((r) => setTimeout(r, 200));
    if (stopping) return;
    const startedAt = Date.now();
    // The worker reads its configuration from the same environment; stdin is a pipe only so the
    // worker sees its end (EOF) the moment this process dies, even by kill -9.
    const worker = spawn(process.execPath, [...process.execArgv, CLI_ENTRY(), 'server', WORKER_FLAG], { stdio: ['pipe', 'inherit', 'inherit'], env: process.env });
    child = worker;
    // A spawn that fails (no exit follows) is retried like a crash.
    worker.once('error', (err) => {
      log.error(`could not run the worker: ${err.message}`);
      if (worker.pid === undefined && !stopping) restartTimer = setTimeout(() => void start(), 5_000);
    });
    // The pipe to a worker that died mid-write must not fail the supervisor.
    worker.stdin?.on('error', () => undefined);
    log.info({ workerPid: worker.pid }, `control plane worker started (pid ${worker.pid})`);
    worker.once('exit', (code, signal) => {
      child = undefined;
      if (stopping) return;
      if (code === WORKER_FATAL_EXIT_CODE) {
        log.error('the worker cannot start with this configuration; not restarting');
        process.exit(1);
      }
      if (Date.now() - startedAt >= STABLE_RUN_MS) failures = 0;
      const delay = Math.min(30_000, 500 * 2 ** Math.min(failures++, 6));
      log.error({ workerPid: worker.pid }, `control plane worker exited (${signal ?? `code ${code}`}); restarting in ${delay} ms`);
      restartTimer = setTimeout(() => void start(), delay);
    });
  };
  void start();

  return {
    workerPid: () => child?.pid,
    async stop() {
      stopping = true;
      clearTimeout(restartTimer);
      const worker = child;
      if (!worker || worker.exitCode !== null) return;
      const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
      worker.kill('SIGTERM');
      const timer = setTimeout(() => worker.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
