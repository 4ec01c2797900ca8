// Scope tests over every route of every API (issue 11, "Scope tests"). The route lists are read
// from the sources of truth, not kept here: native operations from openapi/native.yaml (with
// their x-nestbox-scope) and its WebSocket table, Daytona and E2B routes from their express
// routers, which must match the scope tables the gate enforces (compat/*/scopes.ts). For each
// route: no key → 401, a key with every scope but the one declared → 403, a key limited to
// another sandbox → 404, a revoked key → 401, each in the API's own error shape. A route added
// without a declared scope fails here. Requests carry no body: the checks come first.
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { load as loadYaml } from 'js-yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';
import { listRoutes } from './route-list.js';
import { scopeTestKeys } from './scope-keys.js';
import { SCOPES, type Scope } from '../core/types.js';
import { NATIVE_WEBSOCKET_ROUTES } from '../src/http/native/websocket.js';
import { createE2bControlPlaneRouter as createE2bControlPlane } from '../compat/e2b/index.js';
import { e2bOptionsOf } from '../src/http/app.js';
import { createControlPlaneRouter as createDaytonaControlPlane } from '../compat/daytona/control-plane.js';
import { createToolboxRouter } from '../compat/daytona/toolbox.js';
import { daytonaOptionsOf } from '../src/http/app.js';
import { E2B_CONTROL_PLANE_SCOPES } from '../compat/e2b/scopes.js';
import { DAYTONA_API_SCOPES, DAYTONA_TOOLBOX_SCOPES } from '../compat/daytona/scopes.js';
import { tableKeys, type ScopeTable } from '../compat/scope-gate.js';

let t: TestServer;
let sandboxA: string;
let sandboxB: string;
let keys: Awaited<ReturnType<typeof scopeTestKeys>>;

beforeAll(async () => {
  t = await startTestServer();
  const ids: string[] = [];
  for (const name of ['a', 'b']) {
    const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ labels: { suite: 'scopes', name }, egress: { mode: 'deny-all' } });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    ids.push(res.body.id);
  }
  [sandboxA, sandboxB] = ids;
  keys = await scopeTestKeys(t, sandboxB);
});
afterAll(async () => {
  await t?.close();
});

type Shape = 'native' | 'daytona' | 'e2b';

/** The error code a body says, in each API's own shape (checked so a refusal cannot come from the wrong layer). */
function errorOf(shape: Shape, status: number, text: string): { ok: boolean; why: string } {
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(text) as Record<string, unknown>;
  } catch {
    return { ok: false, why: `not JSON: ${text.slice(0, 200)}` };
  }
  if (shape === 'native') {
    const code = (body.error as { code?: string } | undefined)?.code;
    const expected = { 401: 'unauthorized', 403: 'forbidden', 404: 'not_found' }[status];
    return { ok: code === expected, why: `native error code ${code}, expected ${expected}` };
  }
  if (shape === 'daytona') return { ok: body.statusCode === status && typeof body.message === 'string', why: `daytona body ${text.slice(0, 200)}` };
  return { ok: body.code === status && typeof body.message === 'string', why: `e2b body ${text.slice(0, 200)}` };
}

async function call(method: string, url: string, headers: Record<string, string>): Promise<{ status: number; text: string }> {
  const res = await fetch(`${t.url}${url}`, { method: method === 'ALL' ? 'GET' : method, headers, redirect: 'manual' });
  return { status: res.status, text: await res.text() };
}

/** Route template → a concrete path on sandbox A with harmless placeholder values. */
function concrete(template: string): string {
  if (template.includes('/^')) {
    // A regular-expression route as listed (`…/^\/volumes(\/.*)?$/`): its literal prefix.
    const at = template.indexOf('/^');
    return template.slice(0, at) + template.slice(at + 2).replace(/\(\\\/\.\*\)\?\$\/$/, '').replace(/\\\//g, '/');
  }
  return template
    .replace(/\{sandboxId\}|:sandboxId\b|:sandboxID\b/g, sandboxA)
    .replace(/\{port\}|:port\b/g, '3000')
    .replace(/:minutes\b/g, '5')
    .replace(/\{[A-Za-z]+\}|:[A-Za-z]+/g, 'x1')
    .replace(/\*rest/g, 'x1');
}

interface Probe {
  method: string;
  url: string;
  scope: Scope | 'authenticated';
  touchesSandbox: boolean;
  shape: Shape;
  auth: (key: string) => Record<string, string>;
}

async function expectRefused(probe: Probe, key: string | undefined, status: number, what: string): Promise<void> {
  const res = await call(probe.method, probe.url, key === undefined ? {} : probe.auth(key));
  const label = `${probe.method} ${probe.url} with ${what}`;
  expect(res.status, `${label}: ${res.text.slice(0, 300)}`).toBe(status);
  const shape = errorOf(probe.shape, status, res.text);
  expect(shape.ok, `${label}: ${shape.why}`).toBe(true);
}

async function checkProbe(probe: Probe): Promise<void> {
  await expectRefused(probe, undefined, 401, 'no key');
  await expectRefused(probe, keys.revoked.key, 401, 'a revoked key');
  if (probe.scope !== 'authenticated') await expectRefused(probe, keys.without.get(probe.scope)!.key, 403, `a key without ${probe.scope}`);
  else {
    // Routes that only say "not supported": a key with no scope at all gets no more than that.
    const res = await call(probe.method, probe.url, probe.auth(keys.none.key));
    expect(res.status, `${probe.method} ${probe.url} with a key without scopes: ${res.text.slice(0, 200)}`).toBeGreaterThanOrEqual(400);
    expect(res.status).not.toBe(500);
  }
  if (probe.touchesSandbox) await expectRefused(probe, keys.limitedToOther.key, 404, 'a key limited to another sandbox');
}

/** Non-GET routes that only read, by design; any other non-GET route declared with a read scope is a mistake. */
const READING_NON_GET = new Set([
  'native downloadFiles',
  'native createFileWatcher',
  'native deleteFileWatcher',
  'e2b POST /sandboxes/:sandboxID/connect',
  'e2b POST /v2/sandboxes/:sandboxID/connect',
  'daytona POST /files/bulk-download',
]);
const isReadScope = (scope: string) => scope.endsWith(':read');

describe('native API: every operation of openapi/native.yaml', () => {
  const spec = loadYaml(readFileSync(new URL('../openapi/native.yaml', import.meta.url), 'utf8')) as {
    paths: Record<string, Record<string, { operationId?: string; security?: unknown[]; 'x-nestbox-scope'?: string }>>;
  };
  const operations = Object.entries(spec.paths).flatMap(([path, item]) =>
    Object.entries(item)
      .filter(([, op]) => typeof op === 'object' && op.operationId)
      .map(([method, op]) => ({ path, method: method.toUpperCase(), op })),
  );

  it('declares a valid scope on every operation that needs a key, and no mutating operation with a read scope', () => {
    expect(operations.length).toBeGreaterThan(50);
    for (const { path, method, op } of operations) {
      if (Array.isArray(op.security) && op.security.length === 0) continue;
      const scope = op['x-nestbox-scope'];
      expect(SCOPES, `${op.operationId} ${method} ${path}`).toContain(scope);
      if (method !== 'GET' && isReadScope(scope!)) expect(READING_NON_GET, `${op.operationId} is ${method} but declares ${scope}`).toContain(`native ${op.operationId}`);
    }
  });

  it('answers 401 / 403 / 404 / 401 on every operation before doing anything', async () => {
    let probed = 0;
    for (const { path, method, op } of operations) {
      if (Array.isArray(op.security) && op.security.length === 0) continue;
      await checkProbe({
        method,
        url: `/api/v1${concrete(path)}`,
        scope: op['x-nestbox-scope'] as Scope,
        touchesSandbox: path.includes('{sandboxId}'),
        shape: 'native',
        auth: (key) => ({ Authorization: `Bearer ${key}` }),
      });
      probed++;
    }
    expect(probed).toBeGreaterThan(50);
    // Nothing above touched sandbox A.
    const a = await t.http.get(`/api/v1/sandboxes/${sandboxA}`).set(t.auth);
    expect(a.body).toMatchObject({ state: 'running', labels: { suite: 'scopes', name: 'a' } });
  });

  it('refuses native WebSocket upgrades the same way', async () => {
    for (const route of NATIVE_WEBSOCKET_ROUTES) {
      let n = 0;
      const path = route.pattern.source
        .replace(/^\^/, '')
        .replace(/\$$/, '')
        .replace(/\([^)]*\)/g, () => (n++ === 0 ? sandboxA : 'x1'))
        .replace(/\\\//g, '/');
      const without = keys.without.get(route.scope)!.key;
      expect((await upgradeStatus(path, undefined)).status, `${path} without a key`).toBe(401);
      expect((await upgradeStatus(path, keys.revoked.key)).status, `${path} revoked`).toBe(401);
      expect((await upgradeStatus(path, without)).status, `${path} without ${route.scope}`).toBe(403);
      expect((await upgradeStatus(path, keys.limitedToOther.key)).status, `${path} limited to another sandbox`).toBe(404);
      // Browsers pass the key as ?access_token= instead: the same checks.
      expect((await upgradeStatus(`${path}?access_token=${keys.revoked.key}`, undefined)).status, `${path}?access_token= revoked`).toBe(401);
      expect((await upgradeStatus(`${path}?access_token=${without}`, undefined)).status, `${path}?access_token= without ${route.scope}`).toBe(403);
    }
  });
});

function compatProbes(api: 'daytona' | 'e2b', table: ScopeTable, prefix: string, sandboxParam: RegExp, auth: Probe['auth']): Probe[] {
  return table.map(([key, scope]) => {
    const [method, path] = [key.slice(0, key.indexOf(' ')), key.slice(key.indexOf(' ') + 1)];
    if (scope === 'public') throw new Error(`${api} ${key}: public routes are not served behind the gate`);
    if (method !== 'GET' && method !== 'ALL' && isReadScope(scope)) expect(READING_NON_GET, `${api} ${key} declares ${scope}`).toContain(`${api} ${key}`);
    const full = prefix + path;
    return { method, url: concrete(full), scope, touchesSandbox: sandboxParam.test(full), shape: api, auth };
  });
}

describe('Daytona API: every route of its routers', () => {
  const bearer = (key: string) => ({ Authorization: `Bearer ${key}` });

  it('declares a scope for every route, in the order the routers serve them', () => {
    const services = t.server.services;
    expect(listRoutes(createDaytonaControlPlane(services, daytonaOptionsOf(services))).map((r) => `${r.method} ${r.path}`)).toEqual(tableKeys(DAYTONA_API_SCOPES));
    expect(listRoutes(createToolboxRouter(services, daytonaOptionsOf(services))).map((r) => `${r.method} ${r.path}`)).toEqual(tableKeys(DAYTONA_TOOLBOX_SCOPES));
  });

  it('answers 401 / 403 / 404 / 401 on every control-plane route', async () => {
    for (const probe of compatProbes('daytona', DAYTONA_API_SCOPES, '/daytona/api', /:sandboxId/, bearer)) await checkProbe(probe);
  });

  it('answers 401 / 403 / 404 / 401 on every toolbox route, on both mounts', async () => {
    for (const prefix of ['/daytona/toolbox/:sandboxId', '/daytona/api/toolbox/:sandboxId/toolbox']) {
      for (const probe of compatProbes('daytona', DAYTONA_TOOLBOX_SCOPES, prefix, /:sandboxId/, bearer)) await checkProbe(probe);
    }
    const a = await t.http.get(`/api/v1/sandboxes/${sandboxA}`).set(t.auth);
    expect(a.body.state).toBe('running');
  });

  it('refuses toolbox WebSocket upgrades the same way', async () => {
    const routes: [string, Scope][] = [
      [`/daytona/toolbox/${sandboxA}/process/pty/create-connect?id=x1`, 'sandboxes:exec'],
      [`/daytona/toolbox/${sandboxA}/process/pty/x1/connect`, 'sandboxes:exec'],
      [`/daytona/toolbox/${sandboxA}/process/session/x1/command/x1/logs?follow=true`, 'sandboxes:read'],
    ];
    for (const [path, scope] of routes) {
      expect((await upgradeStatus(path, undefined)).status, `${path} without a key`).toBe(401);
      expect((await upgradeStatus(path, keys.revoked.key)).status, `${path} revoked`).toBe(401);
      expect((await upgradeStatus(path, keys.without.get(scope)!.key)).status, `${path} without ${scope}`).toBe(403);
      expect((await upgradeStatus(path, keys.limitedToOther.key)).status, `${path} limited to another sandbox`).toBe(404);
    }
  });
});

describe('E2B API: every control-plane route', () => {
  it('declares a scope for every route, in the order the router serves them', () => {
    expect(listRoutes(createE2bControlPlane(t.server.services, e2bOptionsOf(t.server.services))).map((r) => `${r.method} ${r.path}`)).toEqual(tableKeys(E2B_CONTROL_PLANE_SCOPES));
  });

  it('answers 401 / 403 / 404 / 401 on every route', async () => {
    for (const probe of compatProbes('e2b', E2B_CONTROL_PLANE_SCOPES, '/e2b', /:sandboxID/, (key) => ({ 'X-API-KEY': key }))) await checkProbe(probe);
    const a = await t.http.get(`/api/v1/sandboxes/${sandboxA}`).set(t.auth);
    expect(a.body.state).toBe('running');
  });
});

/** The status a WebSocket upgrade is refused with (101 if it was accepted). */
function upgradeStatus(path: string, key: string | undefined): Promise<{ status: number; body: string }> {
  const url = new URL(t.url);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: url.hostname,
      port: url.port,
      path,
      headers: {
        Connection: 'Upgrade',
        Upgrade: 'websocket',
        'Sec-WebSocket-Version': '13',
        'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
        ...(key ? { Authorization: `Bearer ${key}` } : {}),
      },
      timeout: 30_000,
    });
    req.on('upgrade', (_res, socket) => {
      socket.destroy();
      resolve({ status: 101, body: '' });
    });
    req.on('response', (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('timeout', () => req.destroy(new Error(`upgrade ${path} timed out`)));
    req.on('error', reject);
    req.end();
  });
}
