// envd's `process.Process` service translated onto the toolbox's process operations
// (e2b.md (c) "RPC-by-RPC usage"; core/services/toolbox.ts). E2B names a process by its pid (or
// tag); Nestbox by a process id, so every call first finds the process with that pid: no
// mapping is kept here.
import { constants as osConstants } from 'node:os';
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from '@connectrpc/connect';
import type { MessageInitShape } from '@bufbuild/protobuf';
import type { ProcessInfo as GuestProcessInfo } from '../../../core/guest.js';
import { NestboxError } from '../../../core/errors.js';
import type { E2bDeps } from '../deps.js';
import {
  Process,
  Signal,
  type ProcessEventSchema,
  type ProcessSelector,
  type PTY,
} from '../gen/process/process_pb.js';
import { rpcError } from '../errors.js';
import { dropConnection } from './connect-adapter.js';
import type { SandboxTarget } from '../target.js';
import { e2bAccount } from '../routing.js';
import { templateDefaults } from '../template-defaults.js';
import type { ErrorLog } from '../../../core/logger.js';
import { CODE_CONTEXT_TAG_PREFIX } from '../../../core/services/code-interpreter.js';

/** Longest process lifetime passed to the guest (the native API's `timeoutMs` maximum, 24 h). */
const MAX_PROCESS_TIMEOUT_MS = 86_400_000;

type ProcessEventInit = MessageInitShape<typeof ProcessEventSchema>;
export type ResolveTarget = (ctx: HandlerContext) => Promise<SandboxTarget>;

/** Processes Nestbox starts for itself (sessions, code-interpreter kernels) are not E2B's. */
function isHidden(p: GuestProcessInfo): boolean {
  return p.tag !== null && (p.tag.startsWith('session:') || p.tag.startsWith(CODE_CONTEXT_TAG_PREFIX));
}

async function findProcess(deps: E2bDeps, target: SandboxTarget, selector: ProcessSelector | undefined, signal?: AbortSignal): Promise<GuestProcessInfo> {
  const body = await deps.core.toolbox.listProcesses(target.principal, target.sandboxId, { all: true }, { signal });
  const wanted = selector?.selector;
  if (!wanted?.case) throw new ConnectError('process: give a pid or a tag', Code.InvalidArgument);
  const matches = body.processes.filter((p) => !isHidden(p) && (wanted.case === 'pid' ? p.pid === wanted.value : p.tag === wanted.value));
  // A pid can be reused after a process ended: the running one wins, then the newest (list order).
  const found = matches.find((p) => p.status === 'running') ?? matches[0];
  if (!found) throw new ConnectError(`process with ${wanted.case} ${wanted.value} not found`, Code.NotFound);
  return found;
}

function signalNumber(name: string | null): number | undefined {
  return name ? (osConstants.signals as Record<string, number>)[name] : undefined;
}

/**
 * The end event as envd reports it: `exit status N` for an exit, `signal: killed` for a kill
 * (the exit code then follows the shell convention 128+signal, as the probe saw 137).
 */
export function endEvent(exit: { status: string; exitCode: number | null; signal: string | null; timedOut: boolean }): ProcessEventInit {
  if (exit.exitCode !== null && exit.status === 'exited') {
    const status = `exit status ${exit.exitCode}`;
    return { event: { case: 'end', value: { exitCode: exit.exitCode, exited: true, status, ...(exit.exitCode !== 0 ? { error: status } : {}) } } };
  }
  const number = signalNumber(exit.signal) ?? signalNumber('SIGKILL')!;
  const name = (exit.signal ?? 'SIGKILL').replace(/^SIG/, '').toLowerCase();
  const status = exit.timedOut ? `signal: ${name === 'kill' ? 'killed' : name} (deadline exceeded)` : `signal: ${name === 'kill' ? 'killed' : name}`;
  return { event: { case: 'end', value: { exitCode: exit.exitCode ?? 128 + number, exited: false, status, error: status } } };
}

/** Is the sandbox gone or no longer running (killed, timed out, paused), as opposed to a passing failure? */
async function sandboxEnded(deps: E2bDeps, target: SandboxTarget): Promise<boolean> {
  try {
    return (await deps.core.sandboxes.get(target.principal, target.sandboxId)).state !== 'running';
  } catch (err) {
    return err instanceof NestboxError && err.code === 'not_found';
  }
}

/** Relay a guest process's events as envd ProcessEvents: start first (e2b.md (h) 3), then data, keepalives and end. */
async function* relayEvents(deps: E2bDeps, target: SandboxTarget, info: GuestProcessInfo, offsets: { stdout: number; stderr: number }, ctx: HandlerContext): AsyncGenerator<ProcessEventInit> {
  yield { event: { case: 'start', value: { pid: info.pid } } };
  try {
    const stream = await deps.core.toolbox.processEvents(target.principal, target.sandboxId, info.processId, { stdoutOffset: offsets.stdout, stderrOffset: offsets.stderr }, { signal: ctx.signal });
    for await (const e of stream.events()) {
      if (e.type === 'keepalive') {
        yield { event: { case: 'keepalive', value: {} } };
      } else if (e.type === 'exit') {
        yield endEvent(e);
        return;
      } else {
        const bytes = Buffer.from(e.data, 'base64');
        // A terminal's output is the guest's stdout; envd calls it `pty`.
        const output = info.pty ? { case: 'pty' as const, value: bytes } : e.type === 'stdout' ? { case: 'stdout' as const, value: bytes } : { case: 'stderr' as const, value: bytes };
        yield { event: { case: 'data', value: { output } } };
      }
    }
  } catch (err) {
    if (!ctx.signal.aborted && (await sandboxEnded(deps, target))) dropConnection(ctx);
    throw err;
  }
  // The guest closed the stream without an exit: the sandbox went away (or its agent did).
  if (await sandboxEnded(deps, target)) dropConnection(ctx);
  throw new ConnectError('the process stream ended without an exit (the sandbox stopped?)', Code.Unavailable);
}

function ptySize(pty: PTY | undefined): { cols: number; rows: number } | undefined {
  return pty?.size ? { cols: pty.size.cols || 80, rows: pty.size.rows || 24 } : undefined;
}

/** RPC errors as Connect errors; a 500's details go to the log, not the client. */
const errorsTo = (log: ErrorLog) => <A extends unknown[], R>(fn: (...a: A) => Promise<R>) => async (...a: A): Promise<R> => {
  try {
    return await fn(...a);
  } catch (err) {
    throw rpcError(err, (a[1] as HandlerContext).signal, log);
  }
};

const streamErrorsTo = (log: ErrorLog) => <A extends unknown[], R>(fn: (...a: A) => AsyncGenerator<R>) =>
  async function* (...a: A): AsyncGenerator<R> {
    try {
      yield* fn(...a);
    } catch (err) {
      throw rpcError(err, (a[1] as HandlerContext).signal, log);
    }
  };

export function processService(deps: E2bDeps, resolve: ResolveTarget): Partial<ServiceImpl<typeof Process>> {
  const { toolbox } = deps.core;
  const withErrors = errorsTo(deps.log);
  const withStreamErrors = streamErrorsTo(deps.log);

  async function writeInput(target: SandboxTarget, selector: ProcessSelector | undefined, data: Uint8Array, signal: AbortSignal): Promise<void> {
    const info = await findProcess(deps, target, selector, signal);
    await toolbox.writeStdin(target.principal, target.sandboxId, info.processId, Buffer.from(data), { signal });
  }

  return {
    start: withStreamErrors(async function* (req, ctx) {
      const target = await resolve(ctx);
      // A server stream for as long as it runs: counted against the stream caps (429 beyond them).
      deps.streams.acquireUntilAborted({ keyId: target.principal.keyId, sandboxId: target.sandboxId }, ctx.signal);
      const config = req.process;
      if (!config?.cmd) throw new ConnectError('process.cmd: required', Code.InvalidArgument);
      const pty = ptySize(req.pty);
      // Connect-Timeout-Ms is the process's lifetime in envd (e2b.md (h) 9): pass it on so the
      // guest kills the process at the deadline the client gave up at.
      const timeoutMs = ctx.timeoutMs();
      const info = await toolbox.startProcess(target.principal, target.sandboxId, {
        argv: [config.cmd, ...config.args],
        ...(Object.keys(config.envs).length ? { env: config.envs } : {}),
        // The request's directory, else the template's workdir (template-defaults.ts), else the user's home.
        ...(config.cwd ? { cwd: config.cwd } : await templateDefaults(deps.core, target).then((d) => (d.workdir ? { cwd: d.workdir } : {}))),
        // The request's user, else the template's, else E2B's `user` (HOME, USER and the default cwd follow it).
        user: (await e2bAccount(deps.core, target, ctx.requestHeader)).name,
        // Capped at the native API's 24 h: Connect allows deadlines of up to 10 digits of ms, and
        // past 2^31 ms the guest's timer would fire at once and kill the process immediately.
        ...(timeoutMs !== undefined ? { timeoutMs: Math.min(MAX_PROCESS_TIMEOUT_MS, Math.max(1, Math.floor(timeoutMs))) } : {}),
        ...(req.tag !== undefined ? { tag: req.tag } : {}),
        ...(pty ? { pty } : { stdin: req.stdin ?? true }),
      }, { signal: ctx.signal });
      for await (const event of relayEvents(deps, target, info, { stdout: 0, stderr: 0 }, ctx)) yield { event };
    }),

    connect: withStreamErrors(async function* (req, ctx) {
      const target = await resolve(ctx);
      // A server stream for as long as it runs: counted against the stream caps (429 beyond them).
      deps.streams.acquireUntilAborted({ keyId: target.principal.keyId, sandboxId: target.sandboxId }, ctx.signal);
      const info = await findProcess(deps, target, req.process, ctx.signal);
      if (info.status !== 'running') {
        // Upstream replays start + end for a process that just ended.
        yield { event: { event: { case: 'start', value: { pid: info.pid } } } };
        yield { event: endEvent({ status: info.status, exitCode: info.exitCode, signal: info.signal, timedOut: info.timedOut }) };
        return;
      }
      // Output from this point on, as envd's Connect does.
      for await (const event of relayEvents(deps, target, info, { stdout: info.stdout.bytes, stderr: info.stderr.bytes }, ctx)) yield { event };
    }),

    list: withErrors(async (_req, ctx) => {
      const target = await resolve(ctx);
      const body = await toolbox.listProcesses(target.principal, target.sandboxId, {}, { signal: ctx.signal });
      return {
        // `config` is always set: the SDK reads it without a guard (e2b.md (h) 18).
        processes: body.processes
          .filter((p) => !isHidden(p) && p.status === 'running')
          .map((p) => ({ pid: p.pid, config: { cmd: p.cmd, args: p.args, envs: {}, cwd: p.cwd }, ...(p.tag !== null ? { tag: p.tag } : {}) })),
      };
    }),

    sendInput: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const input = req.input?.input;
      if (!input?.case) throw new ConnectError('input: give stdin or pty bytes', Code.InvalidArgument);
      await writeInput(target, req.process, input.value, ctx.signal);
      return {};
    }),

    streamInput: withErrors(async (requests, ctx) => {
      const target = await resolve(ctx);
      let selector: ProcessSelector | undefined;
      for await (const message of requests) {
        if (message.event.case === 'start') selector = message.event.value.process;
        else if (message.event.case === 'data') {
          if (!selector) throw new ConnectError('the first message must be start', Code.InvalidArgument);
          const input = message.event.value.input?.input;
          if (input?.case) await writeInput(target, selector, input.value, ctx.signal);
        }
      }
      return {};
    }),

    sendSignal: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const info = await findProcess(deps, target, req.process, ctx.signal);
      // envd answers not_found for a process that is gone; the SDK's kill() then returns false.
      if (info.status !== 'running') throw new ConnectError(`process with pid ${info.pid} not found`, Code.NotFound);
      if (req.signal === Signal.SIGKILL) await toolbox.killProcess(target.principal, target.sandboxId, info.processId, { signal: ctx.signal }); // the whole process group, like envd's kill
      else if (req.signal === Signal.SIGTERM) await toolbox.signalProcess(target.principal, target.sandboxId, info.processId, 'SIGTERM', { signal: ctx.signal });
      else throw new ConnectError('signal: SIGTERM or SIGKILL', Code.InvalidArgument);
      return {};
    }),

    update: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const info = await findProcess(deps, target, req.process, ctx.signal);
      const size = ptySize(req.pty);
      if (size) await toolbox.resizeTerminal(target.principal, target.sandboxId, info.processId, size, { signal: ctx.signal });
      return {};
    }),

    closeStdin: withErrors(async (req, ctx) => {
      const target = await resolve(ctx);
      const info = await findProcess(deps, target, req.process, ctx.signal);
      await toolbox.closeStdin(target.principal, target.sandboxId, info.processId, { signal: ctx.signal });
      return {};
    }),
  };
}
