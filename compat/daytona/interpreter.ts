// Daytona's `sandbox.codeInterpreter` (daytona-wave2 §4.2, §4.3) over core's code interpreter
// (core/code-interpreter/types.ts): contexts are core's contexts (one Jupyter kernel each), and
// a run over the `/process/interpreter/execute` socket is one cell whose events become the
// daemon's frames. Daytona's built-in context `default` is core's default python context.
import { stripVTControlCharacters } from 'node:util';
import express, { type Router } from 'express';
import { WebSocket } from 'ws';
import { NestboxError, errors, publicError } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { CodeContext, CodeEvent, RunCodeInput } from '../../core/code-interpreter/types.js';
import type { Principal } from '../../core/types.js';
import type { Log, ToolboxCall, ToolboxHandler } from './context.js';
import { daemonCall, PROCESS_CODES } from './errors.js';

/** The id Daytona's SDKs and daemon give the context a run without `contextId` uses. */
export const DEFAULT_CONTEXT_ID = 'default';

/** Where a context starts and as whom: Daytona's `daytona` user in the daemon's workdir. */
export interface InterpreterDefaults {
  user: string;
  cwd: string;
}

type Core = Pick<CompatPort, 'codeInterpreter'>;

/** Daytona's InterpreterContext: `active` is true for every context core lists (its kernel runs). */
export function renderContext(c: CodeContext): Record<string, unknown> {
  return { id: c.id, cwd: c.cwd, createdAt: c.createdAt, active: true, language: c.language };
}

/** The context routes (HTTP, under the toolbox): create, list (the default left out), delete. */
export function createInterpreterRoutes(core: Core & Pick<CompatPort, 'toolbox'>, tb: ToolboxHandler, defaultsOf: (c: ToolboxCall) => Promise<InterpreterDefaults>): Router {
  const router = express.Router({ mergeParams: true });
  const { codeInterpreter } = core;
  /**
   * A cwd the account cannot enter (`/root` for daytona) would start a kernel that dies at
   * once, which core can only report as its own failure: it is the client's, a 400 naming cwd.
   */
  const checkCwd = async (c: ToolboxCall, cwd: string, user: string) => {
    const r = await core.toolbox.exec(c.principal, c.sandboxId, { argv: ['/bin/sh', '-c', 'cd -- "$1"', 'sh', cwd], user, timeoutMs: 30_000 });
    if (r.exitCode !== 0) throw errors.validation('cwd', `${JSON.stringify(cwd)} is not a directory ${user} can enter`);
  };
  router.post('/context', tb(async (c) => {
    const b = (c.req.body && typeof c.req.body === 'object' ? c.req.body : {}) as Record<string, unknown>;
    if (b.cwd !== undefined && b.cwd !== null && typeof b.cwd !== 'string') throw errors.validation('cwd', 'must be a string');
    if (b.language !== undefined && b.language !== null && typeof b.language !== 'string') throw errors.validation('language', 'must be a string');
    const defaults = await defaultsOf(c);
    if (typeof b.cwd === 'string' && b.cwd !== '') await checkCwd(c, b.cwd, defaults.user);
    // The SDK never sends a language (the daemon has python only); core's other kernels are
    // accepted too, and core names a language this sandbox's image has no kernel for.
    const created = await codeInterpreter.createContext(c.principal, c.sandboxId, {
      language: (b.language as string | undefined) || 'python',
      cwd: (b.cwd as string | undefined) || defaults.cwd,
      user: defaults.user,
    });
    c.res.json(renderContext(created));
  }));
  router.get('/context', tb(async (c) => {
    const list = await codeInterpreter.listContexts(c.principal, c.sandboxId);
    // The daemon lists only the contexts users made: core's default contexts are left out.
    c.res.json({ contexts: list.filter((ctx) => !ctx.isDefault).map(renderContext) });
  }));
  router.delete('/context/:contextId', tb(async (c) => {
    const id = String(c.req.params.contextId);
    if (id === DEFAULT_CONTEXT_ID) throw errors.validation('id', 'cannot delete the default context');
    const found = await daemonCall(PROCESS_CODES, codeInterpreter.getContext(c.principal, c.sandboxId, id));
    if (found.isDefault) throw errors.validation('id', 'cannot delete the default context');
    await daemonCall(PROCESS_CODES, codeInterpreter.deleteContext(c.principal, c.sandboxId, id));
    c.res.json({ message: 'Context deleted successfully' });
  }));
  return router;
}

// ---- the execute socket (daytona-wave2 §4.3) ------------------------------------------------

/** Close codes of the daemon's socket. 4008 is the SDKs' DaytonaTimeoutError. */
const CLOSE = { normal: 1000, goingAway: 1001, protocolError: 1002, policyViolation: 1008, internalError: 1011, timeout: 4008 } as const;

/** A run without `timeout` is stopped after 10 minutes, as the daemon's; `0` means never. */
const DEFAULT_TIMEOUT_SECONDS = 600;
/** The same ceiling as a toolbox command's timeout (a Node timer past 2^31 ms fires at once). */
const MAX_TIMEOUT_SECONDS = 86_400;
/** The request frame must come this soon after the socket opens. */
const FIRST_FRAME_WAIT_MS = 60_000;
/** A client that reads slower than the cell writes is cut off past this much unsent output. */
const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;

interface ExecuteRequest {
  code: string;
  contextId?: string;
  envs?: Record<string, string>;
  timeoutSeconds: number;
}

/** Why a socket is closed before anything runs: the daemon's close code and reason. */
class Refusal extends Error {
  constructor(readonly closeCode: number, reason: string) {
    super(reason);
  }
}

/** The one client frame, read as the daemon reads it (its Go types: a bad type is a bad payload). */
function parseRequest(data: string): ExecuteRequest {
  let raw: unknown;
  try {
    raw = JSON.parse(data);
  } catch {
    throw new Refusal(CLOSE.protocolError, 'invalid JSON payload');
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw new Refusal(CLOSE.protocolError, 'invalid JSON payload');
  const r = raw as Record<string, unknown>;
  const present = (v: unknown) => v !== undefined && v !== null;
  if (present(r.code) && typeof r.code !== 'string') throw new Refusal(CLOSE.protocolError, 'invalid JSON payload');
  if (present(r.contextId) && typeof r.contextId !== 'string') throw new Refusal(CLOSE.protocolError, 'invalid JSON payload');
  if (present(r.timeout) && (typeof r.timeout !== 'number' || !Number.isFinite(r.timeout))) throw new Refusal(CLOSE.protocolError, 'invalid JSON payload');
  if (present(r.envs) && (typeof r.envs !== 'object' || Array.isArray(r.envs) || Object.values(r.envs as object).some((v) => typeof v !== 'string'))) {
    throw new Refusal(CLOSE.protocolError, 'invalid JSON payload');
  }
  if (!r.code) throw new Refusal(CLOSE.policyViolation, 'code is required');
  const timeout = present(r.timeout) ? (r.timeout as number) : DEFAULT_TIMEOUT_SECONDS;
  if (timeout < 0) throw new Refusal(CLOSE.policyViolation, 'timeout must be greater than or equal to 0');
  if (timeout > MAX_TIMEOUT_SECONDS) throw new Refusal(CLOSE.policyViolation, `timeout must be at most ${MAX_TIMEOUT_SECONDS} seconds (0 = none)`);
  return { code: r.code as string, contextId: (r.contextId as string | undefined) || undefined, envs: present(r.envs) ? (r.envs as Record<string, string>) : undefined, timeoutSeconds: timeout };
}

/** A close reason is at most 123 bytes (RFC 6455 5.5). */
function closeReason(text: string): string {
  let out = text;
  while (Buffer.byteLength(out) > 123) out = out.slice(0, -1);
  return out;
}

/** The next text frame, or undefined if the client closed (or sent nothing in time). */
function firstFrame(client: WebSocket): Promise<string | undefined> {
  return new Promise((resolve) => {
    const done = (v: string | undefined) => {
      clearTimeout(timer);
      client.off('message', onMessage);
      client.off('close', onClose);
      resolve(v);
    };
    const onMessage = (data: WebSocket.RawData) => done(Buffer.isBuffer(data) ? data.toString('utf8') : Array.isArray(data) ? Buffer.concat(data).toString('utf8') : Buffer.from(data).toString('utf8'));
    const onClose = () => done(undefined);
    const timer = setTimeout(() => {
      done(undefined);
      client.close(CLOSE.policyViolation, 'no request frame');
    }, FIRST_FRAME_WAIT_MS);
    client.on('message', onMessage);
    client.on('close', onClose);
  });
}

/**
 * One run on an accepted socket: read the request frame, run the cell in its context (FIFO per
 * context: core runs a context's cells one at a time), send its output as the daemon's frames
 * (every frame carries all five keys, as the daemon's do), then `control` and close 1000. A
 * cell its timeout interrupted closes with 4008 and no `control` frame (the TypeScript SDK
 * resolves on the first `control` it sees); the context survives. A client that leaves
 * interrupts the cell.
 *
 * Results (`execute_result`, `display_data`) have no frame: both SDKs read only stdout, stderr,
 * error and control, and the daemon's interpreter (plain `exec`) never produces them. They are
 * dropped, so a trailing expression prints nothing, as on Daytona.
 */
export async function serveInterpreterSocket(core: Core, principal: Principal, sandboxId: string, defaults: InterpreterDefaults, client: WebSocket, log: Log): Promise<void> {
  const frame = (type: string, fields: { text?: string; name?: string; value?: string; traceback?: string }) =>
    JSON.stringify({ type, text: fields.text ?? '', name: fields.name ?? '', value: fields.value ?? '', traceback: fields.traceback ?? '' });
  const close = (code: number, reason = '') => {
    if (client.readyState === WebSocket.OPEN) client.close(code, closeReason(reason));
  };
  const data = await firstFrame(client);
  if (data === undefined) return;
  let request: ExecuteRequest;
  try {
    request = parseRequest(data);
  } catch (err) {
    if (err instanceof Refusal) return close(err.closeCode, err.message);
    throw err;
  }
  const useDefault = request.contextId === undefined || request.contextId === DEFAULT_CONTEXT_ID;
  const stop = new AbortController();
  let clientGone = false;
  client.once('close', () => {
    clientGone = true;
    stop.abort();
  });
  const timeoutMs = request.timeoutSeconds > 0 ? Math.round(request.timeoutSeconds * 1000) : undefined;
  const input: RunCodeInput = {
    code: request.code,
    ...(useDefault ? { language: 'python', user: defaults.user, cwd: defaults.cwd } : { contextId: request.contextId }),
    envs: request.envs,
    timeoutMs,
  };
  let events: AsyncGenerator<CodeEvent>;
  try {
    if (!useDefault) await core.codeInterpreter.getContext(principal, sandboxId, request.contextId!);
    events = await core.codeInterpreter.run(principal, sandboxId, input, { signal: stop.signal });
  } catch (err) {
    return closeOnError(err, request, close, log);
  }
  try {
    // The cell's outcome; acted on once the events are over. The stream is read to its own end
    // (never left at `end`): after a lost kernel it waits for the old one to be gone, so this
    // context's next cell starts a fresh kernel instead of finding the dying one.
    let outcome: 'ok' | 'error' | 'interrupted' | 'lost' | undefined;
    for await (const event of events) {
      if (clientGone) break;
      if (client.bufferedAmount > MAX_BUFFERED_BYTES) {
        stop.abort();
        return close(CLOSE.policyViolation, 'slow consumer');
      }
      switch (event.type) {
        case 'stdout':
        case 'stderr':
          client.send(frame(event.type, { text: event.text }));
          break;
        case 'error':
          // Daytona's tracebacks are plain text; a Jupyter kernel's are coloured.
          client.send(frame('error', { name: event.name, value: event.value, traceback: stripVTControlCharacters(event.traceback) }));
          break;
        case 'end':
          outcome = event.status;
          break;
        default:
          // start, keepalive, and results (see above): nothing the SDKs read.
          break;
      }
    }
    if (clientGone) return;
    switch (outcome) {
      case undefined:
        // The events ended without an `end` (the stream was cut).
        return close(CLOSE.goingAway, 'the run ended without an outcome');
      case 'interrupted':
        if (timeoutMs !== undefined) return close(CLOSE.timeout);
        client.send(frame('control', { text: 'interrupted' }));
        return close(CLOSE.normal);
      case 'lost':
        // The kernel died (os._exit, out of memory): the daemon closes with 1001 when its
        // worker ends. Said as an error first, so the TypeScript SDK (which resolves on 1001) reports it.
        client.send(frame('error', { name: 'WorkerProcessError', value: 'the interpreter process ended during the run; the context state is lost and its next run starts a new interpreter' }));
        return close(CLOSE.goingAway, 'worker process ended');
      default:
        client.send(frame('control', { text: 'completed' }));
        return close(CLOSE.normal);
    }
  } catch (err) {
    if (!clientGone) closeOnError(err, request, close, log);
  } finally {
    stop.abort();
  }
}

function closeOnError(err: unknown, request: ExecuteRequest, close: (code: number, reason?: string) => void, log: Log): void {
  if (err instanceof NestboxError && err.code === 'not_found' && request.contextId !== undefined && err.details?.kind !== 'sandbox') {
    return close(CLOSE.policyViolation, `context not found: ${request.contextId}`);
  }
  const e = publicError(err, log, 'daytona interpreter socket');
  // A client's mistake (a bad env, a language the image lacks) is a policy violation, as the
  // daemon's refusals are; the rest is the server's (1011), with what it says.
  close(e.status < 500 ? CLOSE.policyViolation : CLOSE.internalError, e.message);
}

