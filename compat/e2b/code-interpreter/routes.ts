// The code-interpreter HTTP API (port 49999 traffic, e2b.md (e)): /execute streams the
// kernel's NDJSON for one cell; /contexts manages kernels (kernels.ts).
import type { Request, Response } from 'express';
import { NestboxError, publicError } from '../../../core/errors.js';
import { clientHasGone } from '../../../http-kit/request-checks.js';
import type { E2bDeps } from '../deps.js';
import { isSandboxUnavailable, unavailableMessage } from '../errors.js';
import type { SandboxTarget } from '../target.js';
import { createContext, kernelFor, listContexts, removeContext, restartContext } from './kernels.js';
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

export async function execute(deps: E2bDeps, target: SandboxTarget, req: Request, res: Response): Promise<void> {
  const { toolbox } = deps.core;
  const { principal, sandboxId } = target;
  // The answer streams for as long as the code runs: counted against the stream caps (429 beyond).
  deps.streams.acquireUntilClosed({ keyId: target.principal.keyId, sandboxId: target.sandboxId }, res);
  const body = (req.body ?? {}) as ExecuteBody;
  const code = optionalString(body.code, 'code');
  if (code === undefined) throw new NestboxError('validation_failed', 'code: required', { field: 'code' });
  const contextId = optionalString(body.context_id, 'context_id');
  const language = optionalString(body.language, 'language');
  if (contextId && language) throw new NestboxError('validation_failed', 'context_id: give a context or a language, not both', { field: 'context_id' });
  const envVars = body.env_vars ?? undefined;
  if (envVars !== undefined && (typeof envVars !== 'object' || envVars === null || Object.values(envVars).some((v) => typeof v !== 'string'))) {
    throw new NestboxError('validation_failed', 'env_vars: must be an object of strings', { field: 'env_vars' });
  }

  const kernel = await kernelFor(deps, target, contextId, language);
  // A client that gives up (the SDK's timeoutMs) interrupts the cell (runCell): the context's
  // kernel keeps its state for the next call.
  const abort = new AbortController();
  res.on('close', () => abort.abort());
  const messages = await toolbox.runCell(principal, sandboxId, kernel.process.processId, { code, ...(envVars ? { env: envVars as Record<string, string> } : {}) }, { signal: abort.signal });

  // The kernel speaks E2B's /execute shapes already (kernel.py): each message is one NDJSON line.
  res.status(200).setHeader('content-type', 'application/x-ndjson');
  res.flushHeaders();
  try {
    for await (const message of messages) {
      res.write(JSON.stringify(message) + '\n');
      if (message.type === 'end') {
        res.end();
        return;
      }
    }
  } catch (err) {
    if (abort.signal.aborted) return;
    throw err;
  }
  // The kernel died mid-cell (os._exit, out of memory): upstream reports it this way.
  res.write(JSON.stringify({ type: 'error', name: 'UnexpectedEndOfExecution', value: 'the code context\'s kernel exited during the execution; its state is lost', traceback: '' }) + '\n');
  res.write(JSON.stringify({ type: 'end_of_execution' }) + '\n');
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
