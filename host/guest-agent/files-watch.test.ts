import { appendFile, chmod, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { createServer, request, type IncomingMessage } from 'node:http';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { AgentClient } from '../agent-protocol/client.js';
import { WatchEvent, WatcherEventsResponse, type WatchChangeEvent } from '../agent-protocol/files.js';
import { call, q } from './files-testing.js';
import { PollingWatchers, streamWatchAsSse } from './files-watch-streams.js';
import { startTestAgent, type TestAgent } from './testing.js';

const WAIT_MS = 5_000;

/** Collects watch messages and waits (bounded) for ones matching a predicate. */
class EventLog {
  readonly events: WatchEvent[] = [];
  private waiters: (() => void)[] = [];

  push(event: WatchEvent): void {
    this.events.push(WatchEvent.parse(event));
    for (const wake of this.waiters.splice(0)) wake();
  }

  changes(): WatchChangeEvent[] {
    return this.events.filter((event): event is WatchChangeEvent => event.type !== 'ready' && event.type !== 'keepalive');
  }

  async waitFor(description: string, predicate: (events: WatchEvent[]) => boolean, timeoutMs = WAIT_MS): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate(this.events)) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new Error(`timed out waiting for ${description}; got ${JSON.stringify(this.events)}`);
      await Promise.race([new Promise<void>((resolve) => this.waiters.push(resolve)), sleep(Math.min(remaining, 100))]);
    }
  }

  async waitForChange(type: WatchChangeEvent['type'], path: string): Promise<WatchChangeEvent> {
    await this.waitFor(`${type} ${path}`, () => this.changes().some((event) => event.type === type && event.path === path));
    return this.changes().find((event) => event.type === type && event.path === path)!;
  }
}

interface Subscription {
  log: EventLog;
  close(): void;
}

function subscribeSse(socketPath: string, path: string, recursive: boolean): Promise<Subscription> {
  return new Promise((resolve, reject) => {
    const log = new EventLog();
    const req = request({
      socketPath,
      path: `/files/watch?${q({ path, recursive })}`,
      headers: { accept: 'text/event-stream' },
    });
    req.on('error', () => {});
    req.on('response', (response: IncomingMessage) => {
      if (response.statusCode !== 200) {
        reject(new Error(`SSE answered ${response.statusCode}`));
        return;
      }
      expect(response.headers['content-type']).toMatch(/^text\/event-stream/);
      let buffered = '';
      response.setEncoding('utf8');
      response.on('data', (text: string) => {
        buffered += text;
        for (let end = buffered.indexOf('\n\n'); end !== -1; end = buffered.indexOf('\n\n')) {
          const frame = buffered.slice(0, end);
          buffered = buffered.slice(end + 2);
          const data = frame.split('\n').find((line) => line.startsWith('data: '));
          if (data) log.push(JSON.parse(data.slice(6)));
        }
      });
      response.on('error', () => {});
      resolve({ log, close: () => req.destroy() });
    });
    req.end();
  });
}

function subscribeWebSocket(socketPath: string, path: string, recursive: boolean): Promise<Subscription> {
  return new Promise((resolve, reject) => {
    const log = new EventLog();
    const socket = new WebSocket(`ws+unix://${socketPath}:/files/watch?${q({ path, recursive })}`);
    socket.on('message', (data) => log.push(JSON.parse(String(data))));
    socket.on('open', () => resolve({ log, close: () => socket.close() }));
    socket.on('unexpected-response', (_req, response) => reject(new Error(`WebSocket answered ${response.statusCode}`)));
    socket.on('error', reject);
  });
}

describe('watching files', () => {
  let agent: TestAgent;
  let client: AgentClient;

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  describe.each([
    ['WebSocket', subscribeWebSocket],
    ['SSE', subscribeSse],
  ])('GET /files/watch over %s', (transport, subscribe) => {
    it('sends ready first, then create, write, rename, chmod and remove, recursively', async () => {
      const dir = join(agent.home, `watched-${transport}`);
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'existing.txt'), 'was here before');
      const { log, close } = await subscribe(agent.socketPath, dir, true);
      try {
        await log.waitFor('ready', (events) => events.length > 0);
        expect(log.events[0]).toEqual({ type: 'ready' });

        const file = join(dir, 'new.txt');
        await writeFile(file, 'one\n');
        expect(await log.waitForChange('create', file)).toMatchObject({ isDir: false, at: expect.any(String) });

        await sleep(150);
        await appendFile(file, 'two\n');
        await log.waitForChange('write', file);

        const renamed = join(dir, 'renamed.txt');
        await rename(file, renamed);
        await log.waitForChange('rename', file);
        await log.waitForChange('create', renamed);

        await chmod(renamed, 0o600);
        await log.waitForChange('chmod', renamed);

        await rm(renamed);
        await log.waitForChange('remove', renamed);

        // A new subdirectory is watched too, and what is created in it is reported.
        const sub = join(dir, 'sub');
        await mkdir(sub);
        expect(await log.waitForChange('create', sub)).toMatchObject({ isDir: true });
        await sleep(150);
        await writeFile(join(sub, 'inner.txt'), 'x');
        await log.waitForChange('create', join(sub, 'inner.txt'));
        await rm(sub, { recursive: true });
        await log.waitForChange('remove', join(sub, 'inner.txt'));
        expect(await log.waitForChange('remove', sub)).toMatchObject({ isDir: true });

        // Nothing about the file that was there before the watch started.
        expect(log.changes().some((event) => event.path.endsWith('existing.txt'))).toBe(false);
        expect(log.changes().every((event) => Date.parse(event.at) > 0)).toBe(true);
      } finally {
        close();
      }
    });
  });

  it('reports only direct children without recursive, and a tree created at once with recursive', async () => {
    const dir = join(agent.home, 'flat');
    await mkdir(join(dir, 'child'), { recursive: true });
    const flat = await subscribeWebSocket(agent.socketPath, dir, false);
    const deep = await subscribeWebSocket(agent.socketPath, dir, true);
    try {
      await flat.log.waitFor('ready', (events) => events.length > 0);
      await deep.log.waitFor('ready', (events) => events.length > 0);
      await writeFile(join(dir, 'child/nested.txt'), 'n');
      await mkdir(join(dir, 'a/b/c'), { recursive: true });
      await writeFile(join(dir, 'a/b/c/leaf.txt'), 'leaf');
      await writeFile(join(dir, 'top.txt'), 't');
      await flat.log.waitForChange('create', join(dir, 'top.txt'));
      await deep.log.waitForChange('create', join(dir, 'top.txt'));
      await deep.log.waitForChange('create', join(dir, 'child/nested.txt'));
      // Created before the new directories' watches were in place: found by their scan.
      await deep.log.waitForChange('create', join(dir, 'a/b/c/leaf.txt'));
      await deep.log.waitForChange('create', join(dir, 'a/b'));
      expect(flat.log.changes().some((event) => event.path.includes('nested') || event.path.includes('leaf'))).toBe(false);
      expect(flat.log.changes().some((event) => event.type === 'create' && event.path === join(dir, 'a'))).toBe(true);
    } finally {
      flat.close();
      deep.close();
    }
  });

  it('follows a directory renamed inside the tree and reports one moved out as removed', async () => {
    const dir = join(agent.home, 'renames');
    await mkdir(join(dir, 'before'), { recursive: true });
    await writeFile(join(dir, 'before/kept.txt'), 'k');
    const outside = join(agent.home, 'outside-of-watch');
    await mkdir(outside, { recursive: true });
    const { log, close } = await subscribeWebSocket(agent.socketPath, dir, true);
    try {
      await log.waitFor('ready', (events) => events.length > 0);
      await rename(join(dir, 'before'), join(dir, 'after'));
      expect(await log.waitForChange('rename', join(dir, 'before'))).toMatchObject({ isDir: true });
      await log.waitForChange('create', join(dir, 'after'));
      await sleep(150);
      await writeFile(join(dir, 'after/new.txt'), 'n');
      await log.waitForChange('create', join(dir, 'after/new.txt'));
      // The moved directory's existing content is not announced again.
      expect(log.changes().some((event) => event.path.endsWith('kept.txt'))).toBe(false);

      await rename(join(dir, 'after'), join(outside, 'gone'));
      expect(await log.waitForChange('remove', join(dir, 'after'))).toMatchObject({ isDir: true });
      await writeFile(join(outside, 'gone/unwatched.txt'), 'u');
      await sleep(300);
      expect(log.changes().some((event) => event.path.includes('unwatched'))).toBe(false);
    } finally {
      close();
    }
  });

  it('coalesces a burst of writes but never loses a short-lived file', async () => {
    const dir = join(agent.home, 'bursty');
    await mkdir(dir, { recursive: true });
    const file = join(dir, 'log.txt');
    await writeFile(file, '');
    const { log, close } = await subscribeSse(agent.socketPath, dir, false);
    try {
      await log.waitFor('ready', (events) => events.length > 0);
      for (let index = 0; index < 500; index++) await appendFile(file, `line ${index}\n`);
      const fleeting = join(dir, 'fleeting.tmp');
      await writeFile(fleeting, 'here and gone');
      await rm(fleeting);
      await log.waitForChange('remove', fleeting);
      await log.waitForChange('create', fleeting);
      const writes = log.changes().filter((event) => event.type === 'write' && event.path === file);
      expect(writes.length).toBeGreaterThan(0);
      expect(writes.length).toBeLessThan(100);
    } finally {
      close();
    }
  });

  it('reports an uploaded file as itself, never its temp file', async () => {
    const dir = join(agent.home, 'uploads');
    await mkdir(dir, { recursive: true });
    const { log, close } = await subscribeSse(agent.socketPath, dir, false);
    try {
      await log.waitFor('ready', (events) => events.length > 0);
      const target = join(dir, 'landed.txt');
      const put = await call(client, 'PUT', `/files/content?${q({ path: target })}`, Buffer.from('uploaded'));
      expect(put.status).toBe(200);
      await log.waitForChange('write', target);
      await sleep(200);
      // Reported as the in-place write it stands for (as E2B's envd reports one): create, chmod, write.
      expect(log.changes().map((event) => [event.type, event.path])).toEqual([
        ['create', target],
        ['chmod', target],
        ['write', target],
      ]);
      // Overwriting it is a write of the same file, not a new one.
      const before = log.changes().length;
      expect((await call(client, 'PUT', `/files/content?${q({ path: target })}`, Buffer.from('again'))).status).toBe(200);
      await log.waitFor('overwrite', () => log.changes().length > before);
      await sleep(200);
      expect(log.changes().slice(before).map((event) => [event.type, event.path])).toEqual([['write', target]]);
    } finally {
      close();
    }
  });

  it('sends keepalives while nothing happens', async () => {
    // The real interval is 15 s; the stream function takes a shorter one for this test.
    const dir = join(agent.home, 'quiet');
    await mkdir(dir, { recursive: true });
    const socketPath = join(agent.root, 'keepalive.sock');
    const server = createServer((req, res) => {
      streamWatchAsSse(req, res, { root: dir, recursive: false }, 30).catch(() => res.destroy());
    });
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    const { log, close } = await subscribeSse(socketPath, dir, false);
    try {
      await log.waitFor('two keepalives', (events) => events.filter((event) => event.type === 'keepalive').length >= 2);
      expect(log.events[0]).toEqual({ type: 'ready' });
      expect(log.changes()).toEqual([]);
    } finally {
      close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it('ends the stream when the watched directory is removed', async () => {
    const dir = join(agent.home, 'doomed');
    await mkdir(dir, { recursive: true });
    const socket = new WebSocket(`ws+unix://${agent.socketPath}:/files/watch?${q({ path: dir })}`);
    const log = new EventLog();
    socket.on('message', (data) => log.push(JSON.parse(String(data))));
    const closed = new Promise<number>((resolve) => socket.on('close', (code) => resolve(code)));
    await log.waitFor('ready', (events) => events.length > 0);
    await rm(dir, { recursive: true });
    await log.waitForChange('remove', dir);
    expect(await Promise.race([closed, sleep(WAIT_MS).then(() => -1)])).toBe(1000);
  });

  it('answers 404 for a missing path and 400 for a file, on both transports', async () => {
    await writeFile(join(agent.home, 'plain.txt'), 'x');
    const missing = await call(client, 'GET', `/files/watch?${q({ path: 'nope' })}`, undefined, { accept: 'text/event-stream' });
    expect(missing.status).toBe(404);
    const file = await call(client, 'GET', `/files/watch?${q({ path: 'plain.txt' })}`, undefined, { accept: 'text/event-stream' });
    expect(file.status).toBe(400);
    expect(file.json().error.message).toMatch(/^path: not a directory/);
    const noAccept = await call(client, 'GET', `/files/watch?${q({ path: '.' })}`);
    expect(noAccept.status).toBe(400);
    expect(noAccept.json().error.message).toMatch(/^accept: /);
    await expect(subscribeWebSocket(agent.socketPath, join(agent.home, 'nope'), false)).rejects.toThrow(/404/);
    await expect(subscribeWebSocket(agent.socketPath, join(agent.home, 'plain.txt'), false)).rejects.toThrow(/400/);
  });

  describe('polling watchers', () => {
    it('has the events of a change already queued when the call that made it returns', async () => {
      const dir = join(agent.home, 'polled-at-once');
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'existing.txt'), 'old');
      const { watcherId } = (await call(client, 'POST', '/files/watchers', { path: 'polled-at-once', recursive: true })).json();
      const drain = async (): Promise<[string, string][]> =>
        WatcherEventsResponse.parse((await call(client, 'GET', `/files/watchers/${watcherId}/events`)).json()).events.map((event) => [event.type, event.path]);
      try {
        const fresh = join(dir, 'fresh.txt');
        expect((await call(client, 'PUT', `/files/content?${q({ path: fresh })}`, Buffer.from('new'))).status).toBe(200);
        // No waiting: drained right after the write returned.
        expect(await drain()).toEqual([
          ['create', fresh],
          ['chmod', fresh],
          ['write', fresh],
        ]);
        expect((await call(client, 'PUT', `/files/content?${q({ path: join(dir, 'existing.txt') })}`, Buffer.from('new'))).status).toBe(200);
        expect(await drain()).toEqual([['write', join(dir, 'existing.txt')]]);
        // An overwrite and a new file back to back: the new file may get the inode number the
        // overwrite just freed, which must not read as a rename of the overwritten file.
        for (let round = 0; round < 3; round++) {
          const another = join(dir, `another-${round}.txt`);
          expect((await call(client, 'PUT', `/files/content?${q({ path: join(dir, 'existing.txt') })}`, Buffer.from(`round ${round}`))).status).toBe(200);
          expect((await call(client, 'PUT', `/files/content?${q({ path: another })}`, Buffer.from('x'))).status).toBe(200);
          expect(await drain()).toEqual([
            ['write', join(dir, 'existing.txt')],
            ['create', another],
            ['chmod', another],
            ['write', another],
          ]);
        }
        // A write by another process, in place.
        await appendFile(join(dir, 'existing.txt'), ' and more');
        expect(await drain()).toEqual([['write', join(dir, 'existing.txt')]]);
        // A directory made, then a file written into it at once (before any watch could be on it).
        await mkdir(join(dir, 'sub'));
        expect((await call(client, 'PUT', `/files/content?${q({ path: join(dir, 'sub/inner.txt') })}`, Buffer.from('i'))).status).toBe(200);
        expect(await drain()).toEqual([
          ['create', join(dir, 'sub')],
          ['create', join(dir, 'sub/inner.txt')],
          ['chmod', join(dir, 'sub/inner.txt')],
          ['write', join(dir, 'sub/inner.txt')],
        ]);
      } finally {
        await call(client, 'DELETE', `/files/watchers/${watcherId}`);
      }
    });

    it('creates a watcher, drains its events, and deletes it', async () => {
      const dir = join(agent.home, 'polled');
      await mkdir(dir, { recursive: true });
      const created = await call(client, 'POST', '/files/watchers', { path: 'polled', recursive: true });
      expect(created.status).toBe(201);
      const { watcherId } = created.json();
      expect(watcherId).toMatch(/^w_[0-9a-f]{24}$/);

      await writeFile(join(dir, 'a.txt'), 'a');
      await mkdir(join(dir, 'nested'));
      const seen: WatchChangeEvent[] = [];
      const deadline = Date.now() + WAIT_MS;
      while (Date.now() < deadline && !seen.some((event) => event.path === join(dir, 'nested'))) {
        const drained = WatcherEventsResponse.parse((await call(client, 'GET', `/files/watchers/${watcherId}/events`)).json());
        seen.push(...drained.events);
        expect(drained).toMatchObject({ dropped: 0, closed: false });
        await sleep(50);
      }
      // The file's write may or may not fall into the window of its create; the creates are certain.
      expect(seen.filter((event) => event.type !== 'write').map((event) => [event.type, event.path, event.isDir])).toEqual([
        ['create', join(dir, 'a.txt'), false],
        ['create', join(dir, 'nested'), true],
      ]);
      // Drained: nothing repeats.
      expect((await call(client, 'GET', `/files/watchers/${watcherId}/events`)).json().events).toEqual([]);

      expect((await call(client, 'DELETE', `/files/watchers/${watcherId}`)).status).toBe(204);
      expect((await call(client, 'GET', `/files/watchers/${watcherId}/events`)).status).toBe(404);
      expect((await call(client, 'DELETE', `/files/watchers/${watcherId}`)).status).toBe(404);
    });

    it('validates creation', async () => {
      expect((await call(client, 'POST', '/files/watchers', { path: 'no-such-dir' })).status).toBe(404);
      expect((await call(client, 'POST', '/files/watchers', { path: 'polled/a.txt' })).status).toBe(400);
      expect((await call(client, 'POST', '/files/watchers', { recursive: true })).json().error.message).toMatch(/^path: /);
    });

    it('bounds the buffer, counting what was dropped, and removes idle watchers', async () => {
      const dir = join(agent.home, 'overflow');
      await mkdir(dir, { recursive: true });
      const watchers = new PollingWatchers(60_000, 5);
      try {
        const id = await watchers.create({ root: dir, recursive: false });
        for (let index = 0; index < 8; index++) await writeFile(join(dir, `f${index}`), 'x');
        const deadline = Date.now() + WAIT_MS;
        let drained = await watchers.drain(id);
        while (Date.now() < deadline && drained.events.length + drained.dropped < 8) {
          await sleep(50);
          const next = await watchers.drain(id);
          drained = { events: [...drained.events, ...next.events], dropped: drained.dropped + next.dropped, closed: next.closed };
        }
        expect(drained.events.length).toBeLessThanOrEqual(10);
        expect(drained.events.length + drained.dropped).toBeGreaterThanOrEqual(8);
        expect(drained.dropped).toBeGreaterThan(0);

        watchers.sweep(Date.now() + 59_000);
        await expect(watchers.drain(id)).resolves.toBeDefined();
        watchers.sweep(Date.now() + 61_000);
        await expect(watchers.drain(id)).rejects.toThrow(/no such watcher/);
      } finally {
        watchers.closeAll();
      }
    });
  });
});
