// A hybrid-vsock muxer like Cloud Hypervisor's (virtio-devices/src/vsock/unix/muxer.rs), for the
// simulator: the host connects to `vsock.socket`, sends `CONNECT <port>\n`; if the guest has a
// listener on that port the muxer answers `OK <host port>\n` (host ports count up from 2^30) and
// splices; otherwise it just closes the connection. While the VM is paused nothing in the guest
// can accept, so handshakes wait until it resumes.
import { connect, createServer, type Server, type Socket } from 'node:net';
import { rm } from 'node:fs/promises';

const MAX_COMMAND_BYTES = 32;

export interface MuxerGuest {
  /** The Unix socket of the guest listener on `port`, if something listens there. */
  listenerFor(port: number): string | undefined;
  paused(): boolean;
}

export class HybridVsockMuxer {
  private server?: Server;
  private nextHostPort = 2 ** 30;
  private readonly connections = new Set<Socket>();
  private waiting: Array<() => void> = [];
  /** Handshakes seen, for tests of the simulator itself. */
  handshakes = 0;

  constructor(
    readonly socketPath: string,
    private readonly guest: MuxerGuest,
    private readonly log: (line: string) => void,
  ) {}

  async start(): Promise<void> {
    const server = createServer((socket) => this.accept(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.socketPath, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.server = server;
  }

  /** What CH does on restore (v52+): host-side connections are reset; the listener stays. */
  resetConnections(): void {
    for (const socket of this.connections) socket.destroy();
    this.connections.clear();
  }

  /** The guest resumed: handshakes that waited can complete now. */
  wake(): void {
    const waiting = this.waiting;
    this.waiting = [];
    for (const proceed of waiting) proceed();
  }

  async close(): Promise<void> {
    this.resetConnections();
    this.waiting = [];
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
    await rm(this.socketPath, { force: true });
  }

  private accept(host: Socket): void {
    this.connections.add(host);
    host.once('close', () => this.connections.delete(host));
    host.on('error', () => host.destroy());
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      buffered = Buffer.concat([buffered, chunk]);
      const newline = buffered.indexOf(0x0a);
      if (newline < 0) {
        if (buffered.length > MAX_COMMAND_BYTES) host.destroy();
        return;
      }
      host.off('data', onData);
      host.pause();
      const command = buffered.subarray(0, newline).toString('latin1');
      const rest = buffered.subarray(newline + 1);
      const match = /^\s*connect\s+(\d+)\s*$/i.exec(command);
      const port = match ? Number(match[1]) : NaN;
      if (!match || port > 0xffffffff) {
        this.log(`vsock: malformed command ${JSON.stringify(command)}; closing`);
        host.destroy();
        return;
      }
      this.handshakes++;
      const proceed = (): void => this.connectGuest(host, port, rest);
      if (this.guest.paused()) this.waiting.push(proceed);
      else proceed();
    };
    host.on('data', onData);
  }

  private connectGuest(host: Socket, port: number, early: Buffer): void {
    if (host.destroyed) return;
    const listener = this.guest.listenerFor(port);
    // The guest answers with a reset; CH closes the Unix connection without an OK.
    if (!listener) {
      host.destroy();
      return;
    }
    const guest = connect(listener);
    guest.once('error', () => host.destroy());
    guest.once('connect', () => {
      this.connections.add(guest);
      guest.once('close', () => {
        this.connections.delete(guest);
        host.end();
      });
      host.once('close', () => guest.destroy());
      host.write(`OK ${this.nextHostPort++}\n`);
      if (early.length) guest.write(early);
      host.pipe(guest);
      guest.pipe(host);
      host.resume();
    });
  }
}
