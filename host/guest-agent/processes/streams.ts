// Following a process's output: the events stream (WebSocket or SSE) and the PTY socket share
// one pump. Nothing is queued per client: the pump pulls from the process's retained buffers at
// the client's own offsets and stops pulling while more than HIGH_WATER bytes are unsent, so a
// slow client costs at most that much memory and never slows the process down. A client that
// falls out of the retention window sees a gap (the next chunk's offset jumps).
import type { ServerResponse } from 'node:http';
// Type only: ws itself is loaded at the first upgrade (websocket.ts).
import type { WebSocket } from 'ws';
import type { ProcessEvent } from '../../agent-protocol/processes.js';
import type { ManagedProcess, StreamName } from './managed-process.js';

const HIGH_WATER = 1024 * 1024;
/** Largest chunk per message; keeps single frames small and interleaving fine-grained. */
const MAX_CHUNK = 64 * 1024;

/** Where a pump writes. Implementations track their own unsent bytes. */
export interface OutputSink {
  readonly closed: boolean;
  sendChunk(stream: StreamName, start: number, data: Buffer): void;
  sendExit(process: ManagedProcess): void;
  sendKeepalive(): void;
  unsentBytes(): number;
  /** Resolves when unsent bytes fall below the low-water mark, or the sink closes. */
  drained(): Promise<void>;
  /** Resolves when the client goes away. */
  readonly gone: Promise<void>;
  end(): void;
}

export interface PumpOptions {
  offsets: Record<StreamName, number>;
  streams: readonly StreamName[];
  keepaliveIntervalMs: number;
}

/** Replays from the offsets, follows live output, sends the exit and ends the sink. */
export async function pumpOutput(process: ManagedProcess, sink: OutputSink, options: PumpOptions): Promise<void> {
  const offsets = { ...options.offsets };
  const keepalive = options.keepaliveIntervalMs > 0 ? setInterval(() => sink.sendKeepalive(), options.keepaliveIntervalMs) : undefined;
  try {
    while (!sink.closed) {
      const next = process.nextSlice(offsets, options.streams, MAX_CHUNK);
      if (next) {
        sink.sendChunk(next.stream, next.slice.start, next.slice.data);
        offsets[next.stream] = next.slice.start + next.slice.data.length;
        if (sink.unsentBytes() > HIGH_WATER) await sink.drained();
        continue;
      }
      if (!process.running) {
        sink.sendExit(process);
        sink.end();
        return;
      }
      await Promise.race([process.nextChange(), sink.gone]);
    }
  } finally {
    if (keepalive) clearInterval(keepalive);
  }
}

function eventJson(event: ProcessEvent): string {
  return JSON.stringify(event);
}

function exitEvent(process: ManagedProcess): ProcessEvent {
  return { type: 'exit', status: process.status, exitCode: process.exitCode, signal: process.signal, timedOut: process.timedOut };
}

/** Shared by the WebSocket sinks: counts bytes handed to ws until its send callback fires. */
class WebSocketWriter {
  private unsent = 0;
  private waiters: Array<() => void> = [];
  readonly gone: Promise<void>;

  constructor(readonly ws: WebSocket) {
    this.gone = new Promise((resolve) => ws.once('close', () => resolve()));
    void this.gone.then(() => this.release());
  }

  get closed(): boolean {
    return this.ws.readyState !== this.ws.OPEN;
  }

  send(data: string | Buffer, binary: boolean): void {
    if (this.closed) return;
    const length = typeof data === 'string' ? Buffer.byteLength(data) : data.length;
    this.unsent += length;
    this.ws.send(data, { binary }, () => {
      this.unsent -= length;
      if (this.unsent < HIGH_WATER / 2) this.release();
    });
  }

  unsentBytes(): number {
    return this.unsent;
  }

  drained(): Promise<void> {
    if (this.closed || this.unsent < HIGH_WATER / 2) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  close(): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.close(1000);
  }

  private release(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }
}

/** Events over a WebSocket: one JSON text frame per event. */
export function eventsWebSocketSink(ws: WebSocket): OutputSink {
  const writer = new WebSocketWriter(ws);
  return {
    get closed() {
      return writer.closed;
    },
    gone: writer.gone,
    sendChunk: (stream, start, data) => writer.send(eventJson({ type: stream, offset: start, data: data.toString('base64') }), false),
    sendExit: (process) => writer.send(eventJson(exitEvent(process)), false),
    sendKeepalive: () => writer.send(eventJson({ type: 'keepalive' }), false),
    unsentBytes: () => writer.unsentBytes(),
    drained: () => writer.drained(),
    end: () => writer.close(),
  };
}

/** The PTY socket: terminal bytes as binary frames, the exit as a text frame. */
export function ptyWebSocketSink(ws: WebSocket): OutputSink {
  const writer = new WebSocketWriter(ws);
  return {
    get closed() {
      return writer.closed;
    },
    gone: writer.gone,
    sendChunk: (_stream, _start, data) => writer.send(data, true),
    sendExit: (process) => writer.send(JSON.stringify({ type: 'exit', exitCode: process.exitCode, signal: process.signal }), false),
    // WebSocket pings keep idle terminals alive through proxies without a message the
    // client would have to tell apart from output.
    sendKeepalive: () => {
      if (!writer.closed) ws.ping();
    },
    unsentBytes: () => writer.unsentBytes(),
    drained: () => writer.drained(),
    end: () => writer.close(),
  };
}

/** Events as Server-Sent Events: one `data:` line per event. */
export function serverSentEventsSink(res: ServerResponse): OutputSink {
  res.writeHead(200, {
    'Content-Type': 'text/event-stream',
    'Cache-Control': 'no-cache',
    // Proxies such as nginx would otherwise hold events back in their buffers.
    'X-Accel-Buffering': 'no',
  });
  res.flushHeaders();
  const gone = new Promise<void>((resolve) => res.once('close', () => resolve()));
  const isClosed = (): boolean => res.destroyed || res.writableEnded;
  const write = (event: ProcessEvent): void => {
    if (!isClosed()) res.write(`data: ${eventJson(event)}\n\n`);
  };
  return {
    get closed() {
      return isClosed();
    },
    gone,
    sendChunk: (stream, start, data) => write({ type: stream, offset: start, data: data.toString('base64') }),
    sendExit: (process) => write(exitEvent(process)),
    sendKeepalive: () => write({ type: 'keepalive' }),
    unsentBytes: () => res.writableLength,
    drained: () =>
      isClosed() || !res.writableNeedDrain
        ? Promise.resolve()
        : new Promise<void>((resolve) => {
            const done = (): void => {
              res.off('drain', done);
              res.off('close', done);
              resolve();
            };
            res.once('drain', done);
            res.once('close', done);
          }),
    end: () => res.end(),
  };
}
