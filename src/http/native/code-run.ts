// The HTTP side of code runs (POST /code/run and its WebSocket form): the run request as core
// takes it, the stream frames, the collected answer, and how a cell's end maps onto a WebSocket
// close code. The cells themselves run in core's CodeInterpreterService (core/services/code-interpreter.ts).
import { NestboxError, publicError } from '../../../core/errors.js';
import type { CodeEvent, MimeBundle, RunCodeInput } from '../../../core/code-interpreter/types.js';
import type { Logger } from '../../../core/logger.js';
import type { Principal } from '../../../core/types.js';
import type { Services } from '../../services.js';

/** The body of runCode (the spec's RunCodeRequest, already validated against it). */
export interface RunCodeBody {
  code: string;
  contextId?: string;
  language?: string;
  envs?: Record<string, string>;
  timeoutMs?: number;
  cwd?: string;
  user?: string;
}

/** What a stream carries: the cell's events, plus `failure` when the stream broke after it began. */
export type CodeStreamFrame = CodeEvent | { type: 'failure'; error: { code: string; message: string } };

export function failureFrame(err: unknown, log?: Pick<Logger, 'error'>): { frame: CodeStreamFrame; status: number } {
  const e = publicError(err, log, 'code run');
  return { frame: { type: 'failure', error: { code: e.code, message: e.message } }, status: e.status };
}

/**
 * Starts the cell and waits for its first event, so that everything the engine refuses before
 * the cell runs (unknown context, a language the image has no kernel for, a stopped sandbox)
 * is still an ordinary error answer rather than a broken stream.
 */
export async function startCodeRun(
  services: Services,
  principal: Principal,
  sandboxId: string,
  body: RunCodeBody,
  signal: AbortSignal,
): Promise<{ first: IteratorResult<CodeEvent>; events: AsyncGenerator<CodeEvent> }> {
  if (body.contextId !== undefined && body.language !== undefined) {
    throw new NestboxError('validation_failed', 'language: give either contextId (the context has its language) or language (its default context), not both', { field: 'language' });
  }
  const input: RunCodeInput = { code: body.code, contextId: body.contextId, language: body.language, envs: body.envs, timeoutMs: body.timeoutMs, cwd: body.cwd, user: body.user };
  const events = await services.codeInterpreter.run(principal, sandboxId, input, { signal });
  const first = await events.next();
  return { first, events };
}

/** The events of a run, the first one (already read by startCodeRun) included. */
export async function* allEvents(start: { first: IteratorResult<CodeEvent>; events: AsyncGenerator<CodeEvent> }): AsyncGenerator<CodeEvent> {
  if (start.first.done) return;
  yield start.first.value;
  yield* start.events;
}

/** The spec's CodeRunResult: a cell's events collected into one answer. */
export interface CodeRunResult {
  status: 'ok' | 'error' | 'interrupted' | 'lost';
  executionCount: number | null;
  stdout: string;
  stderr: string;
  text: string | null;
  results: { main: boolean; data: MimeBundle }[];
  error: { name: string; value: string; traceback: string } | null;
}

export class CodeRunCollector {
  private readonly result: CodeRunResult = { status: 'ok', executionCount: null, stdout: '', stderr: '', text: null, results: [], error: null };
  private ended = false;

  add(e: CodeEvent): void {
    switch (e.type) {
      case 'start':
        this.result.executionCount = e.executionCount;
        break;
      case 'stdout':
      case 'stderr':
        this.result[e.type] += e.text;
        break;
      case 'result':
        this.result.results.push({ main: e.main, data: e.data });
        if (e.main && typeof e.data['text/plain'] === 'string') this.result.text = e.data['text/plain'];
        break;
      case 'error':
        this.result.error = { name: e.name, value: e.value, traceback: e.traceback };
        break;
      case 'end':
        this.ended = true;
        this.result.status = e.status;
        if (e.executionCount !== undefined) this.result.executionCount = e.executionCount;
        break;
      case 'keepalive':
        break;
    }
  }

  done(): CodeRunResult {
    // The engine always ends a cell with `end`; a generator that stopped without one lost its kernel.
    if (!this.ended) this.result.status = 'lost';
    return this.result;
  }
}

/** WebSocket close codes of a cell's end (documented in openapi/native.yaml, runCodeWebSocket). */
export function closeCodeOfEnd(status: 'ok' | 'error' | 'interrupted' | 'lost'): number {
  return status === 'interrupted' ? 4000 : status === 'lost' ? 4001 : 1000;
}

/** A refusal or failure after the upgrade: 4000 + its HTTP status (4400, 4404, 4503, …). */
export function closeCodeOfStatus(status: number): number {
  return 4000 + Math.min(Math.max(status, 400), 599);
}
