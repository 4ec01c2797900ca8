// The three ways a client can follow a TreeWatcher: a WebSocket, Server-Sent Events, or a
// polling watcher it drains now and then (E2B's CreateWatcher / GetWatcherEvents).
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { WatchChangeEvent, WatchEvent, WatcherEventsResponse } from '../agent-protocol/files.js';
import { AgentHttpError, notFound } from './errors.js';
import { TreeWatcher } from './files-watch.js';
import type { UpgradeContext } from './websocket.js';

export const KEEPALIVE_INTERVAL_MS = 15_000;
/** A stream client this far behind is cut off rather than buffered for without bound. */
const MAX_STREAM_BACKLOG_BYTES = 16 * 1024 * 1024;
export const POLLING_BUFFER_LIMIT = 10_000;
export const POLLING_IDLE_TIMEOUT_MS = 10 * 60 * 1000;
const MAX_POLLING_WATCHERS = 1000;

export interface WatchTarget {
  root: string;
  recursive: boolean;
}

/**
 * Starts a watch whose events are held back until `release` is called: a large tree takes a
 * while to scan, and a change seen meanwhile must not reach the client before `ready`.
 */
async function startHeldWatch(target: WatchTarget, deliver: (event: WatchChangeEvent) => void, onEnd: (reason: 'removed' | 'error') => void) {
  let held: WatchChangeEvent[] | undefined = [];
  const watcher = await TreeWatcher.start({
    root: target.root,
    recursive: target.recursive,
    onEvent: (event) => (held ? held.push(event) : deliver(event)),
    onEnd: (reason) => onEnd(reason),
  });
  return {
    watcher,
    release(): void {
      const queued = held ?? [];
      held = undefined;
      for (const event of queued) deliver(event);
    },
  };
}

/** GET /files/watch with `Accept: text/event-stream`. Resolves when the stream is over. */
export async function streamWatchAsSse(req: IncomingMessage, res: ServerResponse, target: WatchTarget, keepaliveMs = KEEPALIVE_INTERVAL_MS): Promise<void> {
  let finish: () => void = () => {};
  const over = new Promise<void>((resolve) => (finish = resolve));
  const send = (event: WatchEvent): void => {
    if (res.writableEnded || res.destroyed) return;
    if (res.writableLength > MAX_STREAM_BACKLOG_BYTES) {
      res.destroy();
      return;
    }
    res.write(`data: ${JSON.stringify(event)}\n\n`);
  };
  const { watcher, release } = await startHeldWatch(target, send, () => {
    // The directory is gone: nothing more can come, so end the stream cleanly.
    if (!res.writableEnded) res.end();
  });
  const keepalive = setInterval(() => send({ type: 'keepalive' }), keepaliveMs);
  const cleanup = (): void => {
    clearInterval(keepalive);
    watcher.close();
    finish();
  };
  res.once('close', cleanup);
  req.socket.setTimeout(0);
  res.writeHead(200, {
    'Content-Type': 'text/event-stream; charset=utf-8',
    'Cache-Control': 'no-cache',
    // Proxies (nginx) must not buffer a stream of small events.
    'X-Accel-Buffering': 'no',
  });
  send({ type: 'ready' });
  release();
  await over;
}

/** The WebSocket form of GET /files/watch. */
export async function streamWatchOverWebSocket(context: UpgradeContext, target: WatchTarget, keepaliveMs = KEEPALIVE_INTERVAL_MS): Promise<void> {
  let socket: import('ws').WebSocket | undefined;
  const send = (event: WatchEvent): void => {
    if (!socket || socket.readyState !== socket.OPEN) return;
    if (socket.bufferedAmount > MAX_STREAM_BACKLOG_BYTES) {
      socket.terminate();
      return;
    }
    socket.send(JSON.stringify(event));
  };
  let endReason: 'removed' | 'error' | undefined;
  const { watcher, release } = await startHeldWatch(target, send, (reason) => {
    endReason = reason;
    socket?.close(reason === 'removed' ? 1000 : 1011, reason === 'removed' ? 'watched directory removed' : 'watch failed');
  });
  // A handshake that fails inside ws never calls back; the socket closing is the only sign.
  context.req.socket.once('close', () => watcher.close());
  socket = await context.accept();
  const keepalive = setInterval(() => send({ type: 'keepalive' }), keepaliveMs);
  socket.on('close', () => {
    clearInterval(keepalive);
    watcher.close();
  });
  socket.on('error', () => socket?.terminate());
  if (endReason) {
    socket.close(endReason === 'removed' ? 1000 : 1011);
    return;
  }
  send({ type: 'ready' });
  release();
}

interface PollingWatcher {
  watcher: TreeWatcher;
  events: WatchChangeEvent[];
  dropped: number;
  closed: boolean;
  lastPolledAt: number;
}

/** Polling watchers of one agent, with an idle sweep so forgotten ones do not pile up. */
export class PollingWatchers {
  private readonly watchers = new Map<string, PollingWatcher>();
  private readonly sweepTimer: NodeJS.Timeout;

  constructor(
    private readonly idleTimeoutMs = POLLING_IDLE_TIMEOUT_MS,
    private readonly bufferLimit = POLLING_BUFFER_LIMIT,
  ) {
    this.sweepTimer = setInterval(() => this.sweep(), Math.min(60_000, Math.max(idleTimeoutMs / 4, 10)));
    this.sweepTimer.unref();
  }

  async create(target: WatchTarget): Promise<string> {
    if (this.watchers.size >= MAX_POLLING_WATCHERS) {
      throw new AgentHttpError(409, 'conflict', `path: too many watchers (${MAX_POLLING_WATCHERS}); remove some first`);
    }
    const id = `w_${randomBytes(12).toString('hex')}`;
    const entry: PollingWatcher = { watcher: undefined as unknown as TreeWatcher, events: [], dropped: 0, closed: false, lastPolledAt: Date.now() };
    entry.watcher = await TreeWatcher.start({
      root: target.root,
      recursive: target.recursive,
      onEvent: (event) => {
        if (entry.events.length >= this.bufferLimit) entry.dropped++;
        else entry.events.push(event);
      },
      onEnd: () => {
        entry.closed = true;
      },
    });
    this.watchers.set(id, entry);
    return id;
  }

  /** The events so far; a change made before this call is among them (TreeWatcher.settle). */
  async drain(id: string): Promise<WatcherEventsResponse> {
    const entry = this.watchers.get(id);
    if (!entry) throw notFound(`no such watcher: ${id}`);
    entry.lastPolledAt = Date.now();
    await entry.watcher.settle();
    const response: WatcherEventsResponse = { events: entry.events, dropped: entry.dropped, closed: entry.closed };
    entry.events = [];
    entry.dropped = 0;
    return response;
  }

  remove(id: string): void {
    const entry = this.watchers.get(id);
    if (!entry) throw notFound(`no such watcher: ${id}`);
    entry.watcher.close();
    this.watchers.delete(id);
  }

  sweep(now = Date.now()): void {
    for (const [id, entry] of this.watchers) {
      if (now - entry.lastPolledAt >= this.idleTimeoutMs) {
        entry.watcher.close();
        this.watchers.delete(id);
      }
    }
  }

  closeAll(): void {
    clearInterval(this.sweepTimer);
    for (const entry of this.watchers.values()) entry.watcher.close();
    this.watchers.clear();
  }
}
