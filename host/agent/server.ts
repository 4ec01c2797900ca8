// The host agent's HTTP server: lifecycle calls from the control plane onto the driver, and a
// streaming pass-through from the control plane to each sandbox's guest agent. The control
// plane never learns how a sandbox is run; it only speaks this API.
import http from 'node:http';
import { timingSafeEqual } from 'node:crypto';
import type { Socket } from 'node:net';
import { pipeline } from 'node:stream/promises';
import type { ZodType } from 'zod';
import type { Logger } from '../../core/logger.js';
import type { Driver, SandboxSpec } from '../drivers/types.js';
import { KeyedLocks } from '../keyed-locks.js';
import { driverErrorStatus } from '../drivers/errors.js';
import { AgentClient, AgentRequestError } from '../agent-protocol/client.js';
import { ERROR_CATALOGUE, isErrorCode } from '../../core/errors.js';
import {
  EgressPolicy,
  HostForkRequest,
  HostPullRequest,
  HostSandboxSpec,
  HostSnapshotRequest,
  ImageIdParam,
  PORT_PROXY_AUTH_HEADER,
  PORT_PROXY_ERROR_HEADER,
  PULL_CONTENT_TYPE,
  SandboxIdParam,
  SnapshotIdParam,
  type HostPullLine,
} from '../protocol/schemas.js';
import { ImageError } from '../images/oci/errors.js';
import { acceptAndRelay, connectUpstream, refuseUpgrade } from '../protocol/ws-relay.js';
import { clientGoneSignal } from '../protocol/client-gone.js';
import { discardableBody } from '../agent-protocol/request-body.js';
import type { HostAgentMetrics } from './metrics.js';
import { forwardableHeaders, proxyHttp, proxyUpgrade, writeRawResponse, type ProxyTarget } from '../protocol/http-proxy.js';
import { inSampledTrace, inSpan, serveInSpan, tracingEnabled } from '../../core/tracing.js';
import { GuestSpanRelay, type GuestSpanSink } from './guest-spans.js';
import { EXPORT_ROUTE, importSandbox, importSnapshotChain, serveExport, TransferError } from './transfer.js';
import { HostResizeSpec, HostSandboxImportRequest, HostSnapshotImportRequest } from '../protocol/schemas.js';
import { handleVolumeRoute } from './volumes.js';

export interface HostAgentServerOptions {
  hostId: string;
  secret: string;
  driver: Driver;
  /** Lines about one sandbox carry `sandboxId`. */
  logger: Logger;
  /** How long a pull's answer waits for its first line, and the most time between lines (default 10 s). */
  pullKeepaliveMs?: number;
  /** This agent's Prometheus series, measured and served at `GET /metrics` for `Bearer <token>` (absent: no /metrics, 404). */
  metrics?: { series: HostAgentMetrics; token: string };
  /** With tracing on: where the spans drained from guest agents go (guest-spans.ts); unset = never drained. */
  guestSpans?: GuestSpanSink;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const MAX_JSON_BODY = 1024 * 1024;
/** `/v1/sandboxes/{id}/ports/{port}` followed by the path inside the sandbox's server. */
const PORT_ROUTE = /^\/v1\/sandboxes\/([a-z0-9]{1,32})\/ports\/(\d{1,5})(?=$|[/?])/;
/** A sandbox server that does not even accept the connection this fast is treated as not listening. */
const PORT_CONNECT_TIMEOUT_MS = 10_000;

/** What a hosted-port request could not reach, told apart from the sandbox server's own answers. */
class PortProxyError extends Error {
  constructor(
    readonly status: number,
    readonly kind: 'not_found' | 'not_running' | 'not_listening' | 'validation_failed',
    message: string,
  ) {
    super(message);
  }
}

function portErrorBody(error: PortProxyError): string {
  return JSON.stringify({ error: { code: error.kind, message: error.message } });
}
/** While a file-view request streams, tell the driver the view is in use this often. */
const FILE_VIEW_TOUCH_MS = 15_000;
/**
 * A pull's answer waits this long for its first line (so an early failure keeps its status),
 * and a line goes out at least this often afterwards (so no proxy or idle timeout cuts it).
 */
const PULL_KEEPALIVE_MS = 10_000;

async function readJson<T>(req: http.IncomingMessage, schema: ZodType<T>): Promise<T> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_JSON_BODY) throw new HttpError(413, 'payload_too_large', 'body: larger than 1 MiB');
    chunks.push(chunk as Buffer);
  }
  let value: unknown;
  try {
    value = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    throw new HttpError(400, 'validation_failed', 'body: not valid JSON');
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new HttpError(400, 'validation_failed', `${issue.path.join('.') || 'body'}: ${issue.message}`);
  }
  return parsed.data;
}

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function sendError(res: http.ServerResponse, err: unknown): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (err instanceof HttpError || err instanceof TransferError) return sendJson(res, err.status, { error: { code: err.code, message: err.message } });
  if (err instanceof AgentRequestError) return sendJson(res, err.status, { error: { code: err.code, message: err.message } });
  // A pull's failures carry the catalogue's codes (a bad reference, no such tag, refused credentials).
  if (err instanceof ImageError) return sendJson(res, ERROR_CATALOGUE[err.code].status, { error: { code: err.code, message: err.message } });
  // The driver's typed errors are the caller's mistakes (unknown id, name taken, wrong state).
  const mapped = driverErrorStatus(err);
  if (mapped) return sendJson(res, mapped.status, { error: { code: mapped.code, message: (err as Error).message } });
  const message = err instanceof Error ? err.message : String(err);
  sendJson(res, 500, { error: { code: 'internal', message } });
}

/** A request's route as its span is named: ids left out (`/v1/sandboxes/{id}/agent/exec`), no query. */
function routeOf(url: string | undefined): string {
  const path = (url ?? '/').split('?', 1)[0];
  return path.replace(/^\/v1\/(sandboxes|snapshots|images)\/[^/]+/, '/v1/$1/{id}').replace(/^(\/v1\/sandboxes\/\{id\}\/ports)\/\d+.*$/, '$1/{port}');
}

function sameKey(a: Buffer | undefined, b: Buffer | undefined): boolean {
  return a === b || (!!a && !!b && a.equals(b));
}

export class HostAgentServer {
  readonly server: http.Server;
  /** One lifecycle operation per sandbox at a time; later calls wait for earlier ones. */
  private readonly locks = new KeyedLocks();
  /** One keep-alive client per running sandbox, dropped when its socket changes or it stops. */
  private readonly agents = new Map<string, AgentClient>();
  /** One client per live file view (a new view process means a new client, even on the same path). */
  private readonly viewAgents = new Map<string, { viewId: string; client: AgentClient }>();
  /** Keep-alive connections to each sandbox's servers, dropped when its address changes or it stops. */
  private readonly portAgents = new Map<string, { address: string; agent: http.Agent }>();

  /** Drains guest agents' spans after traced requests (tracing on only). */
  private readonly guestSpans?: GuestSpanRelay;

  constructor(private readonly opts: HostAgentServerOptions) {
    this.guestSpans = opts.guestSpans ? new GuestSpanRelay(opts.guestSpans, opts.logger) : undefined;
    this.server = http.createServer((req, res) => {
      // With tracing on, in a server span continuing the control plane's trace (its traceparent).
      if (tracingEnabled()) return serveInSpan(req, res, routeOf(req.url), { 'nestbox.host.id': opts.hostId }, () => void this.handle(req, res).catch((err) => sendError(res, err)));
      this.handle(req, res).catch((err) => sendError(res, err));
    });
    this.server.on('upgrade', (req, socket, head) => this.handleUpgrade(req, socket as Socket, head));
    // Only the control plane talks to a host agent, and it bounds its clients' deadlines itself:
    // Node's default 5-minute request timeout would cut a big upload streaming through here.
    this.server.requestTimeout = 0;
    this.server.headersTimeout = 60_000;
  }

  private authorized(req: http.IncomingMessage): boolean {
    // Hosted-port requests keep the user's Authorization header for the sandbox's server.
    const portRoute = PORT_ROUTE.test(req.url ?? '');
    const raw = portRoute ? req.headers[PORT_PROXY_AUTH_HEADER] : req.headers.authorization;
    const header = typeof raw === 'string' ? raw : '';
    const given = Buffer.from(header.startsWith('Bearer ') ? header.slice(7) : '');
    const expected = Buffer.from(this.opts.secret);
    return given.length === expected.length && timingSafeEqual(given, expected);
  }

  private async serveMetrics(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const metrics = this.opts.metrics;
    if (!metrics) throw new HttpError(404, 'not_found', 'no route /metrics');
    if (req.method !== 'GET') throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on /metrics`);
    const header = req.headers.authorization ?? '';
    const given = Buffer.from(header.startsWith('Bearer ') ? header.slice(7) : '');
    const expected = Buffer.from(metrics.token);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) throw new HttpError(401, 'unauthorized', 'missing or invalid metrics token');
    const text = await metrics.series.scrape();
    res.writeHead(200, { 'content-type': metrics.series.contentType, 'content-length': Buffer.byteLength(text) });
    res.end(text);
  }

  private transferContext() {
    return { hostId: this.opts.hostId, secret: this.opts.secret, driver: this.opts.driver, logger: this.opts.logger };
  }

  private withLock<T>(id: string, task: () => Promise<T>): Promise<T> {
    return this.locks.run(id, task);
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    // Scraped with the metrics token, not the host secret (a Prometheus server must not hold that).
    if (req.url === '/metrics' || req.url?.startsWith('/metrics?')) return this.serveMetrics(req, res);
    // A peer host agent pulling a transfer shows a token for that data, never the host secret.
    const exportRoute = EXPORT_ROUTE.exec((req.url ?? '').split('?', 1)[0]);
    if (exportRoute) return serveExport(this.transferContext(), req, res, exportRoute[1] as 'snapshots' | 'sandboxes', exportRoute[2]);
    if (!this.authorized(req)) throw new HttpError(401, 'unauthorized', 'missing or invalid host secret');
    if (PORT_ROUTE.test(req.url ?? '')) return this.proxyToPort(req, res);
    const url = new URL(req.url ?? '/', 'http://host-agent');
    const parts = url.pathname.split('/').filter(Boolean);
    if (parts[0] !== 'v1') throw new HttpError(404, 'not_found', `no route ${url.pathname}`);
    const driver = this.opts.driver;

    if (parts.length === 2 && parts[1] === 'info' && req.method === 'GET') {
      return sendJson(res, 200, { hostId: this.opts.hostId, driver: driver.name, capabilities: driver.capabilities() });
    }
    if (parts[1] === 'snapshots') return this.handleSnapshots(parts, req, res, url.pathname);
    if (parts[1] === 'images') return this.handleImages(parts, req, res, url.pathname);
    if (parts[1] === 'volumes') return handleVolumeRoute(driver, parts, req, res, url);
    if (parts[1] !== 'sandboxes') throw new HttpError(404, 'not_found', `no route ${url.pathname}`);

    if (parts.length === 2) {
      if (req.method === 'GET') return sendJson(res, 200, { sandboxes: await this.runtimes() });
      if (req.method === 'POST') {
        const spec = await readJson(req, HostSandboxSpec);
        if (await driver.get(spec.id)) throw new HttpError(409, 'conflict', `sandbox ${spec.id} already exists on host ${this.opts.hostId}`);
        if (spec.warm && !driver.claimWarm) throw new HttpError(501, 'not_supported', `the ${driver.name} driver keeps no warm pool`);
        const runtime = await this.withLock(spec.id, () => this.driverCall('create', spec.id, () => driver.create(spec as SandboxSpec, (line) => this.opts.logger.info({ sandboxId: spec.id, operation: 'create' }, line))));
        return sendJson(res, 201, { id: runtime.id, status: runtime.status });
      }
      throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${url.pathname}`);
    }

    const id = SandboxIdParam.safeParse(parts[2]);
    if (!id.success) throw new HttpError(400, 'validation_failed', `sandbox id: ${id.error.issues[0].message}`);
    const sandboxId = id.data;

    if (parts.length === 4 && parts[3] === 'resize') {
      if (req.method !== 'POST') throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${url.pathname}`);
      const change = await readJson(req, HostResizeSpec);
      if (!driver.resize) throw new HttpError(501, 'not_supported', `the ${driver.name} driver cannot resize sandboxes`);
      if (!(await driver.get(sandboxId))) throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
      const result = await this.withLock(sandboxId, () => driver.resize!(sandboxId, change));
      return sendJson(res, 200, result);
    }

    if (parts.length === 4 && parts[3] === 'claim') {
      // Warm pool (issue 20): the create that claimed this member in the database hands it its
      // spec (environment, egress policy); idempotent, so a takeover may send it again.
      if (req.method !== 'POST') throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${url.pathname}`);
      const spec = await readJson(req, HostSandboxSpec);
      if (spec.id !== sandboxId) throw new HttpError(400, 'validation_failed', 'id: does not match the sandbox in the path');
      if (!driver.claimWarm) throw new HttpError(501, 'not_supported', `the ${driver.name} driver keeps no warm pool`);
      if (!(await driver.get(sandboxId))) throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
      const runtime = await this.withLock(sandboxId, () => this.driverCall('claim', sandboxId, () => driver.claimWarm!(spec as SandboxSpec)));
      return sendJson(res, 200, { id: runtime.id, status: runtime.status });
    }

    if (parts.length === 4 && parts[3] === 'egress') {
      if (req.method !== 'POST') throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${url.pathname}`);
      const egress = await readJson(req, EgressPolicy);
      if (!driver.setEgress) throw new HttpError(501, 'not_supported', `the ${driver.name} driver has no egress control`);
      if (!(await driver.get(sandboxId))) throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
      const result = await this.withLock(sandboxId, () => driver.setEgress!(sandboxId, egress));
      return sendJson(res, 200, result);
    }

    if (parts.length === 3) {
      if (req.method === 'GET') {
        const runtime = await driver.get(sandboxId);
        if (!runtime) throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
        return sendJson(res, 200, { id: runtime.id, status: runtime.status, ...(runtime.warm ? { warm: true } : {}) });
      }
      if (req.method === 'DELETE') {
        await this.guestSpans?.flush(sandboxId);
        this.dropAgent(sandboxId);
        this.dropViewAgent(sandboxId);
        this.dropPortAgent(sandboxId);
        await this.withLock(sandboxId, () => this.driverCall('destroy', sandboxId, () => driver.destroy(sandboxId)));
        res.writeHead(204).end();
        return;
      }
      throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${url.pathname}`);
    }

    const action = parts[3];
    if (parts.length === 4 && ['stop', 'start', 'pause', 'unpause', 'fork', 'snapshot'].includes(action) && !(await driver.get(sandboxId))) {
      throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
    }
    if (parts.length === 4 && action === 'stop' && req.method === 'POST') {
      await this.guestSpans?.flush(sandboxId);
      this.dropAgent(sandboxId);
      this.dropPortAgent(sandboxId);
      const result = await this.withLock(sandboxId, () => this.driverCall('stop', sandboxId, () => driver.stop(sandboxId)));
      return sendJson(res, 200, result);
    }
    if (parts.length === 4 && action === 'start' && req.method === 'POST') {
      const spec = await readJson(req, HostSandboxSpec);
      if (spec.id !== sandboxId) throw new HttpError(400, 'validation_failed', 'id: does not match the sandbox in the path');
      const result = await this.withLock(sandboxId, () => this.driverCall('start', sandboxId, () => driver.start(spec as SandboxSpec)));
      return sendJson(res, 200, { id: result.id, status: result.status, memoryRestored: result.memoryRestored, resumeReason: result.resumeReason });
    }
    if (parts.length === 4 && (action === 'pause' || action === 'unpause') && req.method === 'POST') {
      if (action === 'pause') await this.guestSpans?.flush(sandboxId);
      const runtime = await this.withLock(sandboxId, () => this.driverCall(action, sandboxId, () => (action === 'pause' ? driver.pause(sandboxId) : driver.unpause(sandboxId))));
      return sendJson(res, 200, { id: runtime.id, status: runtime.status });
    }
    if (parts.length === 4 && action === 'fork' && req.method === 'POST') {
      const body = await readJson(req, HostForkRequest);
      const result = await this.withLock(sandboxId, () => this.driverCall('fork', sandboxId, () => driver.fork(sandboxId, body.children as SandboxSpec[])));
      return sendJson(res, 200, {
        children: result.children.map((child) => ({ id: child.id, status: child.status })),
        memoryCopied: result.memoryCopied,
        diskCopy: result.diskCopy,
      });
    }
    if (parts.length === 4 && action === 'import' && req.method === 'POST') {
      const body = await readJson(req, HostSandboxImportRequest);
      const result = await this.driverCall('import', sandboxId, () => importSandbox(this.transferContext(), sandboxId, body));
      return sendJson(res, 200, result);
    }
    if (parts.length === 4 && action === 'snapshot' && req.method === 'POST') {
      const body = await readJson(req, HostSnapshotRequest);
      const result = await this.withLock(sandboxId, () => this.driverCall('snapshot', sandboxId, () => driver.snapshot(sandboxId, body.snapshotId)));
      return sendJson(res, 201, result);
    }
    if (action === 'agent') {
      const agentPath = '/' + parts.slice(4).join('/') + url.search;
      return this.proxyTo(await this.agentFor(sandboxId), agentPath, req, res, sandboxId);
    }
    if (action === 'files-view') {
      const agentPath = '/' + parts.slice(4).join('/') + url.search;
      return this.proxyToFileView(sandboxId, agentPath, req, res);
    }
    throw new HttpError(404, 'not_found', `no route ${url.pathname}`);
  }

  // ---- hosted ports ------------------------------------------------------------------------------

  /** Where a hosted-port request goes: the running sandbox's slot address and the path inside. */
  private async portTarget(req: http.IncomingMessage, keepAlive: boolean): Promise<ProxyTarget> {
    const rawUrl = req.url ?? '/';
    const match = PORT_ROUTE.exec(rawUrl);
    if (!match) throw new PortProxyError(404, 'not_found', 'no such port route');
    const [prefix, sandboxId, portText] = match;
    const port = Number(portText);
    if (port < 1 || port > 65535) throw new PortProxyError(400, 'validation_failed', `port ${portText} is outside 1-65535`);
    const runtime = await this.opts.driver.get(sandboxId);
    if (!runtime) throw new PortProxyError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
    const address = runtime.network?.sandboxAddress;
    // A frozen sandbox would accept nothing and hang the client: say so instead.
    if (runtime.status !== 'running' || !address) throw new PortProxyError(409, 'not_running', `sandbox ${sandboxId} is ${runtime.status}`);
    // The rest of the raw URL, untouched (no decoding, trailing slash and query kept).
    const rest = rawUrl.slice(prefix.length);
    const path = rest.startsWith('/') ? rest : `/${rest}`;
    return {
      host: address,
      port,
      path,
      headers: forwardableHeaders(req, [PORT_PROXY_AUTH_HEADER]),
      agent: keepAlive ? this.portAgentFor(sandboxId, address) : false,
      connectTimeoutMs: PORT_CONNECT_TIMEOUT_MS,
    };
  }

  /** HTTP to a server inside the sandbox, streamed both ways (the host → sandbox direction is open in nft). */
  private async proxyToPort(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    let target: ProxyTarget;
    try {
      target = await this.portTarget(req, true);
    } catch (error) {
      if (!(error instanceof PortProxyError)) throw error;
      req.resume();
      res.writeHead(error.status, { 'content-type': 'application/json', [PORT_PROXY_ERROR_HEADER]: error.kind });
      res.end(portErrorBody(error));
      return;
    }
    proxyHttp(req, res, target, {
      onUpstreamError: (error) => {
        const failure = new PortProxyError(502, 'not_listening', `nothing answers on port ${target.port} in the sandbox (${error.code ?? error.message})`);
        res.writeHead(502, { 'content-type': 'application/json', [PORT_PROXY_ERROR_HEADER]: failure.kind });
        res.end(portErrorBody(failure));
      },
    });
  }

  private handlePortUpgrade(req: http.IncomingMessage, socket: Socket, head: Buffer): void {
    const refuse = (error: PortProxyError) =>
      writeRawResponse(socket, error.status, { 'content-type': 'application/json', [PORT_PROXY_ERROR_HEADER]: error.kind }, portErrorBody(error));
    this.portTarget(req, false)
      .then((target) =>
        proxyUpgrade(req, socket, head, target, {
          onUpstreamError: (error) => refuse(new PortProxyError(502, 'not_listening', `nothing answers on port ${target.port} in the sandbox (${error.code ?? error.message})`)),
        }),
      )
      .catch((error: unknown) => {
        if (error instanceof PortProxyError) return refuse(error);
        refuseUpgrade(socket, 500, { error: { code: 'internal', message: error instanceof Error ? error.message : String(error) } });
      });
  }

  private portAgentFor(sandboxId: string, address: string): http.Agent {
    const cached = this.portAgents.get(sandboxId);
    if (cached?.address === address) return cached.agent;
    cached?.agent.destroy();
    const agent = new http.Agent({ keepAlive: true, maxSockets: 256, keepAliveMsecs: 1_000 });
    this.portAgents.set(sandboxId, { address, agent });
    return agent;
  }

  private dropPortAgent(sandboxId: string): void {
    this.portAgents.get(sandboxId)?.agent.destroy();
    this.portAgents.delete(sandboxId);
  }

  /** `GET /v1/snapshots` and `DELETE /v1/snapshots/{snapshotId}`. */
  private async handleSnapshots(parts: string[], req: http.IncomingMessage, res: http.ServerResponse, pathname: string): Promise<void> {
    const driver = this.opts.driver;
    if (parts.length === 2 && req.method === 'GET') return sendJson(res, 200, { snapshots: await driver.listSnapshots() });
    if (parts.length === 4 && parts[3] === 'import') {
      const id = SnapshotIdParam.safeParse(parts[2]);
      if (!id.success) throw new HttpError(400, 'validation_failed', `snapshot id: ${id.error.issues[0].message}`);
      if (req.method !== 'POST') throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${pathname}`);
      const body = await readJson(req, HostSnapshotImportRequest);
      return sendJson(res, 200, { snapshotIds: await importSnapshotChain(this.transferContext(), id.data, body) });
    }
    if (parts.length === 3) {
      const id = SnapshotIdParam.safeParse(parts[2]);
      if (!id.success) throw new HttpError(400, 'validation_failed', `snapshot id: ${id.error.issues[0].message}`);
      if (req.method === 'DELETE') {
        await driver.deleteSnapshot(id.data);
        res.writeHead(204).end();
        return;
      }
      throw new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${pathname}`);
    }
    throw new HttpError(parts.length === 2 ? 405 : 404, parts.length === 2 ? 'method_not_allowed' : 'not_found', `no route ${req.method} ${pathname}`);
  }

  /** `POST /v1/images/pull`, `GET /v1/images`, `DELETE /v1/images/{id}` (the driver's OCI store). */
  private async handleImages(parts: string[], req: http.IncomingMessage, res: http.ServerResponse, pathname: string): Promise<void> {
    const driver = this.opts.driver;
    const notAllowed = () => new HttpError(405, 'method_not_allowed', `${req.method} not allowed on ${pathname}`);
    const unsupported = () => new HttpError(501, 'not_supported', `the ${driver.name} driver has no image store`);
    if (parts.length === 3 && parts[2] === 'pull') {
      if (req.method !== 'POST') throw notAllowed();
      const body = await readJson(req, HostPullRequest);
      if (!driver.pullImage) throw unsupported();
      return this.streamPull(body, req, res);
    }
    if (parts.length === 2) {
      if (req.method !== 'GET') throw notAllowed();
      if (!driver.listImages) throw unsupported();
      return sendJson(res, 200, { images: await driver.listImages() });
    }
    if (parts.length === 3) {
      let raw: string;
      try {
        raw = decodeURIComponent(parts[2]);
      } catch {
        throw new HttpError(400, 'validation_failed', 'image id: not valid percent-encoding');
      }
      const id = ImageIdParam.safeParse(raw);
      if (!id.success) throw new HttpError(400, 'validation_failed', `image id: ${id.error.issues[0].message}`);
      if (req.method !== 'DELETE') throw notAllowed();
      if (!driver.deleteImage) throw unsupported();
      await driver.deleteImage(id.data);
      res.writeHead(204).end();
      return;
    }
    throw new HttpError(404, 'not_found', `no route ${req.method} ${pathname}`);
  }

  /**
   * A pull's answer: NDJSON lines (schemas.ts HostPullLine) of progress, then the image or the
   * error. The 200 goes out with the first line; a failure before it (bad reference, no such
   * tag, refused credentials: found while the manifest is read) is a plain error answer with
   * its status. The client going away kills the pull (the store leaves nothing half-pulled).
   * The credentials go to the store only: never to a log line or a message.
   */
  private async streamPull(body: HostPullRequest, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const signal = clientGoneSignal(req, res);
    const log = this.opts.logger;
    const send = (line: HostPullLine): void => {
      if (res.destroyed || res.writableEnded) return;
      if (!res.headersSent) res.writeHead(200, { 'content-type': PULL_CONTENT_TYPE, 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' });
      res.write(`${JSON.stringify(line)}\n`);
    };
    const keepalive = setInterval(() => send({ keepalive: true }), this.opts.pullKeepaliveMs ?? PULL_KEEPALIVE_MS);
    const started = Date.now();
    log.info({ operation: 'pull', reference: body.reference }, `pull ${body.reference}${body.credentials ? ' (with credentials)' : ''}`);
    try {
      const image = await this.opts.driver.pullImage!(body.reference, {
        credentials: body.credentials,
        signal,
        onProgress: (line) => {
          log.info({ operation: 'pull', reference: body.reference }, line);
          send({ progress: line });
        },
      });
      send({ image });
      res.end();
    } catch (error) {
      if (signal.aborted) {
        log.info({ operation: 'pull', reference: body.reference }, `pull ${body.reference}: cancelled by the client after ${Date.now() - started} ms`);
        res.destroy();
        return;
      }
      log.warn({ operation: 'pull', reference: body.reference }, `pull ${body.reference} failed: ${error instanceof Error ? error.message : String(error)}`);
      if (!res.headersSent) throw error;
      const code = (error as { code?: unknown }).code;
      send({ error: { code: typeof code === 'string' && isErrorCode(code) ? code : 'internal', message: error instanceof Error ? error.message : String(error) } });
      res.end();
    } finally {
      clearInterval(keepalive);
    }
  }

  /**
   * Pass-through to a read-only guest agent over a STOPPED sandbox's disk. The view is started
   * on first use and kept alive while requests come (and while one streams).
   */
  private async proxyToFileView(sandboxId: string, agentPath: string, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const driver = this.opts.driver;
    const runtime = await driver.get(sandboxId);
    if (!runtime) throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
    if (runtime.status !== 'stopped') {
      throw new HttpError(409, 'invalid_state', `sandbox ${sandboxId} is ${runtime.status} on host ${this.opts.hostId}; read its files through /agent`);
    }
    const view = await driver.fileView(sandboxId);
    let cached = this.viewAgents.get(sandboxId);
    if (cached?.viewId !== view.viewId) {
      cached?.client.close();
      cached = { viewId: view.viewId, client: new AgentClient(view.agentSocket, { proofKey: view.agentProofKey }) };
      this.viewAgents.set(sandboxId, cached);
    }
    const keepAlive = setInterval(() => driver.touchFileView(sandboxId), FILE_VIEW_TOUCH_MS);
    res.once('close', () => {
      clearInterval(keepAlive);
      driver.touchFileView(sandboxId);
    });
    return this.proxyTo(cached.client, agentPath, req, res, sandboxId);
  }

  private dropViewAgent(sandboxId: string): void {
    this.viewAgents.get(sandboxId)?.client.close();
    this.viewAgents.delete(sandboxId);
  }

  private async runtimes() {
    return (await this.opts.driver.list()).map((r) => ({ id: r.id, status: r.status }));
  }

  private async agentFor(sandboxId: string): Promise<AgentClient> {
    const runtime = await this.opts.driver.get(sandboxId);
    if (!runtime) throw new HttpError(404, 'not_found', `sandbox ${sandboxId} not found on host ${this.opts.hostId}`);
    if (runtime.status !== 'running' || !runtime.agentSocket) {
      this.dropAgent(sandboxId);
      throw new HttpError(409, 'invalid_state', `sandbox ${sandboxId} is ${runtime.status} on host ${this.opts.hostId}`);
    }
    const cached = this.agents.get(sandboxId);
    // A new boot has a new key (and may reuse the socket path).
    if (cached?.socketPath === runtime.agentSocket && sameKey(cached.proofKey, runtime.agentProofKey)) return cached;
    cached?.close();
    const client = new AgentClient(runtime.agentSocket, { proofKey: runtime.agentProofKey });
    this.agents.set(sandboxId, client);
    return client;
  }

  /** An answer without a valid proof is an agent failure worth a log line (finding 7 of issue 11). */
  private noteForgedAnswer(what: string, detail: string, sandboxId?: string): void {
    this.opts.logger.warn({ sandboxId }, `guest agent answer refused (${what}): ${detail}`);
  }

  private dropAgent(sandboxId: string): void {
    this.agents.get(sandboxId)?.close();
    this.agents.delete(sandboxId);
  }

  /** Streams both ways: neither the request nor the response body is held in memory. */
  private async proxyTo(agent: AgentClient, agentPath: string, req: http.IncomingMessage, res: http.ServerResponse, sandboxId: string): Promise<void> {
    const headers: Record<string, string> = {};
    for (const name of ['content-type', 'content-length', 'range', 'accept']) {
      const value = req.headers[name];
      if (typeof value === 'string') headers[name] = value;
    }
    const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
    // If our caller goes away (a client cancelled exec, an upload dropped mid-body), drop the
    // upstream request too, before or after its answer started, so the guest agent sees the
    // disconnect: it kills the command or discards the half-written file.
    const signal = clientGoneSignal(req, res);
    let upstream: http.IncomingMessage;
    const answered = this.opts.metrics?.series.guestRequestTimer(agentPath);
    try {
      // The guest agent may answer before the body is all sent (507 disk full): its request then
      // fails while ours is still arriving, and the rest of ours must be read and dropped, not
      // left unread (request-body.ts), so the early answer reaches the control plane.
      upstream = await agent.request({ method: req.method ?? 'GET', path: agentPath, headers, body: hasBody ? discardableBody(req) : undefined, signal });
      answered?.(upstream.statusCode ?? 0);
    } catch (error) {
      answered?.(error instanceof AgentRequestError ? error.status : 0);
      if (error instanceof AgentRequestError && error.code === 'agent_unavailable') this.noteForgedAnswer(agentPath, error.message);
      throw error;
    }
    signal.addEventListener('abort', () => upstream.destroy(), { once: true });
    if (signal.aborted) upstream.destroy();
    const passHeaders: Record<string, string> = {};
    for (const name of ['content-type', 'content-length', 'content-range', 'accept-ranges']) {
      const value = upstream.headers[name];
      if (typeof value === 'string') passHeaders[name] = value;
    }
    res.writeHead(upstream.statusCode ?? 502, passHeaders);
    try {
      await pipeline(upstream, res);
    } finally {
      // The guest recorded a span for a traced request: bring it out (guest-spans.ts).
      if (this.guestSpans && inSampledTrace()) this.guestSpans.noteTraced(sandboxId, agent);
    }
  }

  /** One driver call, in a span of its own (child of the request's) when tracing is on. */
  private driverCall<T>(operation: string, sandboxId: string, call: () => Promise<T>): Promise<T> {
    if (!tracingEnabled()) return call();
    return inSpan(`driver.${operation}`, { 'nestbox.operation': operation, 'nestbox.sandbox.id': sandboxId, 'nestbox.host.id': this.opts.hostId, 'nestbox.driver': this.opts.driver.name }, call);
  }

  /** WebSocket pass-through to the guest agent (used by streaming features: process streams, PTY). */
  private handleUpgrade(req: http.IncomingMessage, socket: Socket, head: Buffer): void {
    if (!this.authorized(req)) return refuseUpgrade(socket, 401, { error: { code: 'unauthorized', message: 'missing or invalid host secret' } });
    if (PORT_ROUTE.test(req.url ?? '')) return this.handlePortUpgrade(req, socket, head);
    const url = new URL(req.url ?? '/', 'http://host-agent');
    const parts = url.pathname.split('/').filter(Boolean);
    const id = SandboxIdParam.safeParse(parts[2]);
    if (parts[0] !== 'v1' || parts[1] !== 'sandboxes' || !id.success || parts[3] !== 'agent') {
      return refuseUpgrade(socket, 404, { error: { code: 'not_found', message: 'no such WebSocket route' } });
    }
    this.agentFor(id.data)
      .then(async (agent) => {
        const upstream = await agent.connectWebSocket(`/${parts.slice(4).join('/')}${url.search}`, req);
        if (!upstream.ok) {
          if (upstream.status === 502 && upstream.body.includes('"agent_unavailable"')) this.noteForgedAnswer(id.data, upstream.body, id.data);
          return refuseUpgrade(socket, upstream.status, upstream.body);
        }
        acceptAndRelay(req, socket, head, upstream.ws);
      })
      .catch((err: unknown) => {
        const status = err instanceof HttpError ? err.status : 502;
        const code = err instanceof HttpError ? err.code : 'host_unavailable';
        refuseUpgrade(socket, status, { error: { code, message: err instanceof Error ? err.message : String(err) } });
      });
  }

  listen(port: number, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(port, host, () => {
        this.server.off('error', reject);
        resolve((this.server.address() as { port: number }).port);
      });
    });
  }

  async close(): Promise<void> {
    await this.guestSpans?.close();
    for (const id of [...this.agents.keys()]) this.dropAgent(id);
    for (const id of [...this.viewAgents.keys()]) this.dropViewAgent(id);
    for (const id of [...this.portAgents.keys()]) this.dropPortAgent(id);
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

