// The typed guest client against a real in-process guest agent: paths, success statuses, body
// checks and the one error decoder, as core sees them through HostClient.guest().
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NestboxError } from '../../core/errors.js';
import { startTestAgent, type TestAgent } from '../guest-agent/testing.js';
import { AgentClient } from './client.js';
import { HttpGuestClient } from './guest-client.js';

async function failure(promise: Promise<unknown>): Promise<NestboxError> {
  try {
    await promise;
  } catch (err) {
    if (err instanceof NestboxError) return err;
    throw err;
  }
  throw new Error('expected the call to fail');
}

async function text(body: Readable): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of body) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

function guestOver(client: AgentClient): HttpGuestClient {
  return new HttpGuestClient(
    (r) => client.request({ method: r.method, path: r.path, headers: r.headers, body: r.body, signal: r.signal }),
    (path) => ({ url: `ws+unix://${client.socketPath}:${path}`, headers: {} }),
    'test',
  );
}

describe('HttpGuestClient against an in-process guest agent', () => {
  let agent: TestAgent;
  let client: AgentClient;
  let guest: HttpGuestClient;

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
    guest = guestOver(client);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  it('writes, stats, lists, reads a byte range, moves and deletes files', async () => {
    const dir = join(agent.home, 'g');
    const made = await guest.makeDirectory({ path: dir });
    expect(made).toMatchObject({ created: true, info: { type: 'dir', path: dir } });
    expect((await guest.makeDirectory({ path: dir })).created).toBe(false);
    const info = await guest.writeFile(`${dir}/a.txt`, Readable.from([Buffer.from('hello world')]), { mode: '600' });
    expect(info).toMatchObject({ name: 'a.txt', size: 11, mode: 0o600 });
    expect((await guest.statFile(`${dir}/a.txt`)).size).toBe(11);
    expect((await guest.listFiles({ path: dir })).entries.map((e) => e.name)).toEqual(['a.txt']);
    const part = await guest.readFile(`${dir}/a.txt`, { range: 'bytes=6-' });
    expect(part.status).toBe(206);
    expect(part.headers.contentRange).toBe('bytes 6-10/11');
    expect(await text(part.body)).toBe('world');
    expect((await guest.moveFile({ from: `${dir}/a.txt`, to: `${dir}/b.txt` })).name).toBe('b.txt');
    await guest.deleteFile({ path: `${dir}/b.txt` });
    const missing = await failure(guest.statFile(`${dir}/b.txt`));
    expect(missing.code).toBe('not_found');
    // The guest's 400 names the field, and the message survives the decoder.
    const recursive = await failure(guest.deleteFile({ path: agent.home, recursive: false }));
    expect(recursive.code).toBe('validation_failed');
    expect(recursive.message).toMatch(/^recursive/);
  });

  it('runs a process and streams its events, then refuses to signal it once it ended', async () => {
    const started = await guest.startProcess({ argv: ['/bin/sh', '-c', 'printf out; printf err >&2'] });
    expect(started).toMatchObject({ status: 'running', pty: false });
    const stream = await guest.processEvents(started.processId, { offset: 0 });
    expect(stream.headers.contentType).toMatch(/^text\/event-stream/);
    const seen: string[] = [];
    for await (const event of stream.events()) {
      if (event.type === 'stdout' || event.type === 'stderr') seen.push(`${event.type}:${Buffer.from(event.data, 'base64').toString()}`);
      if (event.type === 'exit') {
        seen.push(`exit:${event.exitCode}`);
        break;
      }
    }
    stream.body.destroy();
    expect(seen.sort()).toEqual(['exit:0', 'stderr:err', 'stdout:out']);
    const output = await guest.processOutput(started.processId, { offset: 0 });
    expect(output).toMatchObject({ stdout: 'out', stderr: 'err', status: 'exited', exitCode: 0 });
    expect((await guest.listProcesses({ all: true })).processes.some((p) => p.processId === started.processId)).toBe(true);
    expect((await failure(guest.signalProcess(started.processId, 'SIGTERM'))).code).toBe('invalid_state');
    expect((await failure(guest.getProcess('nosuch'))).code).toBe('not_found');
  });

  it('runs session commands synchronously (200) and asynchronously (202)', async () => {
    const session = await guest.createSession({ sessionId: 'typed' });
    expect(session.sessionId).toBe('typed');
    const sync = await guest.runSessionCommand('typed', { cmd: 'X=7; echo $X' });
    expect(sync).toMatchObject({ status: 200, command: { status: 'exited', exitCode: 0, stdout: '7\n' } });
    const later = await guest.runSessionCommand('typed', { cmd: 'sleep 0.1', async: true });
    expect(later.status).toBe(202);
    expect((await guest.getSessionCommand('typed', later.command.commandId)).commandId).toBe(later.command.commandId);
    expect((await guest.listSessions()).sessions.map((s) => s.sessionId)).toContain('typed');
    await guest.deleteSession('typed');
    expect((await failure(guest.getSession('typed'))).code).toBe('not_found');
  });
});

describe('HttpGuestClient and a peer that does not speak the contract', () => {
  let server: Server;
  let client: AgentClient;
  let agent: TestAgent;

  beforeAll(async () => {
    agent = await startTestAgent();
    const socketPath = join(agent.root, 'impostor.sock');
    server = createServer((req, res) => {
      if (req.url?.startsWith('/files/stat')) return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"name":"x"}');
      if (req.url?.startsWith('/processes/p1/events')) {
        // An event stream whose connection breaks under it (a sandbox deleted mid-stream).
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(': open\n\n');
        return void setTimeout(() => res.socket?.destroy(), 50);
      }
      res.writeHead(409, { 'content-type': 'application/json' }).end('{"error":{"code":"brand_new_code","message":"taken"}}');
    });
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    client = new AgentClient(socketPath);
  });
  afterAll(async () => {
    client.close();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await agent.stop();
  });

  it('refuses an answer its schema does not allow, and names an unknown code by its status', async () => {
    const guest = guestOver(client);
    const bad = await failure(guest.statFile('/x'));
    expect(bad.code).toBe('internal');
    expect(bad.message).toMatch(/unexpected answer to GET \/files\/stat/);
    const unknown = await failure(guest.createSession({}));
    expect(unknown.toJSON()).toEqual({ code: 'conflict', message: 'taken' });
  });

  it('tells an event stream cut mid-way as host_unavailable, not as a raw socket error', async () => {
    const guest = guestOver(client);
    const stream = await guest.processEvents('p1', { stdoutOffset: 0, stderrOffset: 0 });
    const cut = await failure((async () => {
      for await (const _event of stream.events()) void _event;
    })());
    expect(cut.code).toBe('host_unavailable');
    expect(cut.message).toMatch(/event stream of GET \/processes\/p1\/events.* was cut/);
  });
});
