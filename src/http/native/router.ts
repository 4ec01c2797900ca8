// The native API: openapi/native.yaml is the source of truth for routes and validation;
// openapi-backend routes each request to the handler of its operationId.
import { noteRoute, UNMATCHED_ROUTE } from '../metrics.js';
import express, { type Request, type Response, type Router } from 'express';
import { OpenAPIBackend, type Context, type Document } from 'openapi-backend';
import { load as loadYaml } from 'js-yaml';
import addFormats from 'ajv-formats';
import { errors, NestboxError, publicError, hasRetryAfter, retryAfterSeconds, toNestboxError } from '../../../core/errors.js';
import { canSeeSandbox, requireScope } from '../../../core/services/auth.js';
import { SCOPES, type Principal, type Scope } from '../../../core/types.js';
import type { Logger } from '../../../core/logger.js';
import type { Services } from '../../services.js';
import { noteRequest, requestLogger } from '../request-id.js';
import { nativeHandlers } from './handlers/index.js';
import type { NativeHandler } from './context.js';
import { clientHasGone, rejectNulInJsonBody } from '../../../http-kit/request-checks.js';

export function renderNativeError(res: Response, err: unknown, log?: Pick<Logger, 'error'>): void {
  if (clientHasGone(res)) return void res.destroy();
  // publicError is the last-resort guard: a 500 shows only a reference, the log has the rest.
  const e = publicError(err, log, 'native API');
  if (e.status > 500 && log) log.error({ code: e.code }, `native API ${e.code}: ${e.message}`);
  if (res.headersSent) {
    // The body was already streaming: the only honest signal left is to cut the connection.
    res.destroy();
    return;
  }
  if (hasRetryAfter(e)) res.setHeader('Retry-After', String(retryAfterSeconds(e)));
  res.status(e.status).json({ error: e.toJSON() });
}

interface AjvError {
  instancePath?: string;
  keyword: string;
  message?: string;
  params: Record<string, unknown>;
}

/** Turn openapi-backend's ajv errors into one message that names the field. */
export function describeValidationErrors(errors: AjvError[] | null | undefined): NestboxError {
  const first = errors?.[0];
  if (!first) return new NestboxError('validation_failed', 'request: invalid');
  // instancePath looks like /requestBody/env/FOO or /query/limit or /path/sandboxId.
  const segments = (first.instancePath ?? '').split('/').filter(Boolean);
  const [where, ...rest] = segments;
  let field = rest.join('.');
  let problem = first.message ?? 'is invalid';
  if (first.keyword === 'additionalProperties') {
    const extra = String(first.params.additionalProperty);
    field = field ? `${field}.${extra}` : extra;
    problem = 'is not a known field';
  } else if (first.keyword === 'required') {
    const missing = String(first.params.missingProperty);
    if (missing === 'requestBody') {
      field = 'body';
      problem = 'is required (a JSON object)';
    } else {
      field = field ? `${field}.${missing}` : missing;
      problem = 'is required';
    }
  } else if (first.keyword === 'pattern' && /path$/.test(field)) {
    problem = 'must not contain NUL bytes';
  }
  if (!field) field = where === 'requestBody' ? 'body' : (where ?? 'request');
  return new NestboxError('validation_failed', `${field}: ${problem}`, { field, location: where ?? 'request' });
}

function hasBody(req: Request): boolean {
  return Number(req.headers['content-length'] ?? 0) > 0 || req.headers['transfer-encoding'] !== undefined;
}

export function loadNativeSpec(text: string): Document {
  return loadYaml(text) as Document;
}

/** The openapi-backend instance for the native spec (handlers are registered by the caller). */
/**
 * openapi-backend matches a request by flattening the whole spec into fresh operation objects
 * (twice per request) and compiling one RegExp per operation, about 1.3 ms per request for this
 * spec: a quarter of a replica's CPU under GET load. The spec never changes after init, so the
 * operations are flattened once and their path patterns compiled once; matching then does what
 * the library's `matchOperation` does, in its order (exact path and method; else every
 * operation whose path pattern matches, most specific first, the first with the method; 404 or
 * 405 otherwise, thrown when `strict`). `router.test.ts` checks the two agree on every operation.
 */
export function precompileOperationMatching(api: OpenAPIBackend): void {
  const router = api.router;
  const operations = router.getOperations();
  router.getOperations = () => operations;
  const byId = new Map(operations.filter((op) => op.operationId).map((op) => [op.operationId!, op]));
  router.getOperation = (operationId: string) => byId.get(operationId);
  const exact = new Map<string, typeof operations>();
  for (const op of operations) exact.set(op.path, [...(exact.get(op.path) ?? []), op]);
  const escape = (literal: string) => literal.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
  const patterns = operations
    .map((op) => ({ op, pattern: new RegExp(`^${op.path.split(/\{[^}]+\}/).map(escape).join('[^/]+')}$`), specificity: op.path.replace(/\{.*?\}/g, '').length }))
    // Array.prototype.sort is stable, as the library's lodash orderBy is.
    .sort((a, b) => b.specificity - a.specificity);
  router.matchOperation = ((request: Parameters<typeof router.matchOperation>[0], strict?: boolean) => {
    const req = router.normalizeRequest(request);
    const notFound = () => {
      if (strict) throw new Error('404-notFound: no route matches request');
      return undefined;
    };
    // (private in the library's types; the same check its own matchOperation starts with)
    if (!(router as unknown as { isUnderApiRoot(path: string): boolean }).isUnderApiRoot(req.path)) return notFound();
    const path = router.normalizePath(req.path);
    const hit = exact.get(path)?.find((op) => op.method === req.method);
    if (hit) return hit;
    const candidates = patterns.filter((p) => p.pattern.test(path));
    if (!candidates.length) return notFound();
    const match = candidates.find((p) => p.op.method === req.method);
    if (!match) {
      if (strict) throw new Error('405-methodNotAllowed: this method is not registered for the route');
      return undefined;
    }
    return match.op;
  }) as typeof router.matchOperation;
}

export function createNativeBackend(spec: Document): OpenAPIBackend {
  return new OpenAPIBackend({
    definition: spec,
    quick: false,
    validate: true,
    strict: true,
    // Formats such as date-time are part of the contract; teach ajv to check them.
    customizeAjv: (ajv) => {
      (addFormats as unknown as (a: typeof ajv) => void)(ajv);
      return ajv;
    },
  });
}

export function createNativeRouter(services: Services): Router {
  const api = createNativeBackend(loadNativeSpec(services.nativeSpecText));

  const wrap = (handler: NativeHandler) => async (c: Context, req: Request, res: Response) => {
    noteRoute(req, 'native', c.operation.operationId ?? UNMATCHED_ROUTE);
    const principal = await authenticate(c, req);
    const sandboxId = c.request.params?.sandboxId;
    noteRequest(req, { operation: c.operation.operationId, organizationId: principal?.organizationId, sandboxId: typeof sandboxId === 'string' ? sandboxId : undefined });
    await handler({ api: c, req, res, principal, services });
  };

  /**
   * Who calls, and may they call this operation at all: key (401), the operation's
   * `x-nestbox-scope` (403), and for a key limited to some sandboxes, the sandbox in the path
   * (404, as if absent). This runs before the request is validated too (see validationFail), so
   * a caller without the right learns nothing about what a valid request would look like, and
   * the answers do not depend on the body.
   */
  const authenticate = async (c: Context, req: Request): Promise<Principal | undefined> => {
    const operation = c.operation as { security?: unknown[]; 'x-nestbox-scope'?: string };
    if (Array.isArray(operation.security) && operation.security.length === 0) return undefined;
    const header = req.headers.authorization;
    const token = header?.startsWith('Bearer ') ? header.slice(7).trim() : undefined;
    const principal = await services.auth.authenticate(token);
    // Rate limits right after the key is known and before anything else, so a refused request
    // costs one lookup and (rarely) one lease; even a request that fails its scope check counts.
    await services.requestRates.admit(principal, 'native');
    const scope = operation['x-nestbox-scope'];
    if (!scope || !SCOPES.includes(scope as Scope)) throw new NestboxError('internal', `operation ${c.operation.operationId} declares no valid x-nestbox-scope`);
    requireScope(principal, scope as Scope);
    const sandboxId = c.request.params?.sandboxId;
    if (typeof sandboxId === 'string' && !canSeeSandbox(principal, sandboxId)) throw errors.notFound('sandbox', sandboxId);
    return principal;
  };

  const handlers: Record<string, (c: Context, req: Request, res: Response) => Promise<void>> = {};
  for (const [operationId, handler] of Object.entries(nativeHandlers)) handlers[operationId] = wrap(handler);
  api.register({
    ...handlers,
    validationFail: async (c: Context, req: Request) => {
      noteRoute(req, 'native', c.operation?.operationId ?? UNMATCHED_ROUTE);
      if (c.operation) await authenticate(c, req);
      throw describeValidationErrors(c.validation.errors as AjvError[]);
    },
    notFound: async (c: Context) => {
      throw new NestboxError('not_found', `no route ${c.request.method.toUpperCase()} ${c.request.path}`);
    },
    methodNotAllowed: async (c: Context) => {
      throw new NestboxError('method_not_allowed', `${c.request.method.toUpperCase()} is not allowed on ${c.request.path}`);
    },
    notImplemented: async (c: Context) => {
      throw new NestboxError('not_supported', `operation ${c.operation?.operationId} is not implemented`);
    },
  });
  // Authentication happens in `wrap` (it needs the database and yields the principal), so
  // openapi-backend's own security check is told to let every request through to it.
  api.registerSecurityHandler('bearer', () => true);
  // Until init has finished, a request finds the library's own matching (handleRequest awaits it).
  void api.init().then(() => precompileOperationMatching(api));

  const router = express.Router();
  // Only JSON bodies are parsed; file uploads stay a stream for the handler.
  router.use(express.json({ limit: '2mb', type: ['application/json', 'application/*+json'] }));
  router.use(rejectNulInJsonBody((res, err) => renderNativeError(res, err)));
  router.use(async (req: Request, res: Response) => {
    try {
      const isJson = req.is(['application/json', 'application/*+json']);
      await api.handleRequest(
        {
          method: req.method,
          path: req.path,
          query: req.query as Record<string, string | string[]>,
          headers: req.headers as Record<string, string | string[]>,
          // Absent JSON body = undefined, so "required" is reported as a missing body.
          // Non-JSON bodies (files, multipart) stay a stream for the handler; openapi-backend
          // only needs to know one is there.
          body: isJson ? req.body : hasBody(req) ? {} : undefined,
        },
        req,
        res,
      );
    } catch (err) {
      renderNativeError(res, err, requestLogger(req, services.logger));
    }
  });
  // express.json failures (invalid JSON, too large, a charset other than UTF-8) arrive here;
  // core's toNestboxError gives each its 4xx.
  router.use((err: unknown, req: Request, res: Response, _next: unknown) => {
    if ((err as { type?: string }).type === 'entity.too.large') return renderNativeError(res, new NestboxError('payload_too_large', 'body: JSON body larger than 2 MiB'));
    renderNativeError(res, err, requestLogger(req, services.logger));
  });
  return router;
}
