// The scenarios of `@e2b/code-interpreter`'s own test suite (repository e2b-dev/code-interpreter,
// js/tests/**, newest versions), run against Nestbox through the real SDK: each case keeps the
// upstream cell and its expectations, under upstream's file and test name. Adapted to this
// harness: the SDK is pointed at the test server, sandboxes have no internet, and one sandbox
// serves the cases of a file unless a case needs a fresh one (upstream gives every case its own).
//
// Upstream scenarios not here, and why (the count is in contract-tests/e2b/COVERAGE.md):
// - languages/{js,deno} "js import": `import isOdd from "npm:is-odd"` downloads from npm (no
//   internet in tests);
// - cwd "cwd java", env_vars/java (3): no Java kernel in the code-interpreter image;
// - supervision (2): kill upstream's `jupyter-server` / `uvicorn` processes and wait for their
//   process manager; Nestbox has neither (the kernels are the guest agent's, see kernel-lost cases
//   in code-interpreter.test.ts);
// - runtimes/{bun,deno} (2): run the SDK under Bun and Deno, not installed on the test machine;
// - utils (9): unit tests of the SDK's internal `readLines` (src/utils), which the published
//   package does not export; no server is involved;
// - sandboxUrl "jupyterUrl strips trailing slashes from the sandboxUrl option": a behaviour of
//   SDKs after 2.8.0 (the one installed keeps the slash); no server is involved.
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { Sandbox, type OutputMessage, type Result, type SandboxOpts } from '@e2b/code-interpreter';
import { TimeoutError } from 'e2b';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

// A hang guard, not a timing claim: each kernel start is seconds of CPU, and integration files
// run two at a time on a 2-core machine, so a test that starts several kernels gets more room.
vi.setConfig({ testTimeout: 180_000 });

let t: E2bTestServer;
const made: Sandbox[] = [];

beforeAll(async () => {
  t = await startE2bTestServer();
}, 120_000);

afterAll(async () => {
  await Promise.all(made.map((s) => s.kill().catch(() => undefined)));
  await t?.close();
});

/** A sandbox of the SDK's default template (code-interpreter-v1), without internet. */
async function create(opts: SandboxOpts = {}): Promise<Sandbox> {
  const sandbox = await Sandbox.create({ ...t.opts, allowInternetAccess: false, timeoutMs: 600_000, ...opts });
  made.push(sandbox);
  return sandbox;
}

/** One sandbox for the cases of a describe block, made at its first use. */
function shared(): () => Promise<Sandbox> {
  let sandbox: Promise<Sandbox> | undefined;
  return () => (sandbox ??= create());
}

const CASE_MS = 180_000;

describe('basic.test.ts', () => {
  const sandbox = shared();
  it('basic', async () => {
    expect((await (await sandbox()).runCode('x =1; x')).text).toEqual('1');
  }, CASE_MS);
  it('secure access', async () => {
    const s = await create({ network: { allowPublicTraffic: false } });
    expect((await s.runCode('x =1; x')).text).toEqual('1');
  }, CASE_MS);
});

describe('bash.test.ts', () => {
  it('bash', async () => {
    const result = await (await create()).runCode('!pwd');
    expect(result.logs.stdout.join().trim()).toEqual('/home/user');
  }, CASE_MS);
});

describe('callbacks.test.ts', () => {
  const sandbox = shared();
  it('callback results', async () => {
    const results: Result[] = [];
    const result = await (await sandbox()).runCode('x =1; x', { onResult: (r) => void results.push(r) });
    expect(results.length).toBe(1);
    expect(result.results[0].text).toBe('1');
  }, CASE_MS);
  it('callback error', async () => {
    const errors: unknown[] = [];
    const result = await (await sandbox()).runCode('xyz', { onError: (e) => void errors.push(e) });
    expect(errors.length).toBe(1);
    expect(result.error!.name).toBe('NameError');
  }, CASE_MS);
  it('callback stdout', async () => {
    const stdout: OutputMessage[] = [];
    const result = await (await sandbox()).runCode('print("hello")', { onStdout: (o) => void stdout.push(o) });
    expect(stdout.length).toBe(1);
    expect(result.logs.stdout).toEqual(['hello\n']);
  }, CASE_MS);
  it('callback stderr', async () => {
    const stderr: OutputMessage[] = [];
    const result = await (await sandbox()).runCode('import sys;print("This is an error message", file=sys.stderr)', { onStderr: (e) => void stderr.push(e) });
    expect(stderr.length).toBe(1);
    expect(result.logs.stderr).toEqual(['This is an error message\n']);
  }, CASE_MS);
});

describe('charts/*.test.ts', () => {
  const sandbox = shared();
  const chartOf = async (code: string) => (await (await sandbox()).runCode(code)).results[0]?.chart as any;

  it('line', async () => {
    const chart = await chartOf(`
import numpy as np
import matplotlib.pyplot as plt
import datetime

dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
x = np.linspace(0, 2*np.pi, 100)
y_sin = np.sin(x)
y_cos = np.cos(x)

plt.figure(figsize=(10, 6))
plt.plot(dates, y_sin, label='sin(x)')
plt.plot(dates, y_cos, label='cos(x)')
plt.xlabel("Time (s)")
plt.ylabel("Amplitude (Hz)")
plt.title('Plot of sin(x) and cos(x)')
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('line');
    expect(chart.title).toBe('Plot of sin(x) and cos(x)');
    expect(chart.x_label).toBe('Time (s)');
    expect(chart.y_label).toBe('Amplitude (Hz)');
    expect(chart.x_scale).toBe('datetime');
    expect(chart.y_scale).toBe('linear');
    expect(chart.x_unit).toBe('s');
    expect(chart.y_unit).toBe('Hz');
    expect(chart.x_ticks.every((tick: unknown) => typeof tick === 'string')).toBe(true);
    expect(new Date(chart.x_ticks[0])).toBeInstanceOf(Date);
    expect(chart.y_ticks.every((tick: unknown) => typeof tick === 'number')).toBe(true);
    expect(chart.y_tick_labels.every((label: unknown) => typeof label === 'string')).toBe(true);
    expect(chart.x_tick_labels.every((label: unknown) => typeof label === 'string')).toBe(true);
    const lines = chart.elements;
    expect(lines.length).toBe(2);
    const [firstLine, secondLine] = lines;
    expect(firstLine.label).toBe('sin(x)');
    expect(firstLine.points.length).toBe(100);
    expect(firstLine.points.every((p: unknown[]) => typeof p[0] === 'string' && typeof p[1] === 'number')).toBe(true);
    expect(new Date(firstLine.points[0][0])).toEqual(new Date('2023-09-01T00:00:00.000Z'));
    expect(secondLine.label).toBe('cos(x)');
    expect(secondLine.points.length).toBe(100);
    expect(secondLine.points.every((p: unknown[]) => typeof p[0] === 'string' && typeof p[1] === 'number')).toBe(true);
  }, CASE_MS);

  it('pie', async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np

categories = ["No", "No, in blue"]
sizes = [90, 10]
fig, ax = plt.subplots(figsize=(8, 8))
plt.xlabel("x")
plt.ylabel("y")
ax.pie(sizes, labels=categories, autopct='%1.1f%%', startangle=90, colors=plt.cm.Pastel1.colors[:len(categories)])
ax.axis('equal')
plt.title('Will I wake up early tomorrow?')
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('pie');
    expect(chart.title).toBe('Will I wake up early tomorrow?');
    expect(chart.elements.length).toBe(2);
    const [firstData, secondData] = chart.elements;
    expect(firstData.label).toBe('No');
    expect(firstData.angle).toBe(324);
    expect(firstData.radius).toBe(1);
    expect(secondData.label).toBe('No, in blue');
    expect(secondData.angle).toBe(36);
    expect(secondData.radius).toBe(1);
  }, CASE_MS);

  it('bar', async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt

authors = ['Author A', 'Author B', 'Author C', 'Author D']
sales = [100, 200, 300, 400]
plt.figure(figsize=(10, 6))
plt.bar(authors, sales, label='Books Sold', color='blue')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.tight_layout()
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('bar');
    expect(chart.title).toBe('Book Sales by Authors');
    expect(chart.x_label).toBe('Authors');
    expect(chart.y_label).toBe('Number of Books Sold');
    expect(chart.x_unit).toBeNull();
    expect(chart.y_unit).toBeNull();
    const bars = chart.elements;
    expect(bars.length).toBe(4);
    expect(bars.map((bar: any) => bar.value)).toEqual([100, 200, 300, 400]);
    expect(bars.map((bar: any) => bar.group)).toEqual(['Books Sold', 'Books Sold', 'Books Sold', 'Books Sold']);
    expect(bars.map((bar: any) => bar.label)).toEqual(['Author A', 'Author B', 'Author C', 'Author D']);
  }, CASE_MS);

  it('box-and-whisker', async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np

data = {
    'Class A': [85, 90, 78, 92, 88],
    'Class B': [95, 89, 76, 91, 84, 87],
    'Class C': [75, 82, 88, 79, 86]
}
fig, ax = plt.subplots(figsize=(10, 6))
ax.set_title('Exam Scores Distribution')
ax.set_xlabel('Class')
ax.set_ylabel('Score')
ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)
ax.legend()
plt.tight_layout()
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('box_and_whisker');
    expect(chart.title).toBe('Exam Scores Distribution');
    expect(chart.x_label).toBe('Class');
    expect(chart.y_label).toBe('Score');
    expect(chart.x_unit).toBeNull();
    expect(chart.y_unit).toBeNull();
    const bars = chart.elements;
    expect(bars.length).toBe(3);
    expect(bars.map((bar: any) => bar.label)).toEqual(['Class A', 'Class B', 'Class C']);
    expect(bars.map((bar: any) => bar.outliers)).toEqual([[], [76], []]);
    expect(bars.map((bar: any) => bar.min)).toEqual([78, 84, 75]);
    expect(bars.map((bar: any) => bar.first_quartile)).toEqual([85, 84.75, 79]);
    expect(bars.map((bar: any) => bar.median)).toEqual([88, 88, 82]);
    expect(bars.map((bar: any) => bar.third_quartile)).toEqual([90, 90.5, 86]);
    expect(bars.map((bar: any) => bar.max)).toEqual([92, 95, 88]);
  }, CASE_MS);

  it('log', async () => {
    const chart = await chartOf(`
import numpy as np
import matplotlib.pyplot as plt

x = np.linspace(0, 100, 100)
y = np.exp(x)
plt.figure(figsize=(10, 6))
plt.plot(x, y, label='y = e^x')
plt.yscale('log')
plt.xlabel('X-axis')
plt.ylabel('Y-axis (log scale)')
plt.title('Chart with Log Scale on Y-axis')
plt.legend()
plt.grid(True)
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('line');
    expect(chart.title).toBe('Chart with Log Scale on Y-axis');
    expect(chart.x_label).toBe('X-axis');
    expect(chart.y_label).toBe('Y-axis (log scale)');
    expect(chart.x_unit).toBeNull();
    expect(chart.y_unit).toBe('log scale');
    expect(chart.x_scale).toBe('linear');
    expect(chart.y_scale).toBe('log');
    expect(chart.x_ticks.every((x: unknown) => typeof x === 'number')).toBe(true);
    expect(chart.y_ticks.every((y: unknown) => typeof y === 'number')).toBe(true);
    expect(chart.x_tick_labels.every((x: unknown) => typeof x === 'string')).toBe(true);
    expect(chart.y_tick_labels.every((y: unknown) => typeof y === 'string')).toBe(true);
    const lines = chart.elements;
    expect(lines.length).toBe(1);
    expect(lines[0].label).toBe('y = e^x');
    expect(lines[0].points.length).toBe(100);
    expect(lines[0].points.every(([x, y]: unknown[]) => typeof x === 'number' && typeof y === 'number')).toBe(true);
  }, CASE_MS);

  it('scatter', async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np

N = 5
x1 = np.random.rand(N)
y1 = np.random.rand(N)
x2 = np.random.rand(2*N)
y2 = np.random.rand(2*N)
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(x1, y1, c='blue', label='Dataset 1')
plt.scatter(x2, y2, c='red', label='Dataset 2')
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('scatter');
    expect(chart.title).toBeNull();
    expect(chart.x_label).toBe('A');
    expect(chart.y_label).toBe('B');
    expect(chart.x_ticks.every((tick: unknown) => typeof tick === 'number')).toBe(true);
    expect(chart.y_ticks.every((tick: unknown) => typeof tick === 'number')).toBe(true);
    expect(chart.x_tick_labels.every((label: unknown) => typeof label === 'string')).toBe(true);
    expect(chart.y_tick_labels.every((label: unknown) => typeof label === 'string')).toBe(true);
    expect(chart.elements.length).toBe(2);
    const [firstData, secondData] = chart.elements;
    expect(firstData.label).toBe('Dataset 1');
    expect(firstData.points.length).toBe(5);
    expect(firstData.points.every((p: unknown[]) => typeof p[0] === 'number' && typeof p[1] === 'number')).toBe(true);
    expect(secondData.label).toBe('Dataset 2');
    expect(secondData.points.length).toBe(10);
    expect(secondData.points.every((p: unknown[]) => typeof p[0] === 'number' && typeof p[1] === 'number')).toBe(true);
  }, CASE_MS);

  it('superchart', async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np

x1 = np.linspace(0, 10, 100)
y1 = np.sin(x1)
fig, axs = plt.subplots(1, 2, figsize=(10, 8))
fig.suptitle('Multiple Charts Example', fontsize=16)
axs[0].plot(x1, y1, 'r')
axs[0].set_title('Sine Wave')
axs[0].grid(True)
N = 5
x2 = np.random.rand(N)
y2 = np.random.rand(N)
axs[1].scatter(x2, y2, c='blue', label='Dataset 1')
axs[1].set_xlabel('X')
axs[1].set_ylabel('Y')
axs[1].set_title('Scatter Plot')
axs[1].grid(True)
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('superchart');
    expect(chart.title).toBe('Multiple Charts Example');
    const charts = chart.elements;
    expect(charts.length).toBe(2);
    const [first, second] = charts;
    expect(first.title).toBe('Sine Wave');
    expect(first.type).toBe('line');
    expect(first.x_label).toBeNull();
    expect(first.y_label).toBeNull();
    expect(first.elements.length).toBe(1);
    expect(first.elements[0].points.length).toBe(100);
    expect(second.title).toBe('Scatter Plot');
    expect(second.type).toBe('scatter');
    expect(second.x_label).toBe('X');
    expect(second.y_label).toBe('Y');
    expect(second.elements.length).toBe(1);
    expect(second.elements[0].points.length).toBe(5);
  }, CASE_MS);

  it('unknown', async () => {
    const chart = await chartOf(`
import matplotlib.pyplot as plt
import numpy as np

fig, ax = plt.subplots()
circle1 = plt.Circle((0, 0), 1, color='blue', fill=False, linewidth=2)
circle2 = plt.Circle((0, 0), 2, color='red', fill=False, linewidth=2)
ax.add_artist(circle1)
ax.add_artist(circle2)
ax.grid(True)
plt.title('Two Concentric Circles')
plt.show()
`);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('unknown');
    expect(chart.title).toBe('Two Concentric Circles');
    expect(chart.elements.length).toBe(0);
  }, CASE_MS);

  it('datetime scale', async () => {
    const chart = await chartOf(`
    import numpy as np
    import matplotlib.pyplot as plt
    import datetime

    dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(10)]
    y_sin = np.sin(np.linspace(0, 2*np.pi, 100))

    plt.figure(figsize=(10, 6))
    plt.plot(dates, y_sin, label='sin(x)')
    plt.show()
    `);
    expect(chart).toBeDefined();
    expect(chart.type).toBe('line');
    expect(chart.x_scale).toBe('datetime');
    expect(chart.y_scale).toBe('linear');
  }, CASE_MS);

  it('categorical scale', async () => {
    const chart = await chartOf(`
    import numpy as np
    import matplotlib.pyplot as plt

    x = [1, 2, 3, 4, 5]
    y = ['A', 'B', 'C', 'D', 'E']

    plt.figure(figsize=(10, 6))
    plt.plot(x, y)
    plt.show()
    `);
    expect(chart).toBeTruthy();
    expect(chart.type).toBe('line');
    expect(chart.x_scale).toBe('linear');
    expect(chart.y_scale).toBe('categorical');
  }, CASE_MS);
});

describe('contexts.test.ts', () => {
  const sandbox = shared();
  it('create context with no options', async () => {
    const s = await sandbox();
    const context = await s.createCodeContext();
    await sleep(1000);
    const contexts = await s.listCodeContexts();
    const lastContext = contexts[contexts.length - 1];
    expect(lastContext.id).toBeDefined();
    expect(lastContext.language).toBe(context.language);
    expect(lastContext.cwd).toBe(context.cwd);
  }, CASE_MS);
  it('create context with options', async () => {
    const s = await sandbox();
    const context = await s.createCodeContext({ language: 'python', cwd: '/root' });
    await sleep(1000);
    const contexts = await s.listCodeContexts();
    const lastContext = contexts[contexts.length - 1];
    expect(lastContext.id).toBeDefined();
    expect(lastContext.language).toBe(context.language);
    expect(lastContext.cwd).toBe(context.cwd);
  }, CASE_MS);
  it('remove context', async () => {
    const s = await sandbox();
    const context = await s.createCodeContext();
    await s.removeCodeContext(context.id);
    const contexts = await s.listCodeContexts();
    expect(contexts.map((c) => c.id)).not.toContain(context.id);
  }, CASE_MS);
  it('list contexts', async () => {
    const contexts = await (await create()).listCodeContexts();
    expect(contexts.map((c) => c.language)).toContain('python');
    expect(contexts.map((c) => c.language)).toContain('javascript');
  }, CASE_MS);
  it('restart context', async () => {
    const s = await sandbox();
    const context = await s.createCodeContext();
    await s.runCode('x = 1', { context });
    await s.restartCodeContext(context.id);
    const execution = await s.runCode('x', { context });
    expect(execution.error).toBeDefined();
    expect(execution.error?.name).toBe('NameError');
    expect(execution.error?.value).toBe("name 'x' is not defined");
  }, CASE_MS);
});

describe('cwd.test.ts', () => {
  const sandbox = shared();
  it('cwd python', async () => {
    const result = await (await sandbox()).runCode('from pathlib import Path; print(Path.cwd())', { language: 'python' });
    expect(result.logs.stdout.join().trim()).toEqual('/home/user');
  }, CASE_MS);
  it('cwd javascript', async () => {
    expect((await (await sandbox()).runCode('process.cwd()', { language: 'js' })).text).toEqual('/home/user');
  }, CASE_MS);
  it('cwd typescript', async () => {
    expect((await (await sandbox()).runCode('process.cwd()', { language: 'ts' })).text).toEqual('/home/user');
  }, CASE_MS);
  it('cwd deno', async () => {
    expect((await (await sandbox()).runCode('Deno.cwd()', { language: 'deno' })).text).toEqual('/home/user');
  }, CASE_MS);
  it('cwd r', async () => {
    const result = await (await sandbox()).runCode('getwd()', { language: 'r' });
    expect(result.results[0]?.text?.trim()).toEqual('[1] "/home/user"');
  }, CASE_MS);
});

describe('data.test.ts', () => {
  it('get data', async () => {
    const execution = await (await create()).runCode('\nimport pandas as pd\npd.DataFrame({"a": [1, 2, 3]})\n');
    expect(execution.results[0].data).toBeDefined();
  }, CASE_MS);
});

describe('defaultKernels.test.ts', () => {
  const sandbox = shared();
  it('test js kernel', async () => {
    expect((await (await sandbox()).runCode('console.log("Hello World!")', { language: 'js' })).logs.stdout).toEqual(['Hello World!\n']);
  }, CASE_MS);
  it('test esm imports', async () => {
    const output = await (await sandbox()).runCode("\n    import { readFileSync } from 'fs'\n    console.log(typeof readFileSync)\n    ", { language: 'js' });
    expect(output.logs.stdout).toEqual(['function\n']);
  }, CASE_MS);
  it('test top-level await and promise resolution', async () => {
    const output = await (await sandbox()).runCode("\n    await Promise.resolve('Hello World!')\n    ", { language: 'js' });
    expect(output.text).toEqual('Hello World!');
  }, CASE_MS);
  it('test ts kernel', async () => {
    const output = await (await sandbox()).runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' });
    expect(output.logs.stdout).toEqual(['Hello World!\n']);
  }, CASE_MS);
});

describe('displayData.test.ts', () => {
  it('display data', async () => {
    const result = await (await create()).runCode(`
        import matplotlib.pyplot as plt
        import numpy as np

        x = np.linspace(0, 20, 100)
        y = np.sin(x)

        plt.plot(x, y)
        plt.show()
        `);
    const image = result.results[0];
    expect(image.png).toBeDefined();
    expect(image.text).toBeDefined();
    expect(image.extra).toEqual({});
  }, CASE_MS);
});

// env_vars/{python,javascript,deno,bash,r}.test.ts: a variable of the sandbox (Sandbox.create's
// envs) seen by the kernel, one given to a run for that run only, and a run's overriding it.
const ENV_LANGUAGES: { file: string; language: string; read: (name: string) => string; readOr: (name: string, fallback: string) => string; text: (v: string) => string; fromStdout?: boolean }[] = [
  { file: 'python', language: 'python', read: (n) => `import os; os.getenv('${n}')`, readOr: (n, d) => `import os; os.getenv('${n}', '${d}')`, text: (v) => v },
  { file: 'js', language: 'javascript', read: (n) => `process.env.${n}`, readOr: (n, d) => `process.env.${n} || '${d}'`, text: (v) => v },
  { file: 'deno', language: 'deno', read: (n) => `Deno.env.get('${n}')`, readOr: (n, d) => `Deno.env.get('${n}') ?? '${d}'`, text: (v) => v },
  { file: 'bash', language: 'bash', read: (n) => `echo $${n}`, readOr: (n, d) => `echo \${${n}:-${d}}`, text: (v) => `${v}\n`, fromStdout: true },
  { file: 'r', language: 'r', read: (n) => `Sys.getenv("${n}")`, readOr: (n, d) => `Sys.getenv("${n}", unset = "${d}")`, text: (v) => `[1] "${v}"` },
];

for (const l of ENV_LANGUAGES) {
  describe(`env_vars/${l.file}.test.ts`, () => {
    const value = async (s: Sandbox, code: string, envs?: Record<string, string>) => {
      const r = await s.runCode(code, { language: l.language, ...(envs ? { envs } : {}) });
      return l.fromStdout ? r.logs.stdout[0] : r.results[0]?.text?.trim();
    };
    let withEnv: Promise<Sandbox> | undefined;
    const sandboxWithEnv = () => (withEnv ??= create({ envs: { TEST_ENV_VAR: 'supertest' } }));
    const plain = shared();

    it(`env vars on sandbox (${l.language})`, async () => {
      expect(await value(await sandboxWithEnv(), l.read('TEST_ENV_VAR'))).toEqual(l.text('supertest'));
    }, CASE_MS);
    it(`env vars per execution (${l.language})`, async () => {
      const s = await plain();
      expect(await value(s, l.read('FOO'), { FOO: 'bar' })).toEqual(l.text('bar'));
      expect(await value(s, l.readOr('FOO', 'default'))).toEqual(l.text('default'));
    }, CASE_MS);
    it('env vars overwrite', async () => {
      const s = await sandboxWithEnv();
      expect(await value(s, l.read('TEST_ENV_VAR'), { TEST_ENV_VAR: 'overwrite' })).toEqual(l.text('overwrite'));
      // Upstream's python, javascript and bash files also check the sandbox's value comes back.
      if (l.file !== 'r' && l.file !== 'deno') expect(await value(s, l.read('TEST_ENV_VAR'))).toEqual(l.text('supertest'));
    }, CASE_MS);
  });
}

describe('executionCount.test.ts', () => {
  it('execution count', async () => {
    const s = await create();
    await s.runCode('!pwd');
    const result = await s.runCode('!pwd');
    expect(result.executionCount).toEqual(2);
  }, CASE_MS);
});

describe('images/bar.test.ts', () => {
  const sandbox = shared();
  it('test show image', async () => {
    const execution = await (await sandbox()).runCode(`
    import numpy
    from PIL import Image

    imarray = numpy.random.rand(16,16,3) * 255
    image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')

    image.show()
    print("done")
    `);
    expect(execution.results[0]?.png).toBeDefined();
  }, CASE_MS);
  it('test image represent', async () => {
    const execution = await (await sandbox()).runCode(`
    import numpy
    from PIL import Image

    imarray = numpy.random.rand(16,16,3) * 255
    image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')

    image
    `);
    expect(execution.results[0]?.png).toBeDefined();
  }, CASE_MS);
  it('get image on save', async () => {
    const execution = await (await sandbox()).runCode(`
    import numpy
    from PIL import Image

    imarray = numpy.random.rand(16,16,3) * 255
    image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')

    image.save("test.png")
    `);
    expect(execution.results[0]?.png).toBeDefined();
  }, CASE_MS);
});

describe('interrupt.test.ts', () => {
  it('subsequent execution works after client timeout', async () => {
    const s = await create();
    await expect(s.runCode('import time; time.sleep(30)', { timeoutMs: 3_000 })).rejects.toThrow();
    await sleep(5_000);
    const result = await s.runCode('1 + 1', { timeoutMs: 10_000 });
    expect(result.text).toEqual('2');
  }, CASE_MS);
});

describe('kernels.test.ts', () => {
  const sandbox = shared();
  it('create new kernel', async () => {
    await (await sandbox()).createCodeContext();
  }, CASE_MS);
  it('independence of kernels', async () => {
    const s = await sandbox();
    await s.runCode('x = 1');
    const context = await s.createCodeContext();
    const output = await s.runCode('x', { context });
    expect(output.error!.value).toEqual("name 'x' is not defined");
  }, CASE_MS);
  it('pass context and language', async () => {
    const s = await sandbox();
    const context = await s.createCodeContext();
    // Upstream passes the options where the code goes; the server refuses a non-string code.
    await expect(s.runCode({ context, language: 'python' } as never)).rejects.toThrowError();
  }, CASE_MS);
});

describe('killedSandbox.test.ts', () => {
  it('runCode throws a descriptive error when the sandbox is killed during execution', async () => {
    const s = await create();
    const execution = s.runCode('import time; time.sleep(60)');
    const assertion = Promise.all([
      expect(execution).rejects.toThrowError(/sandbox was killed while the request was in progress/),
      expect(execution).rejects.toBeInstanceOf(TimeoutError),
    ]);
    await sleep(2_000);
    await s.kill();
    await assertion;
  }, CASE_MS);
});

// languages/js.test.ts (language "js") and languages/deno.test.ts (language "deno"), without
// "js import" (npm:is-odd needs the internet).
for (const [file, language] of [['js', 'js'], ['deno', 'deno']] as const) {
  describe(`languages/${file}.test.ts`, () => {
    const sandbox = shared();
    it('js simple', async () => {
      expect((await (await sandbox()).runCode('console.log("Hello, World!")', { language })).logs.stdout.join().trim()).toEqual('Hello, World!');
    }, CASE_MS);
    it('js top level await', async () => {
      const result = await (await sandbox()).runCode("\n    async function main() {\n        return 'Hello, World!'\n    }\n\n    await main()\n    ", { language });
      expect(result.results[0].text).toEqual('Hello, World!');
    }, CASE_MS);
    it('js es6', async () => {
      const result = await (await sandbox()).runCode('\nconst add = (x, y) => x + y;\nadd(1, 2)\n', { language });
      expect(result.results[0].text).toEqual('3');
    }, CASE_MS);
    it('js context', async () => {
      const s = await sandbox();
      await s.runCode('const z = 1', { language });
      expect((await s.runCode('z', { language })).results[0].text).toEqual('1');
    }, CASE_MS);
    it('js cwd', async () => {
      const s = await sandbox();
      expect((await s.runCode('process.cwd()', { language })).results[0].text).toEqual('/home/user');
      const ctx = await s.createCodeContext({ cwd: '/home', language });
      expect((await s.runCode('process.cwd()', { context: ctx })).results[0].text).toEqual('/home');
    }, CASE_MS);
    it('ts simple', async () => {
      const result = await (await sandbox()).runCode('\nfunction subtract(x: number, y: number): number {\n  return x - y;\n}\n\nsubtract(1, 2)\n', { language: language === 'js' ? 'ts' : language });
      expect(result.results[0].text).toEqual('-1');
    }, CASE_MS);
    if (file === 'deno') {
      it('test display', async () => {
        const result = await (await sandbox()).runCode(
          '\n   {\n  [Symbol.for("Jupyter.display")]() {\n    return {\n      "text/plain": "Hello world!",\n      "text/html": "<h1>Hello world!</h1>",\n    }\n  }\n}\n',
          { language },
        );
        expect(result.results[0].html).toBe('<h1>Hello world!</h1>');
        expect(result.results[0].text).toBe('Hello world!');
      }, CASE_MS);
    }
  });
}

describe('reconnect.test.ts', () => {
  it('reconnect', async () => {
    const first = await create();
    const sandbox = await Sandbox.connect(first.sandboxId, { ...t.opts, timeoutMs: 60_000 });
    expect((await sandbox.runCode('x =1; x')).text).toEqual('1');
  }, CASE_MS);
});

describe('sandboxUrl.test.ts', () => {
  // Constructing a sandbox makes no request: URL resolution only (no server involved).
  const saved = process.env.E2B_SANDBOX_URL;
  const construct = (opts: object) => new (Sandbox as unknown as new (o: object) => { jupyterUrl: string })({ sandboxId: 'test-sandbox-id', envdVersion: '0.2.0', ...opts });
  it('jupyterUrl points directly to the sandbox host by default', () => {
    delete process.env.E2B_SANDBOX_URL;
    expect(construct({ domain: 'example.dev' }).jupyterUrl).toBe('https://49999-test-sandbox-id.example.dev');
  });
  it('jupyterUrl honors the sandboxUrl option', () => {
    expect(construct({ sandboxUrl: 'https://proxy.example.com' }).jupyterUrl).toBe('https://proxy.example.com');
  });
  it('jupyterUrl honors the E2B_SANDBOX_URL environment variable', () => {
    process.env.E2B_SANDBOX_URL = 'https://env.example.com';
    try {
      expect(construct({}).jupyterUrl).toBe('https://env.example.com');
    } finally {
      if (saved === undefined) delete process.env.E2B_SANDBOX_URL;
      else process.env.E2B_SANDBOX_URL = saved;
    }
  });
});

describe('statefulness.test.ts', () => {
  it('statefulness', async () => {
    const s = await create();
    await s.runCode('x = 1');
    expect((await s.runCode('x += 1; x')).text).toEqual('2');
  }, CASE_MS);
});

describe('streaming.test.ts', () => {
  const sandbox = shared();
  it('streaming output', async () => {
    const out: OutputMessage[] = [];
    await (await sandbox()).runCode('print(1)', { onStdout: (msg) => void out.push(msg) });
    expect(out.length).toEqual(1);
    expect(out[0].line).toEqual('1\n');
  }, CASE_MS);
  it('streaming error', async () => {
    const out: OutputMessage[] = [];
    await (await sandbox()).runCode('import sys;print(1, file=sys.stderr)', { onStderr: (msg) => void out.push(msg) });
    expect(out.length).toEqual(1);
    expect(out[0].line).toEqual('1\n');
  }, CASE_MS);
  it('streaming result', async () => {
    const out: Result[] = [];
    const code = `
        import matplotlib.pyplot as plt
        import numpy as np

        x = np.linspace(0, 20, 100)
        y = np.sin(x)

        plt.plot(x, y)
        plt.show()

        x
        `;
    await (await sandbox()).runCode(code, { onResult: (result) => void out.push(result) });
    expect(out.length).toEqual(2);
  }, CASE_MS);
});

describe('timeout.test.ts', () => {
  it('execution after timeout is not blocked', async () => {
    const s = await create();
    const context = await s.createCodeContext();
    await expect(s.runCode('import time; time.sleep(5)', { context, timeoutMs: 2_000 })).rejects.toThrow();
    const result = await s.runCode('x = 1; x', { context, timeoutMs: 15_000 });
    expect(result.text).toEqual('1');
  }, CASE_MS);
});
