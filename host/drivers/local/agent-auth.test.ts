// Issue 11, finding 7 (authenticated channel): the host agent must tell a forged guest agent
// from the real one. A real local-driver sandbox behind a real HostAgentServer; the real agent
// is accepted (HTTP, streamed bodies, WebSockets, adoption after a host-agent restart), and an
// impersonator on the agent's socket — what a workload that took over the agent would be — is
// refused on every path, also when it replays a proof it saw earlier.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, unlinkSync } from 'node:fs';
import http from 'node:http';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { WebSocket, WebSocketServer } from 'ws';
import { AGENT_NONCE_HEADER, AGENT_PROOF_HEADER } from '../../agent-protocol/auth.js';
import { AGENT_KEY_FILE } from '../../agent-protocol/key-file.js';
import { HostAgentServer } from '../../agent/server.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver } from './driver.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const SECRET = 'host-secret-for-the-agent-auth-test';
const isRoot = process.getuid?.() === 0;

function spec(id: string): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 256, env: {} };
}

interface Answer {
  status: number;
  body: string;
}

function call(port: number, method: string, path: string, body?: unknown): Promise<Answer> {
  return new Promise((resolveCall, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, method, path, headers: { authorization: `Bearer ${SECRET}`, ...(text ? { 'content-type': 'application/json' } : {}) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => resolveCall({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.setTimeout(30_000, () => req.destroy(new Error('no answer within 30 s')));
    req.on('error', reject);
    req.end(text);
  });
}

/** Opens a WebSocket through the host agent: the messages until close, or the refusal's status and body. */
function webSocket(port: number, path: string): Promise<{ opened: boolean; status?: number; body?: string; messages: string[] }> {
  return new Promise((resolveWs) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}${path}`, { headers: { authorization: `Bearer ${SECRET}` } });
    const messages: string[] = [];
    const timer = setTimeout(() => ws.terminate(), 20_000);
    ws.on('message', (data) => messages.push(String(data)));
    ws.on('close', () => {
      clearTimeout(timer);
      resolveWs({ opened: true, messages });
    });
    ws.on('unexpected-response', (_req, res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        clearTimeout(timer);
        resolveWs({ opened: false, status: res.statusCode, body: Buffer.concat(chunks).toString('utf8'), messages });
      });
    });
    ws.on('error', () => {});
  });
}

/** Host pid of the sandbox's guest agent (node running the bundle, in the sandbox's cgroup). */
function agentPid(id: string): number {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline.includes('/.nestbox/lib/guest-agent.mjs') && !cmdline.includes('tini') && readFileSync(`/proc/${entry}/cgroup`, 'utf8').includes(id)) return Number(entry);
    } catch {
      // Gone meanwhile.
    }
  }
  throw new Error(`no guest agent process found for ${id}`);
}

describe.skipIf(!isRoot)('guest agent proofs (real local driver, real host agent)', () => {
  const dataDir = mkdtempSync('/tmp/nbxa-');
  const ownerId = `auth${randomBytes(4).toString('hex')}`;
  const id = `auth${randomBytes(4).toString('hex')}`;
  const drivers: LocalDriver[] = [];
  const servers: HostAgentServer[] = [];
  const logs: string[] = [];
  let port = 0;
  let stoppedAgent: number | undefined;

  function newDriver(): LocalDriver {
    const driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, watchIntervalMs: 500, slotPoolSize: 0 });
    drivers.push(driver);
    return driver;
  }

  async function newHostAgent(driver: LocalDriver): Promise<number> {
    const server = new HostAgentServer({ hostId: 'auth-test', secret: SECRET, driver, logger: pino({}, { write: (line: string) => logs.push(line) }) });
    servers.push(server);
    return server.listen(0, '127.0.0.1');
  }

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('node', [join(REPO, 'scripts', 'bundle-guest-agent.mjs')], { cwd: REPO, stdio: 'inherit' });
    const driver = newDriver();
    await driver.init();
    port = await newHostAgent(driver);
    await driver.create(spec(id));
  }, 300_000);

  afterAll(async () => {
    if (stoppedAgent) {
      try {
        process.kill(stoppedAgent, 'SIGCONT');
      } catch {
        // Gone.
      }
    }
    for (const server of servers) await server.close().catch(() => {});
    const cleaner = newDriver();
    await cleaner.init().catch(() => {});
    await cleaner.destroy(id).catch(() => {});
    for (const driver of drivers) await driver.close();
    const cgroups = await Cgroups.detect();
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }, 60_000);

  it('accepts the real agent, and keeps the key on the host side only', async () => {
    const exec = await call(port, 'POST', `/v1/sandboxes/${id}/agent/exec`, { cmd: 'echo real' });
    expect(exec.status).toBe(200);
    expect(JSON.parse(exec.body)).toMatchObject({ exitCode: 0, stdout: 'real\n' });
    // A streamed body (file content) through the same checks.
    const file = await call(port, 'GET', `/v1/sandboxes/${id}/agent/files/content?path=%2Fetc%2Fhostname`);
    expect(file).toEqual({ status: 200, body: `${id}\n` });

    // WebSocket: a process's event stream, upgraded only after the 101 proved itself.
    const started = await call(port, 'POST', `/v1/sandboxes/${id}/agent/processes`, { cmd: 'echo streamed' });
    expect(started.status).toBe(201);
    const { processId } = JSON.parse(started.body) as { processId: string };
    const events = await webSocket(port, `/v1/sandboxes/${id}/agent/processes/${processId}/events`);
    expect(events.opened).toBe(true);
    expect(events.messages.map((m) => JSON.parse(m) as { type: string }).some((m) => m.type === 'exit')).toBe(true);

    // The key: beside record.json, 0600; nowhere a workload can read it (environment, argv,
    // files under /.nestbox or /proc), and the agent no longer holds the descriptor it came on.
    const keyPath = join(dataDir, 'sandboxes', id, AGENT_KEY_FILE);
    expect(statSync(keyPath).mode & 0o777).toBe(0o600);
    const key = readFileSync(keyPath, 'utf8').trim();
    expect(key).toMatch(/^[0-9a-f]{64}$/);
    // The key came on one end of a socket pair, which tini (the agent's parent) still holds,
    // drained; the agent itself must have closed its copy.
    const pid = agentPid(id);
    const tini = Number(/^PPid:\s+(\d+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]);
    const channel = readlinkSync(`/proc/${tini}/fd/3`);
    expect(channel).toMatch(/^socket:/);
    const agentLinks = readdirSync(`/proc/${pid}/fd`).map((fd) => {
      try {
        return readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        return '';
      }
    });
    expect(agentLinks).not.toContain(channel);
    const search = await call(port, 'POST', `/v1/sandboxes/${id}/agent/exec`, {
      // The key is never spelled out in this command's own argv (which the loop reads too):
      // grep takes it in two halves through a pipe (the first count is a control: it must find it).
      cmd: `k() { printf '%s%s\\n' ${key.slice(0, 32)} ${key.slice(32)}; }; k | grep -cFf <(k); for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; done | grep -cFf <(k); grep -rlFf <(k) /.nestbox /root /tmp 2>/dev/null | wc -l; cat /proc/1/fd/3 2>&1 | grep -cFf <(k)`,
    });
    expect(JSON.parse(search.body)).toMatchObject({ stdout: '1\n0\n0\n0\n' });
  });

  it('adopts the sandbox after a host-agent restart: the stored key still proves the agent', async () => {
    const restarted = newDriver();
    await restarted.init();
    expect(await restarted.get(id)).toMatchObject({ status: 'running' });
    const restartedPort = await newHostAgent(restarted);
    const exec = await call(restartedPort, 'POST', `/v1/sandboxes/${id}/agent/exec`, { cmd: 'echo adopted' });
    expect(JSON.parse(exec.body)).toMatchObject({ exitCode: 0, stdout: 'adopted\n' });
  });

  it('refuses an impersonator on the agent socket: exec, files, WebSockets, adoption, replayed proofs', async () => {
    // Capture a genuine proof first: the impersonator replays it, as one that watched earlier
    // traffic would.
    const runtime = await drivers[0].get(id);
    const genuine = await new Promise<string>((resolveProof, reject) => {
      const req = http.request({ socketPath: runtime!.agentSocket!, path: '/health', headers: { [AGENT_NONCE_HEADER]: '0'.repeat(32) } }, (res) => {
        res.resume();
        resolveProof(String(res.headers[AGENT_PROOF_HEADER]));
      });
      req.on('error', reject);
      req.end();
    });
    expect(genuine).toMatch(/^[0-9a-f]{64}$/);

    // The attack: the real agent stopped, something else answering on its socket with
    // plausible, "successful" answers.
    stoppedAgent = agentPid(id);
    process.kill(stoppedAgent, 'SIGSTOP');
    const socketPath = runtime!.agentSocket!;
    unlinkSync(socketPath);
    const seen: string[] = [];
    const forged = http.createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      req.resume();
      const body = req.url?.startsWith('/exec')
        ? JSON.stringify({ exitCode: 0, signal: null, timedOut: false, stdout: 'forged\n', stderr: '', durationMs: 1, truncated: false })
        : req.url?.startsWith('/health')
          ? JSON.stringify({ status: 'ok', protocolVersion: 1, pid: 2, uptimeMs: 5 })
          : 'forged file content';
      res.writeHead(200, { 'content-type': 'application/json', [AGENT_PROOF_HEADER]: genuine });
      res.end(body);
    });
    const forgedWs = new WebSocketServer({ noServer: true });
    forgedWs.on('headers', (headers) => headers.push(`${AGENT_PROOF_HEADER}: ${genuine}`));
    forged.on('upgrade', (req, socket, head) => {
      seen.push(`WS ${req.url}`);
      forgedWs.handleUpgrade(req, socket, head, (ws) => ws.send(JSON.stringify({ type: 'exit', status: 'exited', exitCode: 0, signal: null, timedOut: false })));
    });
    await new Promise<void>((resolveListen) => forged.listen(socketPath, resolveListen));
    // A host agent without kept-alive connections to the (now stopped) real agent, so every
    // request below dials the socket path anew and meets the impersonator.
    const port = await newHostAgent(drivers[0]);
    try {
      const exec = await call(port, 'POST', `/v1/sandboxes/${id}/agent/exec`, { cmd: 'echo real' });
      expect(exec.status).toBe(502);
      expect(JSON.parse(exec.body)).toMatchObject({ error: { code: 'agent_unavailable' } });
      expect(exec.body).not.toContain('forged');

      const file = await call(port, 'GET', `/v1/sandboxes/${id}/agent/files/content?path=%2Fetc%2Fhostname`);
      expect(file.status).toBe(502);
      expect(file.body).not.toContain('forged');

      const ws = await webSocket(port, `/v1/sandboxes/${id}/agent/processes/p1/events`);
      expect(ws).toMatchObject({ opened: false, status: 502 });
      expect(JSON.parse(ws.body!)).toMatchObject({ error: { code: 'agent_unavailable' } });

      // The impersonator did get every request: the refusals above are the proof check's.
      expect(seen).toEqual(expect.arrayContaining(['POST /exec', 'GET /files/content?path=%2Fetc%2Fhostname', 'WS /processes/p1/events']));
      expect(logs.some((line) => line.includes('guest agent answer refused'))).toBe(true);

      // A restarted host agent does not adopt it either: its health answer proves nothing.
      const restarted = newDriver();
      await restarted.init();
      expect(await restarted.get(id)).toEqual({ id, status: 'stopped' });
      expect(seen).toContain('GET /health');
    } finally {
      await new Promise<void>((resolveClose) => forged.close(() => resolveClose()));
      forged.closeAllConnections();
    }
  });
});
