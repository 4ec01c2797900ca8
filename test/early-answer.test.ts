// An answer given before the request body is all sent (the sandbox's disk is full: 507) must
// reach the client on each hop — control plane → host agent → guest agent — and leave every
// connection and keep-alive pool usable. Real guest agent on a real, full filesystem (a tiny
// tmpfs, so ENOSPC comes from the kernel), real host agent server, real clients of both hops;
// only the driver is a stand-in that points the host agent at that guest agent.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../core/logger.js';
import { NestboxError } from '../core/errors.js';
import { AgentClient, AgentRequestError } from '../host/agent-protocol/client.js';
import { HostAgentServer } from '../host/agent/server.js';
import type { Driver, SandboxRuntime } from '../host/drivers/types.js';
import { startTestAgent, type TestAgent } from '../host/guest-agent/testing.js';
import { HttpHostClient } from '../host/protocol/client.js';

const MiB = 1024 * 1024;
const SECRET = 'early-answer-host-secret-0123456789';
const SANDBOX = 'early1';
/** Far more than the socket buffers of both hops hold, so the answer comes mid-body. */
const BODY_BYTES = 32 * MiB;

/** `bytes` of body in 1 MiB chunks; `closed` settles when the stream is done with either way. */
function body(bytes: number): { stream: Readable; closed: Promise<void> } {
  const chunk = Buffer.alloc(MiB, 0x61);
  let left = bytes;
  const stream = new Readable({
    read() {
      if (left <= 0) return void this.push(null);
      const size = Math.min(left, chunk.length);
      left -= size;
      this.push(chunk.subarray(0, size));
    },
  });
  const closed = new Promise<void>((resolve) => stream.once('close', () => resolve()));
  return { stream, closed };
}

/** Only what the host agent's pass-through needs: one running sandbox whose agent is `guest`. */
function standInDriver(guest: TestAgent): Driver {
  const runtime: SandboxRuntime = { id: SANDBOX, status: 'running', agentSocket: guest.socketPath };
  const refuse = async (): Promise<never> => {
    throw new Error('not used by this test');
  };
  return {
    name: 'local',
    init: async () => {},
    capabilities: () => ({ memorySnapshot: false, fork: false, pause: false, nestedVirt: false, hotResize: false, maxVcpus: 1, probes: {} }),
    get: async (id: string) => (id === SANDBOX ? runtime : undefined),
    list: async () => [runtime],
    create: refuse,
    start: refuse,
    stop: refuse,
    destroy: refuse,
    pause: refuse,
    unpause: refuse,
    fork: refuse,
    snapshot: refuse,
    deleteSnapshot: refuse,
    listSnapshots: async () => [],
    fileView: refuse,
    touchFileView: () => {},
    close: async () => {},
  } as unknown as Driver;
}

/** Reads one HTTP/1.1 response with a Content-Length from a raw socket. */
function readResponse(socket: net.Socket): Promise<{ status: number; headers: string; body: string }> {
  return new Promise((resolve, reject) => {
    let buffered = Buffer.alloc(0);
    const onData = (data: Buffer) => {
      buffered = Buffer.concat([buffered, data]);
      const end = buffered.indexOf('\r\n\r\n');
      if (end === -1) return;
      const headers = buffered.subarray(0, end).toString('latin1');
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(headers)?.[1] ?? 0);
      if (buffered.length < end + 4 + length) return;
      done();
      resolve({ status: Number(headers.split(' ')[1]), headers, body: buffered.subarray(end + 4, end + 4 + length).toString('utf8') });
    };
    const onGone = (error?: Error) => {
      done();
      reject(new Error(`the connection ended before a response came${error ? `: ${(error as NodeJS.ErrnoException).code ?? error.message}` : ''}`));
    };
    const done = () => {
      socket.off('data', onData);
      socket.off('close', onGone);
      socket.off('error', onGone);
    };
    socket.on('data', onData);
    socket.once('close', onGone);
    socket.once('error', onGone);
  });
}

function write(socket: net.Socket, data: Buffer | string): Promise<void> {
  return new Promise((resolve, reject) => socket.write(data, (error) => (error ? reject(error) : resolve())));
}

let dir: string;
let disk: string;
let guest: TestAgent;
let host: HostAgentServer;
let port: number;

beforeAll(async () => {
  dir = mkdtempSync('/tmp/nestbox-early-answer-');
  disk = join(dir, 'disk');
  mkdirSync(disk);
  // A disk of 256 KiB, filled to the last block: every write into it fails with ENOSPC.
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=256k,mode=0755', 'tmpfs', disk]);
  try {
    writeFileSync(join(disk, 'fill'), Buffer.alloc(MiB));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOSPC') throw error;
  }
  guest = await startTestAgent({ home: disk });
  host = new HostAgentServer({ hostId: 'local', secret: SECRET, driver: standInDriver(guest), logger: silentLogger });
  port = await host.listen(0, '127.0.0.1');
});

afterAll(async () => {
  await host?.close();
  await guest?.stop();
  if (disk) execFileSync('umount', ['-l', disk]);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('an answer before the body is all sent (disk full)', () => {
  it('guest agent hop: the 507 arrives, the client stops sending the rest instead of hanging on it, the agent keeps answering', async () => {
    const client = new AgentClient(guest.socketPath);
    try {
      for (let attempt = 0; attempt < 2; attempt++) {
        const upload = body(BODY_BYTES);
        const error = await client.writeFile(join(disk, 'more.bin'), upload.stream).then(
          () => undefined,
          (failure: unknown) => failure,
        );
        expect(error).toBeInstanceOf(AgentRequestError);
        expect((error as AgentRequestError).status).toBe(507);
        expect((error as AgentRequestError).code).toBe('insufficient_storage');
        // Before the fix Node's client stopped relaying 'drain' once the answer was complete,
        // so the body hung half-sent on its socket for good (this await never returned).
        await upload.closed;
        expect((await client.stat(disk)).type).toBe('dir');
      }
    } finally {
      client.close();
    }
  });

  it('host agent hop: after the 507 the rest of the body is read, not reset, and the same connection answers the next request', async () => {
    const socket = net.connect(port, '127.0.0.1');
    await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    try {
      const path = `/v1/sandboxes/${SANDBOX}/agent/files/content?path=${encodeURIComponent(join(disk, 'more.bin'))}`;
      const head = `PUT ${path} HTTP/1.1\r\nhost: host-agent\r\nauthorization: Bearer ${SECRET}\r\ncontent-type: application/octet-stream\r\ncontent-length: ${BODY_BYTES}\r\n\r\n`;
      const chunk = Buffer.alloc(MiB, 0x62);
      const answer = readResponse(socket);
      await write(socket, head);
      await write(socket, chunk);
      const early = await answer;
      expect(early.status, early.body).toBe(507);
      expect(JSON.parse(early.body).error.code).toBe('insufficient_storage');
      // A client may keep sending its body after an early answer; it must not be reset for it.
      for (let sent = MiB; sent < BODY_BYTES; sent += MiB) await write(socket, chunk);
      const next = readResponse(socket);
      await write(socket, `GET /v1/sandboxes/${SANDBOX} HTTP/1.1\r\nhost: host-agent\r\nauthorization: Bearer ${SECRET}\r\n\r\n`);
      // Before the fix the guest hop stalled, the host agent stopped reading, and its keep-alive
      // timeout closed this connection: no answer to this request.
      const answered = await next;
      expect(answered.status, answered.body).toBe(200);
      expect(JSON.parse(answered.body)).toEqual({ id: SANDBOX, status: 'running' });
    } finally {
      socket.destroy();
    }
  });

  it('control plane client: 507 insufficient_storage every time, never host_unavailable, and its keep-alive pool stays usable', async () => {
    const client = new HttpHostClient({ hostId: 'local', baseUrl: `http://127.0.0.1:${port}`, secret: SECRET });
    for (let attempt = 0; attempt < 3; attempt++) {
      const upload = body(BODY_BYTES);
      const error = await client.guest(SANDBOX).writeFile(join(disk, 'more.bin'), upload.stream, {}).then(
        () => undefined,
        (failure: unknown) => failure,
      );
      expect(error).toBeInstanceOf(NestboxError);
      expect((error as NestboxError).code, (error as Error).message).toBe('insufficient_storage');
      await upload.closed;
      // Unrelated requests right after, on the same pools (control plane → host agent → guest).
      expect(await client.getSandbox(SANDBOX)).toEqual({ id: SANDBOX, status: 'running' });
      expect((await client.guest(SANDBOX).statFile(disk)).type).toBe('dir');
    }
  });
});
