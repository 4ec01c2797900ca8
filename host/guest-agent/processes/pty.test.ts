import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { startProcessTestAgent, waitUntil, type ProcessTestAgent } from './test-support.js';

/** A PTY WebSocket client that records terminal bytes, text frames and the close code. */
class Terminal {
  output = Buffer.alloc(0);
  texts: any[] = [];
  closeCode: number | undefined;
  readonly ws: WebSocket;
  readonly opened: Promise<void>;
  readonly closed: Promise<number>;

  constructor(url: string) {
    this.ws = new WebSocket(url);
    this.opened = new Promise((resolve, reject) => {
      this.ws.once('open', () => resolve());
      this.ws.once('error', reject);
    });
    this.closed = new Promise((resolve) => this.ws.once('close', (code) => resolve((this.closeCode = code))));
    this.ws.on('message', (data, isBinary) => {
      if (isBinary) this.output = Buffer.concat([this.output, data as Buffer]);
      else this.texts.push(JSON.parse(data.toString()));
    });
  }

  text(): string {
    return this.output.toString('utf8');
  }

  type(keys: string): void {
    this.ws.send(Buffer.from(keys), { binary: true });
  }

  control(message: object): void {
    this.ws.send(JSON.stringify(message));
  }

  async waitFor(pattern: RegExp, timeoutMs = 10_000): Promise<RegExpMatchArray> {
    return waitUntil(() => this.text().match(pattern) ?? undefined, timeoutMs, `terminal output matching ${pattern}`);
  }
}

describe('PTY processes', () => {
  let agent: ProcessTestAgent;

  beforeAll(async () => {
    agent = await startProcessTestAgent();
  });
  afterAll(async () => {
    await agent.stop();
  });

  async function startBash(cols = 80, rows = 24) {
    const started = await agent.start({ argv: ['bash', '--norc', '--noprofile', '-i'], pty: { cols, rows } });
    expect(started).toMatchObject({ pty: true, status: 'running' });
    return started;
  }

  it('runs bash on a terminal: it answers $((6*7)), stty size follows resize, and the exit code comes over the socket', async () => {
    const started = await startBash(100, 30);
    const terminal = new Terminal(agent.wsUrl(`/processes/${started.processId}/pty`));
    await terminal.opened;
    terminal.type('echo $((6*7))\r');
    await terminal.waitFor(/[\r\n]42\r\n/);

    terminal.type('stty size\r');
    await terminal.waitFor(/[\r\n]30 100\r\n/);
    terminal.control({ type: 'resize', cols: 132, rows: 43 });
    // The resize travels a pipe to the helper; poll until the shell sees it.
    await waitUntil(async () => {
      terminal.type('stty size\r');
      await new Promise((resolve) => setTimeout(resolve, 100));
      return /[\r\n]43 132\r\n/.test(terminal.text()) ? true : undefined;
    });
    expect((await agent.call('POST', `/processes/${started.processId}/resize`, { cols: 90, rows: 20 })).status).toBe(204);
    terminal.type('stty size\r');
    await terminal.waitFor(/[\r\n]20 90\r\n/);

    terminal.type('exit 7\r');
    expect(await terminal.closed).toBe(1000);
    expect(terminal.texts.at(-1)).toEqual({ type: 'exit', exitCode: 7, signal: null });
    expect(await agent.waitForEnd(started.processId)).toMatchObject({ status: 'exited', exitCode: 7 });
  });

  it('passes raw bytes unmodified: UTF-8 and escape sequences', async () => {
    const started = await agent.start({ argv: ['printf', '\\033[1;31mrot\\033[0m ünïcødé ✓'], pty: { cols: 80, rows: 24 } });
    await agent.waitForEnd(started.processId);
    const { json } = await agent.call('GET', `/processes/${started.processId}/output`);
    expect(json.stdout).toBe('\u001b[1;31mrot\u001b[0m ünïcødé ✓');
  });

  it('replays the terminal to a reconnecting client, serves several clients, and writes stdin from HTTP', async () => {
    const started = await startBash();
    const first = new Terminal(agent.wsUrl(`/processes/${started.processId}/pty`));
    await first.opened;
    first.type('echo first-$((1+1))\r');
    await first.waitFor(/first-2/);
    first.ws.close();
    await first.closed;

    const second = new Terminal(agent.wsUrl(`/processes/${started.processId}/pty`));
    const third = new Terminal(agent.wsUrl(`/processes/${started.processId}/pty`));
    await Promise.all([second.opened, third.opened]);
    await second.waitFor(/first-2/); // the replay
    expect((await agent.call('POST', `/processes/${started.processId}/stdin`, 'echo via-$((2+3))\r')).status).toBe(204);
    await second.waitFor(/via-5/);
    await third.waitFor(/via-5/);

    third.control({ type: 'kill' });
    expect(await second.closed).toBe(1000);
    expect(await third.closed).toBe(1000);
    expect(second.texts.at(-1)).toMatchObject({ type: 'exit', exitCode: null, signal: 'SIGKILL' });
    expect(await agent.waitForEnd(started.processId)).toMatchObject({ status: 'killed', signal: 'SIGKILL' });
  });

  it('kills the whole terminal session with DELETE, background jobs included', async () => {
    const started = await startBash();
    const terminal = new Terminal(agent.wsUrl(`/processes/${started.processId}/pty`));
    await terminal.opened;
    terminal.type('sleep 300 & echo bg=$!\r');
    const [, backgroundPid] = await terminal.waitFor(/bg=(\d+)/);
    expect((await agent.call('DELETE', `/processes/${started.processId}`)).status).toBe(204);
    await agent.waitForEnd(started.processId);
    // Dead means gone or a zombie waiting to be reaped (tests have no tini to reap at once).
    await waitUntil(() => {
      try {
        const stat = readFileSync(`/proc/${backgroundPid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2).startsWith('Z') ? true : undefined;
      } catch {
        return true;
      }
    }, 5_000, 'background job killed');
    await terminal.closed;
  });

  it('refuses the PTY socket for a process without a terminal, and unknown processes', async () => {
    const plain = await agent.start({ argv: ['sleep', '5'] });
    const refused = await new Promise<number>((resolve) => {
      const ws = new WebSocket(agent.wsUrl(`/processes/${plain.processId}/pty`));
      ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
      ws.on('error', () => {});
    });
    expect(refused).toBe(400);
    const unknown = await new Promise<number>((resolve) => {
      const ws = new WebSocket(agent.wsUrl('/processes/p99999/events'));
      ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
      ws.on('error', () => {});
    });
    expect(unknown).toBe(404);
    await agent.call('DELETE', `/processes/${plain.processId}`);
  });
});
