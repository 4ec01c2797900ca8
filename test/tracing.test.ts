// Traces end to end: a real server (control plane in this process, its host agent a child
// process, the guest agent inside a real sandbox) exporting to an OTLP/HTTP receiver this test
// starts on loopback. One command run through the API must give one trace with spans of all
// three services, each parented on the hop before it.
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes?: { key: string; value: { stringValue?: string } }[];
  status?: { code?: number };
}
interface ReceivedSpan extends OtlpSpan {
  service: string;
  resource: Record<string, string | undefined>;
}

/** A plain OTLP/HTTP receiver: every span of every JSON POST /v1/traces, with its resource's service. */
async function startReceiver(): Promise<{ url: string; spans: ReceivedSpan[]; contentTypes: Set<string>; close(): Promise<void> }> {
  const spans: ReceivedSpan[] = [];
  const contentTypes = new Set<string>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/traces') {
        res.writeHead(404).end();
        return;
      }
      contentTypes.add(String(req.headers['content-type']));
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
        resourceSpans: { resource: { attributes: { key: string; value: { stringValue?: string } }[] }; scopeSpans: { spans: OtlpSpan[] }[] }[];
      };
      for (const rs of body.resourceSpans) {
        const resource = Object.fromEntries(rs.resource.attributes.map((a) => [a.key, a.value.stringValue]));
        for (const ss of rs.scopeSpans) for (const span of ss.spans) spans.push({ ...span, service: resource['service.name'] ?? '?', resource });
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    spans,
    contentTypes,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const attr = (span: OtlpSpan, key: string) => span.attributes?.find((a) => a.key === key)?.value.stringValue;

let receiver: Awaited<ReturnType<typeof startReceiver>>;
let t: TestServer;

beforeAll(async () => {
  receiver = await startReceiver();
  t = await startTestServer({ env: { NESTBOX_OTLP_ENDPOINT: receiver.url } });
});
afterAll(async () => {
  await t?.close();
  await receiver?.close();
});

describe('traces', () => {
  it('follow a command from the control plane through the host agent into the guest agent', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    const ran = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'echo traced' });
    expect(ran.status, JSON.stringify(ran.body)).toBe(200);
    expect(ran.body.stdout).toBe('traced\n');

    // The guest agent's span reaches the collector through the host agent.
    const guest = await waitFor('the guest agent span of POST /exec', async () => receiver.spans.find((s) => s.service === 'nestbox-guest-agent' && s.name === 'POST /exec'), 60_000, 250);
    expect(guest.resource['nestbox.sandbox.id']).toBe(id);
    const byId = (spanId: string | undefined) => receiver.spans.find((s) => s.spanId === spanId);
    const chainOf = async (span: ReceivedSpan) =>
      waitFor('the whole chain of parents up to the root', async () => {
        const chain: ReceivedSpan[] = [span];
        for (let at = span; at.parentSpanId; ) {
          const parent = byId(at.parentSpanId);
          if (!parent) return undefined;
          chain.push(parent);
          at = parent;
          if (chain.length > 20) throw new Error('a parent loop');
        }
        return chain;
      }, 30_000, 250);
    const chain = await chainOf(guest);
    // guest server ← host agent's client of the guest ← host agent server ← control plane's host client ← control plane server.
    expect(chain.map((s) => [s.service, s.name])).toEqual([
      ['nestbox-guest-agent', 'POST /exec'],
      ['nestbox-host-agent', 'guest POST /exec'],
      ['nestbox-host-agent', 'POST /v1/sandboxes/{id}/agent/exec'],
      ['nestbox-control-plane', 'POST /v1/sandboxes/{id}/agent/exec'],
      ['nestbox-control-plane', 'POST runCommand'],
    ]);
    expect(new Set(chain.map((s) => s.traceId)).size).toBe(1);
    // Kinds: SERVER = 2, CLIENT = 3.
    expect(chain.map((s) => s.kind)).toEqual([2, 3, 2, 3, 2]);
    const root = chain[chain.length - 1];
    expect(attr(root, 'nestbox.sandbox.id')).toBe(id);
    expect(attr(root, 'http.route')).toBe('runCommand');
    expect(receiver.contentTypes).toEqual(new Set(['application/json']));
  });

  it('give each lifecycle operation a span with its ids, parent of the host agent and driver calls it made', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    expect((await t.http.post(`/api/v1/sandboxes/${id}/stop`).set(t.auth)).status).toBe(200);
    // A failing operation: a stopped sandbox cannot be paused.
    expect((await t.http.post(`/api/v1/sandboxes/${id}/pause`).set(t.auth)).status).toBe(409);

    const lifecycle = (operation: string) => receiver.spans.find((s) => s.name === `sandbox.${operation}` && attr(s, 'nestbox.sandbox.id') === id);
    const create = await waitFor('the sandbox.create span', async () => lifecycle('create'), 30_000, 250);
    expect(create.service).toBe('nestbox-control-plane');
    expect(attr(create, 'nestbox.operation.id')).toMatch(/.+/);
    expect(attr(create, 'nestbox.organization.id')).toMatch(/.+/);
    expect(attr(create, 'nestbox.host.id')).toMatch(/.+/);
    // Under it: the control plane's POST /v1/sandboxes, the host agent's server span, its driver.create.
    const driverCreate = await waitFor('driver.create', async () => receiver.spans.find((s) => s.name === 'driver.create' && attr(s, 'nestbox.sandbox.id') === id), 30_000, 250);
    expect(driverCreate.service).toBe('nestbox-host-agent');
    const hostServer = receiver.spans.find((s) => s.spanId === driverCreate.parentSpanId)!;
    expect([hostServer.service, hostServer.name]).toEqual(['nestbox-host-agent', 'POST /v1/sandboxes']);
    const hostClient = receiver.spans.find((s) => s.spanId === hostServer.parentSpanId)!;
    expect([hostClient.service, hostClient.name, hostClient.parentSpanId]).toEqual(['nestbox-control-plane', 'POST /v1/sandboxes', create.spanId]);

    // Its lifecycle log lines were written inside it, so they carry its trace.
    const createdLine = t.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((r) => r.component === 'lifecycle' && r.sandboxId === id && r.operation === 'create' && r.phase === 'succeeded');
    expect(createdLine).toMatchObject({ traceId: create.traceId, spanId: create.spanId });

    const stop = await waitFor('the sandbox.stop span', async () => lifecycle('stop'), 30_000, 250);
    expect(stop.status?.code ?? 0).not.toBe(2);
    await waitFor('driver.stop under it', async () => receiver.spans.find((s) => s.name === 'driver.stop' && s.traceId === stop.traceId), 30_000, 250);
    const pause = await waitFor('the failed sandbox.pause span', async () => lifecycle('pause'), 30_000, 250);
    // ERROR = 2.
    expect(pause.status?.code).toBe(2);
    expect((await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth)).status).toBe(204);
    await waitFor('the sandbox.delete span', async () => lifecycle('delete'), 30_000, 250);
  });
});
