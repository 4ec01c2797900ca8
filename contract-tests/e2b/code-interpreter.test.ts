// runCode and code contexts through the real `@e2b/code-interpreter` SDK (port-49999 traffic,
// e2b.md (e)), backed by Nestbox's own kernel (host/guest-agent/code-interpreter/kernel.py).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from '@e2b/code-interpreter';
import { NotFoundError, TimeoutError } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let sbx: Sandbox;

beforeAll(async () => {
  t = await startE2bTestServer();
  sbx = await Sandbox.create(t.opts);
});

afterAll(async () => {
  await sbx?.kill().catch(() => undefined);
  await t?.close();
});

describe('e2b code interpreter', () => {
  it('keeps state across calls in the default context and returns the last expression', async () => {
    const first = await sbx.runCode('x = 41\nprint("set x")\nx + 1');
    expect(first.error).toBeUndefined();
    expect(first.logs.stdout.join('')).toBe('set x\n');
    expect(first.text).toBe('42');
    expect(first.results[0].isMainResult).toBe(true);
    expect(first.executionCount).toBeGreaterThan(0);

    const second = await sbx.runCode('x * 2');
    expect(second.text).toBe('82');
  });

  it('streams stdout and stderr to callbacks', async () => {
    const out: string[] = [];
    const err: string[] = [];
    const execution = await sbx.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)', {
      onStdout: (m) => void out.push(m.line),
      onStderr: (m) => void err.push(m.line),
    });
    expect(out.join('')).toBe('to out\n');
    expect(err.join('')).toBe('to err\n');
    expect(execution.logs.stderr.join('')).toBe('to err\n');
  });

  it('reports one print as one message on stdout and on stderr', async () => {
    for (const stream of ['stdout', 'stderr'] as const) {
      const seen: string[] = [];
      // Prints spaced out in time, so each reaches the kernel's reader on its own: a print that
      // is split (text, then its newline) shows up as a message without a newline.
      const execution = await sbx.runCode(`import sys, time\nfor i in range(30):\n    print("line", i, file=sys.${stream})\n    time.sleep(0.01)`, {
        [stream === 'stdout' ? 'onStdout' : 'onStderr']: (m: { line: string }) => void seen.push(m.line),
      });
      const expected = Array.from({ length: 30 }, (_, i) => `line ${i}\n`).join('');
      expect(execution.logs[stream].join('')).toBe(expected);
      expect(execution.logs[stream].filter((m) => !m.endsWith('\n'))).toEqual([]);
      expect(seen.join('')).toBe(expected);
      const single = await sbx.runCode(`import sys\nprint("one line", file=sys.${stream})`);
      expect(single.logs[stream]).toEqual(['one line\n']);
    }
    // Text without a newline still arrives, by the end of the cell.
    expect((await sbx.runCode('print("no newline", end="")')).logs.stdout).toEqual(['no newline']);
  });

  it('reports an error with name, value and traceback without throwing', async () => {
    const execution = await sbx.runCode('def boom():\n    return 1 / 0\nboom()');
    expect(execution.error).toBeDefined();
    expect(execution.error!.name).toBe('ZeroDivisionError');
    expect(execution.error!.value).toBe('division by zero');
    expect(execution.error!.traceback).toContain('boom');
    expect(execution.results).toEqual([]);
  });

  it('returns rich results (html) when an object provides them', async () => {
    const execution = await sbx.runCode('class Rich:\n    def _repr_html_(self): return "<b>rich</b>"\n    def __repr__(self): return "Rich()"\nRich()');
    expect(execution.results[0].html).toBe('<b>rich</b>');
    expect(execution.text).toBe('Rich()');
  });

  it('passes env vars for one call only', async () => {
    const withEnv = await sbx.runCode('import os\nos.environ.get("ONLY_NOW")', { envs: { ONLY_NOW: 'yes' } });
    expect(withEnv.text).toBe('yes');
    const after = await sbx.runCode('import os\nrepr(os.environ.get("ONLY_NOW"))');
    expect(after.text).toBe('None');
  });

  it('interrupts a runaway cell at its timeout and keeps the context', async () => {
    await sbx.runCode('survivor = "still here"');
    await expect(sbx.runCode('while True:\n    pass', { timeoutMs: 1500 })).rejects.toBeInstanceOf(TimeoutError);
    const next = await sbx.runCode('survivor');
    expect(next.text).toBe('still here');
  });

  it('creates, lists, restarts and removes contexts with separate state', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' });
    expect(ctx.id).toBeTruthy();
    expect(ctx.language).toBe('python');
    expect(ctx.cwd).toBe('/tmp');
    await sbx.runCode('inside = 7', { context: ctx });
    expect((await sbx.runCode('inside', { context: ctx })).text).toBe('7');
    expect((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text).toBe('/tmp');
    // The default context does not see it.
    expect((await sbx.runCode('inside')).error?.name).toBe('NameError');

    const contexts = await sbx.listCodeContexts();
    expect(contexts.map((c) => c.id)).toContain(ctx.id);

    await sbx.restartCodeContext(ctx);
    expect((await sbx.runCode('inside', { context: ctx })).error?.name).toBe('NameError');

    await sbx.removeCodeContext(ctx);
    expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id);
    await expect(sbx.runCode('1', { context: ctx })).rejects.toBeInstanceOf(NotFoundError);
  });

  it('does not show kernels among the sandbox commands', async () => {
    const procs = await sbx.commands.list();
    expect(procs.some((p) => p.args.join(' ').includes('nestbox'))).toBe(false);
  });
});
