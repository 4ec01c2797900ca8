// Daytona's Socket.IO event stream (compat/daytona/events.ts, daytona-wave2.md §9), through the
// real @daytonaio/sdk 0.218 and through a plain WebSocket speaking Engine.IO v4 / Socket.IO v5
// text frames, as the SDK's client does.
import { spawn } from 'node:child_process';
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { projectPath } from '../../src/paths.js';
import { allScopesBut, makeKey } from '../../test/scope-keys.js';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

/** One Socket.IO client on a raw WebSocket: answers pings, records every event it is sent. */
class RawSocketIo {
  readonly events: { name: string; payload: Record<string, unknown> }[] = [];
  readonly frames: string[] = [];
  private readonly ws: WebSocket;
  private waiters: (() => void)[] = [];

  constructor(apiUrl: string, token: string | undefined) {
    const url = new URL(apiUrl);
    this.ws = new WebSocket(`ws://${url.host}${url.pathname}/socket.io/?source=sdk-typescript&EIO=4&transport=websocket`);
    this.ws.on('message', (data) => {
      const text = data.toString();
      this.frames.push(text);
      if (text === '2') this.ws.send('3');
      else if (text.startsWith('0{')) this.ws.send(`40${JSON.stringify(token === undefined ? {} : { token })}`);
      else if (text.startsWith('42')) {
        const [name, payload] = JSON.parse(text.slice(2)) as [string, Record<string, unknown>];
        this.events.push({ name, payload });
      }
      for (const w of this.waiters.splice(0)) w();
    });
    this.ws.on('close', () => {
      for (const w of this.waiters.splice(0)) w();
    });
  }

  /** Waits (bounded) until `test` holds over what was received. */
  async until(what: string, test: () => boolean, timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!test()) {
      if (Date.now() > deadline || this.ws.readyState === WebSocket.CLOSED) throw new Error(`timed out waiting for ${what}; frames: ${this.frames.join(' | ')}`);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 500);
      });
    }
  }

  connected(): boolean {
    return this.frames.some((f) => f.startsWith('40{"sid"'));
  }

  close(): void {
    this.ws.close();
  }
}

describe('Daytona Socket.IO event stream', () => {
  let env: DaytonaTestEnv;
  let otherOrgKey: string;
  beforeAll(async () => {
    env = await startDaytonaEnv();
    const org = await env.server.server.services.auth.createOrganization('events-other');
    otherOrgKey = (await env.server.server.services.auth.createApiKey(org.id, { name: 'other', preset: 'admin' })).key;
  });
  afterAll(async () => {
    await env?.server.close();
  });

  it('pushes sandbox.created and sandbox.state.updated to the organisation, and nothing to another one', async () => {
    const mine = new RawSocketIo(env.apiUrl, env.server.apiKey);
    const other = new RawSocketIo(env.apiUrl, otherOrgKey);
    try {
      await mine.until('the CONNECT answer', () => mine.connected());
      await other.until('the CONNECT answer', () => other.connected());
      const sb = await env.daytona.create({ labels: { suite: 'events' } });
      await mine.until('started', () => mine.events.some((e) => e.name === 'sandbox.state.updated' && e.payload.newState === 'started'));
      const created = mine.events.find((e) => e.name === 'sandbox.created');
      expect(created?.payload).toMatchObject({ id: sb.id, state: 'creating', labels: { suite: 'events' } });
      const started = mine.events.find((e) => e.name === 'sandbox.state.updated' && e.payload.newState === 'started')!;
      expect(started.payload).toMatchObject({ oldState: 'creating', newState: 'started', sandbox: { id: sb.id, state: 'started', toolboxProxyUrl: `${env.server.url}/daytona/toolbox` } });

      await sb.stop();
      await mine.until('stopped', () => mine.events.some((e) => e.name === 'sandbox.state.updated' && e.payload.newState === 'stopped'));
      expect(mine.events.map((e) => e.payload.newState).filter(Boolean)).toEqual(['started', 'stopping', 'stopped']);
      expect(mine.events.find((e) => e.name === 'sandbox.desired-state.updated')?.payload).toMatchObject({ oldDesiredState: 'started', newDesiredState: 'stopped', sandbox: { id: sb.id } });
      await sb.delete();
      await mine.until('destroyed', () => mine.events.some((e) => e.payload.newState === 'destroyed'));

      expect(other.connected()).toBe(true);
      expect(other.events).toEqual([]);
    } finally {
      mine.close();
      other.close();
    }
  });

  it('refuses a bad key, a missing key and a key without sandboxes:read with a CONNECT_ERROR', async () => {
    for (const token of ['nbx_not-a-real-key', undefined]) {
      const socket = new RawSocketIo(env.apiUrl, token);
      try {
        await socket.until('the CONNECT_ERROR', () => socket.frames.some((f) => f.startsWith('44')));
        const refusal = JSON.parse(socket.frames.find((f) => f.startsWith('44'))!.slice(2)) as { message: string; data: { statusCode: number } };
        expect(refusal.data.statusCode).toBe(401);
        expect(refusal.message).toMatch(/key/i);
        expect(socket.connected()).toBe(false);
      } finally {
        socket.close();
      }
    }
    // The events carry whole sandbox DTOs: a key that may not read sandboxes gets none.
    const noRead = await makeKey(env.server, allScopesBut('sandboxes:read'));
    const socket = new RawSocketIo(env.apiUrl, noRead.key);
    try {
      await socket.until('the CONNECT_ERROR', () => socket.frames.some((f) => f.startsWith('44')));
      expect(JSON.parse(socket.frames.find((f) => f.startsWith('44'))!.slice(2))).toMatchObject({ data: { statusCode: 403 } });
    } finally {
      socket.close();
    }
  });

  it('refuses an upgrade that is not Engine.IO v4 over WebSocket in Daytona\'s error shape', async () => {
    for (const [query, field] of [['', 'EIO'], ['?EIO=3&transport=websocket', 'EIO'], ['?EIO=4&transport=polling', 'transport'], ['?EIO=4&transport=websocket&sid=abc', 'sid']]) {
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const ws = new WebSocket(`${env.server.url.replace('http', 'ws')}/daytona/api/socket.io/${query}`);
        ws.on('unexpected-response', (_req, res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        });
        ws.on('open', () => reject(new Error(`opened with ${query}`)));
        ws.on('error', () => undefined);
      });
      expect(answer.status, query).toBe(400);
      expect(JSON.parse(answer.body)).toMatchObject({ statusCode: 400, message: expect.stringMatching(new RegExp(`^${field}: `)) });
    }
  });

  it('lets a program using SDK 0.218 end by itself once its work is done (create, stop, look up, start, delete)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nbx-daytona-events-'));
    const script = join(dir, 'script.mjs');
    // An ordinary user program: nothing closes the client; the process must end on its own.
    writeFileSync(script, [
      `import { Daytona } from ${JSON.stringify(projectPath('node_modules/@daytonaio/sdk/esm/index.js'))};`,
      `const daytona = new Daytona({ apiUrl: process.env.API_URL, apiKey: process.env.API_KEY });`,
      `const sb = await daytona.create({ labels: { suite: 'events-exit' } });`,
      `console.log('state', sb.state);`,
      `await sb.stop();`,
      // A second object for the same sandbox (a lookup) stays subscribed after the first deletes it.
      `const found = await daytona.get(sb.id);`,
      `await found.start();`,
      `console.log('state', found.state);`,
      `await sb.delete();`,
      `console.log('deleted');`,
    ].join('\n'));
    // Without the stream, the SDK's Socket.IO client retried against a 404 for about 3 minutes
    // (10 attempts, 1 s doubling to 30 s) and held the process that long.
    const boundMs = 150_000;
    const child = spawn(process.execPath, [script], { env: { PATH: process.env.PATH ?? '', API_URL: env.apiUrl, API_KEY: env.server.apiKey }, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const killer = setTimeout(() => child.kill('SIGKILL'), boundMs);
    const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
    clearTimeout(killer);
    rmSync(dir, { recursive: true, force: true });
    expect(output).toContain('state started');
    expect(output).toContain('deleted');
    // Killed at the bound means it did not end by itself.
    expect(exit, output).toEqual({ code: 0, signal: null });
  }, 200_000);
});

describe('Daytona Socket.IO event stream under the stream caps', () => {
  let env: DaytonaTestEnv;
  beforeAll(async () => {
    env = await startDaytonaEnv({ NESTBOX_MAX_STREAMS_PER_KEY: '1' });
  });
  afterAll(async () => {
    await env?.server.close();
  });

  it('holds a stream slot of its key while open: the next socket of that key is refused until it closes', async () => {
    // A key of its own: the SDK client of the test env holds one of the bootstrap key's.
    const key = await makeKey(env.server, ['sandboxes:read']);
    const first = new RawSocketIo(env.apiUrl, key.key);
    await first.until('the first CONNECT answer', () => first.connected());
    const second = new RawSocketIo(env.apiUrl, key.key);
    try {
      await second.until('the CONNECT_ERROR', () => second.frames.some((f) => f.startsWith('44')));
      expect(JSON.parse(second.frames.find((f) => f.startsWith('44'))!.slice(2))).toMatchObject({ message: expect.stringMatching(/streams: this API key already has 1 open streams/), data: { statusCode: 429 } });
    } finally {
      second.close();
      first.close();
    }
    // The slot comes back when the socket closes (bounded retries: the close reaches the server asynchronously).
    let third: RawSocketIo | undefined;
    for (let attempt = 0; attempt < 20 && !third?.connected(); attempt++) {
      third?.close();
      await new Promise((r) => setTimeout(r, 250));
      third = new RawSocketIo(env.apiUrl, key.key);
      await third.until('an answer', () => third!.connected() || third!.frames.some((f) => f.startsWith('44')));
    }
    expect(third?.connected()).toBe(true);
    third?.close();
  });
});
