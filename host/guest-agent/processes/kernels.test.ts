// POST /kernels: the guest agent starts its own code kernel (code-interpreter/kernel.py, which
// ships with it) as a process with stdin open; cells go in on stdin, NDJSON comes out on stdout.
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { KernelMessage } from '../../../core/guest.js';
import { HttpGuestClient } from '../../agent-protocol/guest-client.js';
import { startProcessTestAgent, type ProcessTestAgent } from './test-support.js';

describe('POST /kernels', () => {
  let agent: ProcessTestAgent;

  beforeAll(async () => {
    agent = await startProcessTestAgent();
  });
  afterAll(async () => {
    await agent?.stop();
  });

  /** The kernel's protocol messages for one cell, up to end_of_execution (bounded in time). */
  async function runCell(processId: string, cell: string, code: string): Promise<Record<string, unknown>[]> {
    const before = (await agent.call('GET', `/processes/${processId}`)).json.stdout.bytes as number;
    const written = await agent.call('POST', `/processes/${processId}/stdin`, `${JSON.stringify({ id: cell, code })}\n`, { 'content-type': 'application/octet-stream' });
    expect(written.status).toBe(204);
    const deadline = Date.now() + 20_000;
    for (;;) {
      const { json } = await agent.call('GET', `/processes/${processId}/output?stdoutOffset=${before}`);
      const messages = (json.stdout as string).split('\n').filter(Boolean).map((line) => JSON.parse(line) as Record<string, unknown>);
      if (messages.some((m) => m.type === 'end_of_execution')) return messages.filter((m) => m.cell === cell);
      if (Date.now() > deadline) throw new Error(`cell ${cell} did not end: ${json.stdout} ${json.stderr}`);
      await sleep(50);
    }
  }

  it('starts a kernel that keeps its state from one cell to the next, tagged and listed as a process', async () => {
    const started = await agent.call('POST', '/kernels', { language: 'python', tag: 'kernel-test', env: { GREETING: 'hi' } });
    expect(started.status, started.text).toBe(201);
    expect(started.json).toMatchObject({ status: 'running', tag: 'kernel-test', cmd: 'python3', pty: false });
    const id = started.json.processId as string;

    const first = await runCell(id, 'c1', 'import os\nx = 40\nprint(os.environ["GREETING"], os.environ["MPLBACKEND"])');
    // print() may reach the kernel's pipe in pieces: the cell's stdout is their concatenation.
    expect(first.filter((m) => m.type === 'stdout').map((m) => m.text).join('')).toBe('hi Agg\n');
    const second = await runCell(id, 'c2', 'x + 2');
    expect(second).toContainEqual(expect.objectContaining({ type: 'result', is_main_result: true, text: '42' }));

    const { json: list } = await agent.call('GET', '/processes');
    expect(list.processes.map((p: { processId: string }) => p.processId)).toContain(id);
    expect((await agent.call('DELETE', `/processes/${id}`)).status).toBe(204);
    expect((await agent.waitForEnd(id)).status).toBe('killed');
  });

  it('refuses a language it has no kernel for, and unknown fields, naming them', async () => {
    const ruby = await agent.call('POST', '/kernels', { language: 'ruby' });
    expect(ruby.status).toBe(400);
    expect(ruby.json.error).toMatchObject({ code: 'validation_failed', message: expect.stringMatching(/^language: /) });
    const argv = await agent.call('POST', '/kernels', { language: 'python', argv: ['sh'] });
    expect(argv.status).toBe(400);
    expect(argv.json.error.code).toBe('validation_failed');
    expect((await agent.call('GET', '/kernels')).status).toBe(405);
  });

  describe('through the typed client (runCell: what core calls)', () => {
    const guest = () =>
      new HttpGuestClient(
        (r) => agent.client.request({ method: r.method, path: r.path, headers: r.headers, body: r.body, signal: r.signal }),
        (path) => ({ url: agent.wsUrl(path), headers: {} }),
        'test',
      );

    async function collect(messages: AsyncGenerator<KernelMessage>): Promise<KernelMessage[]> {
      const out: KernelMessage[] = [];
      for await (const m of messages) out.push(m);
      return out;
    }

    it('runs cells with their env, keeps state, interrupts a cell whose caller gave up, and reports a kernel that died', async () => {
      const g = guest();
      const kernel = await g.startKernel({ language: 'python', tag: 'typed' });
      const first = await collect(await g.runCell(kernel.processId, { code: 'import os\ny = os.environ["CELL_VAR"]', env: { CELL_VAR: 'from-env' } }));
      expect(first.at(-1)).toEqual({ type: 'end_of_execution' });
      expect(first.every((m) => !('cell' in m))).toBe(true);
      const second = await collect(await g.runCell(kernel.processId, { code: 'y' }));
      expect(second).toContainEqual(expect.objectContaining({ type: 'result', text: 'from-env' }));

      // A caller that gives up: SIGINT interrupts the cell, the kernel and its state live on.
      const abort = new AbortController();
      const runaway = await g.runCell(kernel.processId, { code: 'import time\nwhile True: time.sleep(0.05)' }, { signal: abort.signal });
      setTimeout(() => abort.abort(), 300);
      await expect(collect(runaway)).rejects.toThrow();
      const after = await collect(await g.runCell(kernel.processId, { code: 'y + "!"' }));
      expect(after).toContainEqual(expect.objectContaining({ type: 'result', text: 'from-env!' }));

      // A kernel that exits mid-cell: the stream ends without end_of_execution.
      const died = await collect(await g.runCell(kernel.processId, { code: 'os._exit(3)' }));
      expect(died.map((m) => m.type)).not.toContain('end_of_execution');
      expect((await agent.waitForEnd(kernel.processId)).exitCode).toBe(3);
    });
  });
});
