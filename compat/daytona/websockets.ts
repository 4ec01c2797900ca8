// Daytona's toolbox WebSockets (daytona.md (e)): session-log follow with the 3-byte stream
// markers, and PTY sockets with the exit-control subprotocol. Each is a translation of a
// guest-agent socket that core's toolbox opens (`toolbox.processEventsSocket`,
// `toolbox.attachTerminal`): process events → marked log bytes, terminal frames → Daytona's
// control messages.
import type http from 'node:http';
import { STATUS_CODES } from 'node:http';
import { constants as osConstants } from 'node:os';
import type { Duplex } from 'node:stream';
import { WebSocket, WebSocketServer } from 'ws';
import { decodeErrorBody, NestboxError, publicError, retryAfterSeconds } from '../../core/errors.js';
import type { GuestWebSocketTarget, ProcessEvent } from '../../core/guest.js';
import { requireScope } from '../../core/services/auth.js';
import { TOOLBOX_OPERATIONS } from '../../core/services/toolbox.js';
import type { Principal } from '../../core/types.js';
import { UPSTREAM_HANDSHAKE_TIMEOUT_MS } from '../../host/protocol/ws-relay.js';
import { claimUpgrade, isUpgradeClaimed } from '../../http-kit/upgrade-claims.js';
import { createDaytonaEventStream, eventStreamQueryProblem, isEventStreamPath } from './events.js';
import type { CompatPort, ToolboxPort } from '../../core/compat-port.js';
import { DAYTONA_PREFIX, STDERR_MARKER, STDOUT_MARKER, type DaytonaOptions } from './context.js';
import { daemonCall, daemonError, daytonaErrorBody, daytonaStatus, PROCESS_CODES, withDaemonCode } from './errors.js';
import { createPty, findPty } from './pty.js';
import { toolboxSandboxId } from './builds.js';
import { serveInterpreterSocket } from './interpreter.js';
import { daytonaAccount } from './sandbox-dto.js';
import { createWorkdirs } from './workdirs.js';

export const PTY_EXIT_CONTROL_SUBPROTOCOL = 'X-Daytona-Pty-Exit-Control';
const PTY_ENVS_SUBPROTOCOL_PREFIX = 'X-Daytona-Pty-Envs~';

/** `/daytona/toolbox/{id}/<path>` or the legacy `/daytona/api/toolbox/{id}/toolbox/<path>`. */
export function parseToolboxPath(pathname: string): { sandboxId: string; path: string } | undefined {
  const m = new RegExp(`^${DAYTONA_PREFIX}/(?:toolbox/([^/]+)|api/toolbox/([^/]+)/toolbox)(/.*)$`).exec(pathname);
  if (!m) return undefined;
  return { sandboxId: decodeURIComponent(m[1] ?? m[2]), path: m[3] };
}

function refuse(socket: Duplex, err: unknown, path: string, log: DaytonaOptions['log']): void {
  const e = publicError(err, log, 'daytona WebSocket');
  const text = JSON.stringify(daytonaErrorBody(e, 'toolbox', path, 'GET'));
  const status = daytonaStatus(e, 'toolbox');
  const retryAfter = status === 429 ? `retry-after: ${retryAfterSeconds(e)}\r\n` : '';
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\n${retryAfter}connection: close\r\n\r\n${text}`);
}

/**
 * The guest socket the toolbox named, opened (and paused: the guest may speak first) before the
 * client is accepted, so a refusal (unknown process, not a terminal) reaches the client as an
 * HTTP error in Daytona's shape, decoded by core's one decoder.
 */
function openUpstream({ url, headers }: GuestWebSocketTarget): Promise<WebSocket> {
  const ws = new WebSocket(url, { headers, handshakeTimeout: UPSTREAM_HANDSHAKE_TIMEOUT_MS });
  return new Promise((resolve, reject) => {
    ws.once('open', () => {
      ws.pause();
      resolve(ws);
    });
    ws.once('unexpected-response', (_r, res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => reject(withDaemonCode(decodeErrorBody(res.statusCode ?? 502, Buffer.concat(chunks).toString('utf8'), "the sandbox's agent"), PROCESS_CODES)));
      res.on('error', () => reject(new NestboxError('host_unavailable', "the sandbox's agent closed the connection")));
    });
    ws.once('error', (err) => reject(new NestboxError('host_unavailable', `the sandbox's agent is not reachable: ${err.message}`)));
  });
}

function offeredProtocols(req: http.IncomingMessage): string[] {
  return String(req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim()).filter(Boolean);
}

function accept(req: http.IncomingMessage, socket: Duplex, head: Buffer, protocol: string | false): Promise<WebSocket> {
  // daytona.md (h) 8: log and interpreter sockets must not answer a subprotocol; PTY sockets must.
  const wss = new WebSocketServer({ noServer: true, handleProtocols: () => protocol });
  return new Promise((resolve) => wss.handleUpgrade(req, socket, head, (client) => {
    wss.close();
    resolve(client);
  }));
}

/** Session command logs, follow mode: process events → `01 01 01`/`02 02 02`-marked bytes, close 1000 at exit. */
async function followLogs(toolbox: ToolboxPort, principal: Principal, sandboxId: string, sessionId: string, commandId: string, req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  if (sessionId !== 'entrypoint') {
    // The session must exist and own the command (command ids are process ids in the guest).
    await daemonCall(PROCESS_CODES, toolbox.getSessionCommand(principal, sandboxId, sessionId, commandId));
  }
  if (sessionId === 'entrypoint') {
    // No entrypoint command runs in a Nestbox sandbox: the log is empty and already complete.
    const client = await accept(req, socket, head, false);
    client.close(1000);
    return;
  }
  const upstream = await openUpstream(await toolbox.processEventsSocket(principal, sandboxId, commandId, { offset: 0 }));
  const client = await accept(req, socket, head, false);
  // An open log stream counts as activity for the idle policy.
  client.once('close', toolbox.keepActive(sandboxId));
  upstream.on('message', (data, isBinary) => {
    if (isBinary || client.readyState !== WebSocket.OPEN) return;
    let event: ProcessEvent;
    try {
      event = JSON.parse(data.toString()) as ProcessEvent;
    } catch {
      return;
    }
    if (event.type === 'stdout' || event.type === 'stderr') {
      client.send(Buffer.concat([event.type === 'stdout' ? STDOUT_MARKER : STDERR_MARKER, Buffer.from(event.data, 'base64')]), { binary: true });
    } else if (event.type === 'exit') {
      client.close(1000);
    }
  });
  upstream.on('close', () => {
    if (client.readyState === WebSocket.OPEN) client.close(1000);
  });
  upstream.on('error', () => client.terminate());
  client.on('close', () => upstream.close());
  client.on('error', () => upstream.terminate());
  upstream.resume();
}

function ptyEnvs(req: http.IncomingMessage): Record<string, string> | undefined {
  const token = offeredProtocols(req).find((p) => p.startsWith(PTY_ENVS_SUBPROTOCOL_PREFIX));
  if (!token) return undefined;
  try {
    const parsed = JSON.parse(Buffer.from(token.slice(PTY_ENVS_SUBPROTOCOL_PREFIX.length), 'base64url').toString('utf8')) as unknown;
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) return Object.fromEntries(Object.entries(parsed).map(([k, v]) => [k, String(v)]));
  } catch {
    // fall through
  }
  throw new NestboxError('validation_failed', 'X-Daytona-Pty-Envs: must be base64url of a JSON object');
}

/** The PTY socket (daytona.md (e) "PTY"): connected → output → exited + close with a JSON reason. */
async function attachPty(toolbox: ToolboxPort, principal: Principal, sandboxId: string, processId: string, req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
  const upstream = await openUpstream(await toolbox.attachTerminal(principal, sandboxId, processId));
  const exitControl = offeredProtocols(req).includes(PTY_EXIT_CONTROL_SUBPROTOCOL);
  const client = await accept(req, socket, head, exitControl ? PTY_EXIT_CONTROL_SUBPROTOCOL : false);
  // An open terminal counts as activity for the idle policy.
  client.once('close', toolbox.keepActive(sandboxId));
  client.send(JSON.stringify({ type: 'control', status: 'connected' }));
  let exited = false;
  upstream.on('message', (data, isBinary) => {
    if (client.readyState !== WebSocket.OPEN) return;
    if (isBinary) {
      client.send(data, { binary: true });
      return;
    }
    let message: { type?: string; exitCode?: number | null; signal?: string | null; message?: string };
    try {
      message = JSON.parse(data.toString()) as typeof message;
    } catch {
      return;
    }
    if (message.type === 'exit') {
      exited = true;
      const signalNumber = message.signal ? (osConstants.signals as Record<string, number>)[message.signal] : undefined;
      const exitCode = message.exitCode ?? (signalNumber ? 128 + signalNumber : -1);
      const exitReason = message.signal ?? (exitCode !== 0 ? 'non-zero exit' : undefined);
      if (exitControl) client.send(JSON.stringify({ type: 'control', status: 'exited', exitCode, ...(exitReason ? { exitReason } : {}) }));
      // Older SDKs read the exit from the close reason (1000 for exit 0, 1011 otherwise, like the daemon).
      client.close(exitCode === 0 ? 1000 : 1011, JSON.stringify({ exitCode, ...(exitReason ? { exitReason } : {}) }));
    } else if (message.type === 'error') {
      client.send(JSON.stringify({ type: 'control', status: 'error', error: message.message ?? 'terminal error' }));
    }
  });
  upstream.on('close', () => {
    if (!exited && client.readyState === WebSocket.OPEN) client.close(1000);
  });
  upstream.on('error', () => client.terminate());
  // Keystrokes are binary (daytona.md (e)); a text frame is typed input too, never a guest control message.
  client.on('message', (data) => {
    if (upstream.readyState === WebSocket.OPEN) upstream.send(Buffer.isBuffer(data) ? data : Buffer.from(data as ArrayBuffer), { binary: true });
  });
  client.on('close', () => upstream.close());
  client.on('error', () => upstream.terminate());
  upstream.resume();
}

/** What the Daytona front door's sockets hold open; `close` ends them (before the HTTP server closes). */
export interface DaytonaWebSockets {
  close(): Promise<void>;
}

export function attachDaytonaWebSockets(server: http.Server, core: Pick<CompatPort, 'auth' | 'requestRates' | 'toolbox' | 'sandboxEvents' | 'sandboxes' | 'images' | 'codeInterpreter' | 'hostRegions'>, options: Pick<DaytonaOptions, 'streams' | 'log' | 'region'>): DaytonaWebSockets {
  const { toolbox } = core;
  const events = createDaytonaEventStream(core, options);
  const workdirs = createWorkdirs(core);
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    // Hosted-port traffic (any path) was claimed before us (src/server.ts orders the listeners).
    if (isUpgradeClaimed(req)) return;
    const url = new URL((req.url ?? '/').replace(/\/{2,}/g, '/'), 'http://nestbox');
    if (!url.pathname.startsWith(`${DAYTONA_PREFIX}/`)) return;
    claimUpgrade(req);
    // The Socket.IO event stream (events.ts): Engine.IO answers the upgrade, the key comes after.
    if (isEventStreamPath(url.pathname)) {
      const problem = eventStreamQueryProblem(url.searchParams);
      if (problem) return refuse(socket, problem, url.pathname, options.log);
      return events.handleUpgrade(req, socket, head);
    }
    void route(url, req, socket, head).catch((err) => refuse(socket, err, url.pathname, options.log));
  });
  return { close: () => events.close() };

  async function route(url: URL, req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const target = parseToolboxPath(url.pathname);
    if (!target) throw new NestboxError('not_found', `no WebSocket route ${url.pathname}`);
    const header = req.headers.authorization;
    const principal = await core.auth.authenticate(header?.startsWith('Bearer ') ? header.slice(7).trim() : undefined);
    await core.requestRates.admit(principal, 'daytona');
    const { path } = target;
    // A sandbox built on demand is addressed by its first (pending) id, its name: builds.ts.
    const sandboxId = await toolboxSandboxId(core.sandboxes, principal, target.sandboxId);
    // Counted until the client's socket closes; beyond the caps a 429 in Daytona's shape.
    options.streams.acquireUntilClosed({ keyId: principal.keyId, sandboxId }, socket);
    let m: RegExpExecArray | null;
    if ((m = /^\/process\/session\/([^/]+)\/command\/([^/]+)\/logs$/.exec(path))) {
      return followLogs(toolbox, principal, sandboxId, decodeURIComponent(m[1]), decodeURIComponent(m[2]), req, socket, head);
    }
    if (path === '/process/session/entrypoint/logs') return followLogs(toolbox, principal, sandboxId, 'entrypoint', '', req, socket, head);
    // PTY sockets attach to a terminal: its scope before anything is looked up (finding the PTY
    // only lists processes, which needs less).
    if (path === '/process/pty/create-connect' || /^\/process\/pty\/[^/]+\/connect$/.test(path)) requireScope(principal, TOOLBOX_OPERATIONS.attachTerminal.scope);
    if (path === '/process/pty/create-connect') {
      const num = (n: string) => (url.searchParams.get(n) ? Number(url.searchParams.get(n)) : undefined);
      const created = await createPty(toolbox, principal, sandboxId, { id: url.searchParams.get('id') ?? '', cols: num('cols'), rows: num('rows'), cwd: url.searchParams.get('cwd') ?? undefined, envs: ptyEnvs(req) });
      return attachPty(toolbox, principal, sandboxId, created.processId, req, socket, head);
    }
    if ((m = /^\/process\/pty\/([^/]+)\/connect$/.exec(path))) {
      const id = decodeURIComponent(m[1]);
      const pty = await findPty(toolbox, principal, sandboxId, id);
      if (!pty) throw daemonError('not_found', `PTY session ${id} not found`, 'PROCESS_NOT_FOUND');
      return attachPty(toolbox, principal, sandboxId, pty.processId, req, socket, head);
    }
    if (path === '/process/interpreter/execute') {
      // daytona-wave2 §4.3 (interpreter.ts). Refusals before the upgrade (scope, account) are HTTP errors.
      requireScope(principal, TOOLBOX_OPERATIONS.runCell.scope);
      const account = await daytonaAccount(toolbox, principal, sandboxId);
      const defaults = { user: account.name, cwd: (await workdirs.of(principal, sandboxId)) ?? account.home };
      const client = await accept(req, socket, head, false);
      // An open run counts as activity for the idle policy.
      client.once('close', toolbox.keepActive(sandboxId));
      return serveInterpreterSocket(core, principal, sandboxId, defaults, client, options.log);
    }
    throw new NestboxError('not_found', `no WebSocket route ${path}`);
  }
}
