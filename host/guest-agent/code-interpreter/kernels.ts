// The guest agent's side of the code interpreter (POST /kernels, GET /kernels/languages,
// POST /scripts; the wire is documented in host/agent-protocol/processes.ts). Kernels are
// kernel bridges (bridge.py) run as ordinary detached processes, so the process routes list,
// follow, feed, signal and kill them; scripts are one-shot processes whose merged output is the
// answer.
import { randomBytes } from 'node:crypto';
import type { z } from 'zod';
import type { KernelLanguagesResponse, RunScriptRequest, RunScriptResponse, StartKernelRequest } from '../../agent-protocol/processes.js';
import { AgentHttpError, validationFailed } from '../errors.js';
import type { ManagedProcess } from '../processes/managed-process.js';
import type { ProcessRegistry } from '../processes/registry.js';
import { prepareStart, startPipeProcess, type SpawnSettings } from '../processes/spawn.js';
import { kernelBridgeProgram, scriptRunnerProgram } from './kernel-program.js';

type Languages = z.infer<typeof KernelLanguagesResponse>;
type KernelRequest = z.infer<typeof StartKernelRequest>;
type ScriptRequest = z.infer<typeof RunScriptRequest>;
type ScriptResponse = z.infer<typeof RunScriptResponse>;

/** The bridge's default (bridge.py --idle-timeout): an hour without a cell reaps a kernel. */
export const DEFAULT_KERNEL_IDLE_SECONDS = 3600;
/** How long a probe of the image's kernels may take (python3 importing jupyter_client). */
const PROBE_TIMEOUT_MS = 60_000;
/** How long a kernel may take to start and answer (R and Deno are slower than IPython). */
const KERNEL_READY_TIMEOUT_MS = 120_000;
/** A kernel bridge's stdout kept for its readers (per stream; beyond it the oldest bytes go). */
const MAX_KERNEL_OUTPUT_BYTES = 16 * 1024 * 1024;
/** A script's merged output is kept up to this; beyond it the oldest bytes are dropped. */
const MAX_SCRIPT_OUTPUT_BYTES = 64 * 1024 * 1024;
const ALL_LANGUAGES = ['python', 'javascript', 'typescript', 'bash', 'r'] as const;

interface LineEvent {
  cell: string | null;
  type: string;
  message?: string;
}

function lines(text: string): LineEvent[] {
  const found: LineEvent[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const parsed = JSON.parse(line) as LineEvent;
      if (parsed && typeof parsed === 'object' && typeof parsed.type === 'string') found.push(parsed);
    } catch {
      // not a protocol line
    }
  }
  return found;
}

function tail(text: string, max = 600): string {
  const trimmed = text.trim();
  return trimmed.length > max ? `…${trimmed.slice(-max)}` : trimmed;
}

/** Until the process ends or `ms` pass; false on the timeout. */
async function endedWithin(process: ManagedProcess, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([process.ended.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export class CodeInterpreterGuest {
  /** Languages a probe found, by account: the image's kernels do not go away while it runs. */
  private readonly found = new Map<string, Set<string>>();
  private probes = 0;

  constructor(
    private readonly settings: SpawnSettings,
    private readonly registry: ProcessRegistry,
  ) {}

  /** The bridge's --probe as the request's account: which kernelspecs it finds, and why not. */
  async languages(request: { user?: string; cwd?: string; env?: Record<string, string> } = {}): Promise<Languages> {
    const prepared = await prepareStart(
      { argv: ['python3', '-u', '-c', kernelBridgeProgram(), '--probe'], user: request.user, cwd: request.cwd, env: request.env, timeoutMs: PROBE_TIMEOUT_MS },
      this.settings,
    );
    this.probes += 1;
    const probe = await startPipeProcess(`kernel-probe-${this.probes}`, prepared, this.settings);
    await probe.ended;
    const stdout = probe.stdout.readAll().toString('utf8');
    const stderr = probe.stderr.readAll().toString('utf8');
    const missingAll = (reason: string): Languages => ({ languages: [], missing: Object.fromEntries(ALL_LANGUAGES.map((l) => [l, reason])) });
    if (probe.exitCode === 127) return missingAll('python3 is not installed in this image');
    const answer = stdout
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => {
        try {
          return JSON.parse(line) as Languages;
        } catch {
          return undefined;
        }
      })
      .find((parsed) => parsed && Array.isArray(parsed.languages));
    if (!answer) return missingAll(probe.timedOut ? 'looking for Jupyter kernels timed out' : `looking for Jupyter kernels failed: ${tail(stderr) || `exit ${probe.exitCode}`}`);
    return { languages: answer.languages, missing: answer.missing ?? {} };
  }

  /** A kernel bridge for the language, registered as a process once its kernel is ready. */
  async startKernel(request: KernelRequest): Promise<ManagedProcess> {
    const { language } = request;
    const known = this.found.get(request.user ?? '');
    if (!known?.has(language)) {
      // Which kernels exist does not depend on the cwd (checked on its own: enterable()).
      const probe = await this.languages({ user: request.user, env: request.env });
      if (!probe.languages.includes(language)) {
        const reason = probe.missing[language];
        throw validationFailed('language', `this image has no Jupyter kernel for ${language}${reason ? ` (${reason})` : ''}; create the sandbox from the code-interpreter image`);
      }
      this.found.set(request.user ?? '', new Set(probe.languages));
    }
    const idle = request.idleTimeoutSeconds ?? DEFAULT_KERNEL_IDLE_SECONDS;
    const prepared = await prepareStart(
      {
        argv: ['python3', '-u', '-c', kernelBridgeProgram(), '--language', language, '--idle-timeout', String(idle)],
        stdin: true,
        tag: request.tag,
        cwd: request.cwd,
        user: request.user,
        env: { PYTHONUNBUFFERED: '1', ...request.env },
      },
      this.settings,
    );
    // A result is one line of the bridge's stdout (a PNG, a DataFrame's HTML): the output kept
    // for a reader that is behind must hold several of them whole.
    const process = await startPipeProcess(this.registry.nextId(), prepared, { ...this.settings, maxRetainedBytesPerStream: Math.max(this.settings.maxRetainedBytesPerStream, MAX_KERNEL_OUTPUT_BYTES) });
    this.registry.add(process);
    try {
      await this.ready(process, language);
    } catch (error) {
      // A cwd the account cannot enter is the caller's mistake (a 400 naming it), not a kernel
      // that failed: asked only when the start failed, so a good start costs nothing more.
      if (request.cwd !== undefined && !(await this.enterable(request.cwd, request.user))) {
        throw validationFailed('cwd', `${request.cwd}: the ${request.user ?? 'agent'} account cannot enter this directory`);
      }
      throw error;
    }
    return process;
  }

  /** Can `user` change into `dir`? (`cd` as that account, from its home.) */
  private async enterable(dir: string, user: string | undefined): Promise<boolean> {
    const prepared = await prepareStart({ argv: ['/bin/sh', '-c', 'cd -- "$1"', 'sh', dir], user, timeoutMs: PROBE_TIMEOUT_MS }, this.settings);
    this.probes += 1;
    const check = await startPipeProcess(`kernel-cwd-${this.probes}`, prepared, this.settings);
    await check.ended;
    return check.exitCode === 0;
  }

  /** Until the bridge says its kernel is ready; its fatal line (or its stderr) otherwise. */
  private async ready(process: ManagedProcess, language: string): Promise<void> {
    const deadline = Date.now() + KERNEL_READY_TIMEOUT_MS;
    for (;;) {
      const events = lines(process.stdout.readAll().toString('utf8')).filter((e) => e.cell === null);
      if (events.some((e) => e.type === 'ready')) return;
      const fatal = events.find((e) => e.type === 'fatal');
      if (fatal || !process.running) {
        await endedWithin(process, 5_000);
        const reason = fatal?.message ?? (tail(process.stderr.readAll().toString('utf8')) || `the bridge exited with ${process.exitCode ?? process.signal}`);
        throw new AgentHttpError(500, 'internal', `the ${language} kernel did not start: ${reason}`);
      }
      if (Date.now() > deadline) {
        process.killRequested = true;
        process.controls?.kill();
        throw new AgentHttpError(504, 'timeout', `the ${language} kernel did not start within ${KERNEL_READY_TIMEOUT_MS / 1000} s`);
      }
      const wait = new Promise<void>((resolve) => setTimeout(resolve, 1_000).unref());
      await Promise.race([process.nextChange(), wait]);
    }
  }

  /** One program run to its end (POST /scripts); `signal` kills it (the client went away). */
  async runScript(request: ScriptRequest, signal: AbortSignal): Promise<ScriptResponse> {
    const chartMarker = `\u001eNESTBOX-CHART-${randomBytes(8).toString('hex')}`;
    const program = request.language === 'python' ? ['python3', '-u', '-c', scriptRunnerProgram()] : ['node', '-'];
    if (request.code.includes('\0')) throw validationFailed('code', 'must not contain a NUL byte');
    const prepared = await prepareStart(
      {
        // One pipe for both streams: the output is in the order the program wrote it.
        argv: ['/bin/sh', '-c', 'exec 2>&1; exec "$@"', 'nestbox-script', ...program, ...(request.argv ?? [])],
        stdin: true,
        cwd: request.cwd,
        user: request.user,
        timeoutMs: request.timeoutMs,
        env: { PYTHONUNBUFFERED: '1', ...request.env, ...(request.language === 'python' ? { NESTBOX_CHART_MARKER: chartMarker } : {}) },
      },
      this.settings,
    );
    this.probes += 1;
    const process = await startPipeProcess(`script-${this.probes}`, prepared, { ...this.settings, maxRetainedBytesPerStream: MAX_SCRIPT_OUTPUT_BYTES });
    const kill = () => process.controls?.kill();
    signal.addEventListener('abort', kill, { once: true });
    try {
      if (process.controls) {
        // A program that exits without reading its code closes the pipe: nothing more to say.
        await process.controls.writeStdin(Buffer.from(request.code, 'utf8')).catch(() => undefined);
        process.controls.closeStdin();
      }
      await process.ended;
    } finally {
      signal.removeEventListener('abort', kill);
    }
    return {
      exitCode: process.timedOut ? null : process.exitCode,
      signal: process.signal,
      timedOut: process.timedOut,
      output: process.stdout.readAll().toString('utf8') + process.stderr.readAll().toString('utf8'),
      chartMarker,
    };
  }
}
