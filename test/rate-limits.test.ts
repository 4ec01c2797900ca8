// Request rate limits across two control-plane replicas on one PostgreSQL database (replica A
// runs the local host agent, replica B none): the buckets are shared through the database, so a
// key spreading its requests over both gets one bucket's worth in total; a second key of the same
// organisation is stopped by the organisation's bucket; another organisation is unaffected; each
// API answers 429 in its own shape with Retry-After, which the real SDKs raise as their
// rate-limit errors; and after Retry-After seconds requests pass again.
//
// No timing thresholds: the counts are bounded by the bucket design (burst + rate × the time the
// loop took, and the leases replicas may hold), and the refill rates are slow enough that the
// few seconds the steps take cannot refill a bucket past what each step relies on.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import knexFactory, { type Knex } from 'knex';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Daytona, DaytonaRateLimitError } from '@daytonaio/sdk';
import { RateLimitError, Sandbox } from 'e2b';
import { AuthService } from '../core/services/auth.js';
import { projectPath } from '../src/paths.js';
import { freePort, removeDataDir, startServerProcess, testEnv, waitFor, type TestServerProcess } from './harness.js';

// Per key: 20 at once, one more every 4 s; per organisation: 30 at once, one more every 10 s.
// A lease of 2 tokens (a tenth of the key's burst; the organisation's is 2 as well, the cap).
const KEY_BURST = 20;
const KEY_RATE = 0.25;
const ORG_BURST = 30;
const LEASE = 2;
const REPLICAS = 2;
const LIMITS = {
  NESTBOX_RATE_LIMIT_KEY_PER_SECOND: String(KEY_RATE),
  NESTBOX_RATE_LIMIT_KEY_BURST: String(KEY_BURST),
  NESTBOX_RATE_LIMIT_ORG_PER_SECOND: '0.1',
  NESTBOX_RATE_LIMIT_ORG_BURST: String(ORG_BURST),
  NESTBOX_RATE_LIMIT_LEASE: String(LEASE),
};
const HOST_SECRET = randomBytes(32).toString('base64url');
const METRICS_TOKEN = randomBytes(16).toString('hex');

let a: TestServerProcess;
let b: { url: string; process: ChildProcess; dataDir: string; output: string[] };
let db: Knex;
const keys: Record<'a1' | 'a2' | 'b1' | 'b2', string> = { a1: '', a2: '', b1: '', b2: '' };

/**
 * A second `nestbox server` on A's database, without a host agent of its own, and without the
 * supervisor (the worker alone: one process fewer to start, and restarts play no part here).
 */
async function startReplica(databaseUrl: string): Promise<typeof b> {
  const dataDir = mkdtempSync('/tmp/nbx-proc-');
  const port = await freePort();
  const output: string[] = [];
  const child = spawn(process.execPath, [projectPath('dist/src/cli.js'), 'server'], {
    env: {
      PATH: process.env.PATH,
      ...testEnv(dataDir, { NESTBOX_PORT: String(port), NESTBOX_DATABASE_URL: databaseUrl, NESTBOX_HOST_SECRET: HOST_SECRET, NESTBOX_LOCAL_HOST_AGENT: 'false', NESTBOX_SERVER_SUPERVISOR: 'false', NESTBOX_BOOTSTRAP_API_KEY: a.apiKey, ...LIMITS }),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (d) => output.push(String(d)));
  child.stderr!.on('data', (d) => output.push(String(d)));
  const url = `http://127.0.0.1:${port}`;
  const replica = { url, process: child, dataDir, output };
  await waitFor('replica B', async () => (await fetch(`${url}/api/v1/health`).catch(() => undefined))?.ok, 60_000).catch((err) => {
    throw new Error(`${(err as Error).message}\nreplica B output:\n${output.join('').slice(-3000)}`);
  });
  return replica;
}

beforeAll(async () => {
  for (const k of Object.keys(process.env)) if (k.startsWith('DAYTONA_')) delete process.env[k];
  a = await startServerProcess({ env: { NESTBOX_HOST_SECRET: HOST_SECRET, NESTBOX_METRICS_TOKEN: METRICS_TOKEN, ...LIMITS } });
  b = await startReplica(a.databaseUrl);
  // Keys straight through the auth service, so that making them spends no request of a bucket:
  // two of the bootstrap key's organisation, two of a second organisation.
  db = knexFactory({ client: 'pg', connection: a.databaseUrl, pool: { min: 0, max: 2 } });
  const auth = new AuthService(db);
  const orgA = (await db('api_keys').select('organization_id').first()) as { organization_id: string };
  const orgB = await auth.createOrganization('rate-limits-other');
  keys.a1 = (await auth.createApiKey(orgA.organization_id, { name: 'a1', preset: 'admin' })).key;
  keys.a2 = (await auth.createApiKey(orgA.organization_id, { name: 'a2', preset: 'admin' })).key;
  keys.b1 = (await auth.createApiKey(orgB.id, { name: 'b1', preset: 'admin' })).key;
  keys.b2 = (await auth.createApiKey(orgB.id, { name: 'b2', preset: 'admin' })).key;
}, 180_000);

afterAll(async () => {
  await db?.destroy();
  if (b) {
    if (b.process.exitCode === null && b.process.signalCode === null) {
      const exited = new Promise((r) => b.process.once('exit', r));
      b.process.kill('SIGTERM');
      await exited;
    }
    removeDataDir(b.dataDir);
  }
  await a?.close();
});

const replicaUrls = () => [a.url, b.url];

interface Answer {
  status: number;
  retryAfter: string | null;
  body: { error?: { code?: string; details?: { scope?: string; retryAfterSeconds?: number } } };
}

async function nativeGet(base: string, key: string, path = '/api/v1/sandboxes?limit=1'): Promise<Answer> {
  const res = await fetch(`${base}${path}`, { headers: { authorization: `Bearer ${key}` } });
  return { status: res.status, retryAfter: res.headers.get('retry-after'), body: (await res.json()) as Answer['body'] };
}

/**
 * Requests of `key`, alternately to replica A and B, until both have refused in a row (at most
 * `max`): how many passed, the last refusal, and the seconds the loop took.
 */
async function drainAlternately(key: string, max = 200): Promise<{ passed: number; refusal: Answer; seconds: number }> {
  const started = performance.now();
  let passed = 0;
  let refusedInARow = 0;
  let refusal: Answer | undefined;
  for (let i = 0; i < max && refusedInARow < REPLICAS; i++) {
    const answer = await nativeGet(replicaUrls()[i % REPLICAS], key);
    if (answer.status === 200) {
      passed++;
      refusedInARow = 0;
    } else {
      expect(answer.status).toBe(429);
      refusal = answer;
      refusedInARow++;
    }
  }
  expect(refusedInARow).toBe(REPLICAS);
  return { passed, refusal: refusal!, seconds: (performance.now() - started) / 1000 };
}

/** Calls `attempt` until it throws (bounded): a token that refilled meanwhile lets one through, which only spends it. */
async function firstError(attempt: () => Promise<unknown>, max = 10): Promise<unknown> {
  for (let i = 0; i < max; i++) {
    try {
      await attempt();
    } catch (err) {
      return err;
    }
  }
  throw new Error(`no error in ${max} attempts`);
}

const expectRetryAfter = (value: string | null) => {
  expect(value).toMatch(/^[1-9]\d*$/);
  return Number(value);
};

describe('request rate limits over two replicas', () => {
  // First, since the operator's calls spend a few of its organisation's 30 tokens, which the next
  // test drains.
  it("gives an organisation the operator's own rates (its keys refused at its burst on both replicas), and turning them off takes effect on both", async () => {
    const operator = { authorization: `Bearer ${a.apiKey}`, 'content-type': 'application/json' };
    const bad = await fetch(`${a.url}/api/v1/organizations`, { method: 'POST', headers: operator, body: JSON.stringify({ name: 'rates-bad', limits: { keyRequestBurst: 0 } }) });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as Answer['body']).error).toMatchObject({ code: 'validation_failed', details: { field: 'limits.keyRequestBurst' } });
    const created = await fetch(`${a.url}/api/v1/organizations`, { method: 'POST', headers: operator, body: JSON.stringify({ name: 'rates-own', limits: { keyRequestBurst: 5, keyRequestsPerSecond: 0.05 } }) });
    expect(created.status).toBe(201);
    const org = (await created.json()) as { id: string; limits: Record<string, number>; customLimits: Record<string, number | null> };
    expect(org.limits).toMatchObject({ keyRequestBurst: 5, keyRequestsPerSecond: 0.05, requestBurst: ORG_BURST, requestsPerSecond: 0.1 });
    expect(org.customLimits).toMatchObject({ keyRequestBurst: 5, keyRequestsPerSecond: 0.05, requestBurst: null });
    const minted = await fetch(`${b.url}/api/v1/organizations/${org.id}/api-keys`, { method: 'POST', headers: operator, body: JSON.stringify({ name: 'c1', preset: 'admin' }) });
    expect(minted.status).toBe(201);
    const c1 = ((await minted.json()) as { key: string }).key;

    const own = await drainAlternately(c1);
    expect(own.passed).toBeLessThanOrEqual(Math.floor(5 + 0.05 * own.seconds));
    // Leases are at most a tenth of the burst and at least one token: one per replica unspent.
    expect(own.passed).toBeGreaterThanOrEqual(5 - REPLICAS);
    expect(own.refusal.body.error).toMatchObject({ code: 'rate_limited', details: { scope: 'key', burst: 5, perSecond: 0.05 } });

    // A key rate of 0: the organisation's keys are not limited (the organisation still is). Each
    // replica reads the change within 5 s.
    const patched = await fetch(`${b.url}/api/v1/organizations/${org.id}`, { method: 'PATCH', headers: operator, body: JSON.stringify({ limits: { keyRequestsPerSecond: 0 } }) });
    expect(patched.status).toBe(200);
    expect(((await patched.json()) as typeof org).limits).toMatchObject({ keyRequestsPerSecond: 0, keyRequestBurst: 0 });
    for (const url of replicaUrls()) {
      await waitFor(`c1 admitted again by ${url}`, async () => (await nativeGet(url, c1)).status === 200, 20_000, 1000);
    }
  });

  it('shares one key bucket between both replicas, then a second key of the organisation meets the organisation bucket; another organisation is unaffected', async () => {
    const started = performance.now();
    const first = await drainAlternately(keys.a1);
    // Every token is taken from the shared row before a replica spends it, so no more than the
    // bucket allowed over the loop passed; each replica may have held up to one lease unspent
    // when it refused.
    expect(first.passed).toBeLessThanOrEqual(Math.floor(KEY_BURST + KEY_RATE * first.seconds));
    expect(first.passed).toBeGreaterThanOrEqual(KEY_BURST - REPLICAS * LEASE);
    expect(first.refusal.body.error).toMatchObject({ code: 'rate_limited', details: { scope: 'key' } });
    expect(expectRetryAfter(first.refusal.retryAfter)).toBe(first.refusal.body.error!.details!.retryAfterSeconds);

    // a2 has its own full key bucket, but the organisation has only what a1 left of its 30.
    const second = await drainAlternately(keys.a2);
    expect(second.refusal.body.error).toMatchObject({ code: 'rate_limited', details: { scope: 'organization' } });
    expect(second.passed).toBeLessThan(KEY_BURST);
    // Every request that passed took one token of the organisation's row (a refusal by the key
    // takes none, one by the organisation gives the key's token back).
    expect(first.passed + second.passed).toBeLessThanOrEqual(Math.floor(ORG_BURST + 0.1 * ((performance.now() - started) / 1000)));
    expectRetryAfter(second.refusal.retryAfter);

    // The other organisation's key passes through both replicas.
    for (const url of replicaUrls()) expect((await nativeGet(url, keys.b1)).status).toBe(200);

    // The refusals were counted (replica A's registry).
    const metrics = await (await fetch(`${a.url}/metrics`, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })).text();
    const count = (scope: string) => Number(metrics.match(new RegExp(`^nestbox_rate_limited_requests_total\\{scope="${scope}",api="native"\\} (\\d+)`, 'm'))?.[1] ?? 0);
    expect(count('key')).toBeGreaterThanOrEqual(1);
    expect(count('organization')).toBeGreaterThanOrEqual(1);
  });

  it('answers 429 in the Daytona and E2B shapes, which the real SDKs raise as their rate-limit errors', async () => {
    // a1 is limited (its key, and its organisation) on every front door of either replica.
    const daytona = new Daytona({ apiUrl: `${b.url}/daytona/api`, apiKey: keys.a1 });
    expect(await firstError(() => daytona.get('no-such-sandbox').catch((err) => { if (err instanceof DaytonaRateLimitError) throw err; }))).toBeInstanceOf(DaytonaRateLimitError);

    const dayApi = await fetch(`${a.url}/daytona/api/sandbox`, { headers: { authorization: `Bearer ${keys.a1}` } });
    expect(dayApi.status).toBe(429);
    expectRetryAfter(dayApi.headers.get('retry-after'));
    expect(await dayApi.json()).toMatchObject({ statusCode: 429, error: 'Too Many Requests', code: 'rate_limited', path: '/daytona/api/sandbox' });
    // The toolbox too, before the sandbox is even looked up.
    const dayToolbox = await fetch(`${b.url}/daytona/toolbox/no-such-sandbox/files?path=/`, { headers: { authorization: `Bearer ${keys.a1}` } });
    expect(dayToolbox.status).toBe(429);
    expectRetryAfter(dayToolbox.headers.get('retry-after'));
    expect(await dayToolbox.json()).toMatchObject({ statusCode: 429, code: 'rate_limited', method: 'GET' });

    const e2bOpts = { apiKey: keys.a1, apiUrl: `${a.url}/e2b`, sandboxUrl: a.url, retries: 0 };
    expect(await firstError(() => Sandbox.getInfo('nosuchsandbox', e2bOpts).catch((err) => { if (err instanceof RateLimitError) throw err; }))).toBeInstanceOf(RateLimitError);
    const e2bApi = await fetch(`${b.url}/e2b/sandboxes`, { headers: { 'x-api-key': keys.a1 } });
    expect(e2bApi.status).toBe(429);
    expectRetryAfter(e2bApi.headers.get('retry-after'));
    expect(await e2bApi.json()).toMatchObject({ code: 429, message: expect.stringContaining('rate limit') });
  });

  it("limits envd traffic against the key its token came from, and lets requests through again after Retry-After", async () => {
    // A sandbox of the other organisation, made through replica B (its host agent is A's).
    const sandbox = await Sandbox.create({ apiKey: keys.b1, apiUrl: `${b.url}/e2b`, sandboxUrl: b.url, timeoutMs: 120_000, allowInternetAccess: false, retries: 0 });
    try {
      expect((await sandbox.files.list('/')).length).toBeGreaterThan(0);
      // Spend b1's key bucket (its organisation keeps some of its 30).
      const drained = await drainAlternately(keys.b1);
      expect(drained.refusal.body.error?.details?.scope).toBe('key');
      // envd's Connect RPCs (resource_exhausted) and its plain HTTP /files (429): RateLimitError both.
      expect(await firstError(() => sandbox.files.list('/'))).toBeInstanceOf(RateLimitError);
      expect(await firstError(() => sandbox.files.read('/etc/hostname'))).toBeInstanceOf(RateLimitError);

      // Retry-After says when the key's bucket has a token again: then a request passes.
      let refused = await nativeGet(b.url, keys.b1);
      for (let i = 0; i < 10 && refused.status !== 429; i++) refused = await nativeGet(b.url, keys.b1);
      expect(refused.status).toBe(429);
      const wait = expectRetryAfter(refused.retryAfter);
      await new Promise((r) => setTimeout(r, wait * 1000));
      expect((await nativeGet(b.url, keys.b1)).status).toBe(200);
    } finally {
      // b2: the same organisation with a key bucket of its own.
      const removed = await fetch(`${a.url}/api/v1/sandboxes/${sandbox.sandboxId}`, { method: 'DELETE', headers: { authorization: `Bearer ${keys.b2}` } });
      expect(removed.status).toBeLessThan(300);
      // Gone before the servers stop (read from the database: polling the API would spend tokens).
      await waitFor('the sandbox deleted', async () => ((await db('sandboxes').where({ id: sandbox.sandboxId }).first()) as { state: string }).state === 'deleted', 60_000, 100);
    }
  });
});
