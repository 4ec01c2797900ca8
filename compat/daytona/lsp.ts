// Daytona's LSP endpoints (daytona-wave2.md §5) onto core's toolbox: the language servers run
// in the sandbox, started and spoken to by its guest agent (host/guest-agent/lsp.ts). Bodies
// and queries are Daytona's; answers are the SDK's CompletionList and LspSymbol[]. A call to a
// server that was not started (or has exited) is the daemon's LSP_SERVER_NOT_INITIALIZED 400.
import express, { type Request, type Router } from 'express';
import { errors, NestboxError } from '../../core/errors.js';
import type { ToolboxPort } from '../../core/compat-port.js';
import type { LspPosition, LspServerInput } from '../../core/guest.js';
import { clientGoneSignal } from '../../http-kit/request-body.js';
import { requireQuery, type ToolboxCall, type ToolboxHandler } from './context.js';
import { daemonError } from './errors.js';
import { SANDBOX_USER } from './sandbox-dto.js';

/** Guest "no such server / it exited / it could not start" → the daemon's code (a sandbox's own state keeps its shape). */
async function lspCall<T>(call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (err) {
    if (err instanceof NestboxError && err.code === 'invalid_state' && err.details?.kind !== 'sandbox') {
      throw daemonError('validation_failed', err.message, 'LSP_SERVER_NOT_INITIALIZED');
    }
    throw err;
  }
}

export function createLspRoutes(toolbox: ToolboxPort, tb: ToolboxHandler): Router {
  const router = express.Router({ mergeParams: true });
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' ? (req.body as Record<string, unknown>) : {});
  const str = (b: Record<string, unknown>, field: string): string => {
    const v = b[field];
    if (typeof v !== 'string' || v === '') throw errors.validation(field, 'is required');
    return v;
  };
  const serverOf = (b: Record<string, unknown>): LspServerInput => ({ languageId: str(b, 'languageId'), pathToProject: str(b, 'pathToProject') });
  const position = (v: unknown): LspPosition => {
    const p = (v ?? {}) as Record<string, unknown>;
    for (const field of ['line', 'character'] as const) {
      if (!Number.isInteger(p[field]) || (p[field] as number) < 0) throw errors.validation(`position.${field}`, 'must be a non-negative integer');
    }
    return { line: p.line as number, character: p.character as number };
  };
  const untilGone = (c: ToolboxCall) => ({ signal: clientGoneSignal(c.req, c.res) });
  const ok = (c: ToolboxCall) => void c.res.status(200).end();

  router.post('/start', tb(async (c) => {
    // As the sandbox's user, like every other toolbox command.
    await lspCall(toolbox.lspStart(c.principal, c.sandboxId, { ...serverOf(body(c.req)), user: SANDBOX_USER }, untilGone(c)));
    ok(c);
  }));
  router.post('/stop', tb(async (c) => {
    await lspCall(toolbox.lspStop(c.principal, c.sandboxId, serverOf(body(c.req)), untilGone(c)));
    ok(c);
  }));
  router.post('/did-open', tb(async (c) => {
    const b = body(c.req);
    await lspCall(toolbox.lspDidOpen(c.principal, c.sandboxId, { ...serverOf(b), uri: str(b, 'uri') }, untilGone(c)));
    ok(c);
  }));
  router.post('/did-close', tb(async (c) => {
    const b = body(c.req);
    await lspCall(toolbox.lspDidClose(c.principal, c.sandboxId, { ...serverOf(b), uri: str(b, 'uri') }, untilGone(c)));
    ok(c);
  }));
  router.post('/completions', tb(async (c) => {
    const b = body(c.req);
    const context = b.context && typeof b.context === 'object' ? (b.context as { triggerKind?: unknown; triggerCharacter?: unknown }) : undefined;
    if (context && !Number.isInteger(context.triggerKind)) throw errors.validation('context.triggerKind', 'must be an integer');
    const list = await lspCall(toolbox.lspCompletion(c.principal, c.sandboxId, {
      ...serverOf(b),
      uri: str(b, 'uri'),
      position: position(b.position),
      ...(context ? { context: { triggerKind: context.triggerKind as number, ...(typeof context.triggerCharacter === 'string' ? { triggerCharacter: context.triggerCharacter } : {}) } } : {}),
    }, untilGone(c)));
    c.res.json(list);
  }));
  router.get('/document-symbols', tb(async (c) => {
    const input = { languageId: requireQuery(c.req, 'languageId'), pathToProject: requireQuery(c.req, 'pathToProject'), uri: requireQuery(c.req, 'uri') };
    c.res.json(await lspCall(toolbox.lspDocumentSymbols(c.principal, c.sandboxId, input, untilGone(c))));
  }));
  // Daytona's path has no hyphen here.
  router.get('/workspacesymbols', tb(async (c) => {
    const input = { query: requireQuery(c.req, 'query'), languageId: requireQuery(c.req, 'languageId'), pathToProject: requireQuery(c.req, 'pathToProject') };
    c.res.json(await lspCall(toolbox.lspWorkspaceSymbols(c.principal, c.sandboxId, input, untilGone(c))));
  }));
  return router;
}
