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
