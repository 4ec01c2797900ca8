// Caps on long-lived streams: WebSockets, Server-Sent Events, Connect server streams and
// proxied upgrades (hosted ports). Each open stream holds a socket in this server, one in the
// host agent and one in the guest agent for as long as it lasts, so one key that opens
// thousands exhausts file descriptors for everyone. A stream is counted against the API key that
// opened it (hosted-port traffic has none: it counts against its sandbox only) and against its
// sandbox; beyond either cap the stream is refused with rate_limited (429 in each API's own
// shape, before any upgrade) and accepted again as soon as one closes.
import { ServerResponse } from 'node:http';
import { NestboxError } from '../../core/errors.js';

/** What kind of stream holds a slot (for the `nestbox_streams_open` gauge; never part of a limit). */
export type StreamKind = 'websocket' | 'http_stream' | 'connect' | 'hosted_port';

export interface StreamCaps {
  perKey: number;
  perSandbox: number;
}

export interface StreamSlot {
  /** Give the slot back; calling it again does nothing. */
  release(): void;
}

export interface StreamOwner {
  /** The API key (or sandbox token) that opened the stream; absent for hosted-port traffic. */
  keyId?: string;
  sandboxId: string;
}

export class StreamLimits {
  private readonly byKey = new Map<string, number>();
  private readonly bySandbox = new Map<string, number>();
  private readonly byKind: Record<StreamKind, number> = { websocket: 0, http_stream: 0, connect: 0, hosted_port: 0 };

  constructor(readonly caps: StreamCaps) {}

  /** A slot for one stream, or rate_limited when the key or the sandbox has its cap open already. */
  acquire(owner: StreamOwner, kind: StreamKind = owner.keyId === undefined ? 'hosted_port' : 'websocket'): StreamSlot {
    const sandboxCount = this.bySandbox.get(owner.sandboxId) ?? 0;
    if (sandboxCount >= this.caps.perSandbox) {
      throw new NestboxError('rate_limited', `streams: sandbox ${owner.sandboxId} already has ${sandboxCount} open streams (the limit); close one and retry`, {
        limit: this.caps.perSandbox,
        scope: 'sandbox',
        retryAfterSeconds: 1,
      });
    }
    const keyCount = owner.keyId === undefined ? 0 : (this.byKey.get(owner.keyId) ?? 0);
    if (owner.keyId !== undefined && keyCount >= this.caps.perKey) {
      throw new NestboxError('rate_limited', `streams: this API key already has ${keyCount} open streams (the limit); close one and retry`, {
        limit: this.caps.perKey,
        scope: 'key',
        retryAfterSeconds: 1,
      });
    }
    this.bySandbox.set(owner.sandboxId, sandboxCount + 1);
    if (owner.keyId !== undefined) this.byKey.set(owner.keyId, keyCount + 1);
    this.byKind[kind]++;
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        this.byKind[kind]--;
        decrement(this.bySandbox, owner.sandboxId);
        if (owner.keyId !== undefined) decrement(this.byKey, owner.keyId);
      },
    };
  }

  /** Holds a slot until `emitter` emits 'close' (a socket, a response, a WebSocket). */
  acquireUntilClosed(owner: StreamOwner, emitter: { once(event: 'close', listener: () => void): unknown }): StreamSlot {
    // An HTTP answer held open is SSE or a streamed body; anything else here is an upgraded socket.
    const kind: StreamKind = owner.keyId === undefined ? 'hosted_port' : emitter instanceof ServerResponse ? 'http_stream' : 'websocket';
    const slot = this.acquire(owner, kind);
    emitter.once('close', () => slot.release());
    return slot;
  }

  /**
   * Holds a slot until `signal` aborts. For Connect server streams: the adapter aborts the
   * handler context's signal when the call ends, however it ends (done, failed, client gone).
   */
  acquireUntilAborted(owner: StreamOwner, signal: AbortSignal): StreamSlot {
    const slot = this.acquire(owner, 'connect');
    if (signal.aborted) slot.release();
    else signal.addEventListener('abort', () => slot.release(), { once: true });
    return slot;
  }

  /** Open streams now by kind (the metrics gauge reads it at scrape time). */
  openByKind(): Record<StreamKind, number> {
    return { ...this.byKind };
  }

  /** Open streams now (for tests and diagnostics). */
  open(owner: StreamOwner): { key: number; sandbox: number } {
    return { key: owner.keyId === undefined ? 0 : (this.byKey.get(owner.keyId) ?? 0), sandbox: this.bySandbox.get(owner.sandboxId) ?? 0 };
  }
}

function decrement(map: Map<string, number>, key: string): void {
  const next = (map.get(key) ?? 1) - 1;
  // Entries go with their last stream, so the maps stay as small as what is open.
  if (next <= 0) map.delete(key);
  else map.set(key, next);
}
