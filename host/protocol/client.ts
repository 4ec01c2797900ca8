// The control plane's client of a host agent (implements core's HostClient over HTTP).
// JSON calls are small; file bodies are streamed straight through without buffering.
import http from 'node:http';
import type { Readable } from 'node:stream';
import type { z } from 'zod';
import { pipeline } from 'node:stream/promises';
import { createInterface } from 'node:readline';
import { decodeErrorBody, NestboxError } from '../../core/errors.js';
import { endClientSpanFailed, endClientSpanWith, startClientSpan, tracingEnabled } from '../../core/tracing.js';
import type { GuestClient, GuestView } from '../../core/guest.js';
import type {
  AgentRequest,
  AgentWebSocketTarget,
  EgressPolicy,
  HostClient,
  HostEgressResult,
  HostForkResult,
  HostImage,
  HostPullOptions,
  HostSandboxRuntime,
  HostSandboxSpec,
  HostSnapshotResult,
  HostStartResult,
  PortProxyTarget,
} from '../../core/host-client.js';
import { HttpGuestClient } from '../agent-protocol/guest-client.js';
import { giveUpBodyAfterAnswer } from '../agent-protocol/request-body.js';
import { errorFromResponse } from './error-response.js';
import * as Schemas from './schemas.js';

// The wire schemas and core's types must describe the same image (a drift fails the build).
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const imageSchemaMatchesCore: Same<z.infer<typeof Schemas.HostImage>, HostImage> = true;
void imageSchemaMatchesCore;

export interface HttpHostClientOptions {
  hostId: string;
  baseUrl: string;
  secret: string;
  /** Lifecycle calls can take a while (cold start of a sandbox); exec has its own timeout. */
  lifecycleTimeoutMs?: number;
}

interface RequestOptions {
  method: string;
  path: string;
  json?: unknown;
  body?: Readable;
  /** A small body already in memory (sent with its length). */
  buffer?: Buffer;
  headers?: Record<string, string>;
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** A host-agent path as a span names it: the sandbox id and the query left out. */
function routeTemplate(path: string): string {
  return path.split('?', 1)[0].replace(/^\/v1\/(sandboxes|snapshots|images|volumes)\/[^/]+/, '/v1/$1/{id}');
}

async function readAll(res: http.IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of res) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** The most a host-to-host transfer may take (a 100 GiB disk at ~120 MB/s is about 15 minutes). */
const TRANSFER_TIMEOUT_MS = 60 * 60_000;

export class HttpHostClient implements HostClient {
  readonly hostId: string;
  private readonly base: URL;
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  private readonly lifecycleTimeoutMs: number;

  constructor(private readonly opts: HttpHostClientOptions) {
    this.hostId = opts.hostId;
    this.base = new URL(opts.baseUrl);
    this.lifecycleTimeoutMs = opts.lifecycleTimeoutMs ?? 180_000;
  }

  guest(id: string, view: GuestView = 'live'): GuestClient {
    return new HttpGuestClient(
      (request) => this.relay(id, view === 'live' ? '/agent' : '/files-view', request),
      (path) => this.agentWebSocket(id, path),
      id,
    );
  }

  /** A guest-agent request through one of the host agent's pass-through prefixes. */
  private relay(id: string, prefix: '/agent' | '/files-view', request: AgentRequest): Promise<http.IncomingMessage> {
    const body = Buffer.isBuffer(request.body) ? undefined : request.body;
    const headers = { ...request.headers };
    if (Buffer.isBuffer(request.body)) headers['content-length'] = String(request.body.length);
    return this.request({
      method: request.method,
      path: this.sandboxPath(id, `${prefix}${request.path}`),
      headers,
      body,
      buffer: Buffer.isBuffer(request.body) ? request.body : undefined,
      signal: request.signal,
    });
  }

  /** Where the guest agent's WebSocket routes of a sandbox are reached (through the host agent). */
  private agentWebSocket(id: string, path: string): AgentWebSocketTarget {
    const url = new URL(this.sandboxPath(id, `/agent${path}`), this.base);
    url.protocol = this.base.protocol === 'https:' ? 'wss:' : 'ws:';
    return { url: url.toString(), headers: { authorization: `Bearer ${this.opts.secret}` } };
  }

  resizeSandbox(id: string, change: Schemas.HostResizeSpec): Promise<Schemas.HostResizeResult> {
    return this.json({ method: 'POST', path: this.sandboxPath(id, '/resize'), json: change, timeoutMs: 600_000 }, Schemas.HostResizeResult);
  }

  claimWarm(spec: HostSandboxSpec): Promise<HostSandboxRuntime> {
    return this.json({ method: 'POST', path: this.sandboxPath(spec.id, '/claim'), json: spec, timeoutMs: 60_000 }, Schemas.HostSandboxRuntime);
  }

  setEgress(id: string, egress: EgressPolicy): Promise<HostEgressResult> {
    return this.json({ method: 'POST', path: this.sandboxPath(id, '/egress'), json: egress, timeoutMs: 60_000 }, Schemas.HostEgressResult);
  }

  /**
   * `POST /v1/images/pull`: progress lines are handed to onProgress as they arrive; the answer
   * is the final line's image. Aborting the signal drops the request, which kills the pull.
   */
  async pullImage(reference: string, options: HostPullOptions = {}): Promise<HostImage> {
    const call: RequestOptions = { method: 'POST', path: '/v1/images/pull', json: { reference, credentials: options.credentials }, signal: options.signal };
    const res = await this.send(call);
    const cancelled = () => new NestboxError('timeout', `the pull of ${reference} on host ${this.hostId} was cancelled`);
    try {
      for await (const text of createInterface({ input: res, crlfDelay: Infinity })) {
        if (!text) continue;
        let parsed: ReturnType<typeof Schemas.HostPullLine.safeParse>;
        try {
          parsed = Schemas.HostPullLine.safeParse(JSON.parse(text));
        } catch (err) {
          throw this.unexpected(call, (err as Error).message);
        }
        if (!parsed.success) throw this.unexpected(call, parsed.error.message);
        const line = parsed.data;
        if ('progress' in line) options.onProgress?.(line.progress);
        else if ('image' in line) {
          res.resume();
          return line.image;
        } else if ('error' in line) throw decodeErrorBody(500, JSON.stringify(line), `host ${this.hostId}`);
      }
    } catch (err) {
      if (options.signal?.aborted) throw cancelled();
      if (err instanceof NestboxError) throw err;
      throw new NestboxError('host_unavailable', `host ${this.hostId}: the pull of ${reference} was cut off: ${(err as Error).message}`);
    } finally {
      if (!res.complete) res.destroy();
    }
    if (options.signal?.aborted) throw cancelled();
    throw new NestboxError('host_unavailable', `host ${this.hostId}: the pull of ${reference} ended without a result`);
  }

  async listImages(): Promise<HostImage[]> {
    return (await this.json({ method: 'GET', path: '/v1/images', timeoutMs: 60_000 }, Schemas.HostImageList)).images;
  }

  async deleteImage(id: string): Promise<void> {
    await this.call({ method: 'DELETE', path: `/v1/images/${encodeURIComponent(id)}` });
  }

  portProxyTarget(id: string, port: number): PortProxyTarget {
    const url = new URL(this.sandboxPath(id, `/ports/${port}`), this.base);
    return { baseUrl: url.toString(), headers: { [Schemas.PORT_PROXY_AUTH_HEADER]: `Bearer ${this.opts.secret}` } };
  }

  private request(o: RequestOptions): Promise<http.IncomingMessage> {
    return new Promise((resolve, reject) => {
      const headers: Record<string, string> = { authorization: `Bearer ${this.opts.secret}`, ...o.headers };
      let payload: Buffer | undefined = o.buffer;
      if (o.json !== undefined) {
        payload = Buffer.from(JSON.stringify(o.json));
        headers['content-type'] = 'application/json';
        headers['content-length'] = String(payload.length);
      }
      // Joins the caller's trace (off, or with no span active: undefined, nothing injected).
      const span = tracingEnabled() ? startClientSpan(`${o.method} ${routeTemplate(o.path)}`, { 'http.request.method': o.method, 'url.template': routeTemplate(o.path), 'nestbox.host.id': this.hostId }, headers) : undefined;
      const req = http.request(
        { host: this.base.hostname, port: this.base.port, method: o.method, path: o.path, headers, agent: this.agent, signal: o.signal },
        (res) => {
          if (span) endClientSpanWith(span, res);
          giveUpBodyAfterAnswer(req, res);
          resolve(res);
        },
      );
      if (o.timeoutMs) {
        req.setTimeout(o.timeoutMs, () => req.destroy(new NestboxError('timeout', `host ${this.hostId} did not answer ${o.method} ${o.path} within ${o.timeoutMs} ms`)));
      }
      req.on('error', (err) => {
        if (span?.isRecording()) endClientSpanFailed(span, err);
        if (err instanceof NestboxError) return reject(err);
        if ((err as NodeJS.ErrnoException).name === 'AbortError') return reject(new NestboxError('timeout', 'the request was cancelled'));
        reject(new NestboxError('host_unavailable', `host ${this.hostId} is not reachable: ${err.message}`));
      });
      if (o.body) {
        // A streamed body may be answered before it is all sent (507 disk full, 413): the host
        // agent reads and drops the rest until we stop sending, which we do once the answer
        // has been read (giveUpBodyAfterAnswer). Not `Connection: close`: a server closes such
        // a connection right after its answer, with our body still arriving, and that reset
        // made our next write fail (EPIPE) before the answer was read (503 instead of 507).
        pipeline(o.body, req).catch((err) => req.destroy(err));
      } else {
        req.end(payload);
      }
    });
  }

  /** A lifecycle call: its answer checked against the protocol's schema (schemas.ts). */
  private async json<T>(o: RequestOptions, schema: z.ZodType<T>): Promise<T> {
    const res = await this.send(o);
    const text = (await readAll(res)).toString('utf8');
    let parsed: ReturnType<typeof schema.safeParse>;
    try {
      parsed = schema.safeParse(JSON.parse(text));
    } catch (err) {
      throw this.unexpected(o, (err as Error).message);
    }
    if (!parsed.success) throw this.unexpected(o, parsed.error.message);
    return parsed.data;
  }

  /** A call answered without a body worth reading (204). */
  private async call(o: RequestOptions): Promise<void> {
    (await this.send(o)).resume();
  }

  private async send(o: RequestOptions): Promise<http.IncomingMessage> {
    const res = await this.request({ timeoutMs: this.lifecycleTimeoutMs, ...o });
    if ((res.statusCode ?? 500) >= 400) throw await errorFromResponse(res, `host ${this.hostId}`);
    return res;
  }

  private unexpected(o: RequestOptions, detail: string): NestboxError {
    return new NestboxError('internal', `host ${this.hostId} sent an unexpected answer to ${o.method} ${o.path}: ${detail}`);
  }

  private sandboxPath(id: string, suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(id)}${suffix}`;
  }

  createSandbox(spec: HostSandboxSpec): Promise<HostSandboxRuntime> {
    return this.json({ method: 'POST', path: '/v1/sandboxes', json: spec }, Schemas.HostSandboxRuntime);
  }

  stopSandbox(id: string): Promise<{ memorySaved: boolean }> {
    return this.json({ method: 'POST', path: this.sandboxPath(id, '/stop') }, Schemas.HostStopResult);
  }

  startSandbox(spec: HostSandboxSpec): Promise<HostStartResult> {
    return this.json({ method: 'POST', path: this.sandboxPath(spec.id, '/start'), json: spec }, Schemas.HostStartResult);
  }

  async destroySandbox(id: string): Promise<void> {
    await this.call({ method: 'DELETE', path: this.sandboxPath(id) });
  }

  pauseSandbox(id: string): Promise<HostSandboxRuntime> {
    return this.json({ method: 'POST', path: this.sandboxPath(id, '/pause') }, Schemas.HostSandboxRuntime);
  }

  unpauseSandbox(id: string): Promise<HostSandboxRuntime> {
    return this.json({ method: 'POST', path: this.sandboxPath(id, '/unpause') }, Schemas.HostSandboxRuntime);
  }

  forkSandbox(sourceId: string, children: HostSandboxSpec[]): Promise<HostForkResult> {
    return this.json({ method: 'POST', path: this.sandboxPath(sourceId, '/fork'), json: { children } }, Schemas.HostForkResult);
  }

  snapshotSandbox(id: string, snapshotId: string): Promise<HostSnapshotResult> {
    return this.json({ method: 'POST', path: this.sandboxPath(id, '/snapshot'), json: { snapshotId } }, Schemas.HostSnapshotResult);
  }

  /** Transfers take as long as the bytes do: bounded by TRANSFER_TIMEOUT_MS, not the lifecycle deadline. */
  importSnapshot(snapshotId: string, source: { url: string; token: string }): Promise<{ snapshotIds: string[] }> {
    return this.json({ method: 'POST', path: `/v1/snapshots/${encodeURIComponent(snapshotId)}/import`, json: { sourceUrl: source.url, token: source.token }, timeoutMs: TRANSFER_TIMEOUT_MS }, Schemas.HostSnapshotImportResult);
  }

  importSandbox(spec: HostSandboxSpec, source: { url: string; token: string }): Promise<HostSandboxRuntime> {
    return this.json({ method: 'POST', path: this.sandboxPath(spec.id, '/import'), json: { sourceUrl: source.url, token: source.token, spec }, timeoutMs: TRANSFER_TIMEOUT_MS }, Schemas.HostSandboxRuntime);
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.call({ method: 'DELETE', path: `/v1/snapshots/${encodeURIComponent(snapshotId)}` });
  }


  ensureVolume(id: string, sizeBytes: number): Promise<Schemas.HostVolumeInfo> {
    return this.json({ method: 'PUT', path: `/v1/volumes/${encodeURIComponent(id)}`, json: { sizeBytes } }, Schemas.HostVolumeInfo);
  }

  volumeInfo(id: string): Promise<Schemas.HostVolumeInfo> {
    return this.json({ method: 'GET', path: `/v1/volumes/${encodeURIComponent(id)}`, timeoutMs: 10_000 }, Schemas.HostVolumeInfo);
  }

  async deleteVolume(id: string): Promise<void> {
    await this.call({ method: 'DELETE', path: `/v1/volumes/${encodeURIComponent(id)}` });
  }

  volumeFiles(id: string, o: { method: string; op: string; query: Record<string, string>; body?: Readable; json?: unknown }): Promise<http.IncomingMessage> {
    const path = `/v1/volumes/${encodeURIComponent(id)}/files${o.op ? `/${o.op}` : ''}?${new URLSearchParams(o.query).toString()}`;
    // Streams take as long as their bytes: no lifecycle deadline on a content read or write.
    return this.send({ method: o.method, path, body: o.body, json: o.json, ...(o.body ? { headers: { 'content-type': 'application/octet-stream' } } : {}), ...(o.body || o.op === 'content' ? { timeoutMs: 0 } : {}) });
  }

  async getSandbox(id: string): Promise<HostSandboxRuntime | undefined> {
    try {
      return await this.json({ method: 'GET', path: this.sandboxPath(id), timeoutMs: 10_000 }, Schemas.HostSandboxRuntime);
    } catch (err) {
      if (err instanceof NestboxError && err.code === 'not_found') return undefined;
      throw err;
    }
  }
}
