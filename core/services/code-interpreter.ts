// Code contexts and cells (issue 15): the engine the three front doors share. A context is one
// Jupyter kernel in the sandbox, started and driven by the guest agent's kernel bridge
// (toolbox.startKernel / runCell); this service keeps the bookkeeping (ids, default contexts,
// one cell at a time per context, timeouts, restarts) so compat layers only translate shapes.
//
// The sandbox's process table is the record of which contexts exist: each kernel is a process
// tagged `nestbox-code:<language>:<createdAt ms>:<context id>` (cwd and user are the process's
// own), so contexts survive a restart of the control plane and every instance sees the same
// ones. Rules:
// - A run without a context uses the language's default context `default-<language>`, started
//   on first use (with that run's user and cwd).
// - A kernel that exited on its own (its cell was `lost`: os._exit, out of memory, a kernel
//   that would not stop after an interrupt; or reaped after an hour without a cell) is started
//   again, fresh, by its context's next cell. A killed one (deleteContext, restartContext's old
//   kernel) is gone: its id is not_found.
// - Cells of one context run one at a time in the order they came (per control-plane instance;
//   the bridge itself also runs the cells it is given in order). A run's timeoutMs counts from
//   the moment its cell is handed to the kernel; then the cell is interrupted (`end`
//   `interrupted`, the context's state survives). A kernel that does not stop within the
//   bridge's grace (10 s) is killed by the bridge: the cell ends `lost` and the next one starts
//   a fresh kernel.
// - A context's own envs are the kernel's environment. They are also remembered here, in
//   memory, so a restart (or a kernel started again) gets them back; after this process
//   restarts, a context whose kernel has to be started again has lost them (its running kernel
//   keeps them).
import { randomUUID } from 'node:crypto';
import { errors, NestboxError } from '../errors.js';
import type { ProcessInfo } from '../guest.js';
import type { Principal } from '../types.js';
import { requireScope } from './auth.js';
import {
  CODE_LANGUAGES,
  type CodeContext,
  type CodeEvent,
  type CodeInterpreterPort,
  type CodeLanguage,
  type CreateContextInput,
  type RunCodeInput,
  type RunScriptInput,
  type RunScriptResult,
} from '../code-interpreter/types.js';
import type { Toolbox } from './toolbox.js';

export const CODE_CONTEXT_TAG_PREFIX = 'nestbox-code:';
const SCRIPT_LANGUAGES = ['python', 'javascript', 'typescript'] as const;
/** How long delete/restart (and a lost cell) wait for the old kernel's process to be gone. */
const KERNEL_EXIT_WAIT_MS = 15_000;
/** How long a kernel bridge gets to shut its kernel down on SIGTERM before it is killed. */
const KERNEL_STOP_GRACE_MS = 5_000;

interface Kernel {
  context: CodeContext;
  process: ProcessInfo;
}

function tagOf(language: CodeLanguage, createdAt: string, id: string): string {
  return `${CODE_CONTEXT_TAG_PREFIX}${language}:${Date.parse(createdAt)}:${id}`;
}

function kernelOf(process: ProcessInfo): Kernel | undefined {
  const tag = process.tag;
  if (!tag?.startsWith(CODE_CONTEXT_TAG_PREFIX)) return undefined;
  const match = /^([a-z]+):(\d+):(.+)$/.exec(tag.slice(CODE_CONTEXT_TAG_PREFIX.length));
  if (!match || !(CODE_LANGUAGES as readonly string[]).includes(match[1])) return undefined;
  const [, language, createdMs, id] = match;
  return {
    context: { id, language: language as CodeLanguage, cwd: process.cwd, user: process.user, isDefault: id === defaultContextId(language as CodeLanguage), createdAt: new Date(Number(createdMs)).toISOString() },
    process,
  };
}

function defaultContextId(language: CodeLanguage): string {
  return `default-${language}`;
}

function defaultContextLanguage(contextId: string): CodeLanguage | undefined {
  const language = contextId.startsWith('default-') ? contextId.slice('default-'.length) : '';
  return (CODE_LANGUAGES as readonly string[]).includes(language) ? (language as CodeLanguage) : undefined;
}

/** A language by name (case-insensitive), else validation_failed naming `field`. */
export function parseCodeLanguage(value: unknown, field = 'language', allowed: readonly string[] = CODE_LANGUAGES): CodeLanguage {
  const name = typeof value === 'string' ? value.trim().toLowerCase() : value;
  if (typeof name !== 'string' || !allowed.includes(name)) {
    throw errors.validation(field, `${JSON.stringify(value)} is not a language Nestbox runs (${allowed.join(', ')})`);
  }
  return name as CodeLanguage;
}

function notFoundContext(id: string): NestboxError {
  return errors.notFound('context', id);
}

export class CodeInterpreterService implements CodeInterpreterPort {
  /** Concurrent first calls on one context start one kernel (within this instance). */
  private readonly starting = new Map<string, Promise<Kernel>>();
  /** The tail of each context's queue of cells: resolves when the last cell queued has ended. */
  private readonly queues = new Map<string, Promise<void>>();
  /** Each context's own envs, to start its kernel again with them. */
  private readonly contextEnvs = new Map<string, Record<string, string>>();

  constructor(private readonly toolbox: Toolbox) {}

  async languages(p: Principal, sandboxId: string): Promise<CodeLanguage[]> {
    requireScope(p, 'sandboxes:exec');
    return (await this.toolbox.kernelLanguages(p, sandboxId)).languages;
  }

  async createContext(p: Principal, sandboxId: string, input: CreateContextInput): Promise<CodeContext> {
    requireScope(p, 'sandboxes:exec');
    const language = parseCodeLanguage(input.language ?? 'python');
    const id = randomUUID();
    if (input.envs && Object.keys(input.envs).length > 0) this.contextEnvs.set(`${sandboxId}/${id}`, { ...input.envs });
    try {
      return (await this.start(p, sandboxId, { id, language, cwd: input.cwd, user: input.user, createdAt: new Date().toISOString() })).context;
    } catch (error) {
      this.contextEnvs.delete(`${sandboxId}/${id}`);
      throw error;
    }
  }

  async listContexts(p: Principal, sandboxId: string): Promise<CodeContext[]> {
    requireScope(p, 'sandboxes:exec');
    return (await this.kernels(p, sandboxId, false)).filter((k) => k.process.status === 'running').map((k) => k.context);
  }

  async getContext(p: Principal, sandboxId: string, contextId: string): Promise<CodeContext> {
    requireScope(p, 'sandboxes:exec');
    const latest = (await this.kernels(p, sandboxId, true)).find((k) => k.context.id === contextId);
    if (!latest || latest.process.status === 'killed') throw notFoundContext(contextId);
    return latest.context;
  }

  async deleteContext(p: Principal, sandboxId: string, contextId: string): Promise<void> {
    requireScope(p, 'sandboxes:exec');
    const running = (await this.kernels(p, sandboxId, false)).filter((k) => k.context.id === contextId && k.process.status === 'running');
    if (running.length === 0) throw notFoundContext(contextId);
    await this.stop(p, sandboxId, running);
    this.contextEnvs.delete(`${sandboxId}/${contextId}`);
  }

  async restartContext(p: Principal, sandboxId: string, contextId: string): Promise<CodeContext> {
    requireScope(p, 'sandboxes:exec');
    const mine = (await this.kernels(p, sandboxId, true)).filter((k) => k.context.id === contextId);
    const running = mine.filter((k) => k.process.status === 'running');
    const latest = mine[0];
    if (!latest || (running.length === 0 && latest.process.status === 'killed')) throw notFoundContext(contextId);
    await this.stop(p, sandboxId, running);
    const { context } = latest;
    return (await this.start(p, sandboxId, { id: context.id, language: context.language, cwd: context.cwd, user: context.user, createdAt: context.createdAt })).context;
  }

  async run(p: Principal, sandboxId: string, input: RunCodeInput, o: { signal?: AbortSignal } = {}): Promise<AsyncGenerator<CodeEvent>> {
    requireScope(p, 'sandboxes:exec');
    if (typeof input.code !== 'string') throw errors.validation('code', 'must be a string');
    if (input.timeoutMs !== undefined && !(Number.isFinite(input.timeoutMs) && input.timeoutMs >= 0)) throw errors.validation('timeoutMs', 'must be a number of milliseconds, 0 or more');
    // A default context named by its id is still the default context of its language.
    const language = input.contextId === undefined ? parseCodeLanguage(input.language ?? 'python') : defaultContextLanguage(input.contextId);
    const contextId = input.contextId ?? defaultContextId(language as CodeLanguage);
    const key = `${sandboxId}/${contextId}`;

    // Take a place in the context's queue first, so cells run in the order they came.
    const previous = this.queues.get(key) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((resolve) => (release = resolve));
    const tail = previous.then(() => mine);
    this.queues.set(key, tail);
    void tail.then(() => {
      if (this.queues.get(key) === tail) this.queues.delete(key);
    });

    let events: AsyncGenerator<CodeEvent>;
    let kernel: Kernel;
    const abort = new AbortController();
    const onAbort = () => abort.abort();
    let timer: NodeJS.Timeout | undefined;
    try {
      await previous;
      if (o.signal?.aborted) throw new NestboxError('invalid_state', 'the run was cancelled before its cell started');
      const cell = { code: input.code, ...(input.envs && Object.keys(input.envs).length > 0 ? { env: input.envs } : {}) };
      kernel = await this.kernelFor(p, sandboxId, contextId, language, input);
      o.signal?.addEventListener('abort', onAbort, { once: true });
      try {
        events = await this.toolbox.runCell(p, sandboxId, kernel.process.processId, cell, { signal: abort.signal });
      } catch (error) {
        // The kernel ended between the look-up and the cell (its idle timeout, a crash): the
        // context's kernel is started again, once, as for any kernel that exited on its own.
        if (!(error instanceof NestboxError && (error.code === 'invalid_state' || error.code === 'not_found'))) throw error;
        await this.waitGone(p, sandboxId, [kernel.process.processId]);
        kernel = await this.kernelFor(p, sandboxId, contextId, language, input);
        events = await this.toolbox.runCell(p, sandboxId, kernel.process.processId, cell, { signal: abort.signal });
      }
      if (input.timeoutMs) {
        timer = setTimeout(onAbort, input.timeoutMs);
        timer.unref?.();
      }
    } catch (error) {
      o.signal?.removeEventListener('abort', onAbort);
      release();
      throw error;
    }
    const stopKeepingActive = this.toolbox.keepActive(sandboxId);
    const service = this;
    return (async function* () {
      try {
        for await (const event of events) {
          // The bridge exits after a lost cell: the next cell must not find it still running.
          // Waited for before the `end` goes out, since a consumer may stop reading at `end`
          // (a return() at that yield would skip anything after it).
          if (event.type === 'end' && event.status === 'lost') await service.waitGone(p, sandboxId, [kernel.process.processId]).catch(() => undefined);
          yield event;
          if (event.type === 'end') return;
        }
      } finally {
        clearTimeout(timer);
        o.signal?.removeEventListener('abort', onAbort);
        stopKeepingActive();
        // Leaving early (the consumer returned) interrupts the cell in runCell's own cleanup.
        await events.return(undefined).catch(() => undefined);
        release();
      }
    })();
  }

  async runScript(p: Principal, sandboxId: string, input: RunScriptInput, o: { signal?: AbortSignal } = {}): Promise<RunScriptResult> {
    requireScope(p, 'sandboxes:exec');
    const language = parseCodeLanguage(input.language, 'language', SCRIPT_LANGUAGES) as RunScriptInput['language'];
    if (typeof input.code !== 'string') throw errors.validation('code', 'must be a string');
    if (input.argv !== undefined && (!Array.isArray(input.argv) || input.argv.some((a) => typeof a !== 'string'))) throw errors.validation('argv', 'must be a list of strings');
    if (input.timeoutMs !== undefined && !(Number.isInteger(input.timeoutMs) && input.timeoutMs >= 0)) throw errors.validation('timeoutMs', 'must be a whole number of milliseconds, 0 or more');
    return this.toolbox.runScript(
      p,
      sandboxId,
      {
        language,
        code: input.code,
        ...(input.argv ? { argv: input.argv } : {}),
        ...(input.envs ? { env: input.envs } : {}),
        ...(input.cwd !== undefined ? { cwd: input.cwd } : {}),
        ...(input.user !== undefined ? { user: input.user } : {}),
        ...(input.timeoutMs ? { timeoutMs: input.timeoutMs } : {}),
      },
      o,
    );
  }

  // ---- kernels ----------------------------------------------------------------------------

  /** Our kernels in the sandbox, newest first (finished ones too with `all`). */
  private async kernels(p: Principal, sandboxId: string, all: boolean): Promise<Kernel[]> {
    const { processes } = await this.toolbox.listProcesses(p, sandboxId, all ? { all } : {});
    return processes.map(kernelOf).filter((k): k is Kernel => k !== undefined);
  }

  private async start(p: Principal, sandboxId: string, c: { id: string; language: CodeLanguage; cwd?: string; user?: string; createdAt: string }): Promise<Kernel> {
    const env = this.contextEnvs.get(`${sandboxId}/${c.id}`);
    const process = await this.toolbox.startKernel(p, sandboxId, {
      language: c.language,
      tag: tagOf(c.language, c.createdAt, c.id),
      ...(c.cwd !== undefined ? { cwd: c.cwd } : {}),
      ...(c.user !== undefined ? { user: c.user } : {}),
      ...(env ? { env } : {}),
    });
    const kernel = kernelOf(process);
    if (!kernel) throw errors.internal(`the kernel of context ${c.id} came back without its tag`);
    return kernel;
  }

  /**
   * The running kernel of a context. A default context starts on first use; a context whose
   * kernel exited on its own starts again; a killed or unknown one is not_found.
   */
  private async kernelFor(p: Principal, sandboxId: string, contextId: string, language: CodeLanguage | undefined, input: RunCodeInput): Promise<Kernel> {
    const key = `${sandboxId}/${contextId}`;
    const pending = this.starting.get(key);
    if (pending) return pending;
    const mine = (await this.kernels(p, sandboxId, true)).filter((k) => k.context.id === contextId);
    const running = mine.find((k) => k.process.status === 'running');
    if (running) return running;
    const latest = mine[0];
    const isDefault = language !== undefined && contextId === defaultContextId(language);
    if (!isDefault && (!latest || latest.process.status === 'killed')) throw notFoundContext(contextId);
    // Checked again: another call may have begun starting it while we listed.
    const again = this.starting.get(key);
    if (again) return again;
    const context = latest?.context;
    const starting = this.start(p, sandboxId, {
      id: contextId,
      language: context?.language ?? (language as CodeLanguage),
      cwd: context?.cwd ?? input.cwd,
      user: context?.user ?? input.user,
      createdAt: context?.createdAt ?? new Date().toISOString(),
    }).finally(() => this.starting.delete(key));
    this.starting.set(key, starting);
    return starting;
  }

  /**
   * Stops kernels and waits until none of them is listed as running (bounded). SIGTERM first:
   * the bridge then takes down its kernel's whole process group (a multiprocessing pool, a
   * `!cmd &`), which a SIGKILL of the bridge's own group would leave behind, and dies of the
   * signal (recorded as killed: the context is gone). What is still running after the grace is
   * killed.
   */
  private async stop(p: Principal, sandboxId: string, kernels: Kernel[]): Promise<void> {
    const gone = (error: unknown) => {
      if (!(error instanceof NestboxError && (error.code === 'not_found' || error.code === 'invalid_state'))) throw error;
    };
    const ids = kernels.map((k) => k.process.processId);
    for (const id of ids) await this.toolbox.signalProcess(p, sandboxId, id, 'SIGTERM').catch(gone);
    const left = await this.waitGone(p, sandboxId, ids, KERNEL_STOP_GRACE_MS);
    for (const id of left) await this.toolbox.killProcess(p, sandboxId, id).catch(gone);
    await this.waitGone(p, sandboxId, left, KERNEL_EXIT_WAIT_MS);
  }

  /** Until none of the processes is running, or the time is up: those still running. */
  private async waitGone(p: Principal, sandboxId: string, processIds: string[], waitMs = KERNEL_EXIT_WAIT_MS): Promise<string[]> {
    const deadline = Date.now() + waitMs;
    let left = processIds;
    while (left.length > 0) {
      const running = new Set((await this.toolbox.listProcesses(p, sandboxId)).processes.map((process) => process.processId));
      left = left.filter((id) => running.has(id));
      if (left.length === 0 || Date.now() >= deadline) break;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    return left;
  }
}
