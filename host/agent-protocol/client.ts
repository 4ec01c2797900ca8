// The host side of the guest-agent protocol (see types.ts). The host agent uses the typed
// helpers for its own work and `request()` to pass API traffic straight through to the guest
// without buffering bodies in either direction.
import { Agent, request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import type { z } from 'zod';
import { errorFromResponse } from '../protocol/error-response.js';
import { connectUpstream, type UpstreamResult } from '../protocol/ws-relay.js';
import { giveUpBodyAfterAnswer } from './request-body.js';
import { endClientSpanFailed, endClientSpanWith, startClientSpan, tracingEnabled } from '../../core/tracing.js';
import { GUEST_SPANS_ROUTE } from './telemetry.js';
import { AGENT_KEY_ROUTE, AGENT_NONCE_HEADER, AGENT_PROOF_HEADER, AGENT_REKEY_HEADER, encodeAgentKey, newNonce, rekeyProof, verifyAgentProof } from './auth.js';
import {
  ExecResponse,
  FileInfo,
  HealthResponse,
  ListResponse,
  type ExecRequest,
} from './types.js';

/**
 * An error answered by the guest agent; `host_unavailable` (503) when it cannot be reached;
 * `agent_unavailable` (502) when something answered without proving it is the real agent.
 */
export class AgentRequestError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'AgentRequestError';
  }
}

export interface AgentHttpRequest {
  method: string;
  /** Path including the query string, e.g. `/files/content?path=%2Fetc%2Fhostname`. */
  path: string;
  headers?: OutgoingHttpHeaders;
  body?: Readable | Buffer | string;
  /** Gives up (and reports host_unavailable) when no response has started within this time. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** `installKey` only: the key the agent holds now, which authorises replacing it by ours. */
  rekeyFrom?: Buffer;
}

export interface ByteRangeRequest {
  start: number;
  /** Inclusive; absent = to the end of the file. */
  end?: number;
}

/** Guest routes no span is made for (see requestOnce). */
const UNTRACED_PATHS = new Set(['/health', GUEST_SPANS_ROUTE]);

/** Socket-level failures that mean "nobody is listening", as opposed to an agent error. */
const UNREACHABLE_CODES = new Set(['ENOENT', 'ECONNREFUSED', 'ENOTSOCK', 'ENOTDIR']);

function errnoCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

async function readAll(response: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** Consumes an error response and turns it into an AgentRequestError (codes decoded by core's one decoder). */
export async function agentErrorFrom(response: IncomingMessage): Promise<AgentRequestError> {
  const status = response.statusCode ?? 502;
  const decoded = await errorFromResponse(response, 'guest agent');
  return new AgentRequestError(status, decoded.code, decoded.message);
}

function isSuccess(response: IncomingMessage): boolean {
  const status = response.statusCode ?? 0;
  return status >= 200 && status < 300;
}

export interface AgentTransport {
  /** Makes the connections (e.g. the Cloud Hypervisor driver's hybrid-vsock http.Agent). */
  agent?: Agent;
  /**
   * The sandbox's per-boot key (auth.ts). With it, every answer must carry a valid proof or is
   * refused as `agent_unavailable`; without it (tests, a VM agent before its key handoff)
   * answers are taken as they come.
   */
  proofKey?: Buffer;
}

export class AgentClient {
  private readonly agent: Agent;
  /** The key answers are checked against; undefined = no check. */
  readonly proofKey?: Buffer;

  /**
   * `socketPath` is the agent's Unix socket, or, with `transport.agent`, just a label for
   * messages: that agent makes the connections.
   */
  constructor(
    readonly socketPath: string,
    transport: AgentTransport = {},
  ) {
    // Idle sockets are dropped after 60 s, before the guest agent's 120 s keep-alive timeout,
    // so a request is never sent on a socket the agent is just closing.
    this.agent = transport.agent ?? new Agent({ keepAlive: true, timeout: 60_000 });
    this.proofKey = transport.proofKey;
  }

  /** Closes pooled connections; the client is unusable afterwards. */
  close(): void {
    this.agent.destroy();
  }

  /**
   * Sends one request and resolves with the response as soon as its headers arrive, whatever
   * the status. Bodies stream in both directions; the caller must consume or destroy the
   * response.
   */
  async request(options: AgentHttpRequest): Promise<IncomingMessage> {
    const canRetry = options.body === undefined || typeof options.body === 'string' || Buffer.isBuffer(options.body);
    try {
      return await this.requestOnce(options);
    } catch (error) {
      // A pooled keep-alive socket can be closed by the peer just as we reuse it; a request
      // whose body we still hold can safely go again on a fresh connection.
      if (canRetry && (error as { reusedSocket?: boolean }).reusedSocket && errnoCode(error) === 'ECONNRESET') {
        return this.requestOnce(options);
      }
      throw this.connectionError(error);
    }
  }

  private requestOnce(options: AgentHttpRequest): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      const headers: OutgoingHttpHeaders = { ...options.headers };
      const nonce = this.proofKey ? newNonce() : undefined;
      if (nonce) headers[AGENT_NONCE_HEADER] = nonce;
      if (nonce && options.rekeyFrom && this.proofKey) headers[AGENT_REKEY_HEADER] = rekeyProof(options.rekeyFrom, nonce, this.proofKey);
      const fixedBody = typeof options.body === 'string' ? Buffer.from(options.body) : options.body;
      if (Buffer.isBuffer(fixedBody)) headers['content-length'] = String(fixedBody.length);

      // Requests passed through to the guest carry the trace on (it records its own span for
      // them); its health polls and the span drain itself are never traced.
      const span = tracingEnabled() && !UNTRACED_PATHS.has(options.path) ? startClientSpan(`guest ${options.method} ${options.path.split('?', 1)[0]}`, { 'http.request.method': options.method }, headers) : undefined;
      const req = httpRequest({
        socketPath: this.socketPath,
        agent: this.agent,
        method: options.method,
        path: options.path,
        headers,
        signal: options.signal,
      });
      req.once('response', (response) => {
        if (span) endClientSpanWith(span, response);
        if (options.timeoutMs) req.setTimeout(0);
        if (this.proofKey && nonce) {
          const subject = { nonce, method: options.method, target: options.path, status: response.statusCode ?? 0 };
          if (!verifyAgentProof(this.proofKey, subject, response.headers[AGENT_PROOF_HEADER])) {
            // Never read a forger's body, never reuse its connection.
            response.destroy();
            req.destroy();
            reject(this.forgedAnswer(`${options.method} ${options.path}`, response.statusCode));
            return;
          }
        }
        giveUpBodyAfterAnswer(req, response);
        resolve(response);
      });
      req.once('error', (error) => {
        if (span?.isRecording()) endClientSpanFailed(span, error);
        Object.assign(error, { reusedSocket: req.reusedSocket });
        reject(error);
      });
      if (options.timeoutMs) {
        req.setTimeout(options.timeoutMs, () => {
          req.destroy(Object.assign(new Error(`no response within ${options.timeoutMs} ms`), { code: 'ETIMEDOUT' }));
        });
      }

      if (fixedBody instanceof Readable) {
        // pipeline destroys the request if the source fails, which rejects via 'error' above.
        pipeline(fixedBody, req).catch(() => {});
      } else {
        req.end(fixedBody);
      }
    });
  }

  private forgedAnswer(what: string, status: number | undefined): AgentRequestError {
    return new AgentRequestError(
      502,
      'agent_unavailable',
      `the answer to ${what} (HTTP ${status ?? '?'}) at ${this.socketPath} carries no valid proof that it comes from the sandbox's guest agent; the agent is treated as failed`,
    );
  }

  /**
   * Opens a WebSocket to the agent (paused, see ws-relay.ts). With a proof key the 101 (or the
   * refusal) must carry a valid proof; otherwise the result is an `agent_unavailable` refusal.
   * `agentPath` is path and query, e.g. `/processes/abc/ws?offset=0`.
   */
  connectWebSocket(agentPath: string, req: IncomingMessage): Promise<UpstreamResult> {
    const key = this.proofKey;
    if (!key) return connectUpstream(`ws+unix://${this.socketPath}:${agentPath}`, {}, req);
    const nonce = newNonce();
    return connectUpstream(`ws+unix://${this.socketPath}:${agentPath}`, { [AGENT_NONCE_HEADER]: nonce }, req, {
      verify: (response) => {
        // What was really sent (ws normalises the URL), which is what the agent signs.
        const sent = (response as IncomingMessage & { req?: { method?: string; path?: string } }).req;
        const subject = { nonce, method: sent?.method ?? 'GET', target: sent?.path ?? agentPath, status: response.statusCode ?? 0 };
        if (verifyAgentProof(key, subject, response.headers[AGENT_PROOF_HEADER])) return undefined;
        return this.forgedAnswer(`the WebSocket ${agentPath}`, response.statusCode).message;
      },
    });
  }

  private connectionError(error: unknown): unknown {
    if (error instanceof AgentRequestError) return error;
    const code = errnoCode(error);
    const reason = (error as Error)?.message ?? String(error);
    if (code && UNREACHABLE_CODES.has(code)) {
      return new AgentRequestError(503, 'host_unavailable', `guest agent is not reachable at ${this.socketPath}: ${reason}`);
    }
    if (code === 'ECONNRESET' || code === 'ETIMEDOUT' || code === 'EPIPE') {
      return new AgentRequestError(503, 'host_unavailable', `guest agent connection failed at ${this.socketPath}: ${reason}`);
    }
    return error;
  }

  private async requestJson<T>(schema: z.ZodType<T>, options: AgentHttpRequest): Promise<T> {
    const response = await this.request({
      ...options,
      headers: { accept: 'application/json', ...options.headers },
    });
    if (!isSuccess(response)) throw await agentErrorFrom(response);
    const text = (await readAll(response)).toString('utf8');
    let parsed: ReturnType<typeof schema.safeParse>;
    try {
      parsed = schema.safeParse(JSON.parse(text));
    } catch (error) {
      throw unexpectedAnswer(options, (error as Error).message);
    }
    if (!parsed.success) throw unexpectedAnswer(options, parsed.error.message);
    return parsed.data;
  }

  /**
   * Gives the agent this client's key (PUT /auth/key): a VM's agent, started by its image, has
   * none after a boot (then `previousKey` is undefined), or, restored from a memory snapshot,
   * the key of the boot it was taken of (`previousKey`, which proves we may replace it). The
   * answer must already be proven under the new key.
   */
  async installKey(previousKey?: Buffer): Promise<void> {
    if (!this.proofKey) throw new Error('installKey needs a client with a proof key');
    const response = await this.request({
      method: 'PUT',
      path: AGENT_KEY_ROUTE,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ key: encodeAgentKey(this.proofKey) }),
      rekeyFrom: previousKey,
    });
    if (!isSuccess(response)) throw await agentErrorFrom(response);
    response.resume();
  }

  health(options: { timeoutMs?: number } = {}): Promise<HealthResponse> {
    return this.requestJson(HealthResponse, { method: 'GET', path: '/health', timeoutMs: options.timeoutMs });
  }

  /** Polls /health until the agent answers; a booting sandbox has no listener yet. */
  async waitReady(options: { timeoutMs?: number; intervalMs?: number } = {}): Promise<HealthResponse> {
    const timeoutMs = options.timeoutMs ?? 10_000;
    const intervalMs = options.intervalMs ?? 100;
    const deadline = Date.now() + timeoutMs;
    let lastFailure: unknown;
    for (;;) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) break;
      try {
        return await this.health({ timeoutMs: Math.max(remaining, 1) });
      } catch (error) {
        // An attempt that failed only when the deadline came (it was given what time was left)
        // says nothing new: the failure before it, say a refused proof, is the reason to report.
        if (lastFailure === undefined || Date.now() < deadline) lastFailure = error;
      }
      if (deadline - Date.now() <= 0) break;
      await sleep(Math.min(intervalMs, Math.max(deadline - Date.now(), 0)));
    }
    const last = (lastFailure as Error | undefined)?.message ?? 'no attempt completed';
    throw new AgentRequestError(503, 'host_unavailable', `guest agent at ${this.socketPath} was not ready within ${timeoutMs} ms; last failure: ${last}`);
  }

  exec(request: ExecRequest): Promise<ExecResponse> {
    return this.requestJson(ExecResponse, {
      method: 'POST',
      path: '/exec',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(request),
    });
  }

  /** Resolves with the streaming body of a 200/206 response; rejects with the agent's error. */
  async readFile(path: string, options: { range?: ByteRangeRequest } = {}): Promise<IncomingMessage> {
    const headers: OutgoingHttpHeaders = {};
    if (options.range) headers.range = `bytes=${options.range.start}-${options.range.end ?? ''}`;
    const response = await this.request({ method: 'GET', path: withQuery('/files/content', { path }), headers });
    if (!isSuccess(response)) throw await agentErrorFrom(response);
    return response;
  }

  /** Streams `body` into the file (created with parents, replaced atomically). */
  writeFile(path: string, body: Readable, options: { mode?: string | number } = {}): Promise<FileInfo> {
    const mode = typeof options.mode === 'number' ? options.mode.toString(8).padStart(3, '0') : options.mode;
    return this.requestJson(FileInfo, {
      method: 'PUT',
      path: withQuery('/files/content', { path, mode }),
      headers: { 'content-type': 'application/octet-stream' },
      body,
    });
  }

  list(path?: string): Promise<ListResponse> {
    return this.requestJson(ListResponse, { method: 'GET', path: withQuery('/files/list', { path }) });
  }

  stat(path: string): Promise<FileInfo> {
    return this.requestJson(FileInfo, { method: 'GET', path: withQuery('/files/stat', { path }) });
  }
}

function unexpectedAnswer(options: AgentHttpRequest, detail: string): AgentRequestError {
  return new AgentRequestError(502, 'internal', `guest agent sent an unexpected answer to ${options.method} ${options.path}: ${detail}`);
}

function withQuery(route: string, params: Record<string, string | undefined>): string {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value !== undefined) query.set(name, value);
  const text = query.toString();
  return text ? `${route}?${text}` : route;
}
