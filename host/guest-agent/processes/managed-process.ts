// One process in the registry: its identity, lifecycle state and retained output. How it is
// actually driven (a pipe child, a pty helper, a command inside a session shell) is behind
// ProcessControls, so every route works the same for all three.
import type { ProcessInfo, ProcessSignal, ProcessStatus } from '../../agent-protocol/processes.js';
import { AgentHttpError } from '../errors.js';
import { RetainedOutput, type OutputSlice } from './output-buffer.js';

export type StreamName = 'stdout' | 'stderr';

export interface ProcessControls {
  /** Resolves once the bytes were handed to the process; rejects with invalid_state when closed. */
  writeStdin(data: Buffer): Promise<void>;
  closeStdin(): void;
  stdinOpen(): boolean;
  signal(signal: ProcessSignal): void;
  /** SIGKILL to everything the process started; never needs a new process. */
  kill(): void;
  resize?(cols: number, rows: number): void;
}

export interface ProcessIdentity {
  id: string;
  pid: number;
  cmd: string;
  args: string[];
  cwd: string;
  tag: string | null;
  user: string;
  pty: boolean;
}

export interface ProcessEnding {
  exitCode: number | null;
  signal: string | null;
}

export function invalidState(message: string): AgentHttpError {
  return new AgentHttpError(409, 'invalid_state', message);
}

export class ManagedProcess {
  readonly startedAt = new Date();
  readonly stdout: RetainedOutput;
  readonly stderr: RetainedOutput;
  status: ProcessStatus = 'running';
  exitCode: number | null = null;
  signal: string | null = null;
  timedOut = false;
  /** Set by DELETE (and the PTY kill control): the end is reported as killed whatever the exit status. */
  killRequested = false;
  endedAt: Date | null = null;
  controls: ProcessControls | undefined;
  /** Resolves when the process has ended and all its output is in the buffers. */
  readonly ended: Promise<void>;
  private resolveEnded!: () => void;
  private seq = 0;
  /** One shared promise for everyone waiting on "something changed", renewed after each change. */
  private change: { promise: Promise<void>; resolve: () => void } | undefined;
  private timeoutTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly identity: ProcessIdentity,
    maxRetainedBytesPerStream: number,
  ) {
    this.stdout = new RetainedOutput(maxRetainedBytesPerStream);
    this.stderr = new RetainedOutput(maxRetainedBytesPerStream);
    this.ended = new Promise((resolve) => (this.resolveEnded = resolve));
  }

  get id(): string {
    return this.identity.id;
  }

  get running(): boolean {
    return this.status === 'running';
  }

  append(stream: StreamName, data: Buffer): void {
    if (data.length === 0) return;
    this.seq += 1;
    this[stream].append(data, this.seq);
    this.notify();
  }

  /** Starts the timeout clock: on expiry everything the process started gets SIGKILL. */
  armTimeout(timeoutMs: number): void {
    if (timeoutMs <= 0 || !this.running) return;
    this.timeoutTimer = setTimeout(() => {
      if (!this.running) return;
      this.timedOut = true;
      this.controls?.kill();
    }, timeoutMs);
    this.timeoutTimer.unref();
  }

  /** Records the end. Call only once all output has been appended. */
  finish(ending: ProcessEnding): void {
    if (!this.running) return;
    if (this.timeoutTimer) clearTimeout(this.timeoutTimer);
    this.exitCode = ending.signal ? null : ending.exitCode;
    this.signal = ending.signal;
    this.status = ending.signal || this.timedOut || this.killRequested ? 'killed' : 'exited';
    this.endedAt = new Date();
    this.notify();
    this.resolveEnded();
  }

  /** Resolves on the next append or on the end. */
  nextChange(): Promise<void> {
    if (!this.running) return Promise.resolve();
    if (!this.change) {
      let resolve!: () => void;
      const promise = new Promise<void>((done) => (resolve = done));
      this.change = { promise, resolve };
    }
    return this.change.promise;
  }

  /**
   * The next piece of output for a reader at these offsets, from whichever stream produced its
   * bytes first, so a replay interleaves stdout and stderr as the process wrote them.
   */
  nextSlice(offsets: Record<StreamName, number>, streams: readonly StreamName[], maxBytes: number): { stream: StreamName; slice: OutputSlice } | undefined {
    let best: { stream: StreamName; slice: OutputSlice } | undefined;
    for (const stream of streams) {
      const slice = this[stream].chunkAt(offsets[stream], maxBytes);
      if (slice && (!best || slice.seq < best.slice.seq)) best = { stream, slice };
    }
    return best;
  }

  requireControls(): ProcessControls {
    if (!this.running || !this.controls) throw invalidState(`process ${this.id} has ended`);
    return this.controls;
  }

  info(): ProcessInfo {
    const { identity } = this;
    return {
      processId: identity.id,
      pid: identity.pid,
      cmd: identity.cmd,
      args: identity.args,
      cwd: identity.cwd,
      tag: identity.tag,
      user: identity.user,
      pty: identity.pty,
      status: this.status,
      exitCode: this.exitCode,
      signal: this.signal,
      timedOut: this.timedOut,
      startedAt: this.startedAt.toISOString(),
      endedAt: this.endedAt?.toISOString() ?? null,
      stdout: { bytes: this.stdout.total, retainedFrom: this.stdout.retainedFrom },
      stderr: { bytes: this.stderr.total, retainedFrom: this.stderr.retainedFrom },
    };
  }

  private notify(): void {
    const change = this.change;
    this.change = undefined;
    change?.resolve();
  }
}
