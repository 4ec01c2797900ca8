// The host agent's HTTP/WebSocket surface. The driver here is a small in-memory stand-in whose
// "guest agent" is a plain HTTP + WebSocket server on a Unix socket: this file tests the host
// agent's routing, auth and relaying; the real driver is exercised in test/ and drivers/local/.
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket, WebSocketServer } from 'ws';
import type { Driver, SandboxRuntime, SandboxSpec, StartResult } from '../drivers/types.js';
import { HostAgentServer } from './server.js';

const SECRET = 'a-host-secret-of-enough-length';

class StandInDriver implements Driver {
  readonly name = 'local' as const;
  readonly sandboxes = new Map<string, SandboxRuntime>();
  constructor(private readonly socket: string) {}
  async init() {}
  capabilities() {
    return { memorySnapshot: false, fork: false, pause: false, nestedVirt: false, hotResize: false, maxVcpus: 1, probes: {} };
  }
  async create(spec: SandboxSpec) {
    const runtime: SandboxRuntime = { id: spec.id, status: 'running', agentSocket: this.socket };
    this.sandboxes.set(spec.id, runtime);
    return runtime;
  }
  async stop(id: string) {
    this.sandboxes.set(id, { id, status: 'stopped' });
    return { memorySaved: false };
  }
  async start(spec: SandboxSpec): Promise<StartResult> {
    return { ...(await this.create(spec)), memoryRestored: false, resumeReason: 'driver_has_no_memory_snapshot' };
  }
  async destroy(id: string) {
    this.sandboxes.delete(id);
  }
  async get(id: string) {
    return this.sandboxes.get(id);
  }
  async list() {
    return [...this.sandboxes.values()];
  }
  async close() {}
}

let dir: string;
let guest: http.Server;
let host: HostAgentServer;
let base: string;
const auth = { authorization: `Bearer ${SECRET}` };
const spec = (id: string) => ({ id, image: 'default', cpu: 1, memoryMiB: 256, env: {} });

beforeAll(async () => {
  dir = mkdtempSync('/tmp/nbx-ha-');
  const socket = join(dir, 'guest.sock');
  // Stand-in guest agent: echoes bodies back, and echoes WebSocket messages with their framing.
  guest = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'x-path': req.url ?? '' });
    req.pipe(res);
  });
  const wss = new WebSocketServer({ server: guest });
  wss.on('connection', (ws, req) => {
    ws.send(`hello ${req.url}`);
    ws.on('message', (data, isBinary) => {
      if (!isBinary && data.toString() === 'bye') return ws.close(4001, 'asked to');
      ws.send(data, { binary: isBinary });
    });
  });
  await new Promise<void>((r) => guest.listen(socket, () => r()));
  host = new HostAgentServer({ hostId: 'h1', secret: SECRET, driver: new StandInDriver(socket), log: () => {} });
  base = `http://127.0.0.1:${await host.listen(0, '127.0.0.1')}`;
});

afterAll(async () => {
  await host.close();
  await new Promise((r) => guest.close(r));
  rmSync(dir, { recursive: true, force: true });
});

describe('host agent API', () => {
  it('refuses requests without the host secret', async () => {
    expect((await fetch(`${base}/v1/sandboxes`)).status).toBe(401);
    expect((await fetch(`${base}/v1/sandboxes`, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
  });

  it('validates specs and ids, and answers unknown sandboxes with 404', async () => {
    const bad = await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify({ ...spec('abc'), cpu: 'x' }) });
    expect(bad.status).toBe(400);
    expect((await bad.json()).error.message).toMatch(/^cpu:/);
    expect((await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: '{' })).status).toBe(400);
    expect((await fetch(`${base}/v1/sandboxes/NOT_AN_ID`, { headers: auth })).status).toBe(400);
    expect((await fetch(`${base}/v1/sandboxes/missing`, { headers: auth })).status).toBe(404);
    expect((await fetch(`${base}/v1/sandboxes/missing/stop`, { method: 'POST', headers: auth })).status).toBe(404);
  });

  it('creates once, refuses a duplicate, stops, starts and deletes', async () => {
    const created = await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('one')) });
    expect(created.status).toBe(201);
    expect((await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('one')) })).status).toBe(409);
    expect(await (await fetch(`${base}/v1/sandboxes/one/stop`, { method: 'POST', headers: auth })).json()).toEqual({ memorySaved: false });
    const agentWhileStopped = await fetch(`${base}/v1/sandboxes/one/agent/health`, { headers: auth });
    expect(agentWhileStopped.status).toBe(409);
    const started = await fetch(`${base}/v1/sandboxes/one/start`, { method: 'POST', headers: auth, body: JSON.stringify(spec('one')) });
    expect(await started.json()).toMatchObject({ status: 'running', memoryRestored: false });
    const mismatch = await fetch(`${base}/v1/sandboxes/one/start`, { method: 'POST', headers: auth, body: JSON.stringify(spec('two')) });
    expect(mismatch.status).toBe(400);
    expect((await fetch(`${base}/v1/sandboxes/one`, { method: 'DELETE', headers: auth })).status).toBe(204);
    expect((await fetch(`${base}/v1/sandboxes/one`, { headers: auth })).status).toBe(404);
  });

  it('passes agent requests through with path, query and body intact', async () => {
    await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('pass')) });
    const body = Buffer.alloc(3 * 1024 * 1024, 7);
    const res = await fetch(`${base}/v1/sandboxes/pass/agent/files/content?path=%2Ftmp%2Fa%20b`, { method: 'PUT', headers: auth, body });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-path')).toBeNull(); // only the known headers are passed on
    expect(Buffer.from(await res.arrayBuffer()).equals(body)).toBe(true);
  });

  it('relays WebSockets message by message, keeping text/binary framing and close codes', async () => {
    const ws = new WebSocket(`${base.replace('http', 'ws')}/v1/sandboxes/pass/agent/pty?cols=80`, { headers: auth });
    const received: (string | Buffer)[] = [];
    const closed = new Promise<[number, string]>((resolve) => ws.on('close', (code, reason) => resolve([code, reason.toString()])));
    ws.on('message', (data, isBinary) => received.push(isBinary ? Buffer.from(data as Buffer) : data.toString()));
    await new Promise((r) => ws.on('open', r));
    ws.send('text frame');
    ws.send(Buffer.from([0, 1, 2, 255]), { binary: true });
    await new Promise((r) => setTimeout(r, 100));
    ws.send('bye');
    expect(await closed).toEqual([4001, 'asked to']);
    expect(received[0]).toBe('hello /pty?cols=80');
    expect(received[1]).toBe('text frame');
    expect(Buffer.isBuffer(received[2]) && (received[2] as Buffer).equals(Buffer.from([0, 1, 2, 255]))).toBe(true);
  });

  it('refuses WebSocket upgrades without the secret or to a stopped sandbox', async () => {
    const attempt = (headers: Record<string, string>, id: string) =>
      new Promise<number>((resolve) => {
        const ws = new WebSocket(`${base.replace('http', 'ws')}/v1/sandboxes/${id}/agent/pty`, { headers });
        ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
        ws.on('open', () => resolve(101));
        ws.on('error', () => undefined);
      });
    expect(await attempt({}, 'pass')).toBe(401);
    expect(await attempt(auth, 'nosuch')).toBe(404);
  });
});
