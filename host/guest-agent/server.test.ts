import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { GUEST_AGENT_PROTOCOL_VERSION } from '../agent-protocol/types.js';
import { startTestAgent, type TestAgent } from './testing.js';

describe('guest agent server', () => {
  let agent: TestAgent;
  let client: AgentClient;

  async function call(method: string, path: string) {
    const response = await client.request({ method, path });
    const chunks: Buffer[] = [];
    for await (const chunk of response) chunks.push(chunk as Buffer);
    return { status: response.statusCode ?? 0, headers: response.headers, json: JSON.parse(Buffer.concat(chunks).toString('utf8')) };
  }

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  it('answers GET /health', async () => {
    const health = await client.health();
    expect(health).toMatchObject({ status: 'ok', protocolVersion: GUEST_AGENT_PROTOCOL_VERSION, pid: process.pid });
    expect(health.uptimeMs).toBeGreaterThanOrEqual(0);
  });

  it('refuses a command timeout Node timers cannot hold, instead of killing the command at once', async () => {
    for (const [path, body] of [
      ['/exec', { cmd: 'true', timeoutMs: 2 ** 31 }],
      ['/processes', { cmd: 'true', timeoutMs: 1e12 }],
    ] as const) {
      const response = await client.request({ method: 'POST', path, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      const chunks: Buffer[] = [];
      for await (const chunk of response) chunks.push(chunk as Buffer);
      expect(response.statusCode, path).toBe(400);
      expect(JSON.parse(Buffer.concat(chunks).toString('utf8')).error.message).toMatch(/^timeoutMs/);
    }
    // The largest one a timer holds is accepted and does not fire early.
    expect((await client.exec({ cmd: 'echo fine', timeoutMs: 2 ** 31 - 1 })).stdout).toBe('fine\n');
  });

  it('sets environment variables for every later process with PUT /env, and validates names', async () => {
    const put = (env: unknown) => client.request({ method: 'PUT', path: '/env', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ env }) });
    const ok = await put({ NESTBOX_ENV_PROBE: 'from the host' });
    ok.resume();
    expect(ok.statusCode).toBe(204);
    expect((await client.exec({ cmd: 'echo "$NESTBOX_ENV_PROBE"' })).stdout).toBe('from the host\n');
    const bad = await put({ 'BAD-NAME': 'x' });
    const chunks: Buffer[] = [];
    for await (const chunk of bad) chunks.push(chunk as Buffer);
    expect(bad.statusCode).toBe(400);
    expect(JSON.parse(Buffer.concat(chunks).toString()).error.code).toBe('validation_failed');
    // `unset` is removed before `env` is applied (updateEnv).
    const both = await client.request({ method: 'PUT', path: '/env', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ env: { NESTBOX_ENV_OTHER: 'o' }, unset: ['NESTBOX_ENV_PROBE', 'NESTBOX_ENV_OTHER'] }) });
    both.resume();
    expect(both.statusCode).toBe(204);
    expect((await client.exec({ cmd: 'echo "${NESTBOX_ENV_PROBE-gone}|$NESTBOX_ENV_OTHER"' })).stdout).toBe('gone|o\n');
  });

  it.each(['/', '/nope', '/files/nope', '/files/content/extra', '//files/list'])('answers 404 not_found for unknown route %s', async (path) => {
    const { status, json } = await call('GET', path);
    expect(status).toBe(404);
    expect(json.error.code).toBe('not_found');
    expect(json.error.message).toContain(path);
  });

  it.each([
    ['POST', '/health', 'GET'],
    ['GET', '/exec', 'POST'],
    ['DELETE', '/files/content', 'GET, PUT'],
    ['POST', '/files/list', 'GET'],
  ])('answers 405 for %s %s with the error shape and Allow', async (method, path, allow) => {
    const { status, headers, json } = await call(method, path);
    expect(status).toBe(405);
    expect(headers.allow).toBe(allow);
    expect(json.error).toMatchObject({ code: 'method_not_allowed', message: expect.stringContaining(method) });
  });

  it('answers malformed HTTP with 400 and keeps serving', async () => {
    const reply = await new Promise<string>((resolve, reject) => {
      const socket = connect(agent.socketPath);
      let text = '';
      socket.on('data', (chunk) => (text += chunk.toString()));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
      socket.write('THIS IS NOT HTTP\r\n\r\n');
    });
    expect(reply).toMatch(/^HTTP\/1\.1 400/);
    expect((await client.health()).status).toBe('ok');
  });

  it('answers 500 internal, logs, and keeps serving when a handler fails unexpectedly', async () => {
    const logged: string[] = [];
    // A NUL byte in the agent's own environment is a fault of the agent's setup, not of the
    // request, and makes spawn throw: exactly the kind of bug that must not crash the agent.
    const broken = await startTestAgent({ env: { BROKEN: 'a\0b' }, log: (line) => logged.push(line) });
    const brokenClient = new AgentClient(broken.socketPath);
    try {
      const response = await brokenClient.request({ method: 'POST', path: '/exec', body: JSON.stringify({ argv: ['true'] }) });
      const chunks: Buffer[] = [];
      for await (const chunk of response) chunks.push(chunk as Buffer);
      expect(response.statusCode).toBe(500);
      expect(JSON.parse(Buffer.concat(chunks).toString()).error).toMatchObject({ code: 'internal', message: expect.stringMatching(/internal error: .+/) });
      expect(logged.join('\n')).toMatch(/unexpected error in POST \/exec/);
      expect((await brokenClient.health()).status).toBe('ok');
    } finally {
      brokenClient.close();
      await broken.stop();
    }
  });
});
