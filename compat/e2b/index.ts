// The E2B-compatible front door. Two mounts on the one HTTP server:
// - `/e2b/*`: the control plane (E2B_API_URL=<origin>/e2b; the SDK keeps a path prefix of its
//   API URL, e2b.md (a) "How the SDK resolves URLs");
// - in-sandbox traffic at the root (E2B_SANDBOX_URL=<origin>), recognised by E2B's routing
//   headers or its fallbacks (e2b.md (a) "One-server recipe"): envd's Connect RPCs and
//   /files + /health (port 49983), and the code interpreter (port 49999).
import express, { type NextFunction, type Request, type RequestHandler, type Response, type Router } from 'express';
import type { HandlerContext } from '@connectrpc/connect';
import { NestboxError } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { E2bDeps, E2bOptions } from './deps.js';
import { createControlPlaneRouter } from './control-plane.js';
import { Filesystem } from './gen/filesystem/filesystem_pb.js';
import { Process } from './gen/process/process_pb.js';
import { filesystemService } from './envd/filesystem.js';
import { processService } from './envd/process.js';
import { downloadFile, health, uploadFiles } from './envd/http.js';
import { handleCodeInterpreter, renderCodeInterpreterError } from './code-interpreter/routes.js';
import { renderEnvdHttpError } from './errors.js';
import { envdConnectHandler } from './envd/connect-adapter.js';
import { rejectNulInJsonBody, requestTargetProblem } from '../../http-kit/request-checks.js';
import { authenticateSandboxTraffic, CODE_INTERPRETER_PORT, ENVD_PORT, sandboxRouteOf, type SandboxRoute } from './routing.js';

export type { E2bOptions } from './deps.js';

/** Only core's port, named entry by entry: whatever else the caller's object holds stays out of reach. */
function depsOf(core: CompatPort, options: E2bOptions): E2bDeps {
  const { toolbox, sandboxes, snapshots, volumes, volumeTokens, auth, sandboxTokens, ports, idempotency, sandboxEvents, images, builds, objects, codeInterpreter, usage, events, webhooks, requestRates, secrets } = core;
  return { ...options, core: { toolbox, sandboxes, snapshots, volumes, volumeTokens, auth, sandboxTokens, ports, idempotency, sandboxEvents, images, builds, objects, codeInterpreter, usage, events, webhooks, requestRates, secrets } };
}

const RPC_PATH = /^\/(process\.Process|filesystem\.Filesystem)\//;
const CODE_INTERPRETER_PATH = /^\/(execute|contexts)(\/|$)/;

/** Is this request in-sandbox traffic for the E2B layer (rather than for another front door)? */
function isSandboxTraffic(req: Request, route: SandboxRoute): boolean {
  if (route.port !== undefined || route.sandboxId !== undefined) return true;
  if (RPC_PATH.test(req.path)) return true;
  // e2b 2.7–2.14 send /files and /health without routing headers, and signed URLs carry none.
  if (req.path === '/files' || req.path === '/health') return Boolean(req.headers['x-access-token'] || req.query.signature);
  return false;
}

export function createE2bSandboxTrafficHandler(core: CompatPort, options: E2bOptions): RequestHandler {
  const deps = depsOf(core, options);
  const resolveRpc = async (ctx: HandlerContext) => authenticateSandboxTraffic(deps.core, ctx.requestHeader, sandboxRouteOf(ctx.requestHeader, options.publicDomain));
  const connect = envdConnectHandler((router) => {
    router.service(Process, processService(deps, resolveRpc));
    router.service(Filesystem, filesystemService(deps, resolveRpc));
  }, deps.log);
  const json = express.json({ limit: '16mb' });
  const noNulInBody = rejectNulInJsonBody((res, err) => renderCodeInterpreterError(res, err));

  return (req: Request, res: Response, next: NextFunction) => {
    const route = sandboxRouteOf(req.headers, options.publicDomain);
    if (!isSandboxTraffic(req, route)) return next();
    const port = route.port ?? ENVD_PORT;
    // Any other port is the sandbox's own service: the hosted-port proxy's business.
    if (port !== ENVD_PORT && port !== CODE_INTERPRETER_PORT) return next();
    // A malformed URL (bad percent-encoding, NUL bytes) is a 400 in the shape of the service asked.
    const problem = requestTargetProblem(req);
    if (problem) {
      if (port === CODE_INTERPRETER_PORT) return renderCodeInterpreterError(res, problem);
      if (RPC_PATH.test(req.path)) return void res.status(400).json({ code: 'invalid_argument', message: problem.message });
      return renderEnvdHttpError(res, problem);
    }
    if (port === CODE_INTERPRETER_PORT) {
      // The code interpreter sends X-Access-Token on /execute only; /contexts carry the traffic token (e2b.md (e)).
      return json(req, res, (err?: unknown) => {
        if (err) return renderCodeInterpreterError(res, err, deps.log);
        noNulInBody(req, res, () => {
          void authenticateSandboxTraffic(deps.core, req.headers, route, { allowTrafficToken: true })
            .then((target) => handleCodeInterpreter(deps, target, req, res))
            .catch((e) => renderCodeInterpreterError(res, e, deps.log));
        });
      });
    }
    if (RPC_PATH.test(req.path)) return void connect(req, res);
    if (req.path === '/files' && req.method === 'GET') return void downloadFile(deps, req, res, route);
    if (req.path === '/files' && req.method === 'POST') return void uploadFiles(deps, req, res, route);
    if (req.path === '/health') return void health(deps, res, route, req);
    renderEnvdHttpError(res, new NestboxError('not_found', `no envd route ${req.method} ${req.path}`));
  };
}

export function createE2bControlPlaneRouter(core: CompatPort, options: E2bOptions): Router {
  return createControlPlaneRouter(depsOf(core, options));
}
