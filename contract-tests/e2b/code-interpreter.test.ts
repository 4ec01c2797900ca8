// runCode and code contexts through the real `@e2b/code-interpreter` SDK (port-49999 traffic,
// e2b.md (e), e2b-wave2.md §3) on the `code-interpreter` template: core's Jupyter kernels
// (core.codeInterpreter) behind compat/e2b/code-interpreter's translation.
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { Sandbox, type OutputMessage, type Result } from '@e2b/code-interpreter';
import { NotFoundError, TimeoutError } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

// A hang guard, not a timing claim: each kernel start is seconds of CPU, and integration files
// run two at a time on a 2-core machine, so a test that starts several kernels gets more room.
vi.setConfig({ testTimeout: 180_000 });

let t: E2bTestServer;
let sbx: Sandbox;

beforeAll(async () => {
  t = await startE2bTestServer();
  // The code-interpreter SDK's default template is code-interpreter-v1; no internet.
  sbx = await Sandbox.create({ ...t.opts, allowInternetAccess: false, timeoutMs: 600_000 });
}, 300_000);

afterAll(async () => {
  await sbx?.kill().catch(() => undefined);
  await t?.close();
});

const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47]);

describe('e2b code interpreter: python results', () => {
  it('keeps state across calls in the default context and returns the last expression', async () => {
    const first = await sbx.runCode('x = 41\nprint("set x")\nx + 1');
    expect(first.error).toBeUndefined();
    expect(first.logs.stdout.join('')).toBe('set x\n');
    expect(first.text).toBe('42');
    expect(first.results[0].isMainResult).toBe(true);
    expect(first.executionCount).toBeGreaterThan(0);

    const second = await sbx.runCode('x * 2');
    expect(second.text).toBe('82');
    // IPython's execution count (number_of_executions) goes up by one per cell.
    expect(second.executionCount).toBe(first.executionCount! + 1);
  });

  it('shows a string result without its quotes, as upstream', async () => {
    expect((await sbx.runCode('"a string"')).text).toBe('a string');
    expect((await sbx.runCode("'single'")).text).toBe('single');
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

  it('streams stdout while the cell still runs', async () => {
    // The cell prints, then waits for a file only this test creates once it has seen the print:
    // the cell can only end if its first line reached onStdout before the end.
    const go = `/tmp/go-${Date.now()}`;
    const seen: OutputMessage[] = [];
    let wrote: Promise<unknown> | undefined;
    const execution = await sbx.runCode(
      `import os, time\nprint("waiting", flush=True)\nfor _ in range(1200):\n    if os.path.exists(${JSON.stringify(go)}):\n        break\n    time.sleep(0.05)\nprint("found" if os.path.exists(${JSON.stringify(go)}) else "gave up")`,
      {
        onStdout: (m) => {
          seen.push(m);
          if (m.line.includes('waiting')) wrote = sbx.files.write(go, 'go');
        },
        timeoutMs: 120_000,
      },
    );
    await wrote;
    expect(seen.map((m) => m.line)).toEqual(['waiting\n', 'found\n']);
    expect(execution.logs.stdout).toEqual(['waiting\n', 'found\n']);
  });

  it('reports one print as one message on stdout and on stderr', async () => {
    for (const stream of ['stdout', 'stderr'] as const) {
      const execution = await sbx.runCode(`import sys, time\nfor i in range(20):\n    print("line", i, file=sys.${stream})\n    time.sleep(0.01)`);
      const expected = Array.from({ length: 20 }, (_, i) => `line ${i}\n`).join('');
      expect(execution.logs[stream].join('')).toBe(expected);
      expect(execution.logs[stream].filter((m) => !m.endsWith('\n'))).toEqual([]);
    }
    expect((await sbx.runCode('print("no newline", end="")')).logs.stdout).toEqual(['no newline']);
  });

  it('reports an exception with name, value and traceback without throwing', async () => {
    const errors: unknown[] = [];
    const execution = await sbx.runCode('def boom():\n    return 1 / 0\nboom()', { onError: (e) => void errors.push(e) });
    expect(execution.error).toBeDefined();
    expect(execution.error!.name).toBe('ZeroDivisionError');
    expect(execution.error!.value).toBe('division by zero');
    expect(execution.error!.traceback).toContain('boom');
    expect(execution.error!.traceback).toContain('ZeroDivisionError');
    expect(execution.results).toEqual([]);
    expect(errors).toHaveLength(1);
  });

  it('returns rich results (html) when an object provides them', async () => {
    const execution = await sbx.runCode('class Rich:\n    def _repr_html_(self): return "<b>rich</b>"\n    def __repr__(self): return "Rich()"\nRich()');
    expect(execution.results[0].html).toBe('<b>rich</b>');
    expect(execution.text).toBe('Rich()');
    expect(execution.results[0].formats()).toContain('html');
  });

  it('shows every display() of a cell as its own result, then the main result', async () => {
    const seen: Result[] = [];
    const execution = await sbx.runCode(
      'from IPython.display import display, HTML, Markdown\ndisplay(HTML("<i>one</i>"))\ndisplay(Markdown("**two**"))\ndisplay({"three": 3}, raw=False)\n"main"',
      { onResult: (r) => void seen.push(r) },
    );
    expect(execution.error).toBeUndefined();
    expect(execution.results).toHaveLength(4);
    expect(execution.results.map((r) => r.isMainResult)).toEqual([false, false, false, true]);
    expect(execution.results[0].html).toBe('<i>one</i>');
    expect(execution.results[1].markdown).toBe('**two**');
    expect(execution.results[2].text).toBe("{'three': 3}");
    expect(execution.text).toBe('main');
    expect(seen).toHaveLength(4);
  });

  it('gives a DataFrame as HTML and as its data', async () => {
    const execution = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})');
    expect(execution.error).toBeUndefined();
    const result = execution.results[0];
    expect(result.isMainResult).toBe(true);
    expect(result.html).toContain('<table');
    expect(result.html).toContain('<td>y</td>');
    expect(result.data).toEqual({ a: [1, 2, 3], b: ['x', 'y', 'z'] });
    expect(result.text).toContain('a  b');
  });

  it('passes env vars for one call only', async () => {
    const withEnv = await sbx.runCode('import os\nos.environ.get("ONLY_NOW")', { envs: { ONLY_NOW: 'yes' } });
    expect(withEnv.text).toBe('yes');
    const after = await sbx.runCode('import os\nrepr(os.environ.get("ONLY_NOW"))');
    expect(after.text).toBe('None');
  });

  it('runs as root in /home/user, as upstream\'s kernels (its Jupyter server runs with sudo)', async () => {
    const execution = await sbx.runCode('import os, getpass\nprint(getpass.getuser())\nprint(os.getcwd())');
    expect(execution.logs.stdout.join('')).toBe('root\n/home/user\n');
  });

  it('reports a kernel that died during a cell, and starts a fresh one for the next', async () => {
    const ctx = await sbx.createCodeContext();
    await sbx.runCode('before = 1', { context: ctx });
    const died = await sbx.runCode('import os\nos._exit(1)', { context: ctx });
    expect(died.error?.name).toBe('UnexpectedEndOfExecution');
    const next = await sbx.runCode('before', { context: ctx });
    expect(next.error?.name).toBe('NameError');
    expect((await sbx.runCode('1 + 1', { context: ctx })).text).toBe('2');
    await sbx.removeCodeContext(ctx);
  });

  it('interrupts a runaway cell at its timeout and keeps the context', async () => {
    await sbx.runCode('survivor = "still here"');
    await expect(sbx.runCode('while True:\n    pass', { timeoutMs: 3_000 })).rejects.toBeInstanceOf(TimeoutError);
    const next = await sbx.runCode('survivor', { timeoutMs: 60_000 });
    expect(next.error).toBeUndefined();
    expect(next.text).toBe('still here');
  });
});

describe('e2b code interpreter: charts', () => {
  it('gives a matplotlib line chart as a PNG and as chart data', async () => {
    const execution = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.plot([0, 1, 2, 3], [0, 1, 4, 9], label="squares")
plt.plot([0, 1, 2, 3], [0, 1, 2, 3], label="identity")
plt.title("Growth")
plt.xlabel("time (s)")
plt.ylabel("value [m]")
plt.show()
`);
    expect(execution.error).toBeUndefined();
    expect(execution.results).toHaveLength(1);
    const [figure] = execution.results;
    expect(figure.isMainResult).toBe(false);
    expect(Buffer.from(figure.png!, 'base64').subarray(0, 4).equals(PNG_MAGIC)).toBe(true);
    expect(figure.formats()).toContain('png');
    const chart = figure.chart as any;
    expect(chart.type).toBe('line');
    expect(chart.title).toBe('Growth');
    expect(chart.x_label).toBe('time (s)');
    expect(chart.y_label).toBe('value [m]');
    expect(chart.x_unit).toBe('s');
    expect(chart.y_unit).toBe('m');
    expect(chart.x_scale).toBe('linear');
    expect(chart.elements.map((e: any) => e.label)).toEqual(['squares', 'identity']);
    expect(chart.elements[0].points).toEqual([[0, 0], [1, 1], [2, 4], [3, 9]]);
    expect(chart.x_ticks.every((x: unknown) => typeof x === 'number')).toBe(true);
    expect(chart.x_tick_labels.every((x: unknown) => typeof x === 'string')).toBe(true);
  });

  it('gives a bar chart', async () => {
    const execution = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.bar(["apples", "pears", "plums"], [3, 5, 2], label="fruit")
plt.title("Basket")
plt.xlabel("kind")
plt.ylabel("count")
plt.show()
`);
    const chart = execution.results[0].chart as any;
    expect(chart.type).toBe('bar');
    expect(chart.title).toBe('Basket');
    expect(chart.x_label).toBe('kind');
    expect(chart.y_label).toBe('count');
    expect(chart.elements.map((e: any) => e.label)).toEqual(['apples', 'pears', 'plums']);
    expect(chart.elements.map((e: any) => e.value)).toEqual([3, 5, 2]);
    expect(chart.elements.map((e: any) => e.group)).toEqual(['fruit', 'fruit', 'fruit']);
  });

  it('gives a pie chart', async () => {
    const execution = await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.pie([75, 25], labels=["yes", "no"])
plt.title("Answers")
plt.show()
`);
    const chart = execution.results[0].chart as any;
    expect(chart.type).toBe('pie');
    expect(chart.title).toBe('Answers');
    expect(chart.elements.map((e: any) => e.label)).toEqual(['yes', 'no']);
    expect(chart.elements.map((e: any) => Math.round(e.angle))).toEqual([270, 90]);
    expect(chart.elements.every((e: any) => e.radius === 1)).toBe(true);
  });
});

describe('e2b code interpreter: languages', () => {
  it('runs JavaScript with state between runs and its results', async () => {
    const out = await sbx.runCode('console.log("hello from js")', { language: 'js' });
    expect(out.error).toBeUndefined();
    expect(out.logs.stdout).toEqual(['hello from js\n']);
    await sbx.runCode('const kept = 20', { language: 'javascript' });
    expect((await sbx.runCode('kept + 22', { language: 'javascript' })).text).toBe('42');
    expect((await sbx.runCode('process.cwd()', { language: 'javascript' })).text).toBe('/home/user');
    const failed = await sbx.runCode('throw new TypeError("bad js")', { language: 'javascript' });
    expect(failed.error?.name).toBe('TypeError');
    expect(failed.error?.value).toContain('bad js');
  });

  it('runs TypeScript, in a context of its own', async () => {
    const ctx = await sbx.createCodeContext({ language: 'typescript' });
    expect(ctx.language).toBe('typescript');
    const execution = await sbx.runCode('function subtract(x: number, y: number): number {\n  return x - y;\n}\nsubtract(1, 2)', { context: ctx });
    expect(execution.error).toBeUndefined();
    expect(execution.text).toBe('-1');
    expect((await sbx.runCode('const m: string = "typed"; console.log(m)', { language: 'ts' })).logs.stdout).toEqual(['typed\n']);
    await sbx.removeCodeContext(ctx);
  });

  it('runs bash in a bash context, with envs per run', async () => {
    const ctx = await sbx.createCodeContext({ language: 'bash' });
    expect(ctx.language).toBe('bash');
    await sbx.runCode('KEPT=bash-state', { context: ctx });
    const execution = await sbx.runCode('echo "$KEPT $(whoami) $PWD"\necho "per run: $PER_RUN"', { context: ctx, envs: { PER_RUN: 'yes' } });
    expect(execution.error).toBeUndefined();
    expect(execution.logs.stdout.join('')).toBe('bash-state root /home/user\nper run: yes\n');
    expect((await sbx.runCode('echo "${PER_RUN:-unset}"', { context: ctx })).logs.stdout.join('')).toBe('unset\n');
  });

  it('runs R', async () => {
    // IRkernel shows a value as display data (not an execute_result): results[0], as upstream's
    // own R tests read it, with its HTML, Markdown and LaTeX forms.
    const execution = await sbx.runCode('x <- c(1, 2, 3)\nsum(x)', { language: 'r' });
    expect(execution.error).toBeUndefined();
    expect(execution.results[0].text?.trim()).toBe('[1] 6');
    expect(execution.results[0].html).toBe('6');
    expect((await sbx.runCode('Sys.getenv("R_RUN")', { language: 'r', envs: { R_RUN: 'set' } })).results[0].text?.trim()).toBe('[1] "set"');
    expect((await sbx.runCode('stop("bad r")', { language: 'r' })).error?.value).toContain('bad r');
  });
});

describe('e2b code interpreter: contexts', () => {
  it('lists the default python and javascript contexts of a fresh sandbox', async () => {
    const fresh = await Sandbox.create({ ...t.opts, allowInternetAccess: false });
    try {
      const contexts = await fresh.listCodeContexts();
      expect(contexts.map((c) => c.language)).toEqual(['python', 'javascript']);
      expect(contexts.every((c) => c.cwd === '/home/user')).toBe(true);
      // Listed before they ran; the first run by language starts the one listed.
      const js = contexts.find((c) => c.language === 'javascript')!;
      expect((await fresh.runCode('1 + 1', { context: js })).text).toBe('2');
      expect((await fresh.runCode('const y = 5; y', { language: 'javascript' })).text).toBe('5');
      expect((await fresh.runCode('y', { context: js })).text).toBe('5');
      expect((await fresh.listCodeContexts()).map((c) => c.id)).toEqual(contexts.map((c) => c.id));
    } finally {
      await fresh.kill();
    }
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
    // The newest context is listed last (upstream's own tests read it there).
    expect(contexts.at(-1)).toEqual({ id: ctx.id, language: 'python', cwd: '/tmp' });

    await sbx.restartCodeContext(ctx);
    const restarted = await sbx.runCode('inside', { context: ctx });
    expect(restarted.error?.name).toBe('NameError');
    expect(restarted.error?.value).toBe("name 'inside' is not defined");

    await sbx.removeCodeContext(ctx);
    expect((await sbx.listCodeContexts()).map((c) => c.id)).not.toContain(ctx.id);
    await expect(sbx.runCode('1', { context: ctx })).rejects.toBeInstanceOf(NotFoundError);
    await expect(sbx.removeCodeContext(ctx)).rejects.toBeInstanceOf(NotFoundError);
    await expect(sbx.restartCodeContext(ctx.id)).rejects.toBeInstanceOf(NotFoundError);
  });

  it('keeps two contexts of one language apart', async () => {
    const a = await sbx.createCodeContext();
    const b = await sbx.createCodeContext();
    expect(a.id).not.toBe(b.id);
    await sbx.runCode('who = "a"', { context: a });
    await sbx.runCode('who = "b"', { context: b });
    expect((await sbx.runCode('who', { context: a })).text).toBe('a');
    expect((await sbx.runCode('who', { context: b })).text).toBe('b');
    await Promise.all([sbx.removeCodeContext(a), sbx.removeCodeContext(b)]);
  });

  it('does not show kernels among the sandbox commands', async () => {
    const procs = await sbx.commands.list();
    expect(procs.filter((p) => /kernel|jupyter|ipykernel|nestbox/i.test(`${p.cmd} ${p.args.join(' ')}`))).toEqual([]);
  });
});
