// The web dashboard in a real browser (Debian's Chromium through playwright-core) against a real
// server, used as a person would: log in with the server's key, create a sandbox with deny-all
// egress (after the API refused a bad size, shown in the form), type into its terminal and read the
// answer off the rendered screen, reload the page, upload a file through the file input, see the
// shell among the processes, publish and unpublish a port, create and revoke an API key, and check
// the narrow-screen layout.
// Each step leaves a screenshot in test-artifacts/dashboard/ (or $NESTBOX_TEST_ARTIFACTS_DIR).
// Also: how the server serves the bundle (SPA fallback, caching, never over an API's 404).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import express from 'express';
import supertest from 'supertest';
import { chromium, type Browser, type Page } from 'playwright-core';
import { dashboardHandler } from '../src/http/dashboard.js';
import { projectPath } from '../src/paths.js';
import { startTestServer, type TestServer } from './harness.js';

const ARTIFACTS = process.env.NESTBOX_TEST_ARTIFACTS_DIR ?? projectPath('test-artifacts/dashboard');
const HTML = { accept: 'text/html,application/xhtml+xml,*/*;q=0.8' };

describe('dashboard', () => {
  let t: TestServer;
  let browser: Browser;
  let page: Page;
  let sandboxId: string;
  const shot = (name: string) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
  /** No horizontal scrolling: the page is no wider than the window. */
  const overflow = () => page.evaluate(() => ({ scrollWidth: document.scrollingElement!.scrollWidth, innerWidth: window.innerWidth }));

  beforeAll(async () => {
    mkdirSync(ARTIFACTS, { recursive: true });
    [t, browser] = await Promise.all([
      startTestServer(),
      chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox'] }),
    ]);
    page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
    page.setDefaultTimeout(20_000);
  }, 180_000);
  afterAll(async () => {
    await browser?.close();
    await t?.close();
  }, 120_000);

  it('serves the app at / and on page paths, keeps the API 404s, caches hashed assets', async () => {
    const root = await t.http.get('/').set(HTML);
    expect(root.status).toBe(200);
    expect(root.headers['content-type']).toMatch(/^text\/html/);
    expect(root.headers['cache-control']).toBe('no-cache');
    expect(root.text).toContain('<div id="root">');
    const deep = await t.http.get('/sandboxes/sbxdoesnotexist').set(HTML);
    expect(deep.status).toBe(200);
    expect(deep.text).toBe(root.text);
    const script = /src="(\/assets\/[^"]+\.js)"/.exec(root.text)![1];
    const asset = await t.http.get(script);
    expect(asset.status).toBe(200);
    expect(asset.headers['cache-control']).toContain('immutable');

    // An unknown API path is still the API's JSON 404, even from a browser that prefers HTML.
    for (const path of ['/api/v1/no-such-thing', '/api/v1/sandboxes/x/nothing/here']) {
      const api = await t.http.get(path).set(HTML).set(t.auth);
      expect(api.status).toBe(404);
      expect(api.headers['content-type']).toMatch(/json/);
      expect(api.body.error.code).toBe('not_found');
    }
    // A missing asset or a non-browser client gets a 404, not the app.
    expect((await t.http.get('/assets/gone-1234.js').set(HTML)).status).toBe(404);
    expect((await t.http.get('/sandboxes/x').set({ accept: '*/*' })).status).toBe(404);
  });

  it('answers a clear 503 page when dist/dashboard was never built', async () => {
    const app = express().use(dashboardHandler('/nonexistent/nestbox-dashboard'));
    const res = await supertest(app).get('/').set(HTML);
    expect(res.status).toBe(503);
    expect(res.text).toContain('npm run build');
  });

  it('logs in with the API key (a wrong key is told why)', async () => {
    await page.goto(`${t.url}/`);
    await page.fill('input[name=apiKey]', 'nbx_not-a-real-key');
    await page.click('button:has-text("Log in")');
    await expect.poll(() => page.textContent('[role=alert]'), { timeout: 10_000 }).toMatch(/HTTP 401/);
    await shot('01-login-wrong-key');
    await page.fill('input[name=apiKey]', t.apiKey);
    await page.click('button:has-text("Log in")');
    await page.waitForSelector('h2:has-text("Sandboxes")');
    await shot('02-sandboxes-empty');
  });

  it('creates a sandbox with deny-all egress and opens it', async () => {
    await page.click('button:has-text("New sandbox")');
    await page.fill('input[name=labels]', 'made-by=dashboard-test');
    await page.selectOption('select[name=egress]', 'deny-all');
    // A value the API refuses comes back as its message, naming the field.
    await page.fill('input[name=memoryMiB]', '0');
    await page.click('button[type=submit]:has-text("Create")');
    await expect.poll(() => page.textContent('form[aria-label="New sandbox"] [role=alert]'), { timeout: 10_000 }).toMatch(/memoryMiB/);
    await shot('03-create-form-error');
    await page.fill('input[name=memoryMiB]', '1024');
    await page.click('button[type=submit]:has-text("Create")');
    await page.waitForURL(/\/sandboxes\/[a-z0-9]+$/);
    sandboxId = new URL(page.url()).pathname.split('/').pop()!;
    await page.waitForSelector('[data-testid=sandbox-state]:has-text("running")', { timeout: 90_000 });
    const sandbox = (await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set(t.auth)).body;
    expect(sandbox).toMatchObject({ state: 'running', labels: { 'made-by': 'dashboard-test' }, egress: { mode: 'deny-all' } });
  }, 120_000);

  it('types into the terminal and sees the answer rendered', async () => {
    await page.waitForSelector('.terminal-bar:has-text("connected")');
    await page.click('[data-testid=terminal]');
    await page.keyboard.type('echo $((6*7))\n');
    // The rendered rows: the typed line holds "echo $((6*7))", only the output row is exactly 42.
    const rows = () => page.$$eval('.xterm-rows > div', (divs) => divs.map((d) => (d.textContent ?? '').trim()));
    await expect.poll(rows, { timeout: 20_000 }).toContain('42');
    await shot('04-terminal-42');
  }, 60_000);

  it('reloads a sandbox page (the server answers the app for the route)', async () => {
    await page.reload();
    await page.waitForSelector(`h2:has-text("${sandboxId}")`);
  });

  it('uploads a file through the file input and lists it', async () => {
    await page.click('button[role=tab]:has-text("Files")');
    await page.waitForSelector('input[name=path]');
    const content = `uploaded from the dashboard test ${Date.now()}\n`;
    await page.setInputFiles('input[name=upload]', { name: 'from-dashboard.txt', mimeType: 'text/plain', buffer: Buffer.from(content) });
    await page.waitForSelector('[data-testid=files] td:has-text("from-dashboard.txt")');
    await shot('05-files-uploaded');
    const res = await t.http.get(`/api/v1/sandboxes/${sandboxId}/files`).query({ path: '/root/from-dashboard.txt' }).set(t.auth).buffer(true).parse((r, cb) => {
      let text = '';
      r.on('data', (c: Buffer) => { text += c.toString(); });
      r.on('end', () => cb(null, text));
    });
    expect(res.status).toBe(200);
    expect(res.body).toBe(content);
  });

  it('lists the terminal\'s shell among the processes, and publishes and unpublishes a port', async () => {
    await page.click('button[role=tab]:has-text("Processes")');
    const shells = async () => ((await t.http.get(`/api/v1/sandboxes/${sandboxId}/commands`).query({ all: true }).set(t.auth)).body.processes as { processId: string; pty?: boolean; status: string }[]).filter((p) => p.pty);
    // One shell runs: the page's own. The one from before the reload was ended as the page went
    // (pagehide), and switching tabs keeps the current one rather than starting another.
    await expect.poll(async () => (await shells()).map((p) => p.status).sort(), { timeout: 10_000 }).toEqual(['killed', 'running']);
    const shell = (await shells()).find((p) => p.status === 'running')!;
    await page.waitForSelector(`td:has-text("${shell.processId}")`);
    await shot('06-processes');

    await page.click('button[role=tab]:has-text("Ports")');
    await page.fill('input[name=port]', '8080');
    await page.click('button:has-text("Publish")');
    const link = page.locator(`a[href*="/p/${sandboxId}/8080"]`);
    await expect.poll(() => link.count(), { timeout: 10_000 }).toBe(1);
    // A private port's link carries the token from the publish answer, so a click gets in: the
    // proxy lets it past (nothing listens on 8080, so no further), the bare URL is refused.
    const href = (await link.getAttribute('href'))!;
    expect(href).toMatch(/[?&]_token=/);
    expect((await fetch(href, { redirect: 'manual' })).status).not.toBe(401);
    expect((await fetch(href.replace(/[?&]_token=[^&]*/, ''), { redirect: 'manual' })).status).toBe(401);
    const ports = (await t.http.get(`/api/v1/sandboxes/${sandboxId}/ports`).set(t.auth)).body.items as { port: number }[];
    expect(ports.map((p) => p.port)).toEqual([8080]);
    await shot('07-port-published');
    await page.click('button:has-text("Unpublish")');
    await page.waitForSelector('text=No published ports.');
    expect((await t.http.get(`/api/v1/sandboxes/${sandboxId}/ports`).set(t.auth)).body.items).toEqual([]);
  });

  it('creates an API key (shown once), revokes it, and the API refuses it after', async () => {
    await page.click('nav a:has-text("API keys")');
    await page.fill('input[name=keyName]', 'dashboard-test-key');
    await page.selectOption('select[name=preset]', 'read-only');
    await page.click('button:has-text("Create key")');
    const key = (await page.textContent('[data-testid=created-key]'))!.trim();
    expect(key.startsWith('nbx_')).toBe(true);
    expect((await t.http.get('/api/v1/sandboxes').set({ Authorization: `Bearer ${key}` })).status).toBe(200);
    await shot('08-key-created');

    const row = page.locator('[data-testid=keys] tr', { hasText: 'dashboard-test-key' });
    await expect.poll(() => row.count()).toBe(1);
    page.once('dialog', (dialog) => void dialog.accept());
    await row.locator('button:has-text("Revoke")').click();
    await expect.poll(() => row.count(), { timeout: 10_000 }).toBe(0);
    await shot('09-key-revoked');
    expect((await t.http.get('/api/v1/sandboxes').set({ Authorization: `Bearer ${key}` })).status).toBe(401);
  });

  it('fits a 390 px wide screen without horizontal scrolling', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    for (const [name, path, ready] of [
      ['10-narrow-sandboxes', '/', `a:has-text("${sandboxId}")`],
      ['11-narrow-sandbox', `/sandboxes/${sandboxId}`, '.terminal-bar:has-text("connected")'],
      ['12-narrow-keys', '/keys', '[data-testid=keys]'],
    ] as const) {
      await page.goto(`${t.url}${path}`);
      await page.waitForSelector(ready);
      await shot(name);
      const { scrollWidth, innerWidth } = await overflow();
      expect(scrollWidth, `${path} at 390 px`).toBeLessThanOrEqual(innerWidth);
    }
  }, 60_000);
});
