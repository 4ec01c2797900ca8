import { describe, expect, it } from 'vitest';
import { EventEmitter } from 'node:events';
import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { NestboxError } from '../../core/errors.js';
import { StreamLimits } from './stream-limits.js';

describe('StreamLimits', () => {
  it('refuses past the sandbox cap and the key cap, and frees a slot once, on release', () => {
    const limits = new StreamLimits({ perKey: 3, perSandbox: 2 });
    const a1 = limits.acquire({ keyId: 'k', sandboxId: 'a' });
    limits.acquire({ keyId: 'k', sandboxId: 'a' });
    expect(() => limits.acquire({ keyId: 'other', sandboxId: 'a' })).toThrow(NestboxError);
    limits.acquire({ keyId: 'k', sandboxId: 'b' });
    let refused: unknown;
    try {
      limits.acquire({ keyId: 'k', sandboxId: 'c' });
    } catch (err) {
      refused = err;
    }
    expect((refused as NestboxError).code).toBe('rate_limited');
    expect((refused as NestboxError).status).toBe(429);
    expect((refused as NestboxError).details?.scope).toBe('key');
    a1.release();
    a1.release();
    expect(limits.open({ keyId: 'k', sandboxId: 'a' })).toEqual({ key: 2, sandbox: 1 });
  });

  it('counts hosted-port traffic (no key) against the sandbox only', () => {
    const limits = new StreamLimits({ perKey: 1, perSandbox: 2 });
    limits.acquire({ sandboxId: 'a' });
    limits.acquire({ sandboxId: 'a' });
    expect(() => limits.acquire({ sandboxId: 'a' })).toThrow(/sandbox a/);
    expect(limits.open({ keyId: 'k', sandboxId: 'b' })).toEqual({ key: 0, sandbox: 0 });
  });

  it('releases on close and on abort, and forgets empty entries', () => {
    const limits = new StreamLimits({ perKey: 10, perSandbox: 10 });
    const socket = new EventEmitter();
    limits.acquireUntilClosed({ keyId: 'k', sandboxId: 'a' }, socket);
    const abort = new AbortController();
    limits.acquireUntilAborted({ keyId: 'k', sandboxId: 'a' }, abort.signal);
    expect(limits.open({ keyId: 'k', sandboxId: 'a' })).toEqual({ key: 2, sandbox: 2 });
    socket.emit('close');
    abort.abort();
    expect(limits.open({ keyId: 'k', sandboxId: 'a' })).toEqual({ key: 0, sandbox: 0 });
    const done = new AbortController();
    done.abort();
    limits.acquireUntilAborted({ keyId: 'k', sandboxId: 'a' }, done.signal);
    expect(limits.open({ keyId: 'k', sandboxId: 'a' })).toEqual({ key: 0, sandbox: 0 });
  });

  it('counts open streams by kind for the metrics, and forgets them on release', () => {
    const limits = new StreamLimits({ perKey: 10, perSandbox: 10 });
    const socket = new EventEmitter();
    const answer = new ServerResponse(new IncomingMessage(new Socket()));
    const abort = new AbortController();
    limits.acquireUntilClosed({ keyId: 'k', sandboxId: 'a' }, socket);
    limits.acquireUntilClosed({ keyId: 'k', sandboxId: 'a' }, answer);
    limits.acquireUntilAborted({ keyId: 'k', sandboxId: 'a' }, abort.signal);
    limits.acquireUntilClosed({ sandboxId: 'a' }, new EventEmitter());
    expect(limits.openByKind()).toEqual({ websocket: 1, http_stream: 1, connect: 1, hosted_port: 1 });
    socket.emit('close');
    answer.emit('close');
    abort.abort();
    expect(limits.openByKind()).toEqual({ websocket: 0, http_stream: 0, connect: 0, hosted_port: 1 });
  });
});
