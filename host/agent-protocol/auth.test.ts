// The proof scheme of auth.ts, on its own and end to end between the real guest-agent server
// and the real AgentClient (HTTP, streamed bodies, WebSocket upgrades and refusals, the key
// handoff on PUT /auth/key, and --key-fd of the bundled agent's entry point).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import http, { type IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestAgent, type TestAgent } from '../guest-agent/testing.js';
import {
  AGENT_KEY_ROUTE,
  AGENT_NONCE_HEADER,
  AGENT_PROOF_HEADER,
  AGENT_REKEY_HEADER,
  AgentKeyHolder,
  agentProof,
  decodeAgentKey,
  encodeAgentKey,
  newAgentKey,
  newNonce,
  rekeyProof,
  verifyAgentProof,
  type ProofSubject,
} from './auth.js';
import { AgentClient, AgentRequestError } from './client.js';

const REPO = resolve(import.meta.dirname, '../..');

async function rejection(promise: Promise<unknown>): Promise<AgentRequestError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof AgentRequestError) return error;
    throw error;
  }
  throw new Error('expected the call to fail');
}

/** What connectUpstream reads from the incoming request: only the asked-for subprotocols. */
const upgradeRequest = { headers: {} } as IncomingMessage;

describe('proofs', () => {
  const key = newAgentKey();
  const subject: ProofSubject = { nonce: newNonce(), method: 'POST', target: '/exec', status: 200 };

  it('verify for exactly the key, nonce, method, target and status they were made for', () => {
    const proof = agentProof(key, subject);
    expect(proof).toMatch(/^[0-9a-f]{64}$/);
    expect(verifyAgentProof(key, subject, proof)).toBe(true);
    // The method is compared in upper case (HTTP methods are case-sensitive tokens, but Node
    // reports them upper case on both sides).
    expect(verifyAgentProof(key, { ...subject, method: 'post' }, proof)).toBe(true);
    for (const changed of [
      { ...subject, nonce: newNonce() },
      { ...subject, method: 'PUT' },
      { ...subject, target: '/exec?x=1' },
      { ...subject, status: 500 },
    ]) {
      expect(verifyAgentProof(key, changed, proof)).toBe(false);
    }
    expect(verifyAgentProof(newAgentKey(), subject, proof)).toBe(false);
  });

  it('refuse missing, malformed and repeated headers without throwing', () => {
    const proof = agentProof(key, subject);
    for (const given of [undefined, '', 'zz', proof.toUpperCase(), `${proof}0`, proof.slice(1), [proof, proof]]) {
      expect(verifyAgentProof(key, subject, given)).toBe(false);
    }
  });

  it('encode keys as 64 hex digits and reject anything else', () => {
    expect(decodeAgentKey(`${encodeAgentKey(key)}\n`)?.equals(key)).toBe(true);
    for (const text of ['', 'ab', 'g'.repeat(64), `${encodeAgentKey(key)}00`]) expect(decodeAgentKey(text)).toBeUndefined();
    expect(() => encodeAgentKey(Buffer.alloc(16))).toThrow(/32 bytes/);
  });

  it('take a first key freely and replace it only with a proof of the current one', () => {
    const holder = new AgentKeyHolder();
    expect(holder.proofFor(newNonce(), 'GET', '/health', 200)).toBeUndefined();
    const first = newAgentKey();
    expect(holder.replace(first, undefined, undefined)).toBe(true);
    const second = newAgentKey();
    const nonce = newNonce();
    expect(holder.replace(second, nonce, undefined)).toBe(false);
    expect(holder.replace(second, nonce, rekeyProof(newAgentKey(), nonce, second))).toBe(false);
    // A proof for another new key or another nonce does not transfer.
    expect(holder.replace(second, nonce, rekeyProof(first, nonce, newAgentKey()))).toBe(false);
    expect(holder.replace(second, nonce, rekeyProof(first, newNonce(), second))).toBe(false);
    expect(holder.key?.equals(first)).toBe(true);
    expect(holder.replace(second, nonce, rekeyProof(first, nonce, second))).toBe(true);
    expect(holder.key?.equals(second)).toBe(true);
    // No proof without a well-formed nonce.
    expect(holder.proofFor('not-a-nonce', 'GET', '/health', 200)).toBeUndefined();
  });
});

describe('guest agent and AgentClient with a proof key', () => {
  const key = newAgentKey();
  let agent: TestAgent;
  let keyless: TestAgent;

  beforeAll(async () => {
    agent = await startTestAgent({ keys: new AgentKeyHolder(key) });
    keyless = await startTestAgent();
  });

  afterAll(async () => {
    await agent.stop();
    await keyless.stop();
  });

  it('accepts the real agent on JSON answers, errors and streamed bodies', async () => {
    const client = new AgentClient(agent.socketPath, { proofKey: key });
    try {
      expect(await client.health()).toMatchObject({ status: 'ok' });
      expect(await client.exec({ cmd: 'printf proven' })).toMatchObject({ exitCode: 0, stdout: 'proven' });
      // An agent error is still the agent's (and proven): its own code, not agent_unavailable.
      expect(await rejection(client.stat('/no/such/file'))).toMatchObject({ status: 404, code: 'not_found' });
      const response = await client.request({ method: 'GET', path: '/no-such-route' });
      response.resume();
      expect(response.statusCode).toBe(404);
    } finally {
      client.close();
    }
  });

  it('refuses answers under another key, and a keyless agent, as agent_unavailable', async () => {
    for (const [socket, proofKey] of [
      [agent.socketPath, newAgentKey()],
      [keyless.socketPath, key],
    ] as const) {
      const client = new AgentClient(socket, { proofKey });
      try {
        const error = await rejection(client.exec({ cmd: 'true' }));
        expect(error).toMatchObject({ status: 502, code: 'agent_unavailable' });
        expect(error.message).toContain('no valid proof');
        // waitReady keeps trying and then says why.
        expect((await rejection(client.waitReady({ timeoutMs: 200, intervalMs: 50 }))).message).toContain('no valid proof');
      } finally {
        client.close();
      }
    }
  });

  it('checks WebSocket upgrades and upgrade refusals', async () => {
    const client = new AgentClient(agent.socketPath, { proofKey: key });
    const wrong = new AgentClient(agent.socketPath, { proofKey: newAgentKey() });
    try {
      const started = await client.request({ method: 'POST', path: '/processes', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ cmd: 'sleep 5' }) });
      const chunks: Buffer[] = [];
      for await (const chunk of started) chunks.push(chunk as Buffer);
      const { processId } = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { processId: string };

      const upstream = await client.connectWebSocket(`/processes/${processId}/events`, upgradeRequest);
      expect(upstream.ok).toBe(true);
      if (upstream.ok) upstream.ws.terminate();
      // The agent's own refusal (an unknown process) is proven too, and passed on as it is.
      expect(await client.connectWebSocket('/processes/nope/events', upgradeRequest)).toMatchObject({ ok: false, status: 404 });

      for (const path of [`/processes/${processId}/events`, '/processes/nope/events']) {
        const refused = await wrong.connectWebSocket(path, upgradeRequest);
        expect(refused).toMatchObject({ ok: false, status: 502 });
        expect(!refused.ok && JSON.parse(refused.body)).toMatchObject({ error: { code: 'agent_unavailable' } });
      }
      await client.request({ method: 'DELETE', path: `/processes/${processId}` }).then((res) => res.resume());
    } finally {
      client.close();
      wrong.close();
    }
  });

  it('hands a keyless agent its key once; a replacement needs the current key', async () => {
    const fresh = await startTestAgent();
    const first = newAgentKey();
    const second = newAgentKey();
    const put = async (newKey: Buffer, proofKey: Buffer, oldKey?: Buffer) => {
      const nonce = newNonce();
      const headers: Record<string, string> = { 'content-type': 'application/json', [AGENT_NONCE_HEADER]: nonce };
      if (oldKey) headers[AGENT_REKEY_HEADER] = rekeyProof(oldKey, nonce, newKey);
      return new Promise<{ status: number; proven: boolean }>((resolvePut, reject) => {
        const req = http.request({ socketPath: fresh.socketPath, method: 'PUT', path: AGENT_KEY_ROUTE, headers }, (res) => {
          res.resume();
          const proven = verifyAgentProof(proofKey, { nonce, method: 'PUT', target: AGENT_KEY_ROUTE, status: res.statusCode ?? 0 }, res.headers[AGENT_PROOF_HEADER]);
          resolvePut({ status: res.statusCode ?? 0, proven });
        });
        req.on('error', reject);
        req.end(JSON.stringify({ key: encodeAgentKey(newKey) }));
      });
    };
    try {
      // The answer to the claim is already proven under the key just installed.
      expect(await put(first, first)).toEqual({ status: 204, proven: true });
      expect(await put(second, first)).toEqual({ status: 403, proven: true });
      expect(await put(second, first, newAgentKey())).toEqual({ status: 403, proven: true });
      expect(await put(second, second, first)).toEqual({ status: 204, proven: true });
      const client = new AgentClient(fresh.socketPath, { proofKey: second });
      expect(await client.health()).toMatchObject({ status: 'ok' });
      client.close();
    } finally {
      await fresh.stop();
    }
  });
});

describe.skipIf(!existsSync(join(REPO, 'dist', 'guest-agent.mjs')))('the bundled agent with --key-fd', () => {
  it('reads its key from the descriptor and proves its answers with it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'nestbox-key-fd-'));
    const socketPath = join(dir, 'agent.sock');
    const key = newAgentKey();
    const child = spawn(process.execPath, [join(REPO, 'dist', 'guest-agent.mjs'), '--socket', socketPath, '--key-fd', '3'], {
      stdio: ['ignore', 'ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir },
    });
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
    const channel = child.stdio[3] as Socket;
    channel.end(encodeAgentKey(key), () => channel.destroy());
    const client = new AgentClient(socketPath, { proofKey: key });
    try {
      const health = await client.waitReady({ timeoutMs: 20_000 });
      expect(stderr).toContain('proof key from the host');
      expect(health.pid).toBe(child.pid);
      const wrong = new AgentClient(socketPath, { proofKey: newAgentKey() });
      expect(await rejection(wrong.health())).toMatchObject({ code: 'agent_unavailable' });
      wrong.close();
    } finally {
      client.close();
      child.kill('SIGKILL');
      for (let i = 0; i < 100 && child.exitCode === null && child.signalCode === null; i++) await sleep(20);
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('refuses to start when the descriptor holds no key', async () => {
    const child = spawn(process.execPath, [join(REPO, 'dist', 'guest-agent.mjs'), '--socket', join(tmpdir(), `nestbox-nokey-${process.pid}.sock`), '--key-fd', '3'], {
      stdio: ['ignore', 'ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
    (child.stdio[3] as Socket).end('not a key');
    const code = await new Promise<number | null>((resolveExit) => child.once('exit', (exitCode) => resolveExit(exitCode)));
    expect(code).toBe(1);
    expect(stderr).toContain('did not hold a proof key');
  });
});
