// The code-interpreter HTTP API (port 49999 traffic, e2b.md (e)) over core's code interpreter:
// /execute streams one cell's events as E2B's NDJSON lines (results.ts); /contexts lists,
// creates, restarts and removes contexts (contexts.ts).
import type { Request, Response } from 'express';
import { NestboxError, publicError, retryAfterSeconds, toNestboxError } from '../../../core/errors.js';
import { clientHasGone } from '../../../http-kit/request-checks.js';
import type { E2bDeps } from '../deps.js';
import { isSandboxUnavailable, unavailableMessage } from '../errors.js';
import type { SandboxTarget } from '../target.js';
import { CODE_LANGUAGES, type CodeEvent } from '../../../core/code-interpreter/types.js';
import { asContextNotFound, codeAccount, createContext, defaultContextLanguage, listContexts, normalizeLanguage, removeContext, restartContext } from './contexts.js';
import { linesOf, type ExecuteLine } from './results.js';
import type { ErrorLog } from '../../../core/logger.js';

/**
 * Status handling of the SDK (e2b.md (e)): 404 → NotFoundError, 502 → TimeoutError, anything
 * else → SandboxError("<status> <statusText>"); the body text is the message.
 */
export function renderCodeInterpreterError(res: Response, err: unknown, log?: ErrorLog): void {
  if (clientHasGone(res)) return void res.destroy();
  const e = publicError(err, log, 'e2b code interpreter');
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const status = isSandboxUnavailable(e) ? 502 : e.status;
  if (status === 429) res.setHeader('Retry-After', String(retryAfterSeconds(e)));
  res.status(status).type('text/plain').send(status === 502 ? unavailableMessage(e) : e.message);
}

interface ExecuteBody {
  code?: unknown;
  context_id?: unknown;
  language?: unknown;
  env_vars?: unknown;
}

function optionalString(value: unknown, field: string): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string') throw new NestboxError('validation_failed', `${field}: must be a string`, { field });
  return value;
}

function envVarsOf(value: unknown): Record<string, string> | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'object' || Array.isArray(value) || Object.values(value).some((v) => typeof v !== 'string')) {
    throw new NestboxError('validation_failed', 'env_vars: must be an object of strings', { field: 'env_vars' });
  }
  return value as Record<string, string>;
}

/**
 * What a run addresses in core's terms: a context by id, or the default context of a language.
 * The default contexts E2B lists before they started (contexts.ts) are addressed by language, so
 * their first run starts them.
 */
function runTarget(contextId: string | undefined, language: string | undefined): { contextId?: string; language?: string } {
  if (contextId !== undefined) {
    const defaultLanguage = defaultContextLanguage(contextId);
    if (defaultLanguage && (CODE_LANGUAGES as readonly string[]).includes(defaultLanguage)) return { language: defaultLanguage };
    return { contextId };
  }
  return { language: normalizeLanguage(language) };
}

/**
 * The sandbox stopped answering during the run (killed, timed out, its host gone). Upstream's
 * connection then just drops, and the SDK asks envd whether the sandbox still runs, reporting
 * "the sandbox was killed while the request was in progress" when it does not: the same here,
 * by closing the connection instead of answering (a sandbox already gone when the request came
 * is a 502 before this, from the router).
 */
function sandboxWentAway(err: unknown): boolean {
  return isSandboxUnavailable(toNestboxError(err));
}

export async function execute(deps: E2bDeps, target: SandboxTarget, req: Request, res: Response): Promise<void> {
  const { principal, sandboxId } = target;
  // The answer streams for as long as the code runs: counted against the stream caps (429 beyond).
  deps.streams.acquireUntilClosed({ keyId: principal.keyId, sandboxId }, res);
  const body = (req.body ?? {}) as ExecuteBody;
  const code = optionalString(body.code, 'code');
  if (code === undefined) throw new NestboxError('validation_failed', 'code: required', { field: 'code' });
  const contextId = optionalString(body.context_id, 'context_id') || undefined;
  const language = optionalString(body.language, 'language') || undefined;
  if (contextId && language) throw new NestboxError('validation_failed', 'context_id: give a context or a language, not both', { field: 'context_id' });
  const envs = envVarsOf(body.env_vars);
  const account = await codeAccount(deps, target);

  // A client that gives up (the SDK's timeoutMs closes the request) interrupts the cell; the
  // context keeps its state for the next run (core's run, aborted).
  const abort = new AbortController();
  res.on('close', () => abort.abort());
  const wanted = runTarget(contextId, language);
  const started = deps.core.codeInterpreter.run(principal, sandboxId, { code, ...wanted, ...(envs ? { envs } : {}), user: account.name, cwd: account.home }, { signal: abort.signal });
  let events: AsyncGenerator<CodeEvent>;
  try {
    // Resolves once the cell is the context's to run (after the cells queued before it), so an
    // unknown context is a 404 and a bad language a 400 before any line.
    events = await (contextId ? asContextNotFound(contextId, started) : started);
  } catch (err) {
    if (sandboxWentAway(err)) return void res.destroy();
    throw err;
  }

  res.status(200).setHeader('content-type', 'application/x-ndjson');
  res.flushHeaders();
  const write = (lines: ExecuteLine[]) => {
    for (const line of lines) res.write(JSON.stringify(line) + '\n');
  };
  try {
    // Read to the generator's own end (it ends after `end`): what core does after a cell's end
    // (waiting for a lost kernel to be gone) must not be cut short by returning early.
    for await (const event of events) {
      if (abort.signal.aborted) break;
      write(linesOf(event));
    }
  } catch (err) {
    if (abort.signal.aborted || clientHasGone(res) || sandboxWentAway(err)) return void res.destroy();
    // The answer has begun: a failure can only be told as a line of it.
    const e = publicError(err, deps.log, 'e2b code interpreter');
    write([{ type: 'error', name: 'UnexpectedEndOfExecution', value: e.message, traceback: '' }, { type: 'end_of_execution' }]);
  } finally {
    await events.return(undefined).catch(() => undefined);
  }
  if (abort.signal.aborted) return void res.destroy();
  res.end();
}

export async function handleCodeInterpreter(deps: E2bDeps, target: SandboxTarget, req: Request, res: Response): Promise<void> {
  try {
    const path = req.path.replace(/\/+$/, '') || '/';
    const contextMatch = path.match(/^\/contexts\/([^/]+)(\/restart)?$/);
    if (path === '/execute' && req.method === 'POST') return await execute(deps, target, req, res);
    if (path === '/contexts' && req.method === 'POST') {
      const body = (req.body ?? {}) as { language?: unknown; cwd?: unknown };
      res.status(200).json(await createContext(deps, target, { language: optionalString(body.language, 'language'), cwd: optionalString(body.cwd, 'cwd') }));
      return;
    }
    if (path === '/contexts' && req.method === 'GET') {
      res.status(200).json(await listContexts(deps, target));
      return;
    }
    if (contextMatch && !contextMatch[2] && req.method === 'DELETE') {
      await removeContext(deps, target, decodeURIComponent(contextMatch[1]));
      res.status(204).end();
      return;
    }
    if (contextMatch && contextMatch[2] && req.method === 'POST') {
      await restartContext(deps, target, decodeURIComponent(contextMatch[1]));
      res.status(204).end();
      return;
    }
    if (path === '/health' && req.method === 'GET') {
      res.status(200).type('text/plain').send('OK');
      return;
    }
    throw new NestboxError('not_found', `no code-interpreter route ${req.method} ${path}`);
  } catch (err) {
    renderCodeInterpreterError(res, err, deps.log);
  }
}
