// Prometheus metrics of a real server and its real local host agent: `/metrics` on both behind
// NESTBOX_METRICS_TOKEN, and the series moving (by value, not only present) after a sandbox is
// created, runs a command and is stopped; no label ever carries a sandbox id. A second server
// without a token has no `/metrics` at all on either process.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync } from 'node:fs';
import { generateApiKey } from '../core/services/auth.js';
import { loadConfig } from '../src/config.js';
import { startServer } from '../src/server.js';
import { silentLogger } from '../core/logger.js';
import { createTestDatabase, removeDataDir, startTestServer, testEnv, waitFor, type TestServer } from './harness.js';

const TOKEN = 'metrics-token-for-tests-0123456789';

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of a Prometheus text exposition (format 0.0.4): `name{a="x",b="y"} value`. */
function parseExposition(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$/.exec(line);
    if (!m) throw new Error(`not an exposition line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\n/g, '\n').replace(/\\"/g, '"').replace(/\\\\/g, '\\');
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

/** The sum of the samples named `name` whose labels include `match` (0 when there are none). */
function valueOf(samples: Sample[], name: string, match: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v))
    .reduce((n, s) => n + s.value, 0);
}

async function scrape(url: string, token: string | null = TOKEN): Promise<{ status: number; contentType: string | null; text: string }> {
  const res = await fetch(`${url}/metrics`, { headers: token === null ? {} : { authorization: `Bearer ${token}` } });
  return { status: res.status, contentType: res.headers.get('content-type'), text: await res.text() };
}

async function hostAgentUrl(t: TestServer): Promise<string> {
  const row = (await t.server.db('hosts').first('url')) as { url: string };
  return row.url;
}

describe('metrics', () => {
  let t: TestServer;
  let agentUrl: string;

  beforeAll(async () => {
    t = await startTestServer({ env: { NESTBOX_METRICS_TOKEN: TOKEN, NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true' } });
    agentUrl = await hostAgentUrl(t);
  }, 180_000);
  afterAll(async () => {
    await t?.close();
  }, 120_000);

  it('answers /metrics on both processes only with the metrics token', async () => {
    for (const url of [t.url, agentUrl]) {
      expect((await scrape(url, null)).status).toBe(401);
      expect((await scrape(url, 'not-the-metrics-token-at-all-xx')).status).toBe(401);
      // The host secret is no metrics token, nor is an API key.
      expect((await scrape(url, t.apiKey)).status).toBe(401);
      const ok = await scrape(url);
      expect(ok.status).toBe(200);
      expect(ok.contentType).toMatch(/^text\/plain; version=0\.0\.4/);
      expect(parseExposition(ok.text).length).toBeGreaterThan(10);
    }
  });

  it('moves the lifecycle, request, state and host-agent series after create, exec and stop', async () => {
    const cp0 = parseExposition((await scrape(t.url)).text);
    const ha0 = parseExposition((await scrape(agentUrl)).text);
    const hostId = (await t.server.db('hosts').first('id') as { id: string }).id;

    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ memoryMiB: 256, egress: { mode: 'deny-all' } });
    expect(created.status).toBe(201);
    const id = created.body.id as string;
    const ran = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'echo metrics' });
    expect(ran.status).toBe(200);
    expect(ran.body.stdout).toContain('metrics');
    // The same sandbox through Daytona's toolbox: its mount carries the id, the label the template.
    const daytonaExec = await t.http.post(`/daytona/toolbox/${id}/process/execute`).set(t.auth).send({ command: 'echo daytona' });
    expect(daytonaExec.status, JSON.stringify(daytonaExec.body)).toBe(200);
    const running = parseExposition((await scrape(t.url)).text);
    expect(valueOf(running, 'nestbox_http_request_duration_seconds_count', { api: 'daytona', method: 'POST', route: '/daytona/toolbox/:sandboxId/process/execute', status: '200' })).toBe(1);
    expect(valueOf(running, 'nestbox_sandboxes', { state: 'running', host: hostId })).toBe(valueOf(cp0, 'nestbox_sandboxes', { state: 'running', host: hostId }) + 1);
    expect(valueOf(running, 'nestbox_host_allocated', { host: hostId, resource: 'memory_bytes' })).toBeGreaterThanOrEqual(256 * 1024 * 1024);
    expect(valueOf(running, 'nestbox_host_allocated', { host: hostId, resource: 'sandboxes' })).toBeGreaterThanOrEqual(1);
    expect(valueOf(running, 'nestbox_host_capacity', { host: hostId, resource: 'cpu' })).toBeGreaterThanOrEqual(1);
    expect(valueOf(running, 'nestbox_host_capacity', { host: hostId, resource: 'memory_bytes' })).toBeGreaterThan(256 * 1024 * 1024);
    // An open Server-Sent Events stream is counted while it lasts.
    const detached = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ detach: true, cmd: 'sleep 60' });
    expect(detached.status).toBe(202);
    const watching = new AbortController();
    // (Not awaited: a quiet stream's headers may wait for its first event or keep-alive.)
    const stream = fetch(`${t.url}/api/v1/sandboxes/${id}/commands/${detached.body.processId}/stream`, { headers: { ...t.auth, accept: 'text/event-stream' }, signal: watching.signal }).catch(() => undefined);
    const streaming = await waitFor('the stream to be counted', async () => {
      const samples = parseExposition((await scrape(t.url)).text);
      return valueOf(samples, 'nestbox_streams_open', { kind: 'http_stream' }) === 1 ? samples : undefined;
    }, 10_000);
    watching.abort();
    await stream;
    await waitFor('the stream to close', async () => valueOf(parseExposition((await scrape(t.url)).text), 'nestbox_streams_open', { kind: 'http_stream' }) === 0, 10_000);
    expect((await t.http.delete(`/api/v1/sandboxes/${id}/commands/${detached.body.processId}`).set(t.auth)).status).toBeLessThan(300);
    // The local host agent heartbeats every 500 ms (test harness), on a labelled internal route.
    expect(valueOf(streaming, 'nestbox_http_request_duration_seconds_count', { api: 'internal', method: 'POST', route: '/internal/v1/hosts/heartbeat', status: '204' })).toBeGreaterThan(0);
    const stopped = await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(t.auth);
    expect(stopped.status).toBe(200);

    const cp1 = parseExposition((await scrape(t.url)).text);
    const delta = (name: string, match: Record<string, string>) => valueOf(cp1, name, match) - valueOf(cp0, name, match);
    for (const operation of ['create', 'stop']) {
      expect(delta('nestbox_lifecycle_operations_total', { operation, phase: 'initiated', initiator: 'request' })).toBe(1);
      expect(delta('nestbox_lifecycle_operations_total', { operation, phase: 'succeeded', initiator: 'request' })).toBe(1);
      expect(delta('nestbox_lifecycle_operation_duration_seconds_count', { operation, outcome: 'succeeded' })).toBe(1);
      expect(delta('nestbox_lifecycle_operation_duration_seconds_sum', { operation, outcome: 'succeeded' })).toBeGreaterThan(0);
    }
    // Requests are labelled by operationId (a template), never by their path.
    expect(delta('nestbox_http_request_duration_seconds_count', { api: 'native', method: 'POST', route: 'createSandbox', status: '201' })).toBe(1);
    expect(delta('nestbox_http_request_duration_seconds_count', { api: 'native', method: 'POST', route: 'runCommand', status: '200' })).toBe(1);
    expect(delta('nestbox_http_request_duration_seconds_count', { api: 'native', method: 'POST', route: 'stopSandbox', status: '200' })).toBe(1);
    // The scrapes themselves are requests too.
    expect(delta('nestbox_http_request_duration_seconds_count', { api: 'internal', method: 'GET', route: '/metrics', status: '200' })).toBeGreaterThanOrEqual(2);
    // The state gauge: one more stopped sandbox, none more running.
    expect(delta('nestbox_sandboxes', { state: 'stopped', host: hostId })).toBe(1);
    expect(delta('nestbox_sandboxes', { state: 'running', host: hostId })).toBe(0);
    // Background passes ran while this happened.
    expect(delta('nestbox_background_pass_duration_seconds_count', { pass: 'expire' })).toBeGreaterThan(0);
    expect(valueOf(cp1, 'nestbox_process_cpu_seconds_total')).toBeGreaterThan(0);

    const ha1 = parseExposition((await scrape(agentUrl)).text);
    const agentDelta = (name: string, match: Record<string, string>) => valueOf(ha1, name, match) - valueOf(ha0, name, match);
    expect(agentDelta('nestbox_host_agent_driver_call_duration_seconds_count', { call: 'create', outcome: 'ok' })).toBe(1);
    expect(agentDelta('nestbox_host_agent_driver_call_duration_seconds_count', { call: 'stop', outcome: 'ok' })).toBe(1);
    // The native command and the Daytona one.
    expect(agentDelta('nestbox_host_agent_guest_request_duration_seconds_count', { call: 'exec', status: '200' })).toBe(2);
    expect(agentDelta('nestbox_host_agent_sandboxes', { status: 'stopped' })).toBe(1);
    expect(valueOf(ha1, 'nestbox_host_agent_slot_pool', { what: 'size' })).toBeGreaterThan(0);
    expect(valueOf(ha1, 'nestbox_host_agent_capacity', { resource: 'cpu' })).toBeGreaterThanOrEqual(1);
    expect(valueOf(ha1, 'nestbox_host_agent_heartbeat_failures_total')).toBe(0);

    // Bounded cardinality: no label value anywhere names the sandbox (nor any path with it).
    for (const samples of [cp1, ha1]) {
      for (const s of samples) for (const v of Object.values(s.labels)) expect(v).not.toContain(id);
    }
    const deleted = await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth);
    expect(deleted.status).toBe(204);
  }, 180_000);

  it('counts and times image builds and pulls by outcome', async () => {
    const before = parseExposition((await scrape(t.url)).text);
    const principal = await t.server.services.auth.authenticate(t.apiKey);
    const built = await t.http.post('/api/v1/builds').set(t.auth).send({ name: 'metrics-build', steps: [{ run: 'echo built > /built' }], egress: { mode: 'deny-all' } });
    expect(built.status, JSON.stringify(built.body)).toBe(202);
    // A registry on a loopback port nothing listens on: the pull fails at once.
    const pulled = await t.http.post('/api/v1/builds').set(t.auth).send({ name: 'metrics-pull', dockerfile: 'FROM 127.0.0.1:1/nothing/here:1\nRUN true\n', egress: { mode: 'deny-all' } });
    expect(pulled.status, JSON.stringify(pulled.body)).toBe(202);
    expect((await t.server.services.builds.waitFor(principal, built.body.id)).state).toBe('succeeded');
    expect((await t.server.services.builds.waitFor(principal, pulled.body.id)).state).toBe('failed');
    const after = parseExposition((await scrape(t.url)).text);
    const delta = (name: string, match: Record<string, string>) => valueOf(after, name, match) - valueOf(before, name, match);
    expect(delta('nestbox_image_builds_total', { outcome: 'succeeded' })).toBe(1);
    expect(delta('nestbox_image_builds_total', { outcome: 'failed' })).toBe(1);
    expect(delta('nestbox_image_build_duration_seconds_count', { outcome: 'succeeded' })).toBe(1);
    expect(delta('nestbox_image_build_duration_seconds_sum', { outcome: 'succeeded' })).toBeGreaterThan(0);
    expect(delta('nestbox_image_pulls_total', { outcome: 'failed' })).toBe(1);
    expect(delta('nestbox_image_pull_duration_seconds_count', { outcome: 'failed' })).toBe(1);
    expect(valueOf(after, 'nestbox_image_builds_pending', { state: 'queued' })).toBe(0);
    expect(valueOf(after, 'nestbox_image_builds_pending', { state: 'running' })).toBe(0);
    for (const s of after) for (const v of Object.values(s.labels)) expect(v).not.toContain(built.body.id);
  }, 300_000);

  it('reports the webhook delivery queue: a delivery whose receiver fails waits as retrying', async () => {
    const { createServer } = await import('node:http');
    let attempts = 0;
    const receiver = createServer((req, res) => {
      attempts++;
      req.resume();
      res.writeHead(500).end('no');
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', () => r()));
    const principal = await t.server.services.auth.authenticate(t.apiKey);
    const { webhook } = await t.server.services.webhooks.create(principal, { url: `http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`, eventTypes: ['webhook.ping'] });
    try {
      const before = parseExposition((await scrape(t.url)).text);
      expect(valueOf(before, 'nestbox_webhook_deliveries_pending', { state: 'retrying' })).toBe(0);
      await t.server.services.webhooks.ping(principal, webhook.id);
      await waitFor('the receiver to be called', async () => attempts >= 1);
      // The failed attempt is recorded, then the delivery waits (NESTBOX_WEBHOOK_RETRY_SECONDS is a day: minutes of backoff).
      await waitFor('the delivery to wait as retrying', async () => valueOf(parseExposition((await scrape(t.url)).text), 'nestbox_webhook_deliveries_pending', { state: 'retrying' }) === 1);
    } finally {
      await t.server.services.webhooks.remove(principal, webhook.id);
      receiver.close();
    }
    expect(valueOf(parseExposition((await scrape(t.url)).text), 'nestbox_webhook_deliveries_pending', { state: 'retrying' })).toBe(0);
  }, 180_000);

  it('labels compat routes by template and unknown paths as unmatched', async () => {
    const before = parseExposition((await scrape(t.url)).text);
    const e2b = await t.http.get('/e2b/sandboxes/nosuchsandbox123').set('X-API-Key', t.apiKey);
    expect(e2b.status).toBe(404);
    const daytona = await t.http.get('/daytona/api/sandbox/nosuchsandbox123').set(t.auth);
    expect(daytona.status).toBe(404);
    const unknown = await t.http.get('/api/v1/no/such/route/nosuchsandbox123').set(t.auth);
    expect(unknown.status).toBe(404);
    const after = parseExposition((await scrape(t.url)).text);
    const delta = (match: Record<string, string>) => valueOf(after, 'nestbox_http_request_duration_seconds_count', match) - valueOf(before, 'nestbox_http_request_duration_seconds_count', match);
    expect(delta({ api: 'e2b', route: '/e2b/sandboxes/:sandboxID', status: '404' })).toBe(1);
    expect(delta({ api: 'native', route: 'unmatched', status: '404' })).toBe(1);
    expect(delta({ api: 'daytona', status: '404' })).toBe(1);
    for (const s of after) for (const v of Object.values(s.labels)) expect(v).not.toContain('nosuchsandbox123');
  });
});

describe('metrics without a token', () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({ database: 'pglite' });
  }, 180_000);
  afterAll(async () => {
    await t?.close();
  }, 120_000);

  it('serves no /metrics on either process', async () => {
    expect((await scrape(t.url)).status).toBe(404);
    expect((await scrape(t.url, null)).status).toBe(404);
    expect((await scrape(await hostAgentUrl(t))).status).toBe(404);
  });
});

describe('metrics of placement', () => {
  it('counts a create that finds no host alive', async () => {
    // No host agent at all: every create fails its placement.
    const dataDir = mkdtempSync('/tmp/nbx-it-');
    const apiKey = generateApiKey();
    const database = await createTestDatabase();
    const server = await startServer(loadConfig(testEnv(dataDir, { NESTBOX_DATABASE_URL: database.url, NESTBOX_LOCAL_HOST_AGENT: 'false', NESTBOX_BOOTSTRAP_API_KEY: apiKey, NESTBOX_METRICS_TOKEN: TOKEN })), silentLogger);
    try {
      const before = parseExposition((await scrape(server.url)).text);
      const res = await fetch(`${server.url}/api/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' }, body: '{}' });
      expect(res.status).toBe(503);
      const after = parseExposition((await scrape(server.url)).text);
      expect(valueOf(after, 'nestbox_placement_failures_total', { reason: 'no_host_alive' }) - valueOf(before, 'nestbox_placement_failures_total', { reason: 'no_host_alive' })).toBe(1);
      expect(valueOf(after, 'nestbox_http_request_duration_seconds_count', { api: 'native', route: 'createSandbox', status: '503' })).toBe(1);
    } finally {
      await server.close();
      await database.drop();
      removeDataDir(dataDir);
    }
  }, 60_000);
});
