// Starting detached processes: validation of a start request, then a plain child on pipes or a
// command on a terminal through the nestbox-pty helper (see pty-helper/nestbox-pty.c for why a
// helper of our own). Both end up as a ManagedProcess whose controls the routes use.
import type { WorkloadLauncher } from '../workload.js';
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { constants as osConstants } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import type { ProcessSignal, StartProcessRequest, TerminalSize } from '../../agent-protocol/processes.js';
import { AgentHttpError } from '../errors.js';
import { commandLine, mergedEnv, workingDirectory } from '../exec.js';
import { killGroup, killSession, signalGroup } from './kill.js';
import { invalidState, ManagedProcess, type ProcessControls, type ProcessIdentity } from './managed-process.js';
import { resolveAccount, type RunAs } from './users.js';

export interface SpawnSettings {
  /** The agent user's home: default cwd and HOME unless another user is asked for. */
  home: string;
  baseEnv: NodeJS.ProcessEnv;
  /** Path of the nestbox-pty helper binary. */
  ptyHelper: string;
  /** Written to /proc/<pid>/oom_score_adj of every spawned process; undefined = leave as is. */
  oomScoreAdj: number | undefined;
  maxRetainedBytesPerStream: number;
  /** Where accounts are looked up (tests may point elsewhere). */
  passwdPath?: string;
  /** Starts workloads through nestbox-enter when the sandbox has it. */
  launcher: WorkloadLauncher;
}

export interface PreparedStart {
  file: string;
  args: string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
  runAs: RunAs;
  timeoutMs: number;
  stdin: boolean;
  tag: string | null;
  pty: TerminalSize | undefined;
}

/** How long a pty helper may take to report the command's pid before the start fails. */
const PTY_START_TIMEOUT_MS = 10_000;
/** After the command of a pty was killed, how long the helper gets to report before it is killed too. */
const PTY_HELPER_GRACE_MS = 3_000;

/** Validates everything that can be wrong with a request before anything is started. */
export async function prepareStart(request: StartProcessRequest, settings: SpawnSettings): Promise<PreparedStart> {
  const { file, args } = commandLine(request);
  const { runAs, home, defaultDir, identityEnv } = await resolveAccount(request.user, settings);
  const cwd = await workingDirectory(request.cwd, request.cwd === undefined ? defaultDir : home);
  const env = mergedEnv({ baseEnv: settings.baseEnv, home }, { ...identityEnv, ...request.env });
  if (request.pty && request.env?.TERM === undefined) env.TERM = 'xterm-256color';
  if (request.tag?.includes('\0')) throw new AgentHttpError(400, 'validation_failed', 'tag: must not contain a NUL byte');
  return {
    file,
    args,
    cwd,
    env,
    runAs,
    timeoutMs: request.timeoutMs ?? 0,
    stdin: request.stdin ?? false,
    tag: request.tag ?? null,
    pty: request.pty,
  };
}

function identityOf(id: string, prepared: PreparedStart): ProcessIdentity {
  return {
    id,
    pid: 0,
    cmd: prepared.file,
    args: prepared.args,
    cwd: prepared.cwd,
    tag: prepared.tag,
    user: prepared.runAs.name,
    pty: prepared.pty !== undefined,
  };
}

function adjustOomScore(pid: number, settings: SpawnSettings): void {
  if (settings.oomScoreAdj === undefined) return;
  try {
    writeFileSync(`/proc/${pid}/oom_score_adj`, String(settings.oomScoreAdj));
  } catch {
    // Gone already, or a kernel without the knob: nothing to protect then.
  }
}

/** Resolves once the child is running, or with the spawn error (ENOENT, EACCES…). */
function spawned(child: ChildProcess): Promise<NodeJS.ErrnoException | undefined> {
  return new Promise((resolve) => {
    child.once('spawn', () => resolve(undefined));
    child.once('error', (error) => resolve(error as NodeJS.ErrnoException));
  });
}

/** Resolves after a write was handed to the pipe; a closed or broken pipe is invalid_state. */
function writeTo(stream: Writable, data: Buffer): Promise<void> {
  return new Promise((resolve, reject) => {
    if (stream.destroyed || stream.writableEnded) {
      reject(invalidState('stdin is closed'));
      return;
    }
    stream.write(data, (error) => (error ? reject(invalidState(`stdin is closed: ${error.message}`)) : resolve()));
  });
}

/** A missing program is a process that exited 127 with the reason on stderr, like a shell. */
function failedStart(process: ManagedProcess, file: string, error: NodeJS.ErrnoException): void {
  const notFound = error.code === 'ENOENT';
  const reason = notFound ? 'command not found' : error.code === 'EACCES' ? 'permission denied' : error.message;
  process.append('stderr', Buffer.from(`${file}: ${reason}\n`));
  process.finish({ exitCode: notFound ? 127 : 126, signal: null });
}

export async function startPipeProcess(id: string, prepared: PreparedStart, settings: SpawnSettings): Promise<ManagedProcess> {
  const managed = new ManagedProcess(identityOf(id, prepared), settings.maxRetainedBytesPerStream);
  const launch = settings.launcher.wrap(prepared.file, prepared.args, prepared.runAs);
  const child = spawn(launch.file, launch.args, {
    cwd: prepared.cwd,
    env: prepared.env,
    uid: launch.uid,
    gid: launch.gid,
    // Own process group (setsid), so one kill(-pid) reaches every descendant that stays in it.
    detached: true,
    stdio: [prepared.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe', ...launch.extraStdio],
  });
  if (child.pid !== undefined && !launch.adjusted) adjustOomScore(child.pid, settings);
  // Listeners first: output can only arrive on a later tick, so nothing is missed.
  child.stdout?.on('data', (chunk: Buffer) => managed.append('stdout', chunk));
  child.stderr?.on('data', (chunk: Buffer) => managed.append('stderr', chunk));
  const failure = await spawned(child);
  if (failure) {
    failedStart(managed, prepared.file, failure);
    return managed;
  }
  managed.identity.pid = child.pid as number;
  const pid = child.pid as number;
  const stdin = child.stdin;
  // A process that exits without reading its stdin breaks the pipe: that closes stdin, no more.
  stdin?.on('error', () => stdin.destroy());
  managed.controls = {
    writeStdin: (data) => (stdin ? writeTo(stdin, data) : Promise.reject(invalidState('stdin is closed (the process was started with stdin: false)'))),
    closeStdin: () => stdin?.end(),
    stdinOpen: () => !!stdin && !stdin.destroyed && !stdin.writableEnded,
    signal: (signal: ProcessSignal) => void signalGroup(pid, signal),
    kill: () => killGroup(pid),
  };
  // 'close', not 'exit': it waits until the pipes are drained, so no output is lost.
  child.on('close', (exitCode, signal) => managed.finish({ exitCode, signal }));
  managed.armTimeout(prepared.timeoutMs);
  return managed;
}

const SIGNAL_NAMES = new Map<number, string>(Object.entries(osConstants.signals).map(([name, number]) => [number, name]));

/** Reads the helper's status lines ("pid N", "exit N", "signal N") from its fd 4. */
function statusReader(stream: Readable, onLine: (kind: string, value: number) => void): void {
  let pending = '';
  stream.setEncoding('utf8');
  stream.on('data', (text: string) => {
    pending += text;
    for (let newline = pending.indexOf('\n'); newline !== -1; newline = pending.indexOf('\n')) {
      const [kind, value] = pending.slice(0, newline).split(' ');
      pending = pending.slice(newline + 1);
      if (kind && /^\d+$/.test(value ?? '')) onLine(kind, Number(value));
    }
    if (pending.length > 256) pending = ''; // not our protocol; never grow
  });
}

export async function startPtyProcess(id: string, prepared: PreparedStart, settings: SpawnSettings): Promise<ManagedProcess> {
  const size = prepared.pty as TerminalSize;
  const managed = new ManagedProcess(identityOf(id, prepared), settings.maxRetainedBytesPerStream);
  const oom = settings.oomScoreAdj === undefined ? '-' : String(settings.oomScoreAdj);
  // nestbox-enter (when present) puts the helper, and so the command it forks, in the workload
  // cgroup as the target user; the helper then has nothing left to adjust.
  const launch = settings.launcher.wrap(settings.ptyHelper, [String(size.cols), String(size.rows), oom, prepared.file, ...prepared.args], prepared.runAs, 5);
  const helper = spawn(launch.file, launch.args, {
    cwd: prepared.cwd,
    env: prepared.env,
    uid: launch.uid,
    gid: launch.gid,
    detached: true,
    stdio: ['pipe', 'pipe', 'pipe', 'pipe', 'pipe', ...launch.extraStdio],
  });
  const [input, output, diagnostics, control, status] = helper.stdio as [Writable, Readable, Readable, Writable, Readable];
  output.on('data', (chunk: Buffer) => managed.append('stdout', chunk));
  diagnostics.on('data', (chunk: Buffer) => managed.append('stderr', chunk));
  input.on('error', () => input.destroy());
  control.on('error', () => control.destroy());

  let ending: { exitCode: number | null; signal: string | null } | undefined;
  const commandPid = new Promise<number | undefined>((resolve) => {
    statusReader(status, (kind, value) => {
      if (kind === 'pid') resolve(value);
      else if (kind === 'exit') ending = { exitCode: value, signal: null };
      else if (kind === 'signal') ending = { exitCode: null, signal: SIGNAL_NAMES.get(value) ?? `SIG${value}` };
    });
    helper.once('close', () => resolve(undefined));
  });
  const failure = await spawned(helper);
  if (failure) {
    throw new AgentHttpError(500, 'internal', `the pty helper could not be started (${settings.ptyHelper}): ${failure.message}`);
  }
  if (helper.pid !== undefined) adjustOomScore(helper.pid, settings);
  helper.on('close', (exitCode, signal) => managed.finish(ending ?? { exitCode, signal }));
  let timer: NodeJS.Timeout | undefined;
  const startTimeout = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), PTY_START_TIMEOUT_MS);
  });
  const pid = await Promise.race([commandPid, startTimeout]);
  clearTimeout(timer);
  if (pid === undefined) {
    if (helper.exitCode === null) killGroup(helper.pid as number);
    const detail = Buffer.concat([managed.stderr.readAll()]).toString('utf8').trim();
    throw new AgentHttpError(500, 'internal', `the pty helper failed to start the command${detail ? `: ${detail}` : ''}`);
  }
  managed.identity.pid = pid;
  const helperPid = helper.pid as number;
  const controls: ProcessControls = {
    writeStdin: (data) => writeTo(input, data),
    closeStdin: () => input.end(),
    stdinOpen: () => !input.destroyed && !input.writableEnded,
    // The command is a session leader: its pid is its process group (and session) id.
    signal: (signal: ProcessSignal) => void signalGroup(pid, signal),
    kill: () => {
      killSession(pid);
      // The helper exits by itself once the command is gone; this only covers a stuck helper.
      setTimeout(() => {
        if (managed.running) killGroup(helperPid);
      }, PTY_HELPER_GRACE_MS).unref();
    },
    resize: (cols, rows) => {
      const record = Buffer.alloc(4);
      record.writeUInt16BE(cols, 0);
      record.writeUInt16BE(rows, 2);
      if (!control.destroyed) control.write(record);
    },
  };
  managed.controls = controls;
  managed.armTimeout(prepared.timeoutMs);
  return managed;
}
