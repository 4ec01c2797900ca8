// The guest agent's HTTP handler. It knows nothing about the listener: main.ts binds it to a
// Unix socket today; a vsock or virtio-serial transport can hand it connections later through
// `server.emit('connection', socket)`.
import { parseOwner } from './files-ownership.js';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { z } from 'zod';
import { AGENT_KEY_ROUTE, AGENT_NONCE_HEADER, AGENT_PROOF_HEADER, AGENT_REKEY_HEADER, AgentKeyHolder, decodeAgentKey } from '../agent-protocol/auth.js';
import { EnvRequest, ExecRequest, GUEST_AGENT_PROTOCOL_VERSION, type HealthResponse } from '../agent-protocol/types.js';
import { readJsonBody } from './body.js';
import { AgentHttpError, notFound, sendError, sendJson } from './errors.js';
import { prepareCommand, runCommand, type ExecSettings } from './exec.js';
import { discardableBody } from '../agent-protocol/request-body.js';
import { listDirectory, parseListDepth, receiveFile, sendFile, statPath } from './files.js';
import { createFileRoutes, type FileRouteMethods } from './files-routes.js';
import { parseFileMode, resolveOptionalSandboxPath, resolveSandboxPath } from './paths.js';
import { ProcessService, type ProcessServiceOptions } from './processes/service.js';
import { DEFAULT_WORKLOAD_OOM_SCORE_ADJ, WorkloadLauncher } from './workload.js';
import { createUpgradeDispatcher, type UpgradeRoute } from './websocket.js';
import { tcpForwardRoute } from './tcp-forward.js';
import type { LspService } from './lsp.js';
import { ARCHIVE_EXTRACT_ROUTE, ARCHIVE_ROUTE } from '../agent-protocol/archive.js';
import { GUEST_SPANS_ROUTE } from '../agent-protocol/telemetry.js';
import { GuestTracing } from './tracing.js';

export interface AgentServerOptions {
  /** The sandbox user's home: relative paths and the default cwd resolve against it. */
  home: string;
  /** Environment processes start from; defaults to the agent's own. */
  env?: NodeJS.ProcessEnv;
  /** Per-stream cap on collected exec output. Default 16 MiB. */
  maxOutputBytes?: number;
  /** Largest accepted JSON body (exec requests carry stdin). Default 64 MiB. */
  maxJsonBodyBytes?: number;
  /** Largest POST /files/upload body (413 above it). Default: no limit. */
  maxUploadBytes?: number;
  /** Largest file POST /files/replace will read into memory. Default 64 MiB. */
  maxReplaceFileBytes?: number;
  /** Detached processes, PTYs and sessions: bounds and the pty helper (processes/service.ts). */
  processes?: ProcessServiceOptions;
  /** Where unexpected errors are reported. Default: stderr. */
  log?: (message: string) => void;
  /**
   * The per-boot key that proves answers to the host agent (agent-protocol/auth.ts). Given at
   * start by the local driver; a Cloud Hypervisor guest starts without one and receives it on
   * `PUT /auth/key`. Without a key, answers carry no proof (and a host agent expecting one
   * refuses them).
   */
  keys?: AgentKeyHolder;
}

interface RequestContext {
  req: IncomingMessage;
  res: ServerResponse;
  query: URLSearchParams;
}

type Handler = (context: RequestContext) => Promise<void>;
type RouteTable = Record<string, Partial<Record<string, Handler>>>;

const MiB = 1024 * 1024;

// Loaded at first use (issue 20): every module the agent imports at boot is parsed and evaluated
// before it can answer its first request, and these are large (tar; vscode-languageserver-
// protocol) and rarely needed. The bundle keeps them in chunk files beside it, as read-only as
// the bundle itself (scripts/bundle-guest-agent.mjs).
const loadArchives = (): Promise<typeof import('./files-archive.js')> => import('./files-archive.js');
const LSP_ROUTE_PREFIX = '/lsp/';

function splitTarget(url: string | undefined): { pathname: string; query: URLSearchParams } {
  // Not `new URL()`: a target such as `//files/list` would be read as a host name.
  const target = url ?? '/';
  const queryStart = target.indexOf('?');
  if (queryStart === -1) return { pathname: target, query: new URLSearchParams() };
  return { pathname: target.slice(0, queryStart), query: new URLSearchParams(target.slice(queryStart + 1)) };
}

/** Aborts when the client disconnects before the response was completely sent. */
function clientGoneSignal(res: ServerResponse): AbortSignal {
  const controller = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) controller.abort();
  });
  return controller.signal;
}

const KeyRequest = z.object({ key: z.string() }).strict();

/**
 * Signs the answer's status when the headers go out, whichever way the handler sends them
 * (writeHead, or implicitly on the first write, which Node routes through writeHead too).
 */
function attachProof(req: IncomingMessage, res: ServerResponse, keys: AgentKeyHolder): void {
  const nonce = req.headers[AGENT_NONCE_HEADER];
  if (typeof nonce !== 'string') return;
  const writeHead = res.writeHead;
  res.writeHead = function (this: ServerResponse, statusCode: number, ...rest: unknown[]) {
    // Read at send time: `PUT /auth/key` answers under the key it has just installed.
    const proof = keys.proofFor(nonce, req.method, req.url, statusCode);
    if (proof && !this.headersSent) this.setHeader(AGENT_PROOF_HEADER, proof);
    return (writeHead as (...args: unknown[]) => ServerResponse).call(this, statusCode, ...rest);
  } as typeof res.writeHead;
}

function buildRoutes(options: Required<Omit<AgentServerOptions, 'log' | 'processes'>>, startedAt: number, launcher: WorkloadLauncher): RouteTable {
  const { home } = options;
  const execSettings: ExecSettings = { home, baseEnv: options.env, maxOutputBytes: options.maxOutputBytes, launcher };

  return {
    '/health': {
      GET: async ({ res }) => {
        const body: HealthResponse = {
          status: 'ok',
          protocolVersion: GUEST_AGENT_PROTOCOL_VERSION,
          pid: process.pid,
          uptimeMs: Date.now() - startedAt,
        };
        sendJson(res, 200, body);
      },
    },
    '/env': {
      // The same object is the base environment of exec, processes and sessions, so updating
      // it in place reaches every later start.
      PUT: async ({ req, res }) => {
        const request = await readJsonBody(req, EnvRequest, options.maxJsonBodyBytes);
        for (const name of request.unset ?? []) delete options.env[name];
        Object.assign(options.env, request.env);
        res.writeHead(204).end();
      },
    },
    [AGENT_KEY_ROUTE]: {
      // A guest started without a key (Cloud Hypervisor) gets it here right after its boot; a
      // key is only ever replaced by someone who proves they hold the current one.
      PUT: async ({ req, res }) => {
        const request = await readJsonBody(req, KeyRequest, 4096);
        const key = decodeAgentKey(request.key);
        if (!key) throw new AgentHttpError(400, 'validation_failed', 'key: must be 64 hexadecimal digits');
        const nonce = req.headers[AGENT_NONCE_HEADER];
        if (!options.keys.replace(key, typeof nonce === 'string' ? nonce : undefined, req.headers[AGENT_REKEY_HEADER])) {
          throw new AgentHttpError(403, 'forbidden', 'this agent already has a key; replacing it needs a proof of the current one');
        }
        res.writeHead(204).end();
      },
    },
    '/exec': {
      POST: async ({ req, res }) => {
        const signal = clientGoneSignal(res);
        const request = await readJsonBody(req, ExecRequest, options.maxJsonBodyBytes);
        const command = await prepareCommand(request, execSettings);
        const result = await runCommand(command, execSettings, signal);
        if (!signal.aborted) sendJson(res, 200, result);
      },
    },
    '/files/content': {
      GET: async ({ req, res, query }) => {
        await sendFile(req, res, resolveSandboxPath(query.get('path'), home));
      },
      PUT: async ({ req, res, query }) => {
        const path = resolveSandboxPath(query.get('path'), home);
        const mode = parseFileMode(query.get('mode'));
        const owner = parseOwner(query.get('owner'));
        // A full disk fails the write before the body is all sent; the 507 must still get
        // through, so the file is fed from a stream that can fail without taking the request.
        sendJson(res, 200, await receiveFile(discardableBody(req), path, mode, owner));
      },
    },
    [ARCHIVE_EXTRACT_ROUTE]: {
      POST: async ({ req, res, query }) => {
        const signal = clientGoneSignal(res);
        const path = resolveSandboxPath(query.get('path'), home);
        const mode = parseFileMode(query.get('mode'));
        const { extractArchive, resolveArchiveOwner } = await loadArchives();
        const owner = await resolveArchiveOwner(query.get('owner'));
        // As PUT /files/content: a refusal or a full disk answers before the body is all sent.
        const result = await extractArchive(discardableBody(req), path, { owner, mode, signal });
        if (!signal.aborted) sendJson(res, 200, result);
      },
    },
    [ARCHIVE_ROUTE]: {
      GET: async ({ res, query }) => {
        const path = resolveSandboxPath(query.get('path'), home);
        const { sendArchive } = await loadArchives();
        await sendArchive(res, path);
      },
    },
    '/files/list': {
      GET: async ({ res, query }) => {
        sendJson(res, 200, await listDirectory(resolveOptionalSandboxPath(query.get('path'), home), parseListDepth(query.get('depth'))));
      },
    },
    '/files/stat': {
      GET: async ({ res, query }) => {
        sendJson(res, 200, await statPath(resolveSandboxPath(query.get('path'), home)));
      },
    },
  };
}

function routeFor(routes: RouteTable, req: IncomingMessage, pathname: string, matchDynamic?: (pathname: string) => FileRouteMethods | undefined): Handler {
  const methods = routes[pathname] ?? matchDynamic?.(pathname);
  if (!methods) throw notFound(`no such route: ${req.method} ${pathname}`);
  const handler = methods[req.method ?? ''];
  if (!handler) {
    const allowed = Object.keys(methods).join(', ');
    throw new AgentHttpError(405, 'method_not_allowed', `${req.method} is not allowed on ${pathname} (allowed: ${allowed})`, {
      Allow: allowed,
    });
  }
  return handler;
}

function answerFailure(res: ServerResponse, error: unknown, log: (message: string) => void, what: string): void {
  const clientGone = res.destroyed || res.writableEnded;
  if (error instanceof AgentHttpError) {
    if (!clientGone && !res.headersSent) sendError(res, error);
    return;
  }
  // A client that hung up mid-stream makes our streams fail; that is not worth a log line.
  if (clientGone) return;
  log(`guest agent: unexpected error in ${what}: ${(error as Error)?.stack ?? String(error)}`);
  if (res.headersSent) {
    // Too late for a status: cutting the connection is the only honest signal left.
    res.destroy();
    return;
  }
  sendError(res, new AgentHttpError(500, 'internal', `internal error: ${(error as Error)?.message ?? String(error)}`));
}

export function createAgentServer(options: AgentServerOptions): Server {
  const resolvedOptions = {
    home: options.home,
    env: options.env ?? process.env,
    maxOutputBytes: options.maxOutputBytes ?? 16 * MiB,
    maxJsonBodyBytes: options.maxJsonBodyBytes ?? 64 * MiB,
    maxUploadBytes: options.maxUploadBytes ?? Number.POSITIVE_INFINITY,
    maxReplaceFileBytes: options.maxReplaceFileBytes ?? 64 * MiB,
    keys: options.keys ?? new AgentKeyHolder(),
  };
  const log = options.log ?? ((message: string) => process.stderr.write(`${message}\n`));
  // One launcher for every workload (exec, processes, terminals, sessions): see workload.ts.
  const oomScoreAdj = options.processes?.oomScoreAdj === null ? undefined : (options.processes?.oomScoreAdj ?? DEFAULT_WORKLOAD_OOM_SCORE_ADJ);
  const launcher = new WorkloadLauncher(options.processes?.enterHelper, oomScoreAdj, options.processes?.workCgroupFds, options.processes?.workloadUsernsFd);
  const processes = new ProcessService(
    { home: resolvedOptions.home, env: resolvedOptions.env, maxJsonBodyBytes: resolvedOptions.maxJsonBodyBytes, launcher },
    options.processes,
  );
  // File metadata rides on the pty helper's --xattr mode (pty-helper/nestbox-xattr.c).
  const fileRoutes = createFileRoutes({ ...resolvedOptions, metadataHelper: options.processes?.ptyHelper ?? '/.nestbox/bin/nestbox-pty' });
  // The language servers' routes (lsp.ts) and their service, made at the first /lsp/ request.
  let languageServers: LspService | undefined;
  let lspRoutes: Promise<RouteTable> | undefined;
  const loadLspRoutes = (): Promise<RouteTable> =>
    (lspRoutes ??= import('./lsp.js').then(({ createLspRoutes, LspService }) => {
      languageServers = new LspService({ home: resolvedOptions.home, baseEnv: resolvedOptions.env, launcher, passwdPath: options.processes?.passwdPath });
      return createLspRoutes(languageServers, resolvedOptions.maxJsonBodyBytes);
    }));
  const lspHandler: Handler = async (context) => {
    const { pathname } = splitTarget(context.req.url);
    await routeFor(await loadLspRoutes(), context.req, pathname)(context);
  };
  // Spans of traced requests, drained by the host agent (agent-protocol/telemetry.ts).
  const tracing = new GuestTracing();
  const telemetryRoutes: RouteTable = {
    [GUEST_SPANS_ROUTE]: {
      GET: async ({ res }) => {
        const body = tracing.drain();
        if (!body) {
          res.writeHead(204).end();
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.byteLength });
        res.end(body);
      },
    },
  };
  const routes = { ...buildRoutes(resolvedOptions, Date.now(), launcher), ...fileRoutes.routes, ...telemetryRoutes };

  const server = createServer(
    {
      // Uploads of large files and long-running execs must not be cut by Node's default
      // 5-minute request timeout; the host agent owns deadlines.
      requestTimeout: 0,
      // Longer than the client's idle-socket timeout, so the client always closes an idle
      // keep-alive socket first and never sends a request on one we are closing.
      keepAliveTimeout: 120_000,
    },
    (req, res) => {
      attachProof(req, res, resolvedOptions.keys);
      const { pathname, query } = splitTarget(req.url);
      const tracingLoaded = tracing.traceRequest(req, res, pathname);
      const what = `${req.method} ${pathname}`;
      let handler: Handler;
      try {
        handler = processes.route(req.method, pathname) ?? (pathname.startsWith(LSP_ROUTE_PREFIX) ? lspHandler : routeFor(routes, req, pathname, fileRoutes.matchDynamic));
      } catch (error) {
        answerFailure(res, error, log, what);
        return;
      }
      // Only the first traced request waits, for OpenTelemetry to load (tracing.ts).
      (tracingLoaded ? tracingLoaded.then(() => handler({ req, res, query })) : handler({ req, res, query })).catch((error: unknown) => answerFailure(res, error, log, what));
    },
  );
  // WebSocket routes by path; other features add their UpgradeRoute to this table.
  const upgradeRoutes: UpgradeRoute[] = [...processes.upgradeRoutes, ...fileRoutes.upgradeRoutes, tcpForwardRoute];
  const upgrades = createUpgradeDispatcher(upgradeRoutes, log, (req, status) =>
    resolvedOptions.keys.proofFor(req.headers[AGENT_NONCE_HEADER], req.method, req.url, status),
  );
  server.on('upgrade', upgrades.handle);
  // Tests and shutdown close every connection; WebSockets are connections too.
  const closeHttpConnections = server.closeAllConnections.bind(server);
  server.closeAllConnections = () => {
    upgrades.closeAll();
    closeHttpConnections();
  };
  server.on('close', () => processes.shutdown());
  server.on('close', () => fileRoutes.close());
  server.on('close', () => languageServers?.close());
  server.on('clientError', (error, socket) => {
    // Malformed HTTP: answer 400 if the socket can still take it, never crash. (No proof: the
    // request could not be parsed, so there is no nonce to answer; the host never sends these.)
    if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    else socket.destroy(error);
  });
  return server;
}
