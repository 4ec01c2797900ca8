// POST /kernels, GET /kernels/languages and POST /scripts: the guest agent's code interpreter
// (code-interpreter/bridge.py driving a real IPython kernel through jupyter_client; the python
// display hooks; the one-shot script runner), through the typed client core uses.
//
// Needs Debian's python3-ipykernel, python3-jupyter-client, python3-matplotlib and
// python3-pandas under /usr/bin/python3 (scripts/install-system-deps.sh): the agent's PATH
// starts with /usr/bin so `python3` is that one (a pyenv shim earlier on a developer's PATH
// has none of them).
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHART_MIME, DATAFRAME_MIME, type CodeEvent } from '../../../core/code-interpreter/types.js';
import { HttpGuestClient } from '../../agent-protocol/guest-client.js';
import { descendantsOf } from './kill.js';
import { startProcessTestAgent, waitUntil, type ProcessTestAgent } from './test-support.js';

const PATH = '/usr/bin:/bin';

describe('code interpreter in the guest agent', () => {
  let agent: ProcessTestAgent;
  let guest: HttpGuestClient;
  const kernels: string[] = [];

  beforeAll(async () => {
    agent = await startProcessTestAgent({ env: { PATH, LANG: 'C.UTF-8' } });
    guest = new HttpGuestClient(
      (r) => agent.client.request({ method: r.method, path: r.path, headers: r.headers, body: r.body, signal: r.signal }),
      (path) => ({ url: agent.wsUrl(path), headers: {} }),
      'test',
    );
  }, 60_000);
  afterAll(async () => {
    for (const id of kernels) await agent?.call('DELETE', `/processes/${id}`);
    await agent?.stop();
  });

  /** A python kernel for the test (killed at the end), ready when this resolves. */
  async function pythonKernel(tag = 'kernel-test', more: Record<string, unknown> = {}): Promise<string> {
    const kernel = await guest.startKernel({ language: 'python', tag, idleTimeoutSeconds: 600, ...more });
    kernels.push(kernel.processId);
    return kernel.processId;
  }

  /** A cell's events up to its end, keepalives left out (bounded in time). */
  async function run(kernel: string, code: string, env?: Record<string, string>, signal?: AbortSignal): Promise<CodeEvent[]> {
    const events: CodeEvent[] = [];
    const deadline = setTimeout(() => {
      throw new Error(`cell did not end: ${JSON.stringify(events)}`);
    }, 60_000);
    try {
      for await (const event of await guest.runCell(kernel, { code, ...(env ? { env } : {}) }, { signal })) if (event.type !== 'keepalive') events.push(event);
    } finally {
      clearTimeout(deadline);
    }
    return events;
  }

  const results = (events: CodeEvent[]) => events.filter((e): e is Extract<CodeEvent, { type: 'result' }> => e.type === 'result');
  const stdout = (events: CodeEvent[]) =>
    events
      .filter((e) => e.type === 'stdout')
      .map((e) => (e as { text: string }).text)
      .join('');

  describe('kernels', () => {
    let kernel: string;
    beforeAll(async () => {
      kernel = await pythonKernel();
    }, 120_000);

    it('keeps state across cells, counts executions, and is a tagged process', async () => {
      const first = await run(kernel, 'x = 40\nprint("hello")');
      expect(first[0]).toMatchObject({ type: 'start', executionCount: expect.any(Number) });
      expect(stdout(first)).toBe('hello\n');
      expect(first.at(-1)).toMatchObject({ type: 'end', status: 'ok' });
      const second = await run(kernel, 'x + 2');
      expect(results(second)).toEqual([{ type: 'result', main: true, data: { 'text/plain': '42' } }]);
      const count = (second.at(-1) as { executionCount: number }).executionCount;
      expect(count).toBe((first.at(-1) as { executionCount: number }).executionCount + 1);
      const info = await guest.getProcess(kernel);
      expect(info).toMatchObject({ status: 'running', tag: 'kernel-test', cmd: 'python3' });
    });

    it('runs IPython magics and !shell lines', async () => {
      const events = await run(kernel, '%env MAGIC_VAR=from-magic\n!echo "shell says $MAGIC_VAR"\nlisted = !ls /\n"bin" in listed or "usr" in listed');
      // IPython runs ! lines on a terminal of its own: their lines end in \r\n.
      expect(stdout(events)).toMatch(/^env: MAGIC_VAR=from-magic\nshell says from-magic\r?\n$/);
      expect(results(events).at(-1)?.data['text/plain']).toBe('True');
    });

    it('streams stdout while the cell runs, one event per write', async () => {
      const seen: { event: CodeEvent; at: number }[] = [];
      for await (const event of await guest.runCell(kernel, { code: 'import time, sys\nfor i in range(3):\n    print(f"line {i}", flush=True)\n    time.sleep(0.4)\nprint("err", file=sys.stderr)' })) {
        if (event.type !== 'keepalive') seen.push({ event, at: Date.now() });
      }
      const lines = seen.filter((s) => s.event.type === 'stdout');
      expect(lines.map((s) => (s.event as { text: string }).text)).toEqual(['line 0\n', 'line 1\n', 'line 2\n']);
      // The first line arrived before the cell ended (it sleeps after each line).
      expect(lines[0].at).toBeLessThan(seen.at(-1)!.at);
      expect(seen.map((s) => s.event)).toContainEqual({ type: 'stderr', text: 'err\n' });
    });

    it('reports an error with its name, value and traceback', async () => {
      const events = await run(kernel, 'def f():\n    raise ValueError("bad value")\nf()');
      const error = events.find((e) => e.type === 'error') as Extract<CodeEvent, { type: 'error' }>;
      expect(error).toMatchObject({ name: 'ValueError', value: 'bad value' });
      // IPython's own traceback, colours kept (ANSI), lines joined by "\n".
      expect(error.traceback).toContain('ValueError');
      expect(error.traceback).toContain('bad value');
      expect(error.traceback.split('\n').length).toBeGreaterThan(2);
      expect(events.at(-1)).toMatchObject({ type: 'end', status: 'error' });
    });

    it('interrupts a runaway cell whose caller gave up; the state survives', async () => {
      await run(kernel, 'kept = "still here"');
      const abort = new AbortController();
      const pending = run(kernel, 'import time\nprint("running", flush=True)\nwhile True: time.sleep(0.05)', undefined, abort.signal);
      await sleep(1500);
      abort.abort();
      const events = await pending;
      expect(events.at(-1)).toMatchObject({ type: 'end', status: 'interrupted' });
      expect(events.find((e) => e.type === 'error')).toMatchObject({ name: 'KeyboardInterrupt' });
      expect(results(await run(kernel, 'kept'))[0].data['text/plain']).toBe("'still here'");
    });

    it('interrupts once on a SIGINT to the process group: the bridge lives on', async () => {
      const pending = run(kernel, 'import time\nn = 0\ntry:\n    while True: time.sleep(0.05)\nexcept KeyboardInterrupt:\n    n += 1\n    time.sleep(1)\n    print("handled", n)');
      await sleep(1500);
      await guest.signalProcess(kernel, 'SIGINT');
      const events = await pending;
      // One KeyboardInterrupt: the handler's sleep was not interrupted by a second one.
      expect(stdout(events)).toBe('handled 1\n');
      expect((await guest.getProcess(kernel)).status).toBe('running');
    });

    it('gives several results for display(a, b, c) in one cell', async () => {
      const events = await run(kernel, 'from IPython.display import display, HTML, Markdown\ndisplay(1, HTML("<b>x</b>"), Markdown("# t"))\n"last"');
      const all = results(events);
      expect(all.map((r) => r.main)).toEqual([false, false, false, true]);
      expect(all[0].data['text/plain']).toBe('1');
      expect(all[1].data['text/html']).toBe('<b>x</b>');
      expect(all[2].data['text/markdown']).toBe('# t');
      expect(all[3].data['text/plain']).toBe("'last'");
    });

    it('gives a matplotlib line chart as a PNG and as chart data', async () => {
      const events = await run(
        kernel,
        'import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [2, 4, 8], label="growth")\nplt.plot([1, 2, 3], [1, 1, 1])\nplt.title("Rising")\nplt.xlabel("time (s)")\nplt.ylabel("size [m]")\nplt.show()',
      );
      const [figure] = results(events);
      expect(figure.main).toBe(false);
      expect(Buffer.from(figure.data['image/png'] as string, 'base64').subarray(1, 4).toString()).toBe('PNG');
      const chart = figure.data[CHART_MIME] as Record<string, any>;
      expect(chart).toMatchObject({ type: 'line', title: 'Rising', x_label: 'time (s)', y_label: 'size [m]', x_unit: 's', y_unit: 'm', x_scale: 'linear', y_scale: 'linear' });
      expect(chart.elements).toEqual([
        { label: 'growth', points: [[1, 2], [2, 4], [3, 8]] },
        { label: 'Line 1', points: [[1, 1], [2, 1], [3, 1]] },
      ]);
      expect(chart.x_ticks.length).toBe(chart.x_tick_labels.length);
    });

    it('gives bar and pie charts; an implicit figure at the end of a cell is shown too', async () => {
      const bar = await run(kernel, 'import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.bar(["apples", "pears"], [3, 5], label="fruit")\nax.set_title("Fruit")\nax.set_ylabel("count")');
      // The cell's value (set_ylabel's Text) is its main result; the figure follows as display_data.
      expect(results(bar).map((r) => [r.main, CHART_MIME in r.data])).toEqual([
        [true, false],
        [false, true],
      ]);
      const barChart = results(bar)[1].data[CHART_MIME] as Record<string, any>;
      expect(barChart).toMatchObject({ type: 'bar', title: 'Fruit', y_label: 'count' });
      expect(barChart.elements).toEqual([
        { label: 'apples', group: 'fruit', value: 3 },
        { label: 'pears', group: 'fruit', value: 5 },
      ]);
      const pie = await run(kernel, 'fig, ax = plt.subplots()\nax.pie([1, 3], labels=["a", "b"])\nax.set_title("Share")\nplt.show()');
      const pieChart = results(pie)[0].data[CHART_MIME] as Record<string, any>;
      expect(pieChart).toMatchObject({ type: 'pie', title: 'Share' });
      expect(pieChart.elements).toEqual([
        { label: 'a', angle: 90, radius: 1 },
        { label: 'b', angle: 270, radius: 1 },
      ]);
      // Boxes on their side (vert=False): the categories are still the chart's x.
      const box = await run(kernel, 'fig, ax = plt.subplots()\nax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], labels=["p", "q"], patch_artist=True, vert=False)\nax.set_xlabel("score (pts)")\nplt.show()');
      const boxChart = results(box)[0].data[CHART_MIME] as Record<string, any>;
      expect(boxChart).toMatchObject({ type: 'box_and_whisker', x_label: null, y_label: 'score (pts)', y_unit: 'pts' });
      expect(boxChart.elements).toEqual([
        { label: 'p', min: 1, first_quartile: 2.25, median: 3.5, third_quartile: 4.75, max: 5, outliers: [20] },
        { label: 'q', min: 2, first_quartile: 2.5, median: 3, third_quartile: 3.5, max: 4, outliers: [] },
      ]);
      // Several axes: one superchart; a blank figure: no chart data.
      const many = await run(kernel, 'fig, (a1, a2) = plt.subplots(1, 2)\na1.plot([1, 2], [3, 4])\na2.scatter([1, 2], [5, 6])\nfig.suptitle("Both")\nplt.show()\nplt.figure(figsize=(1, 1))\nplt.show()');
      const [both, blank] = results(many);
      expect(both.data[CHART_MIME]).toMatchObject({ type: 'superchart', title: 'Both', elements: [{ type: 'line' }, { type: 'scatter' }] });
      expect(blank.data['text/plain']).toMatch(/with 0 Axes/);
      expect(blank.data).not.toHaveProperty(CHART_MIME);
    });

    it('passes a result larger than a process stream\'s usual retention (4 MiB) whole', async () => {
      const events = await run(kernel, 'from IPython.display import display, HTML\ndisplay(HTML("x" * 6_000_000))\nprint("after")');
      expect((results(events)[0].data['text/html'] as string).length).toBe(6_000_000);
      expect(stdout(events)).toBe('after\n');
    });

    it('gives a DataFrame as HTML and as its data', async () => {
      const events = await run(kernel, 'import pandas as pd\npd.DataFrame({"name": ["a", "b"], "n": [1, 2], "when": pd.to_datetime(["2024-01-02", "2024-03-04"])})');
      const [frame] = results(events);
      expect(frame.main).toBe(true);
      expect(frame.data['text/html']).toContain('<table');
      expect(frame.data[DATAFRAME_MIME]).toEqual({ name: ['a', 'b'], n: [1, 2], when: ['2024-01-02T00:00:00', '2024-03-04T00:00:00'] });
    });

    it('sets envs for one run and restores them after it, without counting an execution', async () => {
      await run(kernel, 'import os\nos.environ["KEPT"] = "before"');
      const during = await run(kernel, 'print(os.environ["KEPT"], os.environ["ONLY_NOW"])', { KEPT: 'during', ONLY_NOW: 'yes' });
      expect(stdout(during)).toBe('during yes\n');
      const after = await run(kernel, 'print(os.environ["KEPT"], "ONLY_NOW" in os.environ)');
      expect(stdout(after)).toBe('before False\n');
      const counts = [during, after].map((events) => (events.at(-1) as { executionCount: number }).executionCount);
      expect(counts[1]).toBe(counts[0] + 1);
    });
  });

  it('reports a kernel that died as lost; the bridge exits and takes nothing with it', async () => {
    const kernel = await pythonKernel('dying');
    const events = await run(kernel, 'import os\nos._exit(3)');
    expect(events.at(-1)).toEqual({ type: 'end', status: 'lost' });
    const ended = await agent.waitForEnd(kernel, 20_000);
    expect(ended.status).toBe('exited');
    expect(ended.exitCode).toBe(1);
  });

  it('kills the kernel with its bridge (DELETE), even when the kernel started a process of its own', async () => {
    const kernel = await pythonKernel('deleted');
    const { pid } = await guest.getProcess(kernel);
    const children = descendantsOf(pid).map((p) => p.pid);
    expect(children.length).toBeGreaterThan(0);
    // A process the kernel started outlives a SIGKILL of the bridge's group (it is in the
    // kernel's session; core stops kernels with SIGTERM first for that), but does not keep the
    // bridge from being seen to end.
    const started = await run(kernel, 'import subprocess\nsubprocess.Popen(["sleep", "300"]).pid');
    const grandchild = Number(results(started)[0].data['text/plain']);
    try {
      await guest.killProcess(kernel);
      expect((await agent.waitForEnd(kernel)).status).toBe('killed');
      await waitUntil(() => children.every((child) => !isAlive(child)) || undefined, 10_000, 'the kernel to die with its bridge');
    } finally {
      process.kill(grandchild, 'SIGKILL');
    }
  });

  it('on SIGTERM shuts the kernel down with what it started, then dies of the signal', async () => {
    const kernel = await pythonKernel('terminated');
    const started = await run(kernel, 'import subprocess\nchild = subprocess.Popen(["sleep", "300"])\nchild.pid');
    const child = Number(results(started)[0].data['text/plain']);
    expect(isAlive(child)).toBe(true);
    await guest.signalProcess(kernel, 'SIGTERM');
    expect(await agent.waitForEnd(kernel, 20_000)).toMatchObject({ status: 'killed', signal: 'SIGTERM' });
    expect(isAlive(child)).toBe(false);
  });

  it('shuts an idle kernel down after idleTimeoutSeconds', async () => {
    const kernel = await pythonKernel('idle', { idleTimeoutSeconds: 1 });
    const ended = await agent.waitForEnd(kernel, 30_000);
    expect(ended).toMatchObject({ status: 'exited', exitCode: 0 });
  });

  it('refuses a language the image has no kernel for, and unknown fields, naming them', async () => {
    const ruby = await agent.call('POST', '/kernels', { language: 'ruby' });
    expect(ruby.status).toBe(400);
    expect(ruby.json.error).toMatchObject({ code: 'validation_failed', message: expect.stringMatching(/^language: /) });
    // R is a language Nestbox knows; this host has no IRkernel: a clean 400, no process.
    const before = (await guest.listProcesses({ all: true })).processes.length;
    const r = await agent.call('POST', '/kernels', { language: 'r' });
    expect(r.status, r.text).toBe(400);
    expect(r.json.error.message).toMatch(/^language: this image has no Jupyter kernel for r\b.*code-interpreter image/);
    expect((await guest.listProcesses({ all: true })).processes.length).toBe(before);
    const argv = await agent.call('POST', '/kernels', { language: 'python', argv: ['sh'] });
    expect(argv.status).toBe(400);
    expect((await agent.call('GET', '/kernels')).status).toBe(405);
  });

  it('lists the languages it has kernels for', async () => {
    const found = await guest.kernelLanguages();
    expect(found.languages).toContain('python');
    expect(found.languages).not.toContain('r');
    expect(found.missing.r).toMatch(/ir/);
  });

  describe('scripts', () => {
    it('runs python once: argv, merged output in order, exit code', async () => {
      const result = await guest.runScript({ language: 'python', code: 'import sys\nprint("args", sys.argv[1:])\nprint("to stderr", file=sys.stderr)\nprint("back")\nsys.exit(4)', argv: ['a', 'b c'] });
      expect(result).toEqual({ exitCode: 4, output: "args ['a', 'b c']\nto stderr\nback\n", charts: [], timedOut: false });
    });

    it('gives one chart with its PNG per figure plt.show() shows, and strips their lines', async () => {
      const result = await guest.runScript({
        language: 'python',
        code: 'import matplotlib.pyplot as plt\nprint("before")\nplt.plot([1, 2], [3, 4])\nplt.title("One")\nplt.show()\nplt.bar(["x"], [2])\nplt.show()\nprint("after")',
      });
      expect(result.exitCode).toBe(0);
      expect(result.output).toBe('before\nafter\n');
      expect(result.charts.map((c) => [c.type, c.title])).toEqual([
        ['line', 'One'],
        ['bar', null],
      ]);
      expect(Buffer.from(result.charts[0].png!, 'base64').subarray(1, 4).toString()).toBe('PNG');
    });

    it('kills a script at its timeout', async () => {
      const result = await guest.runScript({ language: 'python', code: 'import time\nprint("started", flush=True)\ntime.sleep(60)', timeoutMs: 1500 });
      expect(result).toMatchObject({ exitCode: null, timedOut: true, output: 'started\n' });
    });

    it('runs javascript with node, argv in process.argv.slice(2)', async () => {
      const result = await guest.runScript({ language: 'javascript', code: 'console.log(process.argv.slice(2).join(","));\nconsole.error("e");\nprocess.exitCode = 2', argv: ['x', 'y'] });
      expect(result).toEqual({ exitCode: 2, output: 'x,y\ne\n', charts: [], timedOut: false });
    });
  });
});

function isAlive(pid: number): boolean {
  try {
    // A zombie (not yet reaped by its new parent) is dead for us.
    return !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}
