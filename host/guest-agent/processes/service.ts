// The process and session routes of the guest agent (the contract is documented in
// host/agent-protocol/processes.ts). server.ts asks `route()` before its own exact-path table
// and adds `upgradeRoutes` to its WebSocket table.
import { DEFAULT_WORKLOAD_OOM_SCORE_ADJ, WorkloadLauncher } from '../workload.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { WebSocket } from 'ws';
import {
  CreateSessionRequest,
  PtyControlMessage,
  ResizeRequest,
  SessionCommandRequest,
  SignalRequest,
  RunScriptRequest,
  StartKernelRequest,
  StartProcessRequest,
  type ProcessList,
  type SessionList,
} from '../../agent-protocol/processes.js';
import { readJsonBody } from '../body.js';
import { AgentHttpError, sendJson, validationFailed } from '../errors.js';
import type { UpgradeContext, UpgradeHandler, UpgradeRoute } from '../websocket.js';
import { invalidState, type ManagedProcess } from './managed-process.js';
import { parseOffsets, readOutput } from './output.js';
import { ProcessRegistry } from './registry.js';
import { commandView, SessionManager, type SessionSettings } from './sessions.js';
import { prepareStart, startPipeProcess, startPtyProcess } from './spawn.js';
import { eventsWebSocketSink, ptyWebSocketSink, pumpOutput, serverSentEventsSink } from './streams.js';
import { discardableBody } from '../../agent-protocol/request-body.js';
import type { CodeInterpreterGuest } from '../code-interpreter/kernels.js';

const MiB = 1024 * 1024;

export interface ProcessServiceOptions {
  /** Per stream per process; older bytes are dropped beyond it. Default 4 MiB. */
  maxRetainedBytesPerStream?: number;
  /** Finished processes kept for status and output; the oldest-finished is dropped. Default 50. */
  maxFinishedProcesses?: number;
  /** Live session shells. Default 64. */
  maxSessions?: number;
  /** Events keepalive period. Default 15 s. */
  keepaliveIntervalMs?: number;
  /** The nestbox-pty helper. Default /.nestbox/bin/nestbox-pty (mounted by the local driver). */
  ptyHelper?: string;
  /** Path of the nestbox-enter helper (default /.nestbox/bin/nestbox-enter; absent = start directly). */
  enterHelper?: string;
  /** Inherited descriptors of the workload cgroup's procs files, handed to nestbox-enter. */
  workCgroupFds?: number[];
  /** The agent's descriptor of the workloads' user namespace, handed to nestbox-enter (--userns-fd). */
  workloadUsernsFd?: number;
  /** oom_score_adj for every spawned process; null leaves it alone. Default 800. */
  oomScoreAdj?: number | null;
  /** Account database for `user`. Default /etc/passwd (the sandbox's own). */
  passwdPath?: string;
}

export interface ProcessServiceContext {
  home: string;
  env: NodeJS.ProcessEnv;
  maxJsonBodyBytes: number;
  /** Shared with foreground exec; built from the options when absent (tests). */
  launcher?: WorkloadLauncher;
}

interface RouteContext {
  req: IncomingMessage;
  res: ServerResponse;
  query: URLSearchParams;
}
type RouteHandler = (context: RouteContext) => Promise<void>;
type Params = Record<string, string>;
type ParamHandler = (context: RouteContext, params: Params) => Promise<void>;

interface PatternRoute {
  segments: string[];
  methods: Partial<Record<string, ParamHandler>>;
}

function matchSegments(pattern: string[], segments: string[]): Params | undefined {
  if (pattern.length !== segments.length) return undefined;
  const params: Params = {};
  for (let index = 0; index < pattern.length; index += 1) {
    const expected = pattern[index];
    const actual = segments[index];
    if (expected.startsWith(':')) {
      if (actual === '') return undefined;
      try {
        params[expected.slice(1)] = decodeURIComponent(actual);
      } catch {
        return undefined;
      }
    } else if (expected !== actual) {
      return undefined;
    }
  }
  return params;
}

function splitPath(pathname: string): string[] | undefined {
  if (!pathname.startsWith('/')) return undefined;
  return pathname.slice(1).split('/');
}

function parseBoolean(query: URLSearchParams, name: string): boolean {
  const raw = query.get(name);
  if (raw === null || raw === '' || raw === 'false') return false;
  if (raw === 'true') return true;
  throw validationFailed(name, `must be true or false, got ${JSON.stringify(raw)}`);
}

function noContent(res: ServerResponse): void {
  res.writeHead(204);
  res.end();
}

export class ProcessService {
  readonly registry: ProcessRegistry;
  readonly sessions: SessionManager;
  private readonly settings: SessionSettings;
  private readonly keepaliveIntervalMs: number;
  private readonly routes: PatternRoute[];
  private codeInterpreterLoading?: Promise<CodeInterpreterGuest>;

  constructor(
    private readonly context: ProcessServiceContext,
    options: ProcessServiceOptions = {},
  ) {
    const oomScoreAdj = options.oomScoreAdj === null ? undefined : (options.oomScoreAdj ?? DEFAULT_WORKLOAD_OOM_SCORE_ADJ);
    this.settings = {
      home: context.home,
      baseEnv: context.env,
      ptyHelper: options.ptyHelper ?? '/.nestbox/bin/nestbox-pty',
      oomScoreAdj,
      launcher: context.launcher ?? new WorkloadLauncher(options.enterHelper, oomScoreAdj, options.workCgroupFds, options.workloadUsernsFd),
      maxRetainedBytesPerStream: options.maxRetainedBytesPerStream ?? 4 * MiB,
      passwdPath: options.passwdPath,
      maxSessions: options.maxSessions ?? 64,
    };
    this.keepaliveIntervalMs = options.keepaliveIntervalMs ?? 15_000;
    this.registry = new ProcessRegistry(options.maxFinishedProcesses ?? 50);
    this.sessions = new SessionManager(this.registry, this.settings);
    this.routes = this.buildRoutes();
  }

  /**
   * The code interpreter (kernels.ts, with its Python programs as text) is imported at its first
   * request, not at boot (issue 20): most sandboxes never start a kernel.
   */
  private codeInterpreter(): Promise<CodeInterpreterGuest> {
    this.codeInterpreterLoading ??= import('../code-interpreter/kernels.js').then(({ CodeInterpreterGuest }) => new CodeInterpreterGuest(this.settings, this.registry));
    return this.codeInterpreterLoading;
  }

  /** The handler for a process/session route, or undefined when the path is not ours. */
  route(method: string | undefined, pathname: string): RouteHandler | undefined {
    const segments = splitPath(pathname);
    if (!segments || (segments[0] !== 'processes' && segments[0] !== 'sessions' && segments[0] !== 'kernels' && segments[0] !== 'scripts')) return undefined;
    for (const route of this.routes) {
      const params = matchSegments(route.segments, segments);
      if (!params) continue;
      const handler = route.methods[method ?? ''];
      if (!handler) {
        const allowed = Object.keys(route.methods).join(', ');
        return async () => {
          throw new AgentHttpError(405, 'method_not_allowed', `${method} is not allowed on ${pathname} (allowed: ${allowed})`, { Allow: allowed });
        };
      }
      return (context) => handler(context, params);
    }
    return undefined;
  }

  /** WebSocket routes: process events and the PTY. */
  get upgradeRoutes(): UpgradeRoute[] {
    const byPattern = (pattern: string[], handler: (context: UpgradeContext, params: Params) => Promise<void>): UpgradeRoute => {
      return (pathname) => {
        const segments = splitPath(pathname);
        const params = segments && matchSegments(pattern, segments);
        return params ? ((context) => handler(context, params)) as UpgradeHandler : undefined;
      };
    };
    return [
      byPattern(['processes', ':id', 'events'], (context, params) => this.eventsOverWebSocket(context, params.id)),
      byPattern(['processes', ':id', 'pty'], (context, params) => this.attachTerminal(context, params.id)),
    ];
  }

  /** Kills every process and session shell (the agent is going away). */
  shutdown(): void {
    this.sessions.shutdown();
    for (const process of this.registry.running()) process.controls?.kill();
  }

  private buildRoutes(): PatternRoute[] {
    const json = <T>(req: IncomingMessage, schema: Parameters<typeof readJsonBody<T>>[1]) => readJsonBody(req, schema, this.context.maxJsonBodyBytes);
    const route = (path: string, methods: PatternRoute['methods']): PatternRoute => ({ segments: path.slice(1).split('/'), methods });
    return [
      route('/processes', {
        GET: async ({ res, query }) => {
          const body: ProcessList = { processes: this.registry.list(parseBoolean(query, 'all')) };
          sendJson(res, 200, body);
        },
        POST: async ({ req, res }) => {
          const request = await json(req, StartProcessRequest);
          const prepared = await prepareStart(request, this.settings);
          const id = this.registry.nextId();
          const process = prepared.pty ? await startPtyProcess(id, prepared, this.settings) : await startPipeProcess(id, prepared, this.settings);
          this.registry.add(process);
          sendJson(res, 201, process.info());
        },
      }),
      route('/kernels', {
        POST: async ({ req, res }) => {
          const process = await (await this.codeInterpreter()).startKernel(await json(req, StartKernelRequest));
          sendJson(res, 201, process.info());
        },
      }),
      route('/kernels/languages', {
        GET: async ({ res }) => sendJson(res, 200, await (await this.codeInterpreter()).languages()),
      }),
      route('/scripts', {
        POST: async ({ req, res }) => {
          const request = await json(req, RunScriptRequest);
          // A caller that went away takes its program with it.
          const gone = new AbortController();
          res.once('close', () => {
            if (!res.writableEnded) gone.abort();
          });
          const result = await (await this.codeInterpreter()).runScript(request, gone.signal);
          if (!gone.signal.aborted) sendJson(res, 200, result);
        },
      }),
      route('/processes/:id', {
        GET: async ({ res }, { id }) => sendJson(res, 200, this.registry.get(id).info()),
        DELETE: async ({ res }, { id }) => {
          const process = this.registry.get(id);
          if (process.running) {
            // Reported as killed even if the main process had exited and only its group lived on.
            process.killRequested = true;
            process.controls?.kill();
          }
          noContent(res);
        },
      }),
      route('/processes/:id/output', {
        GET: async ({ res, query }, { id }) => sendJson(res, 200, readOutput(this.registry.get(id), query)),
      }),
      route('/processes/:id/events', {
        GET: async ({ req, res, query }, { id }) => {
          const process = this.registry.get(id);
          if (!(req.headers.accept ?? '').includes('text/event-stream')) {
            throw validationFailed('accept', 'events are served as a WebSocket (Upgrade) or as Server-Sent Events (Accept: text/event-stream)');
          }
          const offsets = parseOffsets(query);
          await pumpOutput(process, serverSentEventsSink(res), { offsets, streams: ['stdout', 'stderr'], keepaliveIntervalMs: this.keepaliveIntervalMs });
        },
      }),
      route('/processes/:id/stdin', {
        POST: async ({ req, res, query }, { id }) => {
          const managed = this.registry.get(id);
          const controls = managed.requireControls();
          if (!controls.stdinOpen()) throw invalidState(`stdin of process ${id} is closed`);
          const echo = parseBoolean(query, 'echo');
          // Streamed through in order; each chunk is handed to the process before the next is
          // read, so a process that does not read its stdin holds the request, not our memory.
          // A stdin closed mid-body (the process exited) is answered at once; the rest of the
          // body is then read and dropped, not left unread (agent-protocol/request-body.ts).
          for await (const chunk of discardableBody(req)) {
            await controls.writeStdin(chunk as Buffer);
            // Echoed once the process has it, so the echo never shows input it did not get.
            if (echo) managed.append('stdout', chunk as Buffer);
          }
          noContent(res);
        },
      }),
      route('/processes/:id/stdin/close', {
        POST: async ({ res }, { id }) => {
          this.registry.get(id).requireControls().closeStdin();
          noContent(res);
        },
      }),
      route('/processes/:id/signal', {
        POST: async ({ req, res }, { id }) => {
          const process = this.registry.get(id);
          const { signal } = await json(req, SignalRequest);
          process.requireControls().signal(signal);
          noContent(res);
        },
      }),
      route('/processes/:id/resize', {
        POST: async ({ req, res }, { id }) => {
          const process = this.registry.get(id);
          const { cols, rows } = await json(req, ResizeRequest);
          if (!process.identity.pty) throw validationFailed('pty', `process ${id} does not run on a terminal`);
          process.requireControls().resize?.(cols, rows);
          noContent(res);
        },
      }),
      route('/sessions', {
        GET: async ({ res }) => {
          const body: SessionList = { sessions: this.sessions.list() };
          sendJson(res, 200, body);
        },
        POST: async ({ req, res }) => sendJson(res, 201, await this.sessions.create(await json(req, CreateSessionRequest))),
      }),
      route('/sessions/:sid', {
        GET: async ({ res }, { sid }) => sendJson(res, 200, this.sessions.get(sid).info()),
        DELETE: async ({ res }, { sid }) => {
          this.sessions.delete(sid);
          noContent(res);
        },
      }),
      route('/sessions/:sid/commands', {
        POST: async ({ req, res }, { sid }) => {
          this.sessions.get(sid); // 404 before reading the body
          const request = await json(req, SessionCommandRequest);
          const process = this.sessions.submit(sid, request);
          if (request.async) {
            sendJson(res, 202, commandView(process));
            return;
          }
          await process.ended;
          sendJson(res, 200, {
            ...commandView(process),
            stdout: process.stdout.readAll().toString('utf8'),
            stderr: process.stderr.readAll().toString('utf8'),
          });
        },
      }),
      route('/sessions/:sid/commands/:cid', {
        GET: async ({ res }, { sid, cid }) => sendJson(res, 200, commandView(this.sessions.command(sid, cid))),
      }),
    ];
  }

  private async eventsOverWebSocket(context: UpgradeContext, id: string): Promise<void> {
    const process = this.registry.get(id);
    const offsets = parseOffsets(context.query);
    const ws = await context.accept();
    // Clients have nothing to say on this socket; incoming messages are ignored.
    await pumpOutput(process, eventsWebSocketSink(ws), { offsets, streams: ['stdout', 'stderr'], keepaliveIntervalMs: this.keepaliveIntervalMs });
  }

  private async attachTerminal(context: UpgradeContext, id: string): Promise<void> {
    const process = this.registry.get(id);
    if (!process.identity.pty) throw validationFailed('pty', `process ${id} does not run on a terminal`);
    const ws = await context.accept();
    ws.on('message', (data, isBinary) => this.onTerminalMessage(process, ws, data as Buffer, isBinary));
    const offsets = { stdout: process.stdout.retainedFrom, stderr: 0 };
    await pumpOutput(process, ptyWebSocketSink(ws), { offsets, streams: ['stdout'], keepaliveIntervalMs: this.keepaliveIntervalMs });
  }

  private onTerminalMessage(process: ManagedProcess, ws: WebSocket, data: Buffer, isBinary: boolean): void {
    if (!process.running || !process.controls) return;
    if (isBinary) {
      // A closed terminal input is the client's problem to notice via exit; nothing to answer.
      process.controls.writeStdin(data).catch(() => {});
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(data.toString('utf8'));
    } catch {
      parsed = undefined;
    }
    const message = PtyControlMessage.safeParse(parsed);
    if (!message.success) {
      // Malformed control is a client bug; say so on the socket rather than guessing.
      ws.send(JSON.stringify({ type: 'error', message: 'control messages are {"type":"resize","cols":N,"rows":N} or {"type":"kill"}' }));
      return;
    }
    if (message.data.type === 'resize') process.controls.resize?.(message.data.cols, message.data.rows);
    else {
      process.killRequested = true;
      process.controls.kill();
    }
  }
}
