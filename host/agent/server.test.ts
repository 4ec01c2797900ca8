// The host agent's HTTP/WebSocket surface. The driver here is a small in-memory stand-in whose
// "guest agent" is a plain HTTP + WebSocket server on a Unix socket: this file tests the host
// agent's routing, auth and relaying; the real driver is exercised in test/ and drivers/local/.
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/logger.js';
import { WebSocket, WebSocketServer } from 'ws';
import { DriverError } from '../drivers/errors.js';
import type { Driver, FileView, ForkResult, SandboxRuntime, SandboxSpec, SnapshotInfo, SnapshotResult, StartResult } from '../drivers/types.js';
import { HostAgentServer } from './server.js';

const SECRET = 'a-host-secret-of-enough-length';

class StandInDriver implements Driver {
  readonly name = 'local' as const;
  readonly sandboxes = new Map<string, SandboxRuntime>();
  readonly snapshots = new Map<string, SnapshotInfo>();
  readonly snapshotUsers = new Map<string, string>();
  fileViewsOpened = 0;
  constructor(private readonly socket: string) {}
  async init() {}
  capabilities() {
    return { memorySnapshot: false, fork: true, pause: true, nestedVirt: false, hotResize: false, maxVcpus: 1, probes: {} };
  }
  private require(id: string): SandboxRuntime {
    const runtime = this.sandboxes.get(id);
    if (!runtime) throw new DriverError('not_found', `sandbox ${id} not found`);
    return runtime;
  }
  async create(spec: SandboxSpec) {
    if (spec.snapshot) {
      if (!this.snapshots.has(spec.snapshot)) throw new DriverError('not_found', `snapshot ${spec.snapshot} not found on this host`);
      this.snapshotUsers.set(spec.snapshot, spec.id);
    }
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
    for (const [snapshot, user] of this.snapshotUsers) if (user === id) this.snapshotUsers.delete(snapshot);
  }
  async pause(id: string) {
    const runtime = this.require(id);
    if (runtime.status === 'stopped') throw new DriverError('invalid_state', `sandbox ${id} is stopped, not running`);
    runtime.status = 'paused';
    return runtime;
  }
  async unpause(id: string) {
    const runtime = this.require(id);
    if (runtime.status === 'stopped') throw new DriverError('invalid_state', `sandbox ${id} is stopped, not paused`);
    runtime.status = 'running';
    return runtime;
  }
  async fork(sourceId: string, children: SandboxSpec[]): Promise<ForkResult> {
    this.require(sourceId);
    for (const child of children) if (this.sandboxes.has(child.id)) throw new DriverError('conflict', `sandbox ${child.id} already exists`);
    return { children: await Promise.all(children.map((child) => this.create(child))), memoryCopied: false, diskCopy: 'copy' };
  }
  async snapshot(id: string, snapshotId: string): Promise<SnapshotResult> {
    this.require(id);
    const info: SnapshotInfo = { snapshotId, sizeBytes: 42, diskCopy: 'copy', layers: [snapshotId], sourceId: id, image: 'default', createdAt: new Date(0).toISOString() };
    this.snapshots.set(snapshotId, info);
    const { sourceId: _source, image: _image, createdAt: _created, ...result } = info;
    return result;
  }
  async deleteSnapshot(snapshotId: string) {
    const user = this.snapshotUsers.get(snapshotId);
    if (user) throw Object.assign(new Error(`snapshot ${snapshotId} is in use by sandbox ${user}`), { code: 'conflict' });
    this.snapshots.delete(snapshotId);
  }
  async listSnapshots() {
    return [...this.snapshots.values()];
  }
  async fileView(id: string): Promise<FileView> {
    if (this.require(id).status !== 'stopped') throw new DriverError('invalid_state', `sandbox ${id} is running`);
    this.fileViewsOpened++;
    return { agentSocket: this.socket, viewId: 'view-1' };
  }
  touchFileView() {}
  async get(id: string) {
    return this.sandboxes.get(id);
  }
  async list() {
    return [...this.sandboxes.values()];
  }
  async close() {}
  async usage() {
    return [];
  }
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
  host = new HostAgentServer({ hostId: 'h1', secret: SECRET, driver: new StandInDriver(socket), logger: silentLogger });
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

  it('answers the image routes 501 for a driver without an image store, after validating their input', async () => {
    const image = `sha256:${'a'.repeat(64)}`;
    const list = await fetch(`${base}/v1/images`, { headers: auth });
    expect(list.status).toBe(501);
    expect((await list.json()).error.code).toBe('not_supported');
    expect((await fetch(`${base}/v1/images/${image}`, { method: 'DELETE', headers: auth })).status).toBe(501);
    expect((await fetch(`${base}/v1/images/pull`, { method: 'POST', headers: auth, body: JSON.stringify({ reference: 'busybox' }) })).status).toBe(501);
    const badBody = await fetch(`${base}/v1/images/pull`, { method: 'POST', headers: auth, body: JSON.stringify({ reference: '' }) });
    expect(badBody.status).toBe(400);
    expect((await badBody.json()).error.message).toMatch(/^reference:/);
    expect((await fetch(`${base}/v1/images/not-an-id`, { method: 'DELETE', headers: auth })).status).toBe(400);
    expect((await fetch(`${base}/v1/images/pull`, { headers: auth })).status).toBe(405);
    expect((await fetch(`${base}/v1/images`, { method: 'POST', headers: auth })).status).toBe(405);
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

  it('pauses and unpauses; a paused sandbox\'s agent answers 409 at once; wrong states are 409, unknown ids 404', async () => {
    await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('pz')) });
    const paused = await fetch(`${base}/v1/sandboxes/pz/pause`, { method: 'POST', headers: auth });
    expect(paused.status).toBe(200);
    expect(await paused.json()).toEqual({ id: 'pz', status: 'paused' });
    const agent = await fetch(`${base}/v1/sandboxes/pz/agent/health`, { headers: auth });
    expect(agent.status).toBe(409);
    expect((await agent.json()).error).toMatchObject({ code: 'invalid_state', message: expect.stringContaining('paused') });
    const listed = await (await fetch(`${base}/v1/sandboxes`, { headers: auth })).json();
    expect(listed.sandboxes).toContainEqual({ id: 'pz', status: 'paused' });
    const unpaused = await fetch(`${base}/v1/sandboxes/pz/unpause`, { method: 'POST', headers: auth });
    expect(await unpaused.json()).toEqual({ id: 'pz', status: 'running' });
    await fetch(`${base}/v1/sandboxes/pz/stop`, { method: 'POST', headers: auth });
    const pauseStopped = await fetch(`${base}/v1/sandboxes/pz/pause`, { method: 'POST', headers: auth });
    expect(pauseStopped.status).toBe(409);
    expect((await pauseStopped.json()).error.code).toBe('invalid_state');
    expect((await fetch(`${base}/v1/sandboxes/nosuch/pause`, { method: 'POST', headers: auth })).status).toBe(404);
    expect((await fetch(`${base}/v1/sandboxes/nosuch/unpause`, { method: 'POST', headers: auth })).status).toBe(404);
  });

  it('forks, validating the children and mapping a taken id to 409', async () => {
    await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('fsrc')) });
    const forked = await fetch(`${base}/v1/sandboxes/fsrc/fork`, { method: 'POST', headers: auth, body: JSON.stringify({ children: [spec('fa'), spec('fb')] }) });
    expect(forked.status).toBe(200);
    expect(await forked.json()).toEqual({ children: [{ id: 'fa', status: 'running' }, { id: 'fb', status: 'running' }], memoryCopied: false, diskCopy: 'copy' });
    const taken = await fetch(`${base}/v1/sandboxes/fsrc/fork`, { method: 'POST', headers: auth, body: JSON.stringify({ children: [spec('fa')] }) });
    expect(taken.status).toBe(409);
    expect((await taken.json()).error.code).toBe('conflict');
    const none = await fetch(`${base}/v1/sandboxes/fsrc/fork`, { method: 'POST', headers: auth, body: JSON.stringify({ children: [] }) });
    expect(none.status).toBe(400);
    const badChild = await fetch(`${base}/v1/sandboxes/fsrc/fork`, { method: 'POST', headers: auth, body: JSON.stringify({ children: [{ ...spec('fc'), cpu: 0 }] }) });
    expect(badChild.status).toBe(400);
    expect((await fetch(`${base}/v1/sandboxes/nosuch/fork`, { method: 'POST', headers: auth, body: JSON.stringify({ children: [spec('fd')] }) })).status).toBe(404);
  });

  it('snapshots: create (201), list, create a sandbox from one (404 when absent), delete (409 in use, then 204)', async () => {
    await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('snsrc')) });
    const saved = await fetch(`${base}/v1/sandboxes/snsrc/snapshot`, { method: 'POST', headers: auth, body: JSON.stringify({ snapshotId: 'tpl-1' }) });
    expect(saved.status).toBe(201);
    expect(await saved.json()).toEqual({ snapshotId: 'tpl-1', sizeBytes: 42, diskCopy: 'copy', layers: ['tpl-1'] });
    const badName = await fetch(`${base}/v1/sandboxes/snsrc/snapshot`, { method: 'POST', headers: auth, body: JSON.stringify({ snapshotId: 'a:b' }) });
    expect(badName.status).toBe(400);
    const listed = await (await fetch(`${base}/v1/snapshots`, { headers: auth })).json();
    expect(listed.snapshots).toEqual([expect.objectContaining({ snapshotId: 'tpl-1', sourceId: 'snsrc', layers: ['tpl-1'] })]);

    const missing = await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify({ ...spec('fromx'), snapshot: 'nope' }) });
    expect(missing.status).toBe(404);
    expect((await missing.json()).error.code).toBe('not_found');
    const fromSnap = await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify({ ...spec('fromt'), snapshot: 'tpl-1' }) });
    expect(fromSnap.status).toBe(201);

    const inUse = await fetch(`${base}/v1/snapshots/tpl-1`, { method: 'DELETE', headers: auth });
    expect(inUse.status).toBe(409);
    expect((await inUse.json()).error).toMatchObject({ code: 'conflict', message: expect.stringContaining('fromt') });
    await fetch(`${base}/v1/sandboxes/fromt`, { method: 'DELETE', headers: auth });
    expect((await fetch(`${base}/v1/snapshots/tpl-1`, { method: 'DELETE', headers: auth })).status).toBe(204);
    expect((await fetch(`${base}/v1/snapshots/tpl-1`, { method: 'DELETE', headers: auth })).status).toBe(204);
    expect((await fetch(`${base}/v1/snapshots/bad:id`, { method: 'DELETE', headers: auth })).status).toBe(400);
    expect((await fetch(`${base}/v1/snapshots`, { method: 'POST', headers: auth })).status).toBe(405);
  });

  it('serves a stopped sandbox\'s files through files-view, and refuses it for a running one', async () => {
    await fetch(`${base}/v1/sandboxes`, { method: 'POST', headers: auth, body: JSON.stringify(spec('fv')) });
    const running = await fetch(`${base}/v1/sandboxes/fv/files-view/files/list?path=%2F`, { headers: auth });
    expect(running.status).toBe(409);
    expect((await running.json()).error.message).toContain('/agent');
    await fetch(`${base}/v1/sandboxes/fv/stop`, { method: 'POST', headers: auth });
    const body = Buffer.from('read through the view');
    const viewed = await fetch(`${base}/v1/sandboxes/fv/files-view/files/content?path=%2Froot%2Fa`, { method: 'POST', headers: auth, body });
    expect(viewed.status).toBe(200);
    expect(Buffer.from(await viewed.arrayBuffer()).equals(body)).toBe(true);
    expect((await fetch(`${base}/v1/sandboxes/nosuch/files-view/files/list`, { headers: auth })).status).toBe(404);
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
