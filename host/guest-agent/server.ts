// The guest agent's HTTP handler. It knows nothing about the listener: main.ts binds it to a
// Unix socket today; a vsock or virtio-serial transport can hand it connections later through
// `server.emit('connection', socket)`.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { ExecRequest, GUEST_AGENT_PROTOCOL_VERSION, type HealthResponse } from '../agent-protocol/types.js';
import { readJsonBody } from './body.js';
import { AgentHttpError, notFound, sendError, sendJson } from './errors.js';
import { prepareCommand, runCommand, type ExecSettings } from './exec.js';
import { listDirectory, receiveFile, sendFile, statPath } from './files.js';
import { parseFileMode, resolveOptionalSandboxPath, resolveSandboxPath } from './paths.js';

export interface AgentServerOptions {
  /** The sandbox user's home: relative paths and the default cwd resolve against it. */
  home: string;
  /** Environment processes start from; defaults to the agent's own. */
  env?: NodeJS.ProcessEnv;
  /** Per-stream cap on collected exec output. Default 16 MiB. */
  maxOutputBytes?: number;
  /** Largest accepted JSON body (exec requests carry stdin). Default 64 MiB. */
  maxJsonBodyBytes?: number;
  /** Where unexpected errors are reported. Default: stderr. */
  log?: (message: string) => void;
}

interface RequestContext {
  req: IncomingMessage;
  res: ServerResponse;
  query: URLSearchParams;
}

type Handler = (context: RequestContext) => Promise<void>;
type RouteTable = Record<string, Partial<Record<string, Handler>>>;

const MiB = 1024 * 1024;

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

function buildRoutes(options: Required<Omit<AgentServerOptions, 'log'>>, startedAt: number): RouteTable {
  const { home } = options;
  const execSettings: ExecSettings = { home, baseEnv: options.env, maxOutputBytes: options.maxOutputBytes };

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
        sendJson(res, 200, await receiveFile(req, path, mode));
      },
    },
    '/files/list': {
      GET: async ({ res, query }) => {
        sendJson(res, 200, await listDirectory(resolveOptionalSandboxPath(query.get('path'), home)));
      },
    },
    '/files/stat': {
      GET: async ({ res, query }) => {
        sendJson(res, 200, await statPath(resolveSandboxPath(query.get('path'), home)));
      },
    },
  };
}

function routeFor(routes: RouteTable, req: IncomingMessage, pathname: string): Handler {
  const methods = routes[pathname];
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
  };
  const log = options.log ?? ((message: string) => process.stderr.write(`${message}\n`));
  const routes = buildRoutes(resolvedOptions, Date.now());

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
      const { pathname, query } = splitTarget(req.url);
      const what = `${req.method} ${pathname}`;
      let handler: Handler;
      try {
        handler = routeFor(routes, req, pathname);
      } catch (error) {
        answerFailure(res, error, log, what);
        return;
      }
      handler({ req, res, query }).catch((error: unknown) => answerFailure(res, error, log, what));
    },
  );
  server.on('clientError', (error, socket) => {
    // Malformed HTTP: answer 400 if the socket can still take it, never crash.
    if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    else socket.destroy(error);
  });
  return server;
}
