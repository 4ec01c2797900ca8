// Networking on the real kernel, through the native API: the slot pool, egress policies against
// a test "internet" host in its own network namespace, the isolation rules, and hosted ports
// (public and private, token → cookie, WebSocket, X-Forwarded-*, 502/404/401/503, wake on use).
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { promisify } from 'node:util';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createSocket } from 'node:dgram';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { TCP_PROBE } from './test-internet.js';

// The test "internet": a namespace with a public-looking address (TEST-NET-3) and a second
// range (TEST-NET-2) routed to it, each answering HTTP on INET_PORT.
const INET_NS = 'nbxtest-inet';
const INET_LINK = 'nbxti0';
const INET_HOST_SIDE = '203.0.113.1';
const INET_ADDRESS = '203.0.113.2';
const INET_OTHER_RANGE = '198.51.100.0/24';
const INET_OTHER_ADDRESS = '198.51.100.2';
const INET_PORT = 8088;
const PUBLIC_DOMAIN = 'sandboxes.test';
const POOL_SIZE = 2;

let t: TestServer;
let inetServer: ChildProcess | undefined;
let inetDir: string;
let hostListener: Server;
let a: string; // the sandbox most tests use
let b: string; // created with deny-all

const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'] });
const quietly = (fn: () => unknown) => {
  try {
    fn();
  } catch {
    // already gone
  }
};

function removeInternet(): void {
  quietly(() => ip('route', 'del', INET_OTHER_RANGE));
  quietly(() => ip('link', 'del', INET_LINK));
  quietly(() => ip('netns', 'del', INET_NS));
}

function createInternet(): void {
  removeInternet();
  ip('netns', 'add', INET_NS);
  ip('link', 'add', INET_LINK, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', INET_NS);
  ip('addr', 'add', `${INET_HOST_SIDE}/24`, 'dev', INET_LINK);
  ip('link', 'set', INET_LINK, 'up');
  ip('-n', INET_NS, 'addr', 'add', `${INET_ADDRESS}/24`, 'dev', 'eth0');
  ip('-n', INET_NS, 'addr', 'add', `${INET_OTHER_ADDRESS}/32`, 'dev', 'lo');
  ip('-n', INET_NS, 'link', 'set', 'eth0', 'up');
  ip('-n', INET_NS, 'link', 'set', 'lo', 'up');
  ip('route', 'add', INET_OTHER_RANGE, 'via', INET_ADDRESS, 'dev', INET_LINK);
}

// A small HTTP + WebSocket echo server for inside the sandbox: the standard library only (the
// image has no websockets module), RFC 6455 handshake and framing by hand.
const SANDBOX_SERVER = String.raw`
import base64, hashlib, json, socket, struct, sys, threading, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *args): pass
    def reply(self, status, body, kind='text/plain'):
        self.send_response(status)
        self.send_header('content-type', kind)
        self.send_header('content-length', str(len(body)))
        self.send_header('set-cookie', 'app=1; Path=/')
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith('/set-cookies?'):
            body = b'cookies set'
            self.send_response(200)
            for cookie in json.loads(urllib.parse.unquote(self.path.split('?', 1)[1])): self.send_header('set-cookie', cookie)
            self.send_header('content-length', str(len(body)))
            self.end_headers()
            return self.wfile.write(body)
        if self.path.startswith('/headers'):
            return self.reply(200, json.dumps({'path': self.path, 'headers': {k.lower(): v for k, v in self.headers.items()}}).encode(), 'application/json')
        self.reply(200, b'hello from the sandbox')
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get('content-length', '0')))
        self.reply(200, body, 'application/octet-stream')

def recv_exact(conn, n):
    data = b''
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk: raise EOFError()
        data += chunk
    return data

def websocket(conn):
    request = b''
    while b'\r\n\r\n' not in request:
        chunk = conn.recv(4096)
        if not chunk: return conn.close()
        request += chunk
    key = [l.split(b':', 1)[1].strip() for l in request.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key:')][0]
    accept = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    conn.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + b'\r\n\r\n')
    try:
        while True:
            first, second = recv_exact(conn, 2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126: length = struct.unpack('>H', recv_exact(conn, 2))[0]
            elif length == 127: length = struct.unpack('>Q', recv_exact(conn, 8))[0]
            mask = recv_exact(conn, 4) if second & 0x80 else b'\0\0\0\0'
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(recv_exact(conn, length)))
            if opcode == 8:
                conn.sendall(b'\x88' + bytes([len(payload)]) + payload)
                break
            reply_opcode = 10 if opcode == 9 else opcode
            header = bytes([0x80 | reply_opcode])
            if len(payload) < 126: header += bytes([len(payload)])
            elif len(payload) < 65536: header += bytes([126]) + struct.pack('>H', len(payload))
            else: header += bytes([127]) + struct.pack('>Q', len(payload))
            conn.sendall(header + payload)
    except EOFError:
        pass
    conn.close()

def websocket_server(port):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(('0.0.0.0', port))
    listener.listen(16)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=websocket, args=(conn,), daemon=True).start()

threading.Thread(target=websocket_server, args=(int(sys.argv[2]),), daemon=True).start()
ThreadingHTTPServer(('0.0.0.0', int(sys.argv[1])), Handler).serve_forever()
`;


// Inside a sandbox, as its root: UDP datagrams with forged sources through a raw socket (before
// a genuine one through an ordinary socket on the same path). Prints per forged packet whether
// the kernel let the raw socket send it ('sent') or refused the socket ('refused').
const SPOOFER = String.raw`
import socket, struct, sys
dst, dport, forged = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def forge(src, sport, payload):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    except PermissionError:
        return 'refused'
    udp = struct.pack('!HHHH', sport, dport, 8 + len(payload), 0) + payload
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
    s.sendto(ip + udp, (dst, 0))
    return 'sent'
results = [forge(spec.split(':')[0], int(spec.split(':')[1]), ('forged-from-' + spec).encode()) for spec in forged]
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'genuine', (dst, dport))
print(' '.join(results))
`;

/** Prints each datagram it gets on a line, and answers it to its sender. */
const UDP_ECHO = String.raw`
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', int(sys.argv[1])))
print('ready', flush=True)
while True:
    data, peer = s.recvfrom(2048)
    print(data.decode(errors='replace'), flush=True)
    try:
        s.sendto(b'echo:' + data, peer)
    except OSError:
        pass  # no route back to a forged source
`;

function udpEcho(netns: string, port: number): Promise<{ process: ChildProcess; lines: string[] }> {
  const child = spawn('ip', ['netns', 'exec', netns, 'python3', '-c', UDP_ECHO, String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines: string[] = [];
  let buffer = '';
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.stdout!.on('data', (chunk: Buffer) => {
      buffer += chunk.toString();
      const parts = buffer.split('\n');
      buffer = parts.pop()!;
      for (const line of parts) {
        if (line === 'ready') resolve({ process: child, lines });
        else lines.push(line);
      }
    });
  });
}

async function run(id: string, cmd: string): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const res = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd, timeoutMs: 20_000 });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body;
}

async function probe(id: string, host: string, port: number): Promise<string> {
  return (await run(id, `python3 /root/probe.py ${host} ${port}`)).stdout.trim();
}

async function createSandbox(body: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
  const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 256, ...body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  await run(res.body.id, `cat > /root/probe.py <<'EOF'\n${TCP_PROBE}\nEOF`);
  return res.body;
}

const patchEgress = (id: string, egress: unknown) => t.http.patch(`/api/v1/sandboxes/${id}`).set(t.auth).send({ egress });
const hostDataDir = () => `${t.dataDir}/host`;
const ownerId = () => `local-${createHash('sha256').update(hostDataDir()).digest('hex').slice(0, 12)}`;

function claimsOfOwner(): { index: number; sandboxId: string; pooled?: boolean }[] {
  const out: { index: number; sandboxId: string; pooled?: boolean }[] = [];
  for (const name of readdirSync('/run/nestbox/slots')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const claim = JSON.parse(readFileSync(join('/run/nestbox/slots', name), 'utf8'));
      if (claim.owner === ownerId()) out.push({ index: Number(name), sandboxId: claim.sandboxId, pooled: claim.pooled });
    } catch {
      // being rewritten
    }
  }
  return out;
}

function slotOf(id: string): { index: number; sandboxAddress: string; hostAddress: string } {
  return JSON.parse(readFileSync(join(hostDataDir(), 'sandboxes', id, 'record.json'), 'utf8')).slot;
}

beforeAll(async () => {
  createInternet();
  inetDir = mkdtempSync('/tmp/nbx-inet-');
  writeFileSync(join(inetDir, 'index.html'), 'the internet says hi\n');
  inetServer = spawn('ip', ['netns', 'exec', INET_NS, 'python3', '-m', 'http.server', String(INET_PORT), '--bind', '0.0.0.0', '--directory', inetDir], { stdio: 'ignore' });
  await waitFor('the test internet host', async () => (await fetch(`http://${INET_ADDRESS}:${INET_PORT}/`).then((r) => r.text()).catch(() => '')).includes('says hi'), 15_000);

  // Something listening on every host address, as a host service would.
  hostListener = createServer((socket) => socket.end('HTTP/1.0 200 OK\r\n\r\nhost service\n'));
  await new Promise<void>((resolve) => hostListener.listen(0, '0.0.0.0', resolve));

  t = await startTestServer({ env: { NESTBOX_SLOT_POOL_SIZE: String(POOL_SIZE), NESTBOX_PUBLIC_DOMAIN: PUBLIC_DOMAIN } });
}, 180_000);

afterAll(async () => {
  await t?.close();
  inetServer?.kill('SIGKILL');
  hostListener?.close();
  removeInternet();
  if (inetDir) rmSync(inetDir, { recursive: true, force: true });
  expect(existsSync(`/run/netns/${INET_NS}`)).toBe(false);
}, 120_000);

describe('slot pool', () => {
  it('creates take a slot the host agent built ahead', async () => {
    const warm = await waitFor('a warm slot pool', async () => {
      const pooled = claimsOfOwner().filter((claim) => claim.pooled);
      return pooled.length === POOL_SIZE ? pooled : undefined;
    }, 30_000);
    const created = await createSandbox();
    a = String(created.id);
    expect(created.egress).toEqual({ mode: 'allow-all' });
    expect(warm.map((claim) => claim.index)).toContain(slotOf(a).index);
    expect(claimsOfOwner().find((claim) => claim.index === slotOf(a).index)).toMatchObject({ sandboxId: a });
  });
});

describe('egress', () => {
  it('reaches the internet with allow-all (the default)', async () => {
    expect(await probe(a, INET_ADDRESS, INET_PORT)).toBe('ok');
    expect((await run(a, `python3 -c "import urllib.request;print(urllib.request.urlopen('http://${INET_ADDRESS}:${INET_PORT}/',timeout=3).read().decode())"`)).stdout).toContain('the internet says hi');
  });

  it('is cut at once by deny-all on a running sandbox, and restored by allow-all', async () => {
    const denied = await patchEgress(a, { mode: 'deny-all' });
    expect(denied.status, JSON.stringify(denied.body)).toBe(200);
    expect(denied.body.egress).toEqual({ mode: 'deny-all' });
    expect(await probe(a, INET_ADDRESS, INET_PORT)).toBe('timeout');
    expect((await t.http.get(`/api/v1/sandboxes/${a}`).set(t.auth)).body.egress).toEqual({ mode: 'deny-all' });
    expect((await patchEgress(a, { mode: 'allow-all' })).status).toBe(200);
    expect(await probe(a, INET_ADDRESS, INET_PORT)).toBe('ok');
  });

  it('allows only the listed CIDRs with allow-list', async () => {
    const listed = await patchEgress(a, { mode: 'allow-list', allow: [INET_OTHER_RANGE] });
    expect(listed.status, JSON.stringify(listed.body)).toBe(200);
    expect(listed.body.egress).toEqual({ mode: 'allow-list', allow: [INET_OTHER_RANGE] });
    expect(await probe(a, INET_OTHER_ADDRESS, INET_PORT)).toBe('ok');
    expect(await probe(a, INET_ADDRESS, INET_PORT)).toBe('timeout'); // a denied CIDR
    expect((await patchEgress(a, { mode: 'allow-all' })).status).toBe(200);
  });

  it('drops a deny list before the allow list (deny wins) and shows the policy on the sandbox', async () => {
    const listed = await patchEgress(a, { mode: 'allow-list', allow: [INET_OTHER_RANGE, '203.0.113.0/24'], deny: [INET_ADDRESS] });
    expect(listed.status, JSON.stringify(listed.body)).toBe(200);
    expect(listed.body.egress).toEqual({ mode: 'allow-list', allow: [INET_OTHER_RANGE, '203.0.113.0/24'], deny: [INET_ADDRESS] });
    expect((await t.http.get(`/api/v1/sandboxes/${a}`).set(t.auth)).body.egress).toEqual(listed.body.egress);
    expect(await probe(a, INET_OTHER_ADDRESS, INET_PORT)).toBe('ok');
    expect(await probe(a, INET_ADDRESS, INET_PORT)).toBe('timeout'); // allowed by the list, denied by the deny list
    const open = await patchEgress(a, { mode: 'allow-all', deny: [INET_OTHER_RANGE] });
    expect(open.status, JSON.stringify(open.body)).toBe(200);
    expect(await probe(a, INET_OTHER_ADDRESS, INET_PORT)).toBe('timeout');
    expect(await probe(a, INET_ADDRESS, INET_PORT)).toBe('ok');
    expect((await patchEgress(a, { mode: 'allow-all' })).status).toBe(200);
    expect(await probe(a, INET_OTHER_ADDRESS, INET_PORT)).toBe('ok');
  });

  it('applies a policy given at create before anything runs', async () => {
    const created = await createSandbox({ egress: { mode: 'deny-all' } });
    b = String(created.id);
    expect(created.egress).toEqual({ mode: 'deny-all' });
    expect(await probe(b, INET_ADDRESS, INET_PORT)).toBe('timeout');
  });

  it('refuses malformed policies with the field named', async () => {
    const v6 = await patchEgress(a, { mode: 'allow-list', allow: ['10.0.0.0/8', '2001:db8::/32'] });
    expect(v6.status).toBe(400);
    expect(v6.body.error.message).toContain('egress.allow[1]');
    const noList = await patchEgress(a, { mode: 'allow-list' });
    expect(noList.status).toBe(400);
    expect(noList.body.error.message).toContain('egress.allow');
    const badMode = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'some' } });
    expect(badMode.status).toBe(400);
    const badDeny = await patchEgress(a, { mode: 'allow-all', deny: ['198.51.100.0/33'] });
    expect(badDeny.status).toBe(400);
    expect(badDeny.body.error.message).toContain('egress.deny[0]');
    const denyWithDenyAll = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all', deny: ['198.51.100.0/24'] } });
    expect(denyWithDenyAll.status).toBe(400);
    expect(denyWithDenyAll.body.error.message).toContain('egress.deny');
  });
});

describe('isolation', () => {
  it('drops sandbox → host services, whatever the host address', async () => {
    const gateway = slotOf(a).hostAddress;
    const hostPort = (hostListener.address() as { port: number }).port;
    // The host itself reaches the service, so a timeout below is the firewall, not the service
    // (asynchronously: the service runs in this very process).
    expect((await promisify(execFile)('python3', ['-c', TCP_PROBE, gateway, String(hostPort)])).stdout.trim()).toBe('ok');
    expect(await probe(a, gateway, hostPort)).toBe('timeout');
    expect(await probe(a, INET_HOST_SIDE, hostPort)).toBe('timeout');
    // The host agent (loopback-bound, so without the firewall this would be "refused").
    const hostAgentPort = Number(new URL(((await t.server.db('hosts').first()) as { url: string }).url).port);
    expect(await probe(a, gateway, hostAgentPort)).toBe('timeout');
  });

  it('drops sandbox → another sandbox, while the host reaches both', async () => {
    await t.http.post(`/api/v1/sandboxes/${b}/commands`).set(t.auth).send({ detach: true, cmd: 'python3 -m http.server 8080 --bind 0.0.0.0' });
    const target = slotOf(b).sandboxAddress;
    await waitFor('a server in sandbox b', async () => execFileSync('python3', ['-c', TCP_PROBE, target, '8080'], { encoding: 'utf8' }).trim() === 'ok', 15_000);
    expect(await probe(a, target, 8080)).toBe('timeout');
  });

  it('drops packets a sandbox forges with another sandbox\'s or an outside source address', async () => {
    const echo = await udpEcho(INET_NS, 47002);
    try {
      // B listens where the answer to a flow forged as B would land.
      await run(b, `cat > /root/udp-listen.py <<'EOF'\nimport socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 40001))\nwhile True:\n    data, _ = s.recvfrom(2048)\n    open('/root/udp-got', 'a').write(data.decode() + '\\n')\nEOF`);
      await t.http.post(`/api/v1/sandboxes/${b}/commands`).set(t.auth).send({ detach: true, cmd: 'python3 /root/udp-listen.py' });
      const victim = slotOf(b).sandboxAddress;
      const marker = createSocket('udp4');
      const sendMarker = () => new Promise<void>((resolve, reject) => marker.send('marker', 40001, victim, (error) => (error ? reject(error) : resolve())));
      await waitFor('the listener in sandbox b', async () => {
        await sendMarker();
        return (await run(b, 'cat /root/udp-got 2>/dev/null')).stdout.includes('marker');
      }, 15_000);

      await run(a, `cat > /root/spoof.py <<'EOF'\n${SPOOFER}\nEOF`);
      const sent = await run(a, `python3 /root/spoof.py ${INET_ADDRESS} 47002 ${victim}:40001 198.19.7.7:5000`);
      expect(sent.exitCode, sent.stderr).toBe(0);
      // Either the kernel refuses the raw socket, or the host drops what it sends.
      expect(sent.stdout.trim()).toMatch(/^(sent|refused) (sent|refused)$/);
      await waitFor('the genuine datagram at the test internet host', async () => echo.lines.includes('genuine'), 15_000);
      expect(echo.lines.filter((line) => line.startsWith('forged'))).toEqual([]);

      // Nothing was answered into B: a marker from the host arrives, and nothing else did.
      await run(b, 'rm -f /root/udp-got');
      await waitFor('a second marker in sandbox b', async () => {
        await sendMarker();
        return (await run(b, 'cat /root/udp-got 2>/dev/null')).stdout.includes('marker');
      }, 15_000);
      expect((await run(b, 'cat /root/udp-got')).stdout.split('\n').filter((line) => line && line !== 'marker')).toEqual([]);
      marker.close();
    } finally {
      echo.process.kill('SIGKILL');
    }
  });
});

describe('hosted ports', () => {
  let token = '';
  const pathOf = (port: number, rest = '') => `/p/${a}/${port}/${rest}`;

  beforeAll(async () => {
    await run(a, `cat > /root/server.py <<'EOF'\n${SANDBOX_SERVER}\nEOF`);
    const started = await t.http.post(`/api/v1/sandboxes/${a}/commands`).set(t.auth).send({ detach: true, cmd: 'python3 /root/server.py 8000 8765' });
    expect(started.status).toBe(202);
    const address = slotOf(a).sandboxAddress;
    await waitFor('the sandbox server', async () => execFileSync('python3', ['-c', TCP_PROBE, address, '8000'], { encoding: 'utf8' }).trim() === 'ok', 15_000);
  });

  it('publishes a public port on both URL forms', async () => {
    const res = await t.http.post(`/api/v1/sandboxes/${a}/ports`).set(t.auth).send({ port: 8000, public: true });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body).toMatchObject({ port: 8000, public: true, url: `https://8000-${a}.${PUBLIC_DOMAIN}/`, pathUrl: `${t.url}/p/${a}/8000/` });
    expect(res.body.token).toBeUndefined();
    const byPath = await t.http.get(pathOf(8000));
    expect(byPath.status).toBe(200);
    expect(byPath.text).toBe('hello from the sandbox');
    const byHost = await t.http.get('/anything').set('Host', `8000-${a}.${PUBLIC_DOMAIN}`);
    expect(byHost.status).toBe(200);
    expect(byHost.text).toBe('hello from the sandbox');
    // Without the slash, a redirect so that relative links resolve inside the port's URL.
    const bare = await t.http.get(`/p/${a}/8000`);
    expect(bare.status).toBe(308);
    expect(bare.headers.location).toBe(`/p/${a}/8000/`);
  });

  it('passes X-Forwarded-* and streams bodies both ways', async () => {
    const seen = await t.http.get(pathOf(8000, 'headers?x=1&y=%20'));
    expect(seen.body.path).toBe('/headers?x=1&y=%20');
    expect(seen.body.headers).toMatchObject({ 'x-forwarded-proto': 'http', 'x-forwarded-prefix': `/p/${a}/8000`, 'x-forwarded-host': new URL(t.url).host });
    expect(seen.body.headers['x-forwarded-for']).toContain('127.0.0.1');
    // The sandbox's own cookie passes, confined to the port's prefix in the path form.
    expect(seen.headers['set-cookie']).toEqual([`app=1; Path=/p/${a}/8000/`]);
    const body = randomBytes(3 * 1024 * 1024);
    const echoed = await fetch(`${t.url}${pathOf(8000, 'echo')}`, { method: 'POST', body });
    expect(echoed.status).toBe(200);
    expect(createHash('sha256').update(Buffer.from(await echoed.arrayBuffer())).digest('hex')).toBe(createHash('sha256').update(body).digest('hex'));
  });

  it('makes a port private: 401 without its token, token once then a cookie, or the header', async () => {
    const res = await t.http.post(`/api/v1/sandboxes/${a}/ports`).set(t.auth).send({ port: 8000 });
    expect(res.status).toBe(201);
    expect(res.body.public).toBe(false);
    token = res.body.token;
    expect(token).toMatch(/^nbxp_[a-z0-9]{40}$/);

    const refused = await t.http.get(pathOf(8000)).set('Accept', 'text/html');
    expect(refused.status).toBe(401);
    expect(refused.text).toContain('This port is private');
    expect((await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', 'nbxp_wrong')).status).toBe(401);

    const withQuery = await t.http.get(pathOf(8000, `headers?_token=${token}&keep=1`));
    expect(withQuery.status).toBe(200);
    // The sandbox sees neither the token nor our cookie; its own parameters stay.
    expect(withQuery.body.path).toBe('/headers?keep=1');
    expect(JSON.stringify(withQuery.body.headers)).not.toContain(token);
    const cookie = (withQuery.headers['set-cookie'] as unknown as string[]).find((c) => c.startsWith(`nestbox_port_${a}_8000=`))!;
    expect(cookie).toBe(`nestbox_port_${a}_8000=${token}; Path=/p/${a}/8000/; HttpOnly; SameSite=Strict`);
    const byCookie = await t.http.get(pathOf(8000, 'headers')).set('Cookie', `${cookie.split(';')[0]}; mine=2`);
    expect(byCookie.status).toBe(200);
    expect(byCookie.body.headers.cookie).toBe('mine=2');
    expect((await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', token)).status).toBe(200);
    // Host form, same token.
    expect((await t.http.get('/').set('Host', `8000-${a}.${PUBLIC_DOMAIN}`).set('X-Nestbox-Port-Token', token)).status).toBe(200);
  });

  it('keeps Nestbox cookies away from sandboxes and sandbox cookies off Nestbox names (path form)', async () => {
    // A sandbox tries to plant cookies: its own port token, another sandbox's, any Nestbox name,
    // and cookies for the whole site.
    const attempts = [
      `nestbox_port_${a}_8000=forged; Path=/p/${a}/8000/`,
      `nestbox_port_${b}_8000=forged; Path=/p/${b}/8000/`,
      'nestbox_port_token=forged; Path=/',
      '__Host-nestbox_session=forged; Path=/; Secure',
      'NESTBOX_api=forged',
      `wide=1; Path=/; Domain=${PUBLIC_DOMAIN}`,
      `inside=1; Path=/p/${a}/8000/app`,
    ];
    const planted = await t.http.get(pathOf(8000, `set-cookies?${encodeURIComponent(JSON.stringify(attempts))}`)).set('X-Nestbox-Port-Token', token);
    expect(planted.status).toBe(200);
    expect(planted.text).toBe('cookies set');
    expect(planted.headers['set-cookie']).toEqual([`wide=1; Path=/p/${a}/8000/`, `inside=1; Path=/p/${a}/8000/app`]);
    // Sandbox pages run in an opaque origin in the path form.
    expect(planted.headers['content-security-policy']).toBe('sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads');

    // What the browser holds for the API's origin never reaches the sandbox: this port's token
    // cookie, another sandbox's, the old shared name, anything named nestbox; its own cookies do.
    const jar = [`nestbox_port_${a}_8000=${token}`, `nestbox_port_${b}_8000=other`, 'nestbox_port_token=old', '__Host-nestbox_session=s', 'NESTBOX_api=k', 'mine=2', 'app=1'].join('; ');
    const seen = await t.http.get(pathOf(8000, 'headers')).set('Cookie', jar);
    expect(seen.status).toBe(200);
    expect(seen.body.headers.cookie).toBe('mine=2; app=1');
    expect(JSON.stringify(seen.body.headers)).not.toContain(token);

    // Only this port's own cookie name is its token: the same token under another name is not.
    expect((await t.http.get(pathOf(8000)).set('Cookie', `nestbox_port_${b}_8000=${token}`)).status).toBe(401);
    expect((await t.http.get(pathOf(8000)).set('Cookie', `nestbox_port_token=${token}`)).status).toBe(401);
    // Behind TLS the cookie is Secure.
    const secure = await t.http.get(pathOf(8000, `?_token=${token}`)).set('X-Forwarded-Proto', 'https');
    expect((secure.headers['set-cookie'] as unknown as string[]).find((c) => c.startsWith(`nestbox_port_${a}_8000=`))).toBe(
      `nestbox_port_${a}_8000=${token}; Path=/p/${a}/8000/; HttpOnly; SameSite=Strict; Secure`,
    );
  });

  it('gives the host form its own origin: no CSP sandbox, host-only cookies, the same cookie rules', async () => {
    const host = `8000-${a}.${PUBLIC_DOMAIN}`;
    const withQuery = await t.http.get(`/headers?_token=${token}`).set('Host', host);
    expect(withQuery.status).toBe(200);
    expect(withQuery.headers['content-security-policy']).toBeUndefined();
    const cookies = withQuery.headers['set-cookie'] as unknown as string[];
    // Host-form URLs are https here (NESTBOX_PUBLIC_SCHEME's default): the cookie is Secure.
    expect(cookies).toContain(`nestbox_port_${a}_8000=${token}; Path=/; HttpOnly; SameSite=Strict; Secure`);
    // The sandbox's own cookie keeps its path on its own host.
    expect(cookies).toContain('app=1; Path=/');
    const attempts = [`nestbox_port_${a}_8000=forged`, `wide=1; Path=/; Domain=${PUBLIC_DOMAIN}`];
    const planted = await t.http.get(`/set-cookies?${encodeURIComponent(JSON.stringify(attempts))}`).set('Host', host).set('Cookie', `nestbox_port_${a}_8000=${token}`);
    expect(planted.status).toBe(200);
    expect(planted.headers['set-cookie']).toEqual(['wide=1; Path=/']);
    const seen = await t.http.get('/headers').set('Host', host).set('Cookie', `nestbox_port_${a}_8000=${token}; mine=3`);
    expect(seen.body.headers.cookie).toBe('mine=3');
  });

  it('mints a new token when published again; the old one stops working', async () => {
    const again = await t.http.post(`/api/v1/sandboxes/${a}/ports`).set(t.auth).send({ port: 8000, public: false });
    expect(again.body.token).not.toBe(token);
    expect((await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', token)).status).toBe(401);
    expect((await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', again.body.token)).status).toBe(200);
    token = again.body.token;
    const list = await t.http.get(`/api/v1/sandboxes/${a}/ports`).set(t.auth);
    expect(list.status).toBe(200);
    expect(list.body.items).toHaveLength(1);
    expect(list.body.items[0]).toMatchObject({ port: 8000, public: false });
    expect(list.body.items[0].token).toBeUndefined();
  });

  it('carries WebSocket upgrades', async () => {
    expect((await t.http.post(`/api/v1/sandboxes/${a}/ports`).set(t.auth).send({ port: 8765, public: true })).status).toBe(201);
    const ws = new WebSocket(`${t.url.replace('http', 'ws')}/p/${a}/8765/`);
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    const echo = (data: string | Buffer) =>
      new Promise<Buffer>((resolve) => {
        ws.once('message', (message) => resolve(message as Buffer));
        ws.send(data);
      });
    expect((await echo('hello through two proxies')).toString()).toBe('hello through two proxies');
    const big = randomBytes(200_000);
    expect(Buffer.compare(await echo(big), big)).toBe(0);
    ws.close();
  });

  it('answers 502 when nothing listens, 404 for unknown ports and sandboxes', async () => {
    expect((await t.http.post(`/api/v1/sandboxes/${a}/ports`).set(t.auth).send({ port: 9999, public: true })).status).toBe(201);
    const refused = await t.http.get(pathOf(9999));
    expect(refused.status).toBe(502);
    expect(refused.body.error.code).toBe('port_not_listening');
    const unknownPort = await t.http.get(pathOf(8001));
    expect(unknownPort.status).toBe(404);
    expect((await t.http.get(`/p/zzzzzzzzzzzzzzzzzzzz/8000/`)).status).toBe(404);
    expect((await t.http.get('/').set('Host', `8001-${a}.${PUBLIC_DOMAIN}`)).status).toBe(404);
    expect((await t.http.delete(`/api/v1/sandboxes/${a}/ports/9999`).set(t.auth)).status).toBe(204);
    expect((await t.http.get(pathOf(9999))).status).toBe(404);
    expect((await t.http.delete(`/api/v1/sandboxes/${a}/ports/9999`).set(t.auth)).status).toBe(404);
    expect((await t.http.post(`/api/v1/sandboxes/${a}/ports`).set(t.auth).send({ port: 70000 })).status).toBe(400);
  });

  it('wakes a paused sandbox on traffic and counts it as activity', async () => {
    // Cached as running by this request; the pause must be seen by the next one (it wakes it).
    expect((await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', token)).status).toBe(200);
    expect((await t.http.post(`/api/v1/sandboxes/${a}/pause`).set(t.auth)).body.state).toBe('paused');
    const woken = await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', token);
    expect(woken.status).toBe(200);
    expect(woken.text).toBe('hello from the sandbox');
    const after = (await t.http.get(`/api/v1/sandboxes/${a}`).set(t.auth)).body;
    expect(after.state).toBe('running');
    expect(new Date(after.lastActivityAt).getTime()).toBeGreaterThan(Date.now() - 10_000);
  });

  it('answers 503 while the sandbox is stopped', async () => {
    // A request just before the stop: the proxy's short cache of the running sandbox holds it,
    // and the stop (a state change) must end that at once.
    expect((await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', token)).status).toBe(200);
    expect((await t.http.post(`/api/v1/sandboxes/${a}/stop`).set(t.auth)).body.state).toBe('stopped');
    const stopped = await t.http.get(pathOf(8000)).set('X-Nestbox-Port-Token', token);
    expect(stopped.status).toBe(503);
    expect(stopped.body.error).toMatchObject({ code: 'sandbox_not_running' });
    expect(stopped.body.error.message).toContain('stopped');
  });
});
