// The guest agent's spans (agent-protocol/telemetry.ts): only for requests carrying a sampled
// traceparent, children of it, kept in a bounded buffer, handed over once as OTLP JSON.
import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { GUEST_SPANS_ROUTE } from '../agent-protocol/telemetry.js';
import { startTestAgent, type TestAgent } from './testing.js';
import { GuestTracing } from './tracing.js';

const TRACE_ID = '0af7651916cd43dd8448eb211c80319c';
const PARENT_ID = 'b7ad6b7169203331';

interface OtlpBody {
  resourceSpans: { resource: { attributes: { key: string; value: { stringValue?: string } }[] }; scopeSpans: { spans: { traceId: string; spanId: string; parentSpanId?: string; name: string; kind: number }[] }[] }[];
}

describe('guest agent spans', () => {
  let agent: TestAgent;
  let client: AgentClient;

  async function drain(): Promise<{ status: number; body?: OtlpBody }> {
    const response = await client.request({ method: 'GET', path: GUEST_SPANS_ROUTE });
    const chunks: Buffer[] = [];
    for await (const chunk of response) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    return { status: response.statusCode ?? 0, body: text ? (JSON.parse(text) as OtlpBody) : undefined };
  }

  async function exec(headers: Record<string, string>) {
    const response = await client.request({ method: 'POST', path: '/exec', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ cmd: 'true' }) });
    for await (const _chunk of response) void _chunk;
    expect(response.statusCode).toBe(200);
  }

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  it('records nothing for requests without a sampled trace context', async () => {
    await exec({});
    await exec({ traceparent: `00-${TRACE_ID}-${PARENT_ID}-00` });
    await exec({ traceparent: 'not a trace context' });
    expect((await drain()).status).toBe(204);
  });

  it('records a server span, child of the caller\'s, handed over once as OTLP JSON', async () => {
    await exec({ traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` });
    const drained = await drain();
    expect(drained.status).toBe(200);
    const [resourceSpans] = drained.body!.resourceSpans;
    expect(resourceSpans.resource.attributes).toContainEqual({ key: 'service.name', value: { stringValue: 'nestbox-guest-agent' } });
    const spans = resourceSpans.scopeSpans.flatMap((s) => s.spans);
    expect(spans).toHaveLength(1);
    // SERVER = 2 in OTLP's enum.
    expect(spans[0]).toMatchObject({ traceId: TRACE_ID, parentSpanId: PARENT_ID, name: 'POST /exec', kind: 2 });
    expect(spans[0].spanId).toMatch(/^[0-9a-f]{16}$/);
    // The drain took them: the next one has nothing.
    expect((await drain()).status).toBe(204);
  });

  it('keeps only the newest spans when nobody drains them', async () => {
    const tracing = new GuestTracing(3);
    for (let i = 0; i < 5; i++) {
      const req = { method: 'GET', headers: { traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` } } as unknown as IncomingMessage;
      const res = Object.assign(new EventEmitter(), { statusCode: 200, writableFinished: true }) as unknown as ServerResponse;
      await tracing.traceRequest(req, res, `/files/${i}`);
      res.emit('close');
    }
    const body = JSON.parse(Buffer.from(tracing.drain()!).toString('utf8')) as OtlpBody;
    expect(body.resourceSpans[0].scopeSpans.flatMap((s) => s.spans).map((s) => s.name)).toEqual(['GET /files/2', 'GET /files/3', 'GET /files/4']);
    expect(tracing.drain()).toBeUndefined();
  });
});
