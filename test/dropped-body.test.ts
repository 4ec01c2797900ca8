// Issue 11 finding 1: a client that announces a body, sends part of it and vanishes must never
// take the server down. The real program runs as its own process (supervised, as `npm start`
// runs it), so a crash would show as a new worker pid (or no answer at all on old code).
// Every streamed route of the three APIs gets headers plus a partial body, cut at several byte
// offsets, by a clean close (FIN) and by a reset (RST), on a running sandbox and on a paused
// one that the request is waking. Afterwards: the same worker and host agent still answer, and
// no half-sent file exists in the sandbox (nor its temp file).
import net from 'node:net';
import { gzipSync } from 'node:zlib';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServerProcess, waitFor, type TestServerProcess } from './harness.js';

let s: TestServerProcess;
let sandboxId: string;
let envdToken: string;
let stdinProcessId: string;
let workerPid: number;
let hostAgentPid: number;

const DECLARED = 1_000_000;
/** Where every dropped upload aims; must stay empty. */
const DROP_DIR = '/tmp/dropped';
/** Byte offsets at which the body is cut: none, tiny, one chunk, past the 16 KiB stream buffers. */
const OFFSETS = [0, 1, 10, 4096, 70_000];
/** A server in the sandbox that reads request bodies, behind a public hosted port. */
const PORT = 8000;
const BODY_READER = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get('content-length', 0)))
        self.send_response(200); self.send_header('content-length', '2'); self.end_headers(); self.wfile.write(b'ok')
http.server.ThreadingHTTPServer(('0.0.0.0', ${PORT}), H).serve_forever()
`;

async function sh(id: string, cmd: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const res = await s.http.post(`/api/v1/sandboxes/${id}/commands`).set(s.auth).send({ cmd });
  if (res.status !== 200) throw new Error(`command failed: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}

interface Drop {
  /** Request line and headers (without the blank line); Content-Length or chunked is added. */
  head: string[];
  /** The start of a well-formed body (a multipart preamble, a gzip stream); padded with bytes. */
  prefix?: Buffer;
  chunked?: boolean;
}

/**
 * Sends the head and `bytes` of the body, lets it reach the server, then closes (`reset`: RST).
 * `linger` (ms, or a condition to await) lets the server get further (streaming upstream, waking
 * the sandbox) before the cut.
 */
async function drop(d: Drop, bytes: number, reset: boolean, linger: number | (() => Promise<unknown>)): Promise<void> {
  const socket = net.connect(s.port, '127.0.0.1');
  socket.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  const head = [...d.head, d.chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${DECLARED}`, 'Connection: close', '', ''].join('\r\n');
  let body = Buffer.concat([d.prefix ?? Buffer.alloc(0), Buffer.alloc(Math.max(0, bytes - (d.prefix?.length ?? 0)), 0x61)]).subarray(0, bytes);
  // A chunk that announces more than is sent: the chunked body is cut inside it.
  if (d.chunked) body = Buffer.concat([Buffer.from(`${DECLARED.toString(16)}\r\n`), body]);
  await new Promise<void>((resolve) => socket.write(Buffer.concat([Buffer.from(head), body]), () => resolve()));
  if (typeof linger === 'function') await linger();
  else if (linger) await new Promise((r) => setTimeout(r, linger));
  if (reset) socket.resetAndDestroy();
  else socket.destroy();
}

function multipartPreamble(fields: [string, string][], fileField: string, filename: string): { prefix: Buffer; contentType: string } {
  const boundary = `nbx${randomBytes(6).toString('hex')}`;
  const parts = fields.map(([name, value]) => `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`);
  parts.push(`--${boundary}\r\nContent-Disposition: form-data; name="${fileField}"; filename="${filename}"\r\nContent-Type: application/octet-stream\r\n\r\n`);
  return { prefix: Buffer.from(parts.join('')), contentType: `multipart/form-data; boundary=${boundary}` };
}

/** Every streamed route (and the JSON-bodied stream endpoints) for sandbox `id`, aiming at `n`. */
function routes(id: string, n: string): Record<string, Drop> {
  const bearer = `Authorization: Bearer ${s.apiKey}`;
  const host = `Host: 127.0.0.1:${s.port}`;
  const envd = [host, `E2B-Sandbox-Id: ${id}`, 'E2B-Sandbox-Port: 49983', `X-Access-Token: ${envdToken}`];
  const nativeMultipart = multipartPreamble([['path', `${DROP_DIR}/native-mp-${n}`]], 'file', 'x');
  const daytonaSingle = multipartPreamble([], 'file', 'x');
  const daytonaBulk = multipartPreamble([['files[0].path', `${DROP_DIR}/dt-bulk-${n}`]], 'files[0].file', 'x');
  const e2bMultipart = multipartPreamble([], 'file', `${DROP_DIR}/e2b-mp-${n}`);
  const gzipped = gzipSync(randomBytes(200_000));
  return {
    'native PUT /files': { head: [`PUT /api/v1/sandboxes/${id}/files?path=${DROP_DIR}/native-put-${n} HTTP/1.1`, host, bearer, 'Content-Type: application/octet-stream'] },
    'native PUT /files (chunked)': { head: [`PUT /api/v1/sandboxes/${id}/files?path=${DROP_DIR}/native-chunked-${n} HTTP/1.1`, host, bearer, 'Content-Type: application/octet-stream'], chunked: true },
    'native POST /files/upload (multipart)': { head: [`POST /api/v1/sandboxes/${id}/files/upload HTTP/1.1`, host, bearer, `Content-Type: ${nativeMultipart.contentType}`], prefix: nativeMultipart.prefix },
    'native POST /commands/{id}/stdin': { head: [`POST /api/v1/sandboxes/${id}/commands/${stdinProcessId}/stdin HTTP/1.1`, host, bearer, 'Content-Type: application/octet-stream'] },
    'native POST /commands (JSON)': { head: [`POST /api/v1/sandboxes/${id}/commands HTTP/1.1`, host, bearer, 'Content-Type: application/json'], prefix: Buffer.from('{"cmd":"echo ') },
    'hosted port POST /p/{id}/{port}/': { head: [`POST /p/${id}/${PORT}/upload HTTP/1.1`, host, 'Content-Type: application/octet-stream'] },
    'daytona POST /files/upload': { head: [`POST /daytona/toolbox/${id}/files/upload?path=${DROP_DIR}/dt-single-${n} HTTP/1.1`, host, bearer, `Content-Type: ${daytonaSingle.contentType}`], prefix: daytonaSingle.prefix },
    'daytona POST /files/upload-v2': { head: [`POST /daytona/toolbox/${id}/files/upload-v2?path=${DROP_DIR}/dt-v2-${n} HTTP/1.1`, host, bearer, `Content-Type: ${daytonaSingle.contentType}`], prefix: daytonaSingle.prefix },
    'daytona POST /api/toolbox/…/files/upload (legacy path)': { head: [`POST /daytona/api/toolbox/${id}/toolbox/files/upload?path=${DROP_DIR}/dt-legacy-${n} HTTP/1.1`, host, bearer, `Content-Type: ${daytonaSingle.contentType}`], prefix: daytonaSingle.prefix },
    'daytona POST /files/bulk-upload': { head: [`POST /daytona/toolbox/${id}/files/bulk-upload HTTP/1.1`, host, bearer, `Content-Type: ${daytonaBulk.contentType}`], prefix: daytonaBulk.prefix },
    'daytona POST /process/execute (JSON)': { head: [`POST /daytona/toolbox/${id}/process/execute HTTP/1.1`, host, bearer, 'Content-Type: application/json'], prefix: Buffer.from('{"command":"echo ') },
    'e2b POST /files (octet-stream)': { head: [`POST /files?path=${DROP_DIR}/e2b-raw-${n} HTTP/1.1`, ...envd, 'Content-Type: application/octet-stream'] },
    'e2b POST /files (multipart)': { head: ['POST /files HTTP/1.1', ...envd, `Content-Type: ${e2bMultipart.contentType}`], prefix: e2bMultipart.prefix },
    'e2b POST /files (gzip)': { head: [`POST /files?path=${DROP_DIR}/e2b-gz-${n} HTTP/1.1`, ...envd, 'Content-Type: application/octet-stream', 'Content-Encoding: gzip'], prefix: gzipped },
    'e2b Connect StreamInput (client stream)': { head: ['POST /process.Process/StreamInput HTTP/1.1', ...envd, 'Content-Type: application/connect+json', 'Connect-Protocol-Version: 1'], prefix: Buffer.from([0, 0, 0x0f, 0x42, 0x40]), chunked: true },
    'e2b Connect Filesystem/Stat (unary)': { head: ['POST /filesystem.Filesystem/Stat HTTP/1.1', ...envd, 'Content-Type: application/json', 'Connect-Protocol-Version: 1'], prefix: Buffer.from('{"path":"') },
    'e2b code interpreter POST /execute': { head: ['POST /execute HTTP/1.1', host, `E2B-Sandbox-Id: ${id}`, 'E2B-Sandbox-Port: 49999', `X-Access-Token: ${envdToken}`, 'Content-Type: application/json'], prefix: Buffer.from('{"code":"') },
  };
}

/** The server still answers, and it is the same worker and host agent as at the start. */
async function expectSameServer(): Promise<void> {
  const health = await s.http.get('/api/v1/health');
  expect(health.status).toBe(200);
  expect(health.body.hostsAvailable).toBeGreaterThanOrEqual(1);
  expect(s.workerPid()).toBe(workerPid);
  expect(s.hostAgentPid()).toBe(hostAgentPid);
  expect(s.output.join('')).not.toMatch(/worker exited|Unhandled 'error' event|unhandled rejection/);
}

/** Nothing half-sent was left in place: no file and no upload temp file (discarded asynchronously). */
async function expectNoDroppedFiles(id: string): Promise<void> {
  const listing = await waitFor(
    'dropped uploads to be discarded',
    async () => {
      const out = (await sh(id, `ls -A ${DROP_DIR}`)).stdout;
      return out === '' ? out : undefined;
    },
    60_000,
    500,
  ).catch(async () => (await sh(id, `ls -lA ${DROP_DIR}`)).stdout);
  expect(listing).toBe('');
}

beforeAll(async () => {
  s = await startServerProcess();
  workerPid = s.workerPid()!;
  hostAgentPid = s.hostAgentPid()!;
  expect(workerPid).toBeGreaterThan(0);
  expect(hostAgentPid).toBeGreaterThan(0);
  // Created through E2B so its envd access token is at hand; the other APIs reach it too.
  const created = await s.http.post('/e2b/sandboxes').set('X-API-KEY', s.apiKey).send({ templateID: 'base', timeout: 3600 });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  sandboxId = created.body.sandboxID;
  envdToken = created.body.envdAccessToken;
  await sh(sandboxId, `mkdir -p ${DROP_DIR}`);
  const proc = await s.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(s.auth).send({ cmd: 'cat > /dev/null', detach: true, stdin: true });
  expect(proc.status, JSON.stringify(proc.body)).toBe(202);
  stdinProcessId = proc.body.processId;
  await s.http.put(`/api/v1/sandboxes/${sandboxId}/files?path=/root/reader.py`).set(s.auth).set('content-type', 'application/octet-stream').send(Buffer.from(BODY_READER));
  const reader = await s.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(s.auth).send({ cmd: 'python3 /root/reader.py', detach: true });
  expect(reader.status, JSON.stringify(reader.body)).toBe(202);
  const published = await s.http.post(`/api/v1/sandboxes/${sandboxId}/ports`).set(s.auth).send({ port: PORT, public: true });
  expect(published.status, JSON.stringify(published.body)).toBe(201);
  await waitFor('the body reader', async () => (await s.http.post(`/p/${sandboxId}/${PORT}/`).send('x')).text === 'ok', 30_000);
});

afterAll(async () => {
  await s?.close();
});

describe('a client that vanishes mid-body', () => {
  it('leaves every streamed route of the three APIs (and the server) working', async () => {
    let n = 0;
    for (const offset of OFFSETS) {
      for (const [name, route] of Object.entries(routes(sandboxId, String(n)))) {
        n++;
        // At once (while the route still authenticates), and after the body started upstream.
        await drop(route, offset, n % 2 === 0, 0);
        await drop(routes(sandboxId, `${n}-late`)[name], offset, n % 2 === 1, 150);
      }
      await expectSameServer();
    }
    // Each API still does the real thing on the same sandbox.
    const put = await s.http.put(`/api/v1/sandboxes/${sandboxId}/files?path=/tmp/after/native`).set(s.auth).set('content-type', 'application/octet-stream').send(Buffer.from('ok'));
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    const daytona = await s.http.post(`/daytona/toolbox/${sandboxId}/files/upload?path=/tmp/after/daytona`).set(s.auth).attach('file', Buffer.from('ok'), 'x');
    expect(daytona.status, JSON.stringify(daytona.body)).toBeLessThan(300);
    const e2b = await s.http
      .post('/files?path=/tmp/after/e2b')
      .set({ 'E2B-Sandbox-Id': sandboxId, 'E2B-Sandbox-Port': '49983', 'X-Access-Token': envdToken, 'content-type': 'application/octet-stream' })
      .send(Buffer.from('ok'));
    expect(e2b.status, JSON.stringify(e2b.body)).toBe(200);
    expect((await sh(sandboxId, 'cat /tmp/after/native /tmp/after/daytona /tmp/after/e2b')).stdout).toBe('okokok');
    expect((await s.http.post(`/p/${sandboxId}/${PORT}/`).send('x')).text).toBe('ok');
    await expectNoDroppedFiles(sandboxId);
    await expectSameServer();
  });

  it('leaves the server working when the route was waking a paused sandbox', async () => {
    // One route per API: each pause/unpause cycle takes a while.
    const waking = ['native PUT /files', 'daytona POST /files/upload', 'e2b POST /files (octet-stream)'];
    for (const [i, name] of waking.entries()) {
      const paused = await s.http.post(`/api/v1/sandboxes/${sandboxId}/pause`).set(s.auth);
      expect(paused.status, JSON.stringify(paused.body)).toBe(200);
      expect(paused.body.state, name).toBe('paused');
      // Dropped once the request has set the wake going (the sandbox leaves 'paused'), while
      // the route waits for it before it streams anything.
      await drop(routes(sandboxId, `wake-${i}`)[name], 10, i % 2 === 0, () =>
        waitFor('the wake to start', async () => (await s.http.get(`/api/v1/sandboxes/${sandboxId}`).set(s.auth)).body.state !== 'paused', 30_000, 20),
      );
      await waitFor('the woken sandbox', async () => (await s.http.get(`/api/v1/sandboxes/${sandboxId}`).set(s.auth)).body.state === 'running', 60_000);
      await expectSameServer();
    }
    // The stdin process survived the pauses; the routes all still answer.
    const stdin = await s.http.post(`/api/v1/sandboxes/${sandboxId}/commands/${stdinProcessId}/stdin`).set(s.auth).set('content-type', 'application/octet-stream').send(Buffer.from('x'));
    expect(stdin.status, JSON.stringify(stdin.body)).toBeLessThan(300);
    await expectNoDroppedFiles(sandboxId);
    await expectSameServer();
  });
});

describe('the supervisor', () => {
  it('replaces a control plane worker that dies, on the same port, and sandboxes keep running', async () => {
    const marker = await sh(sandboxId, 'echo before > /tmp/marker && echo ok');
    expect(marker.stdout).toBe('ok\n');
    process.kill(workerPid, 'SIGKILL');
    const next = await waitFor('a new worker', async () => {
      const pid = s.workerPid();
      return pid && pid !== workerPid ? pid : undefined;
    }, 60_000);
    // Back once the new worker's host agent has registered and adopted the sandbox.
    const after = await waitFor('the API and the sandbox back', async () => (await sh(sandboxId, 'cat /tmp/marker')).stdout, 120_000, 500);
    expect(after).toBe('before\n');
    expect(s.workerPid()).toBe(next);
    expect(s.output.join('')).toMatch(/control plane worker exited \(SIGKILL\); restarting/);
    // Room for the waits above (a new worker, then its host agent's adoption), which the default
    // 60 s per test would cut short on a busy machine.
  }, 240_000);
});
