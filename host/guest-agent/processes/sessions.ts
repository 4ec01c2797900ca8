// Sessions: one persistent, non-interactive `bash -l` per session, fed commands on its stdin one
// after another, so cd/export/variables/functions carry over. Each command is a ManagedProcess
// in the registry (a "virtual" process: its pid is the shell's, its output buffers are real).
//
// How one command runs: the agent writes
//     __nestbox_cmd='<cmd, single-quoted>'
//     { printf '\036<prefix>S\036'; eval "$__nestbox_cmd"; } < <stdin>
//     printf '\036<prefix>E%d\036' $? ; printf '\036<prefix>E\036' >&2
// to the shell. The shell's stdout and stderr are scanned for those markers (MarkerScanner):
// bytes before the end marker of each stream belong to the command, the stdout end marker
// carries its exit status. The prefix is random per session, so output cannot fake a marker by
// accident. `exit N` inside a command ends the shell: that command's exit code is N and the
// session is over. The brace group (not a subshell) keeps `cd` and `export` in the shell.
// stdin is /dev/null, or with `stdin: true` a FIFO the agent holds open for writing; the "S"
// marker, printed inside the redirected group, tells the agent the shell has opened it, so a
// close never races the open (a FIFO opened after its last writer left would block forever).
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants as fsConstants, openSync, writeFileSync } from 'node:fs';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { CreateSessionRequest, SessionCommand, SessionCommandRequest, SessionInfo } from '../../agent-protocol/processes.js';
import { AgentHttpError, notFound, validationFailed } from '../errors.js';
import { commandShell, mergedEnv, workingDirectory } from '../exec.js';
import { descendantsOf, killGroup, signalProcess } from './kill.js';
import { invalidState, ManagedProcess, type ProcessControls } from './managed-process.js';
import { MarkerScanner } from './marker-scanner.js';
import type { ProcessRegistry } from './registry.js';
import type { SpawnSettings } from './spawn.js';
import { resolveAccount, type RunAs } from './users.js';

const execFileAsync = promisify(execFile);
/** Commands listed per session; the oldest finished ones are forgotten beyond this. */
const MAX_COMMANDS_PER_SESSION = 1000;

export interface SessionSettings extends SpawnSettings {
  maxSessions: number;
}

function shellQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

interface StdinFifo {
  path: string;
  socket: Socket;
  /** The shell has opened the FIFO (the "S" marker arrived). */
  opened: boolean;
}

/** A submitted command, from submission (it may wait for its turn) to its end. */
interface CommandRun {
  process: ManagedProcess;
  request: SessionCommandRequest;
  stdoutEnded: boolean;
  stderrEnded: boolean;
  status: number | null;
  /** Set once /stdin/close was asked for; the FIFO is closed as soon as the shell opened it. */
  stdinCloseWanted: boolean;
  /** The FIFO feeding the command's stdin (stdin: true), once created. */
  stdin?: StdinFifo;
  /** Resolves when the command starts (with its FIFO, if any) or will never start. */
  started: Promise<StdinFifo | undefined>;
  markStarted: (fifo: StdinFifo | undefined) => void;
  done: () => void;
}

class Session {
  readonly createdAt = new Date();
  readonly commands: ManagedProcess[] = [];
  private readonly shell: ChildProcess;
  private readonly prefix: string;
  private current: CommandRun | undefined;
  private queue: Promise<void> = Promise.resolve();
  ended = false;

  constructor(
    readonly id: string,
    private readonly cwd: string,
    env: NodeJS.ProcessEnv,
    private readonly runAs: RunAs,
    private readonly scratchDir: string,
    private readonly settings: SessionSettings,
    private readonly onEnd: (session: Session) => void,
  ) {
    this.prefix = `NBX${randomBytes(12).toString('hex')}:`;
    // Like a cmd: bash when the image has it, else /bin/sh (the markers are POSIX shell).
    const shell = commandShell(typeof env.PATH === 'string' ? env.PATH : undefined);
    const launch = settings.launcher.wrap(shell, ['-l'], runAs);
    this.shell = spawn(launch.file, launch.args, { cwd, env, uid: launch.uid, gid: launch.gid, detached: true, stdio: ['pipe', 'pipe', 'pipe', ...launch.extraStdio] });
    const marker = Buffer.from(`\x1e${this.prefix}`, 'latin1');
    const stdout = new MarkerScanner(marker, (data) => this.current?.process.append('stdout', data), (body) => this.onMarker('stdout', body));
    const stderr = new MarkerScanner(marker, (data) => this.current?.process.append('stderr', data), (body) => this.onMarker('stderr', body));
    this.shell.stdout?.on('data', (chunk: Buffer) => stdout.push(chunk));
    this.shell.stderr?.on('data', (chunk: Buffer) => stderr.push(chunk));
    this.shell.stdin?.on('error', () => this.shell.stdin?.destroy());
    this.shell.on('error', () => this.end(null, null));
    this.shell.on('close', (code, signal) => {
      stdout.flush();
      stderr.flush();
      this.end(code, signal);
    });
    if (this.shell.pid !== undefined) adjustOom(this.shell.pid, settings.oomScoreAdj);
  }

  get pid(): number {
    return this.shell.pid ?? 0;
  }

  /** Queues a command; resolves with its process at once (the command may still be waiting). */
  submit(request: SessionCommandRequest, id: string): ManagedProcess {
    if (this.ended) throw invalidState(`session ${this.id} has ended`);
    const managed = new ManagedProcess(
      { id, pid: this.pid, cmd: 'bash', args: ['-c', request.cmd], cwd: this.cwd, tag: `session:${this.id}`, user: this.runAs.name, pty: false },
      this.settings.maxRetainedBytesPerStream,
    );
    let markStarted!: (fifo: StdinFifo | undefined) => void;
    const started = new Promise<StdinFifo | undefined>((resolve) => (markStarted = resolve));
    const run: CommandRun = {
      process: managed,
      request,
      stdoutEnded: false,
      stderrEnded: false,
      status: null,
      stdinCloseWanted: false,
      started,
      markStarted,
      done: () => {},
    };
    // Controls from the start: stdin written before the command's turn waits for it.
    managed.controls = this.controlsFor(run);
    this.commands.push(managed);
    this.trimCommands();
    this.queue = this.queue.then(() => this.run(run));
    return managed;
  }

  kill(): void {
    // Children first (they may have left the shell's group), then the group itself.
    for (const child of descendantsOf(this.pid)) signalProcess(child.pid, 'SIGKILL');
    killGroup(this.pid);
  }

  info(): SessionInfo {
    return { sessionId: this.id, createdAt: this.createdAt.toISOString(), commands: this.commands.map(commandView) };
  }

  private async run(run: CommandRun): Promise<void> {
    const { process: managed, request } = run;
    if (!managed.running || this.ended) {
      // Killed while waiting for its turn, or the shell is gone: it never runs.
      run.markStarted(undefined);
      managed.finish({ exitCode: null, signal: null });
      return;
    }
    const finished = new Promise<void>((resolve) => (run.done = resolve));
    this.current = run;
    let stdinPath = '/dev/null';
    if (request.stdin) {
      try {
        run.stdin = await this.openStdinFifo(managed.id);
        stdinPath = run.stdin.path;
      } catch (error) {
        managed.append('stderr', Buffer.from(`nestbox: could not create the command's stdin: ${(error as Error).message}\n`));
        run.markStarted(undefined);
        this.complete(run, { exitCode: 126, signal: null });
        return;
      }
    }
    run.markStarted(run.stdin);
    const p = shellQuote(this.prefix);
    const script =
      `__nestbox_cmd=${shellQuote(request.cmd)}\n` +
      `{ printf '\\036%sS\\036' ${p}; eval "$__nestbox_cmd"; } < ${shellQuote(stdinPath)}\n` +
      `printf '\\036%sE%d\\036' ${p} "$?"; printf '\\036%sE\\036' ${p} >&2\n`;
    this.shell.stdin?.write(script);
    managed.armTimeout(request.timeoutMs ?? 0);
    await finished;
  }

  private controlsFor(run: CommandRun): ProcessControls {
    const killCommand = (): void => {
      // The command's processes are the shell's descendants; they share the shell's group, so
      // they are signalled one by one (a group kill would end the session). Repeated in case
      // one forked during the scan; bounded.
      for (let round = 0; round < 3; round += 1) {
        const found = descendantsOf(this.pid);
        if (found.length === 0) break;
        for (const child of found) signalProcess(child.pid, 'SIGKILL');
      }
    };
    return {
      writeStdin: async (data) => {
        if (!run.request.stdin) throw invalidState('stdin is closed (the command was started without stdin: true)');
        if (run.stdinCloseWanted) throw invalidState('stdin is closed');
        const stdin = await run.started;
        if (!stdin || stdin.socket.destroyed || run.stdinCloseWanted) throw invalidState('stdin is closed');
        await new Promise<void>((resolve, reject) =>
          stdin.socket.write(data, (error) => (error ? reject(invalidState(`stdin is closed: ${error.message}`)) : resolve())),
        );
      },
      closeStdin: () => {
        run.stdinCloseWanted = true;
        if (run.stdin?.opened) run.stdin.socket.end();
      },
      stdinOpen: () => !!run.request.stdin && !run.stdinCloseWanted && run.process.running,
      signal: (signal) => {
        // A command still waiting for its turn has no processes yet: nothing to signal.
        if (this.current !== run) return;
        for (const child of descendantsOf(this.pid)) signalProcess(child.pid, signal);
      },
      kill: () => {
        run.process.killRequested = true;
        // Not started yet: it never will (run() skips it); nothing to signal.
        if (this.current === run) killCommand();
        else run.process.finish({ exitCode: null, signal: null });
      },
    };
  }

  private async openStdinFifo(commandId: string): Promise<StdinFifo> {
    const path = join(this.scratchDir, `${commandId}.stdin`);
    // Node has no mkfifo(); mkfifo(1) is in coreutils, which every image we support has.
    await execFileAsync('mkfifo', ['-m', '600', path]);
    // The shell opens it: it must belong to the session's user.
    if (this.runAs.uid !== undefined) await chown(path, this.runAs.uid, this.runAs.gid ?? this.runAs.uid);
    // O_RDWR never blocks on a FIFO, and with a writer present the shell's open never blocks.
    const fd = openSync(path, fsConstants.O_RDWR | fsConstants.O_NONBLOCK);
    const socket = new Socket({ fd, readable: false, writable: true });
    socket.on('error', () => socket.destroy());
    return { path, socket, opened: false };
  }

  private onMarker(stream: 'stdout' | 'stderr', body: string): void {
    const run = this.current;
    if (!run) return;
    if (body === 'S') {
      if (run.stdin) {
        run.stdin.opened = true;
        if (run.stdinCloseWanted) run.stdin.socket.end();
      }
      return;
    }
    if (!body.startsWith('E')) return;
    if (stream === 'stdout') {
      run.stdoutEnded = true;
      run.status = Number(body.slice(1));
    } else {
      run.stderrEnded = true;
    }
    if (run.stdoutEnded && run.stderrEnded) this.complete(run, { exitCode: run.status, signal: null });
  }

  private complete(run: CommandRun, ending: { exitCode: number | null; signal: string | null }): void {
    if (this.current === run) this.current = undefined;
    if (run.stdin) {
      run.stdin.socket.destroy();
      void rm(run.stdin.path, { force: true });
    }
    run.process.finish(ending);
    run.done();
  }

  private end(code: number | null, signal: string | null): void {
    if (this.ended) return;
    this.ended = true;
    const run = this.current;
    // The shell exiting in the middle of a command means the command ended it (`exit 3`), or
    // the session was killed; either way the shell's status is the command's.
    if (run) this.complete(run, { exitCode: code, signal });
    for (const waiting of this.commands) if (waiting.running && waiting !== run?.process) waiting.finish({ exitCode: null, signal: null });
    void rm(this.scratchDir, { recursive: true, force: true });
    this.onEnd(this);
  }

  private trimCommands(): void {
    while (this.commands.length > MAX_COMMANDS_PER_SESSION) {
      const index = this.commands.findIndex((command) => !command.running);
      if (index === -1) return;
      this.commands.splice(index, 1);
    }
  }
}

function adjustOom(pid: number, value: number | undefined): void {
  if (value === undefined) return;
  try {
    writeFileSync(`/proc/${pid}/oom_score_adj`, String(value));
  } catch {
    // Gone already, or no such knob.
  }
}

export function commandView(process: ManagedProcess): SessionCommand {
  return {
    commandId: process.id,
    cmd: process.identity.args[1] ?? '',
    status: process.running ? 'running' : 'exited',
    exitCode: process.status === 'running' ? null : process.exitCode,
    startedAt: process.startedAt.toISOString(),
    endedAt: process.endedAt?.toISOString() ?? null,
  };
}

export class SessionManager {
  private readonly sessions = new Map<string, Session>();
  private counter = 0;

  constructor(
    private readonly registry: ProcessRegistry,
    private readonly settings: SessionSettings,
  ) {}

  async create(request: CreateSessionRequest): Promise<{ sessionId: string; createdAt: string }> {
    const id = request.sessionId ?? this.generateId();
    if (this.sessions.has(id)) throw new AgentHttpError(409, 'conflict', `session ${id} already exists`);
    const live = [...this.sessions.values()].filter((session) => !session.ended).length;
    if (live >= this.settings.maxSessions) {
      throw invalidState(`too many sessions: at most ${this.settings.maxSessions} may be open at once; delete one first`);
    }
    const { runAs, home, defaultDir, identityEnv } = await resolveAccount(request.user, this.settings);
    const cwd = await workingDirectory(request.cwd, request.cwd === undefined ? defaultDir : home);
    const env = mergedEnv({ baseEnv: this.settings.baseEnv, home }, { ...identityEnv, ...request.env });
    // An image without a shell is refused before anything is made for the session.
    commandShell(typeof env.PATH === 'string' ? env.PATH : undefined);
    const scratchDir = await mkdtemp(join(tmpdir(), 'nestbox-session-'));
    if (runAs.uid !== undefined) await chown(scratchDir, runAs.uid, runAs.gid ?? runAs.uid);
    // Checked again: another create for the same id may have finished while we awaited.
    if (this.sessions.has(id)) {
      await rm(scratchDir, { recursive: true, force: true });
      throw new AgentHttpError(409, 'conflict', `session ${id} already exists`);
    }
    const session = new Session(id, cwd, env, runAs, scratchDir, this.settings, () => this.dropEndedBeyondBound());
    this.sessions.set(id, session);
    return { sessionId: id, createdAt: session.createdAt.toISOString() };
  }

  get(id: string): Session {
    const session = this.sessions.get(id);
    if (!session) throw notFound(`no such session: ${id}`);
    return session;
  }

  list(): SessionInfo[] {
    return [...this.sessions.values()].map((session) => session.info());
  }

  delete(id: string): void {
    const session = this.get(id);
    session.kill();
    this.sessions.delete(id);
  }

  submit(sessionId: string, request: SessionCommandRequest): ManagedProcess {
    const session = this.get(sessionId);
    if (request.cmd.includes('\0')) throw validationFailed('cmd', 'must not contain a NUL byte');
    if (session.ended) throw invalidState(`session ended: ${sessionId}`);
    const process = session.submit(request, this.registry.nextId());
    this.registry.add(process);
    return process;
  }

  command(sessionId: string, commandId: string): ManagedProcess {
    const found = this.get(sessionId).commands.find((command) => command.id === commandId);
    if (!found) throw notFound(`no such command in session ${sessionId}: ${commandId}`);
    return found;
  }

  shutdown(): void {
    for (const session of this.sessions.values()) session.kill();
  }

  private generateId(): string {
    for (;;) {
      this.counter += 1;
      const id = `session-${this.counter}`;
      if (!this.sessions.has(id)) return id;
    }
  }

  /** Ended sessions stay listed for their commands' sake, but only up to maxSessions of them. */
  private dropEndedBeyondBound(): void {
    const ended = [...this.sessions.values()].filter((session) => session.ended);
    for (const session of ended.slice(0, Math.max(0, ended.length - this.settings.maxSessions))) this.sessions.delete(session.id);
  }
}
