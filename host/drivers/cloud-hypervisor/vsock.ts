// Host side of Cloud Hypervisor's hybrid vsock (host-runtime.md §4): connect to the VM's
// `vsock.socket`, write `CONNECT <port>\n`, wait for `OK <host port>\n`, then it is a plain byte
// stream to the guest's listener. CH closes the connection without an OK when nothing listens in
// the guest (a booting VM), so callers retry. The guest may send data right behind the OK line
// in the same segment; those bytes are pushed back (`unshift`) before the socket is handed out,
// with the socket paused, so the consumer sees every byte.
import { Agent, type AgentOptions, type ClientRequestArgs } from 'node:http';
import type { Duplex } from 'node:stream';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { rm } from 'node:fs/promises';

/** CH sends `OK <n>` where n is a u32; anything longer than this is not a handshake. */
const MAX_HANDSHAKE_BYTES = 64;

export class VsockDialError extends Error {
  constructor(
    message: string,
    /** ECONNREFUSED: no guest listener (or no VMM); ETIMEDOUT; EPROTO: not CH's answer. */
    readonly code: 'ECONNREFUSED' | 'ETIMEDOUT' | 'EPROTO' | 'ENOENT',
  ) {
    super(message);
    this.name = 'VsockDialError';
  }
}

export interface DialOptions {
  timeoutMs?: number;
}

/** Resolves with a connected, paused socket positioned at the first byte from the guest. */
export function dialHybridVsock(socketPath: string, port: number, options: DialOptions = {}): Promise<Socket> {
  if (!Number.isInteger(port) || port < 0 || port > 0xffffffff) return Promise.reject(new Error(`invalid vsock port ${port}`));
  const timeoutMs = options.timeoutMs ?? 5_000;
  return new Promise((resolve, reject) => {
    const socket = connect(socketPath);
    let buffered = Buffer.alloc(0);
    let settled = false;
    const fail = (error: VsockDialError): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    };
    const timer = setTimeout(() => fail(new VsockDialError(`no OK from ${socketPath} for port ${port} within ${timeoutMs} ms`, 'ETIMEDOUT')), timeoutMs);
    const onData = (chunk: Buffer): void => {
      buffered = Buffer.concat([buffered, chunk]);
      const newline = buffered.indexOf(0x0a);
      if (newline < 0) {
        if (buffered.length > MAX_HANDSHAKE_BYTES) fail(new VsockDialError(`no handshake line from ${socketPath}: ${JSON.stringify(buffered.toString('latin1').slice(0, 64))}`, 'EPROTO'));
        return;
      }
      const line = buffered.subarray(0, newline).toString('latin1').trim();
      if (!/^OK \d+$/.test(line)) {
        fail(new VsockDialError(`unexpected handshake answer from ${socketPath}: ${JSON.stringify(line)}`, 'EPROTO'));
        return;
      }
      settled = true;
      clearTimeout(timer);
      // Order matters: stop the flow before detaching our listener, then give back the rest.
      socket.pause();
      socket.off('data', onData);
      socket.off('error', onError);
      socket.off('close', onClose);
      const rest = buffered.subarray(newline + 1);
      if (rest.length) socket.unshift(rest);
      resolve(socket);
    };
    const onError = (error: NodeJS.ErrnoException): void => {
      const code = error.code === 'ENOENT' ? 'ENOENT' : 'ECONNREFUSED';
      fail(new VsockDialError(`hybrid vsock ${socketPath} port ${port}: ${error.message}`, code));
    };
    // CH's answer when the guest has no listener on the port: close, no OK.
    const onClose = (): void => fail(new VsockDialError(`hybrid vsock ${socketPath}: closed before OK (nothing listening on guest port ${port}?)`, 'ECONNREFUSED'));
    socket.on('data', onData);
    socket.on('error', onError);
    socket.on('close', onClose);
    socket.once('connect', () => socket.write(`CONNECT ${port}\n`));
  });
}

/**
 * An http.Agent whose connections are hybrid-vsock streams to one guest port, so the guest
 * agent protocol (HTTP/1.1) runs unchanged: `new AgentClient(label, { agent })`.
 */
export class HybridVsockAgent extends Agent {
  constructor(
    private readonly vsockSocket: string,
    private readonly port: number,
    options: AgentOptions & { dialTimeoutMs?: number } = {},
  ) {
    super({ keepAlive: true, timeout: 60_000, ...options });
    this.dialTimeoutMs = options.dialTimeoutMs ?? 5_000;
  }

  private readonly dialTimeoutMs: number;

  // Node's Agent accepts the socket through the callback; the types only declare the sync form.
  override createConnection(_options: ClientRequestArgs, callback?: (error: Error | null, stream: Duplex) => void): Duplex | null | undefined {
    dialHybridVsock(this.vsockSocket, this.port, { timeoutMs: this.dialTimeoutMs }).then(
      (socket) => {
        // http attaches its own reader; let data flow again once it has.
        setImmediate(() => socket.resume());
        callback?.(null, socket);
      },
      (error: Error) => callback?.(error, undefined as unknown as Duplex),
    );
    return undefined;
  }
}

/**
 * A host-side Unix socket that forwards every connection to a guest port over hybrid vsock.
 * This is what `SandboxRuntime.agentSocket` points at for a VM, so the host agent (and anything
 * else that speaks the guest-agent protocol over a Unix socket) works with both drivers.
 */
export class VsockForwarder {
  private server?: Server;
  private readonly open = new Set<Socket>();

  constructor(
    readonly listenPath: string,
    private readonly vsockSocket: string,
    private readonly port: number,
  ) {}

  async start(): Promise<void> {
    await rm(this.listenPath, { force: true });
    const server = createServer({ pauseOnConnect: true }, (client) => this.forward(client));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.listenPath, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.server = server;
  }

  /** Closes the listener and every forwarded connection (a VM being stopped or restored). */
  async close(): Promise<void> {
    for (const socket of this.open) socket.destroy();
    this.open.clear();
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
    await rm(this.listenPath, { force: true });
  }

  private forward(client: Socket): void {
    this.open.add(client);
    client.once('close', () => this.open.delete(client));
    client.on('error', () => client.destroy());
    dialHybridVsock(this.vsockSocket, this.port).then(
      (guest) => {
        if (client.destroyed) {
          guest.destroy();
          return;
        }
        this.open.add(guest);
        guest.once('close', () => {
          this.open.delete(guest);
          client.destroy();
        });
        guest.on('error', () => guest.destroy());
        client.once('close', () => guest.destroy());
        client.pipe(guest);
        guest.pipe(client);
        client.resume();
        guest.resume();
      },
      // The caller sees a reset, just as it would if the guest agent refused the connection.
      () => client.destroy(),
    );
  }
}
