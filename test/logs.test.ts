// Structured logs over a whole sandbox life, through the APIs: every lifecycle outcome has a
// line with its ids (sandbox, organisation, host, operation), a failure has its reason, and no
// line the server (or its host agent, relayed) writes holds the API key, a sandbox's E2B envd
// access token or an Authorization value, even at debug level.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from 'e2b';
import { childPids, startTestServer, waitFor, type TestServer } from './harness.js';

let t: TestServer;

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_LOG_LEVEL: 'debug' } });
});
afterAll(async () => {
  await t?.close();
});

type LogRecord = Record<string, unknown> & { msg: string };
const records = (): LogRecord[] => t.logs.filter((line) => line.startsWith('{')).map((line) => JSON.parse(line) as LogRecord);
const outcome = (sandboxId: string, operation: string, phase: string) =>
  records().find((r) => r.component === 'lifecycle' && r.sandboxId === sandboxId && r.operation === operation && r.phase === phase);

describe('log lines', () => {
  it('carry the ids of every lifecycle outcome and never a key, a token or an Authorization value', async () => {
    const e2bOpts = { apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url };

    // Native: create, exec, stop, delete.
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    expect((await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'echo hi' })).body.stdout).toBe('hi\n');
    expect((await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(t.auth)).status).toBe(200);
    expect((await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth)).status).toBe(204);

    // E2B: its envd access token travels on every in-sandbox call the SDK makes.
    const sbx = await Sandbox.create(e2bOpts);
    const detail = await fetch(`${t.url}/e2b/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-Key': t.apiKey } });
    const envdAccessToken = ((await detail.json()) as { envdAccessToken?: string }).envdAccessToken;
    expect(envdAccessToken).toMatch(/.{16,}/);
    expect((await sbx.commands.run('echo e2b')).stdout).toBe('e2b\n');
    await sbx.files.write('/tmp/x.txt', 'x');
    // A refused token is a request worth a line too.
    expect((await fetch(`${t.url}/files?path=/tmp/x.txt`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': `${envdAccessToken}x` } })).status).toBe(401);

    // A failing operation: the host agent is gone (killed; its supervisor restarts it) when the stop is sent.
    const victim = (await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' } })).body.id as string;
    const agentPid = childPids(process.pid, 'host-agent')[0];
    expect(agentPid).toBeGreaterThan(0);
    process.kill(agentPid, 'SIGKILL');
    await waitFor('the host agent gone', async () => !childPids(process.pid, 'host-agent').includes(agentPid), 10_000, 50);
    const failedStop = await t.http.post(`/api/v1/sandboxes/${victim}/stop`).set(t.auth);
    expect(failedStop.status, JSON.stringify(failedStop.body)).toBeGreaterThanOrEqual(500);
    // Once a new host agent has adopted the sandbox, it can be deleted.
    await waitFor('the victim deleted', async () => (await t.http.delete(`/api/v1/sandboxes/${victim}`).set(t.auth)).status === 204, 120_000, 500);
    await sbx.kill();

    await waitFor('the line of the last outcome', async () => outcome(sbx.sandboxId, 'delete', 'succeeded'), 10_000, 100);

    const expectIds = (record: LogRecord | undefined, what: string) => {
      expect(record, `${what}: no line`).toBeDefined();
      expect(record, what).toMatchObject({ sandboxId: expect.any(String), organizationId: expect.any(String), hostId: expect.any(String), operation: expect.any(String), operationId: expect.any(String) });
    };
    for (const operation of ['create', 'stop', 'delete']) {
      expectIds(outcome(id, operation, 'initiated'), `${operation} initiated`);
      expectIds(outcome(id, operation, 'succeeded'), `${operation} succeeded`);
    }
    const failed = outcome(victim, 'stop', 'failed');
    expectIds(failed, 'stop failed');
    expect(failed).toMatchObject({ level: 'warn', reason: expect.stringContaining('stop failed') });
    expectIds(outcome(victim, 'delete', 'succeeded'), 'delete after the failure');
    expectIds(outcome(sbx.sandboxId, 'create', 'succeeded'), 'E2B create');
    expectIds(outcome(sbx.sandboxId, 'delete', 'succeeded'), 'E2B kill');

    // Request lines: the request id, and the organisation and sandbox once the API knew them.
    const requestLine = records().find((r) => r.level === 'debug' && r.path === `/api/v1/sandboxes/${id}/commands`);
    expect(requestLine).toMatchObject({ requestId: expect.any(String), organizationId: expect.any(String), sandboxId: id, status: 200 });

    // Tracing is off (no NESTBOX_OTLP_ENDPOINT): no line is in a span.
    expect(records().filter((r) => 'traceId' in r)).toEqual([]);

    // Nothing secret anywhere: not in a field, not in a sentence, not in the host agent's relayed lines.
    const all = t.logs.join('\n');
    expect(t.logs.length).toBeGreaterThan(50);
    expect(all).not.toContain(t.apiKey);
    expect(all).not.toContain(envdAccessToken!);
    expect(all).not.toMatch(/Bearer\s+\S/);
    expect(all).not.toMatch(/nbx_[A-Za-z0-9]/);
  });
});
