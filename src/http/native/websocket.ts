// Native WebSocket routes. openapi-backend only sees plain HTTP, so upgrades are routed here:
// the same auth, scopes and sandbox checks as the HTTP operations (through core), then a
// message-by-message relay to the guest agent through the sandbox's host agent.
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { decodeErrorBody, errors, NestboxError, publicError, retryAfterSeconds } from '../../../core/errors.js';
import type { GuestWebSocketTarget } from '../../../core/guest.js';
import { TOOLBOX_OPERATIONS } from '../../../core/services/toolbox.js';
import type { Principal, Scope } from '../../../core/types.js';
import { acceptAndRelay, connectUpstream, refuseUpgrade } from '../../../host/protocol/ws-relay.js';
import type { Services } from '../../services.js';
import { isUpgradeClaimed } from '../../../http-kit/upgrade-claims.js';
import { WebSocketServer } from 'ws';
import { renderBuild, renderBuildLogLine } from './render.js';
import { allEvents, closeCodeOfEnd, closeCodeOfStatus, failureFrame, startCodeRun, type RunCodeBody } from './code-run.js';
import { createNativeBackend, describeValidationErrors, loadNativeSpec } from './router.js';
import { canSeeSandbox, requireScope } from '../../../core/services/auth.js';
import type { OpenAPIBackend } from 'openapi-backend';

/** A WebSocket relayed to the guest agent. */
interface RelayedWebSocketRoute {
  pattern: RegExp;
  /** The scope the toolbox checks (from its one table); listed for the route tests. */
  scope: Scope;
  /** The toolbox call that checks the caller (its own scope) and names the guest socket. */
  open: (services: Services, principal: Principal, m: RegExpMatchArray, query: URLSearchParams) => Promise<GuestWebSocketTarget>;
}

/** A WebSocket the control plane serves itself, over core (the caller's scope is checked before the upgrade). */
interface ServedWebSocketRoute {
  pattern: RegExp;
  scope: Scope;
  serve: (services: Services, principal: Principal, m: RegExpMatchArray, upgrade: { req: http.IncomingMessage; socket: Duplex; head: Buffer }) => Promise<void>;
}

type WebSocketRoute = RelayedWebSocketRoute | ServedWebSocketRoute;

const ID = '([a-z0-9]{1,32})';
const NAME = '([A-Za-z0-9_.-]{1,64})';

function offsetParam(query: URLSearchParams, name: string): number | undefined {
  const v = query.get(name);
  return v === null ? undefined : Number(v);
}

export const NATIVE_WEBSOCKET_ROUTES: readonly WebSocketRoute[] = [
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/commands/${NAME}/stream$`),
    scope: TOOLBOX_OPERATIONS.processEvents.scope,
    open: (services, principal, m, query) =>
      services.toolbox.processEventsSocket(principal, m[1]!, m[2]!, { stdoutOffset: offsetParam(query, 'stdoutOffset'), stderrOffset: offsetParam(query, 'stderrOffset') }),
  },
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/commands/${NAME}/pty$`),
    scope: TOOLBOX_OPERATIONS.attachTerminal.scope,
    open: (services, principal, m) => services.toolbox.attachTerminal(principal, m[1]!, m[2]!),
  },
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/files/watch$`),
    scope: TOOLBOX_OPERATIONS.watchFiles.scope,
    open: (services, principal, m, query) => {
      const recursive = query.get('recursive');
      // A missing path is the guest's 400 to give, after the scope check.
      return services.toolbox.watchFilesSocket(principal, m[1]!, { path: query.get('path') ?? undefined, recursive: recursive === null ? undefined : recursive === 'true' });
    },
  },
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/code/run$`),
    scope: 'sandboxes:exec',
    serve: (services, principal, m, upgrade) => serveCodeRunSocket(services, principal, m[1]!, upgrade),
  },
];

export function attachNativeWebSockets(server: http.Server, services: Services): void {
  const serveBuildLogs = (req: http.IncomingMessage, socket: Duplex, head: Buffer, url: URL, buildId: string) => serveBuildLogsSocket(services, req, socket, head, url, buildId);
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    // A compat front door (listening before this one) already took it: see upgrade-claims.ts.
    if (isUpgradeClaimed(req)) return;
    void handleUpgrade(req, socket, head).catch((err) => {
      const e = publicError(err, services.logger, 'native WebSocket');
      refuseUpgrade(socket, e.status, { error: e.toJSON() }, e.status === 429 ? { 'retry-after': String(retryAfterSeconds(e)) } : {});
    });
  });

  async function handleUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const url = new URL((req.url ?? '/').replace(/\/{2,}/g, '/'), 'http://nestbox');
    const buildLogs = BUILD_LOGS_ROUTE.exec(url.pathname);
    if (buildLogs) return serveBuildLogs(req, socket, head, url, buildLogs[1]!);
    const route = NATIVE_WEBSOCKET_ROUTES.find((r) => r.pattern.test(url.pathname));
    if (!route) throw new NestboxError('not_found', `no WebSocket route ${url.pathname}`);
    const match = url.pathname.match(route.pattern)!;
    // Browsers cannot set headers on a WebSocket, so the key may also come as ?access_token=.
    const header = req.headers.authorization;
    const token = header?.startsWith('Bearer ') ? header.slice(7).trim() : (url.searchParams.get('access_token') ?? undefined);
    const principal = await services.auth.authenticate(token);
    await services.requestRates.admit(principal, 'native');
    // Counted from here until the client's socket closes (refused or relayed): a 429 beyond the caps.
    services.streams.acquireUntilClosed({ keyId: principal.keyId, sandboxId: match[1] }, socket);
    if ('serve' in route) return route.serve(services, principal, match, { req, socket, head });
    const target = await route.open(services, principal, match, url.searchParams);

    const upstream = await connectUpstream(target.url, target.headers, req);
    // A refusal from the guest (or its host agent) goes through the one decoder, like any answer.
    if (!upstream.ok) throw decodeErrorBody(upstream.status, upstream.body, `the guest agent of sandbox ${match[1]}`);
    acceptAndRelay(req, socket, head, upstream.ws);
    keepActiveWhileOpen(services, match[1], (stop) => upstream.ws.once('close', stop));
  }
}

/** A build's log, served by the control plane itself (builds live here, not in a sandbox). */
const BUILD_LOGS_ROUTE = /^\/api\/v1\/builds\/(bld[a-z0-9]{17})\/logs$/;

function bearerOf(req: http.IncomingMessage, url: URL): string | undefined {
  const header = req.headers.authorization;
  return header?.startsWith('Bearer ') ? header.slice(7).trim() : (url.searchParams.get('access_token') ?? undefined);
}

/**
 * The WebSocket form of GET /builds/{id}/logs: text frames `{"type":"line",…}` from `offset`,
 * then `{"type":"end","build":…}` and a normal close, the same JSON as the SSE form.
 */
async function serveBuildLogsSocket(services: Services, req: http.IncomingMessage, socket: Duplex, head: Buffer, url: URL, buildId: string): Promise<void> {
  const principal = await services.auth.authenticate(bearerOf(req, url));
  await services.requestRates.admit(principal, 'native');
  await services.builds.get(principal, buildId); // a 404 (or 403) before the upgrade
  const offset = Number(url.searchParams.get('offset') ?? 0);
  if (!Number.isInteger(offset) || offset < 0) throw new NestboxError('validation_failed', 'offset: must be a non-negative integer', { field: 'offset' });
  services.streams.acquireUntilClosed({ keyId: principal.keyId, sandboxId: `build:${buildId}` }, socket);
  const wss = new WebSocketServer({ noServer: true });
  wss.handleUpgrade(req, socket, head, (client) => {
    wss.close();
    const stop = new AbortController();
    client.once('close', () => stop.abort());
    void (async () => {
      try {
        for await (const item of services.builds.follow(principal, buildId, offset, stop.signal)) {
          if (client.readyState !== client.OPEN) return;
          if ('line' in item) client.send(JSON.stringify({ type: 'line', ...renderBuildLogLine(item.line) }));
          else client.send(JSON.stringify({ type: 'end', build: renderBuild(item.done) }));
        }
        client.close(1000);
      } catch (err) {
        const e = publicError(err, services.logger, 'build log WebSocket');
        client.close(1011, e.message.slice(0, 120));
      }
    })();
  });
}

/** An open stream or terminal counts as activity for the idle policy, for as long as it is open. */
export function keepActiveWhileOpen(services: Services, sandboxId: string, onClose: (stop: () => void) => void): void {
  onClose(services.toolbox.keepActive(sandboxId));
}

/** How long a code-run WebSocket may stay open without its request frame. */
const CODE_RUN_REQUEST_WAIT_MS = 30_000;

/** The spec's validator for the request frame (the same checks as POST /code/run), built at first use. */
let runCodeValidator: Promise<OpenAPIBackend> | undefined;
async function validateRunCodeFrame(services: Services, sandboxId: string, body: unknown): Promise<RunCodeBody> {
  runCodeValidator ??= (async () => {
    const backend = createNativeBackend(loadNativeSpec(services.nativeSpecText));
    backend.registerSecurityHandler('bearer', () => true);
    await backend.init();
    return backend;
  })();
  const validator = await runCodeValidator;
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new NestboxError('validation_failed', 'body: must be a JSON object (the run request)', { field: 'body' });
  const result = validator.validateRequest({ method: 'post', path: `/sandboxes/${sandboxId}/code/run`, headers: { 'content-type': 'application/json' }, body }, 'runCode');
  if (!result.valid) throw describeValidationErrors(result.errors as Parameters<typeof describeValidationErrors>[0]);
  return body as RunCodeBody;
}

/**
 * The WebSocket form of POST /code/run: the first client text frame is the run request, each
 * server text frame one CodeEvent, then a close whose code says how the cell ended (see
 * closeCodeOfEnd / closeCodeOfStatus, documented under runCodeWebSocket in the spec). The caller's
 * scope and the sandbox are checked before the upgrade, so refusals are ordinary HTTP answers.
 */
async function serveCodeRunSocket(services: Services, principal: Principal, sandboxId: string, upgrade: { req: http.IncomingMessage; socket: Duplex; head: Buffer }): Promise<void> {
  requireScope(principal, 'sandboxes:exec');
  if (!canSeeSandbox(principal, sandboxId)) throw errors.notFound('sandbox', sandboxId);
  await services.sandboxes.get(principal, sandboxId); // an unknown sandbox is a 404 before the upgrade
  const wss = new WebSocketServer({ noServer: true, maxPayload: 4 * 1024 * 1024 });
  wss.handleUpgrade(upgrade.req, upgrade.socket, upgrade.head, (client) => {
    wss.close();
    const gone = new AbortController();
    client.once('close', () => gone.abort());
    const refuse = (err: unknown) => {
      const { frame, status } = failureFrame(err, services.logger);
      if (client.readyState !== client.OPEN) return;
      client.send(JSON.stringify(frame));
      client.close(closeCodeOfStatus(status), (frame.type === 'failure' ? frame.error.code : '').slice(0, 120));
    };
    const waiting = setTimeout(() => refuse(new NestboxError('validation_failed', `body: no run request within ${CODE_RUN_REQUEST_WAIT_MS / 1000} s`, { field: 'body' })), CODE_RUN_REQUEST_WAIT_MS);
    client.once('close', () => clearTimeout(waiting));
    client.once('message', (data, isBinary) => {
      clearTimeout(waiting);
      void (async () => {
        try {
          if (isBinary) throw new NestboxError('validation_failed', 'body: the run request is a text frame of JSON', { field: 'body' });
          let parsed: unknown;
          try {
            parsed = JSON.parse(String(data));
          } catch {
            throw new NestboxError('validation_failed', 'body: the run request is not valid JSON', { field: 'body' });
          }
          const started = await startCodeRun(services, principal, sandboxId, await validateRunCodeFrame(services, sandboxId, parsed), gone.signal);
          let endCode = 4001; // a generator that stops without `end` lost its kernel
          for await (const e of allEvents(started)) {
            if (client.readyState !== client.OPEN) return; // the client left: leaving the loop ends the run
            client.send(JSON.stringify(e));
            if (e.type === 'end') endCode = closeCodeOfEnd(e.status);
          }
          if (client.readyState === client.OPEN) client.close(endCode);
        } catch (err) {
          refuse(err);
        }
      })();
    });
  });
}
