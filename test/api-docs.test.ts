// The rendered API reference at /docs on a real server: the page and its CSP, the bundle served
// from dist/docs/ (so `npm run build` must have run), and the page in a real browser (Debian's
// Chromium through playwright-core) rendering the operations while every request it makes goes
// to the server's own origin. Needs no sandbox.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chromium, type Browser } from 'playwright-core';
import { API_DOCS_CSP } from '../src/http/api-docs.js';
import { projectPath } from '../src/paths.js';
import { startTestServer, type TestServer } from './harness.js';

const ARTIFACTS_DIR = join(process.env.NESTBOX_TEST_ARTIFACTS_DIR ?? projectPath('test-artifacts'), 'docs');

let t: TestServer;
let browser: Browser | undefined;

beforeAll(async () => {
  t = await startTestServer();
});

afterAll(async () => {
  await browser?.close();
  await t?.close();
});

describe('GET /docs', () => {
  it('answers an HTML page with a strict CSP that loads only same-origin scripts', async () => {
    const res = await fetch(`${t.url}/docs`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/html/);
    const csp = res.headers.get('content-security-policy');
    expect(csp).toBe(API_DOCS_CSP);
    // The policy itself: nothing but 'self' may load, and no inline script.
    const directives = Object.fromEntries(csp!.split(';').map((d) => d.trim().split(/\s+/)).map(([name, ...values]) => [name, values]));
    expect(directives['default-src']).toEqual(["'none'"]);
    expect(directives['script-src']).toEqual(["'self'"]);
    expect(directives['connect-src']).toEqual(["'self'"]);
    for (const values of Object.values(directives)) for (const v of values) expect(v).toMatch(/^('self'|'none'|'unsafe-inline')$/);
    expect(directives['script-src']).not.toContain("'unsafe-inline'");
    expect(directives['style-src']).toEqual(["'self'", "'unsafe-inline'"]);

    const html = await res.text();
    const urls = [...html.matchAll(/\b(?:src|href)\s*=\s*["']([^"']+)["']/gi)].map((m) => m[1]);
    expect(urls).toContain('/docs/standalone.js');
    // Same origin only: root-relative paths, no scheme, no protocol-relative `//host`.
    for (const url of urls) expect(url, url).toMatch(/^\/(?!\/)/);
    expect(html).not.toMatch(/(?:https?:)?\/\/[a-z0-9.-]+\.[a-z]{2,}/i);
    // Public like the health check and the spec: no key was sent.
    expect((await fetch(`${t.url}/docs/`)).status).toBe(200);
  });

  it('serves the Scalar bundle as cacheable JavaScript', async () => {
    const res = await fetch(`${t.url}/docs/standalone.js`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect(res.headers.get('cache-control')).toMatch(/max-age=86400/);
    const body = await res.text();
    expect(body.length).toBeGreaterThan(500_000);
    expect(body).toContain('createApiReference');
    const etag = res.headers.get('etag');
    expect(etag).toBeTruthy();
    // Through supertest: fetch turns a conditional request into `Cache-Control: no-cache`.
    const again = await t.http.get('/docs/standalone.js').set('If-None-Match', etag!);
    expect(again.status).toBe(304);

    const init = await fetch(`${t.url}/docs/init.js`);
    expect(init.headers.get('content-type')).toMatch(/^text\/javascript/);
    expect(await init.text()).toContain('"url":"/api/v1/openapi.yaml"');
  });

  // The bounds (120 s here, 45 s for the first render) are limits, not expectations: a loaded
  // machine renders slowly.
  it('renders the operations in a real browser, every request going to this server', async () => {
    browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'], headless: true, timeout: 20_000 });
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const origin = new URL(t.url).origin;
    const requested: string[] = [];
    const refusedByCsp: string[] = [];
    page.on('request', (request) => requested.push(request.url()));
    page.on('console', (message) => {
      if (/Content Security Policy/i.test(message.text())) refusedByCsp.push(message.text());
    });
    page.on('pageerror', (err) => refusedByCsp.push(`page error: ${err.message}`));

    await page.goto(`${t.url}/docs`, { waitUntil: 'load', timeout: 20_000 });
    // Summaries of the spec's operations, rendered from /api/v1/openapi.yaml: the first group
    // (Sandboxes) is open, another one (Server) opens from the sidebar.
    await page.getByText('Create a sandbox; answers once its guest agent is ready.').first().waitFor({ state: 'attached', timeout: 45_000 });
    await page.getByText('Server', { exact: true }).first().click({ timeout: 20_000 });
    await page.getByText('Liveness and the number of sandbox hosts available.').first().waitFor({ state: 'attached', timeout: 20_000 });
    // One operation opened from the sidebar: its description (from the spec) is shown.
    await page.getByText('Create a sandbox; answers once its guest agent is ready.').first().click({ timeout: 20_000 });
    await page.getByText('Every field is optional', { exact: false }).first().waitFor({ state: 'visible', timeout: 20_000 });
    mkdirSync(ARTIFACTS_DIR, { recursive: true });
    await page.screenshot({ path: join(ARTIFACTS_DIR, 'api-reference.png'), fullPage: false });

    // "Try it": Scalar's client sends the request itself, to this server (no proxy). Without a
    // key typed in, the server's own 401 comes back, which is what proves where it went.
    await page.locator('button', { hasText: 'Test Request(get /sandboxes)' }).first().click({ timeout: 20_000 });
    const [sent] = await Promise.all([
      page.waitForResponse((response) => response.url().startsWith(`${origin}/api/v1/sandboxes`), { timeout: 20_000 }),
      page.locator('button', { hasText: 'Send Request' }).first().click({ timeout: 20_000 }),
    ]);
    expect(sent.status()).toBe(401);
    expect((await sent.json()).error.code).toBe('unauthorized');
    await page.screenshot({ path: join(ARTIFACTS_DIR, 'api-reference-try-it.png'), fullPage: false });

    expect(requested).toContain(`${origin}/api/v1/openapi.yaml`);
    expect(requested).toContain(`${origin}/docs/standalone.js`);
    const elsewhere = requested.filter((url) => new URL(url).origin !== origin);
    expect(elsewhere).toEqual([]);
    expect(refusedByCsp).toEqual([]);
  }, 120_000);
});
