// Test support for the process routes: an in-process agent with a freshly compiled pty helper,
// JSON calls, and WebSocket/SSE readers. Every wait is bounded in time.
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { WebSocket } from 'ws';
import { AgentClient } from '../../agent-protocol/client.js';
import type { ProcessEvent, ProcessInfo } from '../../agent-protocol/processes.js';
import type { AgentServerOptions } from '../server.js';
import { startTestAgent, type TestAgent } from '../testing.js';

let compiledHelper: string | undefined;

/** Compiles nestbox-pty.c (with nestbox-xattr.c) once per test process, so tests always run the current source. */
export function ptyHelperPath(): string {
  if (!compiledHelper) {
    const source = resolve(fileURLToPath(import.meta.url), '../../pty-helper/nestbox-pty.c');
    // The binary also carries the file-metadata mode (nestbox-xattr.c).
    const xattrSource = resolve(fileURLToPath(import.meta.url), '../../pty-helper/nestbox-xattr.c');
    const output = join(mkdtempSync(join(tmpdir(), 'nestbox-pty-')), 'nestbox-pty');
    execFileSync('cc', ['-O2', '-Wall', '-o', output, source, xattrSource]);
    compiledHelper = output;
  }
  return compiledHelper;
}

export interface ProcessTestAgent extends TestAgent {
  client: AgentClient;
  call(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<{ status: number; json: any; text: string }>;
  start(body: Record<string, unknown>): Promise<ProcessInfo>;
  waitForEnd(id: string, timeoutMs?: number): Promise<ProcessInfo>;
  wsUrl(path: string): string;
}

export async function startProcessTestAgent(options: Partial<AgentServerOptions> = {}): Promise<ProcessTestAgent> {
  const agent = await startTestAgent({
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LANG: 'C.UTF-8' },
    ...options,
    processes: { ptyHelper: ptyHelperPath(), ...options.processes },
  });
  const client = new AgentClient(agent.socketPath);
  const call: ProcessTestAgent['call'] = async (method, path, body, headers = {}) => {
    const payload = body === undefined ? undefined : Buffer.isBuffer(body) || typeof body === 'string' ? body : JSON.stringify(body);
    const response = await client.request({ method, path, body: payload, headers: { 'content-type': 'application/json', ...headers } });
    const chunks: Buffer[] = [];
    for await (const chunk of response) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    let json: any;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    return { status: response.statusCode ?? 0, json, text };
  };
  const start: ProcessTestAgent['start'] = async (body) => {
    const { status, json } = await call('POST', '/processes', body);
    if (status !== 201) throw new Error(`start failed: ${status} ${JSON.stringify(json)}`);
    return json as ProcessInfo;
  };
  const waitForEnd: ProcessTestAgent['waitForEnd'] = async (id, timeoutMs = 10_000) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const { json } = await call('GET', `/processes/${id}`);
      if (json.status !== 'running') return json as ProcessInfo;
      if (Date.now() > deadline) throw new Error(`process ${id} still running after ${timeoutMs} ms`);
      await sleep(20);
    }
  };
  return {
    ...agent,
    client,
    call,
    start,
    waitForEnd,
    wsUrl: (path) => `ws+unix://${agent.socketPath}:${path}`,
    async stop() {
      client.close();
      await agent.stop();
    },
  };
}

export async function waitUntil<T>(probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 10_000, what = 'condition'): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`${what} not met within ${timeoutMs} ms`);
    await sleep(20);
  }
}

export interface CollectedEvents {
  events: ProcessEvent[];
  closeCode: number | undefined;
  stdout: Buffer;
  stderr: Buffer;
}

/**
 * Reads events over a WebSocket until the server closes it, or until `stopWhen` says to
 * disconnect (then the socket is closed by us). Bounded by timeoutMs.
 */
export function collectEvents(url: string, stopWhen?: (collected: CollectedEvents) => boolean, timeoutMs = 20_000): Promise<CollectedEvents> {
  return new Promise((resolvePromise, reject) => {
    const collected: CollectedEvents = { events: [], closeCode: undefined, stdout: Buffer.alloc(0), stderr: Buffer.alloc(0) };
    const ws = new WebSocket(url);
    const timer = setTimeout(() => {
      ws.terminate();
      reject(new Error(`events did not finish within ${timeoutMs} ms`));
    }, timeoutMs);
    let stopped = false;
    ws.on('message', (data) => {
      if (stopped) return;
      const event = JSON.parse(data.toString()) as ProcessEvent;
      collected.events.push(event);
      if (event.type === 'stdout' || event.type === 'stderr') {
        collected[event.type] = Buffer.concat([collected[event.type], Buffer.from(event.data, 'base64')]);
      }
      if (stopWhen?.(collected)) {
        stopped = true;
        ws.close();
      }
    });
    ws.on('close', (code) => {
      clearTimeout(timer);
      collected.closeCode = code;
      resolvePromise(collected);
    });
    ws.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
  });
}
