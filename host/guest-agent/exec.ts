// Foreground process execution: run to completion, answer with collected output.
import type { WorkloadLauncher } from './workload.js';
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants as fsConstants } from 'node:fs';
import { stat } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
import type { ExecRequest, ExecResponse } from '../agent-protocol/types.js';
import { validationFailed } from './errors.js';
import { resolveOptionalSandboxPath } from './paths.js';
import { resolveAccount, type RunAs } from './processes/users.js';

export interface ExecSettings {
  home: string;
  /** The environment every process starts from (the agent's own, i.e. the sandbox's). */
  baseEnv: NodeJS.ProcessEnv;
  /** Per-stream cap on collected output; the tail beyond it is dropped. */
  maxOutputBytes: number;
  /** Starts workloads in the sandbox's workload cgroup (absent outside a sandbox). */
  launcher?: WorkloadLauncher;
  /** Where accounts are looked up for `user` (tests may point elsewhere). */
  passwdPath?: string;
}

interface Command {
  file: string;
  args: string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
  stdin: Buffer | undefined;
  timeoutMs: number;
  runAs: RunAs;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function assertNoNul(value: string, field: string): void {
  if (value.includes('\0')) throw validationFailed(field, 'must not contain a NUL byte');
}

export function commandLine(request: Pick<ExecRequest, 'argv' | 'cmd'>): { file: string; args: string[] } {
  const hasArgv = request.argv !== undefined;
  const hasCmd = request.cmd !== undefined;
  if (hasArgv === hasCmd) throw validationFailed('cmd', 'exactly one of argv or cmd is required');
  if (request.argv) {
    request.argv.forEach((arg, index) => assertNoNul(arg, `argv[${index}]`));
    const [file, ...args] = request.argv;
    if (file === '') throw validationFailed('argv[0]', 'must not be empty');
    return { file, args };
  }
  const cmd = request.cmd as string;
  assertNoNul(cmd, 'cmd');
  const shell = commandShell();
  return { file: shell, args: [shell === 'bash' ? '-lc' : '-c', cmd] };
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, fsConstants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * The shell that runs a `cmd`: bash as a login shell when the image has one on the PATH (every
 * image Nestbox built before OCI images), else the image's /bin/sh (busybox, Alpine). An image
 * with neither (distroless) gets a 400 naming the way out instead of a process that exits 127.
 */
export function commandShell(path = process.env.PATH ?? ''): 'bash' | '/bin/sh' {
  if (path.split(':').some((dir) => dir.startsWith('/') && isExecutable(`${dir}/bash`))) return 'bash';
  if (isExecutable('/bin/sh')) return '/bin/sh';
  throw validationFailed('cmd', "this sandbox's image has no shell (no bash on the PATH, no /bin/sh); start the process by argv instead");
}

export async function workingDirectory(raw: string | undefined, home: string): Promise<string> {
  const cwd = resolveOptionalSandboxPath(raw, home, 'cwd');
  // Checked up front because spawn reports a missing cwd as an ENOENT indistinguishable from a
  // missing program, and a bad cwd is the caller's mistake, not a 127 from the command.
  const info = await stat(cwd).catch(() => undefined);
  if (!info) throw validationFailed('cwd', `no such directory: ${cwd}`);
  if (!info.isDirectory()) throw validationFailed('cwd', `not a directory: ${cwd}`);
  return cwd;
}

export function mergedEnv(settings: Pick<ExecSettings, 'baseEnv' | 'home'>, extra: Record<string, string> | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...settings.baseEnv, HOME: settings.home };
  for (const [name, value] of Object.entries(extra ?? {})) {
    if (name === '' || name.includes('=')) throw validationFailed(`env.${name}`, 'invalid variable name');
    assertNoNul(name, `env.${name}`);
    assertNoNul(value, `env.${name}`);
    env[name] = value;
  }
  return env;
}

function stdinBytes(stdinBase64: string | undefined): Buffer | undefined {
  if (stdinBase64 === undefined) return undefined;
  const compact = stdinBase64.replace(/\s+/g, '');
  if (compact.length % 4 !== 0 || !BASE64.test(compact)) throw validationFailed('stdinBase64', 'not valid base64');
  return Buffer.from(compact, 'base64');
}

/** Validates everything that can be wrong with a request before any process is started. */
export async function prepareCommand(request: ExecRequest, settings: ExecSettings): Promise<Command> {
  const { file, args } = commandLine(request);
  const { runAs, home, defaultDir, identityEnv } = await resolveAccount(request.user, settings);
  return {
    file,
    args,
    cwd: await workingDirectory(request.cwd, request.cwd === undefined ? defaultDir : home),
    env: mergedEnv({ baseEnv: settings.baseEnv, home }, { ...identityEnv, ...request.env }),
    stdin: stdinBytes(request.stdinBase64),
    timeoutMs: request.timeoutMs ?? 0,
    runAs,
  };
}

/** Keeps the head of a stream up to a cap but keeps reading, so the writer never blocks on us. */
class CappedCollector {
  private readonly chunks: Buffer[] = [];
  private bytes = 0;
  truncated = false;

  constructor(private readonly capBytes: number) {}

  add(chunk: Buffer): void {
    const room = this.capBytes - this.bytes;
    if (chunk.length > room) this.truncated = true;
    if (room <= 0) return;
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.chunks.push(kept);
    this.bytes += kept.length;
  }

  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

/** Kills the whole process group: a shell's children must not outlive a timeout. */
export function killProcessGroup(child: ChildProcess): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    // ESRCH: the group is already gone.
  }
}

function spawnFailure(command: Command, error: NodeJS.ErrnoException, startedAt: number): ExecResponse {
  // Behave like a shell: a missing program is exit 127, one that cannot be executed is 126.
  const notFound = error.code === 'ENOENT';
  const reason = notFound ? 'command not found' : (error.code === 'EACCES' ? 'permission denied' : error.message);
  return {
    exitCode: notFound ? 127 : 126,
    signal: null,
    stdout: '',
    stderr: `${command.file}: ${reason}\n`,
    durationMs: performance.now() - startedAt,
    timedOut: false,
    truncated: false,
  };
}

/**
 * Runs a prepared command to completion. Aborting `signal` (the HTTP client went away) kills the
 * process group so nothing is left running that nobody will ever collect.
 */
export function runCommand(command: Command, settings: ExecSettings, signal: AbortSignal): Promise<ExecResponse> {
  return new Promise((resolve, reject) => {
    const startedAt = performance.now();
    const stdout = new CappedCollector(settings.maxOutputBytes);
    const stderr = new CappedCollector(settings.maxOutputBytes);
    let timedOut = false;
    let settled = false;

    const launch = settings.launcher?.wrap(command.file, command.args, command.runAs) ?? { file: command.file, args: command.args, uid: command.runAs.uid, gid: command.runAs.gid };
    const child = spawn(launch.file, launch.args, {
      cwd: command.cwd,
      env: command.env,
      uid: launch.uid,
      gid: launch.gid,
      // Own process group, so one kill(-pgid) reaches every descendant that did not setsid.
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe', ...('extraStdio' in launch ? launch.extraStdio : [])],
    });

    const onAbort = (): void => killProcessGroup(child);
    signal.addEventListener('abort', onAbort, { once: true });
    const timer = command.timeoutMs > 0
      ? setTimeout(() => {
          timedOut = true;
          killProcessGroup(child);
        }, command.timeoutMs)
      : undefined;

    const finish = (outcome: () => ExecResponse): void => {
      if (settled) return;
      settled = true;
      if (timer) clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      try {
        resolve(outcome());
      } catch (error) {
        reject(error);
      }
    };

    child.stdout!.on('data', (chunk: Buffer) => stdout.add(chunk));
    child.stderr!.on('data', (chunk: Buffer) => stderr.add(chunk));
    // A command that exits without reading its stdin makes our write fail with EPIPE; that is
    // the command's choice, not an error of the exec.
    child.stdin!.on('error', () => {});
    child.stdin!.end(command.stdin);

    child.on('error', (error: NodeJS.ErrnoException) => {
      if (child.pid === undefined) finish(() => spawnFailure(command, error, startedAt));
    });
    // 'close' rather than 'exit': it waits for the pipes to drain, so no output is lost.
    child.on('close', (exitCode, exitSignal) => {
      finish(() => ({
        exitCode: exitSignal ? null : exitCode,
        signal: exitSignal,
        stdout: stdout.text(),
        stderr: stderr.text(),
        durationMs: performance.now() - startedAt,
        timedOut,
        truncated: stdout.truncated || stderr.truncated,
      }));
    });
    if (signal.aborted) onAbort();
  });
}
