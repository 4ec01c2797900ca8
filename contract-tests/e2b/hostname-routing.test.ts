// Per-sandbox host names (e2b.md (a) "Production deployment"): with NESTBOX_PUBLIC_DOMAIN set,
// create answers that `domain` (so getHost() works) and `<port>-<id>.<domain>` hosts reach envd
// (49983) and the code interpreter (49999) without routing headers — what e2b 1.x, 2.0–2.6 and
// code-interpreter < 2.7 rely on. Node cannot resolve wildcard names locally, so the requests
// here set the Host header themselves.
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from 'e2b';
import { startTestServer, type TestServer } from '../../test/harness.js';

const DOMAIN = 'sandboxes.nestbox.test';
let t: TestServer;

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_PUBLIC_DOMAIN: DOMAIN } });
});

afterAll(async () => {
  await t?.close();
});

function request(host: string, method: string, path: string, headers: Record<string, string>, body?: string): Promise<{ status: number; text: string }> {
  const url = new URL(t.url);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: url.hostname, port: url.port, method, path, headers: { ...headers, host } }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('e2b per-sandbox host names', () => {
  it('returns the public domain and serves envd and the code interpreter by host name', async () => {
    const sbx = await Sandbox.create({ apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url });
    expect(sbx.getHost(8080)).toBe(`8080-${sbx.sandboxId}.${DOMAIN}`);
    const token = (await (await fetch(`${t.url}/e2b/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': t.apiKey } })).json()) as { envdAccessToken: string; domain: string };
    expect(token.domain).toBe(DOMAIN);

    const health = await request(`49983-${sbx.sandboxId}.${DOMAIN}`, 'GET', '/health', { 'X-Access-Token': token.envdAccessToken });
    expect(health.status).toBe(204);
    // Without its token /health says nothing about whether the sandbox exists (issue 11).
    const anonymous = await request(`49983-${sbx.sandboxId}.${DOMAIN}`, 'GET', '/health', {});
    expect(anonymous.status).toBe(401);
    expect(await request(`49983-nosuchsandbox.${DOMAIN}`, 'GET', '/health', {})).toEqual(anonymous);
    const file = await request(`49983-${sbx.sandboxId}.${DOMAIN}:443`, 'GET', '/files?path=%2Fetc%2Fhostname', { 'X-Access-Token': token.envdAccessToken });
    expect(file.status).toBe(200);
    expect(file.text.trim().length).toBeGreaterThan(0);
    // A token of another sandbox does not open this one.
    const other = await Sandbox.create({ apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url });
    const otherToken = (await (await fetch(`${t.url}/e2b/sandboxes/${other.sandboxId}`, { headers: { 'X-API-KEY': t.apiKey } })).json()) as { envdAccessToken: string };
    const crossed = await request(`49983-${sbx.sandboxId}.${DOMAIN}`, 'GET', '/files?path=%2Fetc%2Fhostname', { 'X-Access-Token': otherToken.envdAccessToken });
    expect(crossed.status).toBe(401);

    const executed = await request(`49999-${sbx.sandboxId}.${DOMAIN}`, 'POST', '/execute', { 'X-Access-Token': token.envdAccessToken, 'content-type': 'application/json' }, JSON.stringify({ code: '6 * 7' }));
    expect(executed.status).toBe(200);
    const lines = executed.text.trim().split('\n').map((l) => JSON.parse(l) as { type: string; text?: string });
    expect(lines.find((l) => l.type === 'result')?.text).toBe('42');
    expect(lines.at(-1)?.type).toBe('end_of_execution');
    await sbx.kill();
    await other.kill();
  });
});

describe("e2b sandbox ports (any port the sandbox listens on, as E2B's proxy)", () => {
  const SERVER = "python3 -c \"import http.server as h\nclass H(h.BaseHTTPRequestHandler):\n  def do_GET(s):\n    b=('port-8000 got ' + s.path + ' token=' + str(s.headers.get('e2b-traffic-access-token'))).encode(); s.send_response(200); s.send_header('content-length', str(len(b))); s.end_headers(); s.wfile.write(b)\nh.HTTPServer(('0.0.0.0', 8000), H).serve_forever()\"";

  async function serving(sbx: Sandbox): Promise<void> {
    await sbx.commands.run(SERVER, { background: true });
    for (let i = 0; i < 100; i++) {
      if ((await sbx.commands.run('python3 -c "import socket; socket.create_connection((\'127.0.0.1\', 8000), 1)"').catch(() => undefined))?.exitCode === 0) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error('the test server in the sandbox did not start');
  }

  it('reaches an unpublished port by host name and by routing headers, public by default', async () => {
    const sbx = await Sandbox.create({ apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url });
    try {
      await serving(sbx);
      const byHost = await request(sbx.getHost(8000), 'GET', '/hello?x=1', {});
      expect(byHost).toEqual({ status: 200, text: 'port-8000 got /hello?x=1 token=None' });
      const byHeaders = await request('anything.example', 'GET', '/via-headers', { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' });
      expect(byHeaders).toEqual({ status: 200, text: 'port-8000 got /via-headers token=None' });
      // A port nothing listens on is the proxy's 502, not a 404 "not published".
      expect((await request(sbx.getHost(8001), 'GET', '/', {})).status).toBe(502);
      // Not one of the organisation's published ports.
      const listed = (await (await fetch(`${t.url}/api/v1/sandboxes/${sbx.sandboxId}/ports`, { headers: { authorization: `Bearer ${t.apiKey}` } })).json()) as { items: unknown[] };
      expect(listed).toEqual({ items: [] });
    } finally {
      await sbx.kill();
    }
  });

  it('with allowPublicTraffic false, needs the traffic token and keeps it from the sandbox', async () => {
    const sbx = await Sandbox.create({ apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url, network: { allowPublicTraffic: false } });
    const other = await Sandbox.create({ apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url, network: { allowPublicTraffic: false } });
    try {
      await serving(sbx);
      expect(sbx.trafficAccessToken).toMatch(/^nbxt_/);
      expect((await request(sbx.getHost(8000), 'GET', '/', {})).status).toBe(401);
      // Another sandbox's traffic token does not open this one.
      expect((await request(sbx.getHost(8000), 'GET', '/', { 'e2b-traffic-access-token': other.trafficAccessToken! })).status).toBe(401);
      const opened = await request(sbx.getHost(8000), 'GET', '/private', { 'e2b-traffic-access-token': sbx.trafficAccessToken! });
      expect(opened).toEqual({ status: 200, text: 'port-8000 got /private token=None' });
    } finally {
      await sbx.kill();
      await other.kill();
    }
  });

  it('serves E2B\'s control plane on api.<domain> without the /e2b prefix (what E2B_DOMAIN makes the SDKs call)', async () => {
    const created = await request(`api.${DOMAIN}:443`, 'POST', '/sandboxes', { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' }, JSON.stringify({ templateID: 'base', timeout: 60, allow_internet_access: false }));
    expect(created.status, created.text).toBe(201);
    const sandbox = JSON.parse(created.text) as { sandboxID: string; domain: string };
    expect(sandbox.domain).toBe(DOMAIN);
    try {
      const listed = await request(`api.${DOMAIN}`, 'GET', '/v2/sandboxes?state=running', { 'X-API-KEY': t.apiKey });
      expect(listed.status).toBe(200);
      expect((JSON.parse(listed.text) as { sandboxID: string }[]).map((s) => s.sandboxID)).toContain(sandbox.sandboxID);
      // In E2B's error shape, as at /e2b.
      const unknown = await request(`API.${DOMAIN.toUpperCase()}`, 'GET', '/sandboxes/nosuchsandbox', { 'X-API-KEY': t.apiKey });
      expect(unknown.status).toBe(404);
      expect(JSON.parse(unknown.text)).toMatchObject({ code: 404 });
      // The native API is not served there (E2B's router answers, wanting its X-API-KEY), and
      // other hosts keep the native paths.
      const native = await request(`api.${DOMAIN}`, 'GET', '/api/v1/sandboxes', { authorization: `Bearer ${t.apiKey}` });
      expect(native.status).toBe(401);
      expect(JSON.parse(native.text)).toMatchObject({ code: 401 });
      expect((await request(`elsewhere.${DOMAIN}`, 'GET', '/api/v1/sandboxes', { authorization: `Bearer ${t.apiKey}` })).status).toBe(200);
    } finally {
      expect((await request(`api.${DOMAIN}`, 'DELETE', `/sandboxes/${sandbox.sandboxID}`, { 'X-API-KEY': t.apiKey })).status).toBe(204);
    }
  });

  it('refuses a non-boolean allowPublicTraffic naming the field', async () => {
    const res = await fetch(`${t.url}/e2b/sandboxes`, { method: 'POST', headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' }, body: JSON.stringify({ templateID: 'base', network: { allowPublicTraffic: 'no' } }) });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { message: string }).message).toContain('network.allowPublicTraffic');
  });
});
