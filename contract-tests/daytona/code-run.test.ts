// `process.codeRun` through the real @daytonaio/sdk 0.218 (daytona-wave2 §4.1): python,
// typescript and javascript sandboxes on core's one-shot runner, argv, env, exit codes, the
// daemon's 408 past the timeout and 400 for a bad env key; charts of plt.show() in
// artifacts.charts in Daytona's shape, from a sandbox of the built-in `code-interpreter` image
// (the `default` image has no data stack). SDK 0.129 runs codeRun through `/process/execute`
// with its own client-side wrapper: checked on the same image.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaError, DaytonaTimeoutError, type Sandbox } from '@daytonaio/sdk';
import { Daytona as LegacyDaytona } from 'daytona-sdk-legacy';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

/** The PNG signature, base64 (`\x89PNG\r\n\x1a\n`). */
const PNG_BASE64_PREFIX = 'iVBORw0KGgo';

let env: DaytonaTestEnv;
let py: Sandbox;
let charts: Sandbox;

beforeAll(async () => {
  env = await startDaytonaEnv();
  py = await env.daytona.create({ language: 'python', networkBlockAll: true, labels: { suite: 'code-run' } }, { timeout: 0 });
  charts = await env.daytona.create({ snapshot: 'code-interpreter', language: 'python', networkBlockAll: true, labels: { suite: 'code-run-charts' } }, { timeout: 0 });
});

afterAll(async () => {
  await py?.delete().catch(() => undefined);
  await charts?.delete().catch(() => undefined);
  await env?.server.close();
});

describe('codeRun (python) on the default image', () => {
  it('passes argv and env, merges stderr into the result and gives the exit code', async () => {
    const r = await py.process.codeRun('import os, sys\nprint("py", sys.argv[1:], os.environ["CODE_VAR"])\nprint("to stderr", file=sys.stderr)', { argv: ['a', 'b c'], env: { CODE_VAR: 'set' } });
    expect(r.exitCode).toBe(0);
    expect(r.result).toBe("py ['a', 'b c'] set\nto stderr\n");
    expect(r.artifacts?.stdout).toBe(r.result);
    expect(r.artifacts?.charts).toEqual([]);
    expect((await py.process.codeRun('raise SystemExit(4)')).exitCode).toBe(4);
    const failed = await py.process.codeRun('1 / 0');
    expect(failed.exitCode).toBe(1);
    expect(failed.result).toMatch(/ZeroDivisionError: division by zero/);
  });

  it('runs as daytona in its home', async () => {
    const r = await py.process.codeRun('import getpass, os; print(getpass.getuser(), os.getcwd())');
    expect(r.result.trim()).toBe('daytona /home/daytona');
  });

  it('answers a run past its timeout with 408 (DaytonaTimeoutError)', async () => {
    const err = await py.process.codeRun('import time; time.sleep(60)', undefined, 1).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaTimeoutError);
    expect((err as DaytonaError).statusCode).toBe(408);
  });

  it('refuses an env key no process can hold with 400 naming envs', async () => {
    const err = await py.process.codeRun('print(1)', { env: { 'BAD-KEY': 'x' } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaError);
    expect((err as DaytonaError).statusCode).toBe(400);
    expect((err as Error).message).toMatch(/envs: "BAD-KEY" is not a valid environment variable name/);
  });
});

describe('codeRun (typescript, javascript)', () => {
  it('runs typescript with argv and env', async () => {
    const ts = await env.daytona.create({ language: 'typescript', networkBlockAll: true }, { timeout: 0 });
    try {
      const r = await ts.process.codeRun('const n: number = 6 * 7;\nconsole.log(n, process.argv.slice(2).join(","), process.env.TS_VAR);\nconsole.error("oops");', { argv: ['x', 'y'], env: { TS_VAR: 'ts' } });
      expect(r.exitCode).toBe(0);
      expect(r.result).toBe('42 x,y ts\noops\n');
      expect((await ts.process.codeRun('process.exit(5)')).exitCode).toBe(5);
    } finally {
      await ts.delete();
    }
  });

  it('runs javascript', async () => {
    const js = await env.daytona.create({ language: 'javascript', networkBlockAll: true }, { timeout: 0 });
    try {
      const r = await js.process.codeRun('console.log([1, 2, 3].map((x) => x * 2).join(" "))');
      expect(r).toMatchObject({ exitCode: 0, result: '2 4 6\n' });
      const thrown = await js.process.codeRun('throw new Error("boom")');
      expect(thrown.exitCode).not.toBe(0);
      expect(thrown.result).toMatch(/Error: boom/);
    } finally {
      await js.delete();
    }
  });
});

describe('codeRun charts (code-interpreter image)', () => {
  it('returns a line chart with its title, labels, points and PNG', async () => {
    const r = await charts.process.codeRun(
      [
        'import matplotlib.pyplot as plt',
        'plt.figure()',
        'plt.plot([1, 2, 3], [1, 4, 9], label="squares")',
        'plt.title("Growth")',
        'plt.xlabel("x")',
        'plt.ylabel("y")',
        'plt.show()',
        'print("done")',
      ].join('\n'),
    );
    expect(r.exitCode).toBe(0);
    // The chart travels in artifacts, never as a marker line in the output.
    expect(r.result).toBe('done\n');
    expect(r.artifacts?.charts).toHaveLength(1);
    const chart = r.artifacts!.charts![0] as unknown as Record<string, unknown>;
    expect(chart).toMatchObject({ type: 'line', title: 'Growth', x_label: 'x', y_label: 'y', x_scale: 'linear', y_scale: 'linear' });
    expect(chart.png).toMatch(new RegExp(`^${PNG_BASE64_PREFIX}`));
    expect(chart.elements).toEqual([{ label: 'squares', points: [[1, 1], [2, 4], [3, 9]] }]);
    expect((chart.x_ticks as unknown[]).every((t) => typeof t === 'number')).toBe(true);
    expect(chart).not.toHaveProperty('x_unit');
  });

  it('returns a bar chart whose values are strings, as Daytona types them', async () => {
    const r = await charts.process.codeRun(
      ['import matplotlib.pyplot as plt', 'plt.bar(["a", "b", "c"], [3, 5, 2], label="n")', 'plt.title("Bars")', 'plt.show()'].join('\n'),
    );
    expect(r.exitCode).toBe(0);
    const chart = r.artifacts!.charts![0] as unknown as Record<string, unknown>;
    expect(chart).toMatchObject({ type: 'bar', title: 'Bars' });
    expect(chart.png).toMatch(new RegExp(`^${PNG_BASE64_PREFIX}`));
    const elements = chart.elements as { label: string; value: unknown; group: string }[];
    expect(elements.map((e) => [e.label, e.value])).toEqual([['a', '3'], ['b', '5'], ['c', '2']]);
    for (const e of elements) expect(typeof e.group).toBe('string');
  });

  it('returns one chart per shown figure; several axes make a composite_chart', async () => {
    const r = await charts.process.codeRun(
      [
        'import matplotlib.pyplot as plt',
        'fig, (a, b) = plt.subplots(1, 2)',
        'a.plot([0, 1], [1, 0])',
        'b.scatter([1, 2], [3, 4])',
        'fig.suptitle("Both")',
        'plt.show()',
        'plt.figure()',
        'plt.pie([1, 3], labels=["one", "three"])',
        'plt.show()',
      ].join('\n'),
    );
    expect(r.exitCode).toBe(0);
    const [composite, pie] = r.artifacts!.charts! as unknown as Record<string, unknown>[];
    expect(composite).toMatchObject({ type: 'composite_chart', title: 'Both' });
    expect(composite.png).toMatch(new RegExp(`^${PNG_BASE64_PREFIX}`));
    const subs = composite.elements as Record<string, unknown>[];
    expect(subs.map((s) => s.type)).toEqual(['line', 'scatter']);
    for (const s of subs) expect(s).not.toHaveProperty('png');
    expect(pie).toMatchObject({ type: 'pie' });
    expect((pie.elements as { label: string }[]).map((e) => e.label)).toEqual(['one', 'three']);
  });

  // SDK 0.129 runs codeRun through `/process/execute` with its own client-side wrapper; that
  // wrapper's chart extraction calls `Axis.get_converter()` (matplotlib 3.10+), which Debian's
  // matplotlib 3.6 in the image lacks, so plt.show() under 0.129 fails in the SDK's own code
  // (COVERAGE.md). The rest of the data stack serves it.
  it('SDK 0.129 (its own wrapper over /process/execute) runs code using the image\'s data stack', async () => {
    const legacy = new LegacyDaytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey, target: 'local' });
    const old = await legacy.get(charts.id);
    const r = await old.process.codeRun(['import sys, numpy, pandas', 'frame = pandas.DataFrame({"n": numpy.arange(4)})', 'print("legacy", int(frame.n.sum()), sys.argv[1:])'].join('\n'), { argv: ['a'] });
    expect(r.exitCode, r.result).toBe(0);
    expect(r.result).toBe("legacy 6 ['a']\n");
    expect(r.artifacts?.charts ?? []).toEqual([]);
  });
});
