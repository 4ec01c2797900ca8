// `sandbox.codeInterpreter` through the real @daytonaio/sdk 0.218 (daytona-wave2 §4.2, §4.3):
// runCode over the `/process/interpreter/execute` socket with its streaming callbacks, state kept
// in a context, contexts created, listed and deleted, a timeout that interrupts the cell while its
// context survives, and the daemon's close codes for bad requests (checked with a plain
// WebSocket where the SDK refuses before sending). SDK 0.129 uses the same socket. The sandbox is
// of the built-in `code-interpreter` image (Daytona's default snapshot has a data stack); the
// `default` image has a python kernel without it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { DaytonaConnectionError, DaytonaError, DaytonaInvalidArgumentError, DaytonaNotFoundError, DaytonaTimeoutError, type Sandbox } from '@daytonaio/sdk';
import { Daytona as LegacyDaytona } from 'daytona-sdk-legacy';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;
let sb: Sandbox;
let plain: Sandbox;

beforeAll(async () => {
  env = await startDaytonaEnv();
  sb = await env.daytona.create({ snapshot: 'code-interpreter', language: 'python', networkBlockAll: true, labels: { suite: 'code-interpreter' } }, { timeout: 0 });
  plain = await env.daytona.create({ language: 'python', networkBlockAll: true, labels: { suite: 'code-interpreter-default-image' } }, { timeout: 0 });
});

afterAll(async () => {
  await sb?.delete().catch(() => undefined);
  await plain?.delete().catch(() => undefined);
  await env?.server.close();
});

/** One raw request on the execute socket: every frame received and how it closed. */
function rawExecute(payload: string): Promise<{ frames: Record<string, unknown>[]; code: number; reason: string }> {
  const url = `${env.server.url.replace(/^http/, 'ws')}/daytona/toolbox/${sb.id}/process/interpreter/execute`;
  const ws = new WebSocket(url, { headers: { authorization: `Bearer ${env.server.apiKey}` } });
  const frames: Record<string, unknown>[] = [];
  return new Promise((resolve, reject) => {
    ws.on('open', () => ws.send(payload));
    ws.on('message', (data) => frames.push(JSON.parse(String(data)) as Record<string, unknown>));
    ws.on('close', (code, reason) => resolve({ frames, code, reason: reason.toString() }));
    ws.on('error', reject);
  });
}

describe('codeInterpreter.runCode', () => {
  it('streams stdout and stderr to the callbacks and reports an error with its traceback', async () => {
    const stdout: string[] = [];
    const stderr: string[] = [];
    const errors: { name: string; value: string; traceback?: string }[] = [];
    const r = await sb.codeInterpreter.runCode('import sys\nprint("out")\nprint("err", file=sys.stderr)\n1 / 0', {
      onStdout: (m) => void stdout.push(m.output),
      onStderr: (m) => void stderr.push(m.output),
      onError: (e) => void errors.push(e),
    });
    expect(stdout.join('')).toBe('out\n');
    expect(stderr.join('')).toBe('err\n');
    expect(r.stdout).toBe('out\n');
    expect(r.stderr).toBe('err\n');
    expect(r.error).toMatchObject({ name: 'ZeroDivisionError', value: 'division by zero' });
    expect(r.error!.traceback).toMatch(/ZeroDivisionError/);
    // Plain text, as the daemon's: no terminal colours.
    expect(r.error!.traceback).not.toMatch(/\x1b\[/);
    expect(errors).toEqual([r.error]);
  });

  it('streams output while the cell still runs', async () => {
    const marker = `/tmp/go-${Date.now()}`;
    let released = false;
    const r = await sb.codeInterpreter.runCode(
      // Waits (bounded) for a file the test writes only after it has seen "ready".
      `import os, time\nprint("ready", flush=True)\nfor _ in range(600):\n    if os.path.exists(${JSON.stringify(marker)}):\n        break\n    time.sleep(0.1)\nprint("released" if os.path.exists(${JSON.stringify(marker)}) else "never released")`,
      {
        onStdout: async (m) => {
          if (m.output.includes('ready') && !released) {
            released = true;
            await sb.fs.uploadFile(Buffer.from('go'), marker);
          }
        },
      },
    );
    expect(released).toBe(true);
    expect(r.stdout).toBe('ready\nreleased\n');
  });

  it('keeps state across runs in the default context, runs as daytona in its home, and passes envs', async () => {
    await sb.codeInterpreter.runCode('counter = 41');
    expect((await sb.codeInterpreter.runCode('counter += 1\nprint(counter)')).stdout).toBe('42\n');
    expect((await sb.codeInterpreter.runCode('import getpass, os\nprint(getpass.getuser(), os.getcwd())')).stdout).toBe('daytona /home/daytona\n');
    const withEnv = await sb.codeInterpreter.runCode('import os\nprint(os.environ.get("RUN_VAR"))', { envs: { RUN_VAR: 'per-run' } });
    expect(withEnv.stdout).toBe('per-run\n');
  });

  it('refuses empty code: the SDK before connecting, the server with 1008 "code is required"', async () => {
    await expect(sb.codeInterpreter.runCode('  ')).rejects.toBeInstanceOf(DaytonaInvalidArgumentError);
    const empty = await rawExecute(JSON.stringify({ code: '' }));
    expect(empty).toMatchObject({ frames: [], code: 1008, reason: 'code is required' });
    const badJson = await rawExecute('{not json');
    expect(badJson).toMatchObject({ frames: [], code: 1002, reason: 'invalid JSON payload' });
    const negative = await rawExecute(JSON.stringify({ code: 'print(1)', timeout: -1 }));
    expect(negative.code).toBe(1008);
  });

  it('sends the daemon frames: every key on each, control completed, then close 1000', async () => {
    const r = await rawExecute(JSON.stringify({ code: 'print("hi")' }));
    expect(r.code).toBe(1000);
    // The kernel may report print's two writes ("hi", "\n") as one stream message or two.
    const output = r.frames.slice(0, -1);
    expect(output.length).toBeGreaterThan(0);
    for (const f of output) expect(f).toEqual({ type: 'stdout', text: f.text, name: '', value: '', traceback: '' });
    expect(output.map((f) => f.text).join('')).toBe('hi\n');
    expect(r.frames.at(-1)).toEqual({ type: 'control', text: 'completed', name: '', value: '', traceback: '' });
  });
});

describe('codeInterpreter contexts', () => {
  it('creates, lists (without the default) and deletes contexts; each keeps its own state and cwd', async () => {
    const a = await sb.codeInterpreter.createContext('/tmp');
    const b = await sb.codeInterpreter.createContext();
    try {
      expect(a).toMatchObject({ cwd: '/tmp', language: 'python', active: true });
      expect(typeof a.id).toBe('string');
      expect(Number.isNaN(Date.parse(String(a.createdAt)))).toBe(false);
      expect(b.cwd).toBe('/home/daytona');
      const listed = await sb.codeInterpreter.listContexts();
      expect(listed.map((c) => c.id).sort()).toEqual([a.id, b.id].sort());
      expect(listed.some((c) => c.id === 'default')).toBe(false);

      await sb.codeInterpreter.runCode('secret = "only in a"', { context: a });
      expect((await sb.codeInterpreter.runCode('print(secret)', { context: a })).stdout).toBe('only in a\n');
      const inB = await sb.codeInterpreter.runCode('print("secret" in globals())', { context: b });
      expect(inB.stdout).toBe('False\n');
      expect((await sb.codeInterpreter.runCode('import os\nprint(os.getcwd())', { context: a })).stdout).toBe('/tmp\n');
      // Nor does the default context see it.
      expect((await sb.codeInterpreter.runCode('print("secret" in globals())')).stdout).toBe('False\n');
    } finally {
      await sb.codeInterpreter.deleteContext(a);
      await sb.codeInterpreter.deleteContext(b);
    }
    expect(await sb.codeInterpreter.listContexts()).toEqual([]);
    const gone = await sb.codeInterpreter.runCode('print(1)', { context: a }).catch((e: unknown) => e);
    expect(gone).toBeInstanceOf(DaytonaConnectionError);
    expect((gone as Error).message).toBe(`context not found: ${a.id} (close code 1008)`);
  });

  it('refuses a context in a directory that does not exist or daytona cannot enter with 400 naming cwd', async () => {
    for (const cwd of ['/no/such/dir', '/etc/hostname', '/root']) {
      const err = await sb.codeInterpreter.createContext(cwd).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DaytonaError);
      expect((err as DaytonaError).statusCode).toBe(400);
      expect((err as Error).message).toMatch(/^cwd: /);
    }
    expect(await sb.codeInterpreter.listContexts()).toEqual([]);
  });

  it('refuses to delete the default context (400) and answers an unknown one with 404', async () => {
    const def = await rawFetch(env, `/daytona/toolbox/${sb.id}/process/interpreter/context/default`, { method: 'DELETE' });
    expect(def.status).toBe(400);
    const unknown = await sb.codeInterpreter.deleteContext({ id: 'no-such-context' } as never).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(DaytonaNotFoundError);
    expect((unknown as DaytonaError).statusCode).toBe(404);
  });

  it('interrupts a cell past its timeout (DaytonaTimeoutError); the context and its state survive', async () => {
    const ctx = await sb.codeInterpreter.createContext();
    try {
      await sb.codeInterpreter.runCode('kept = "still here"', { context: ctx });
      const err = await sb.codeInterpreter.runCode('import time\nwhile True:\n    time.sleep(0.1)', { context: ctx, timeout: 1 }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DaytonaTimeoutError);
      expect((await sb.codeInterpreter.runCode('print(kept)', { context: ctx })).stdout).toBe('still here\n');
      expect((await sb.codeInterpreter.listContexts()).map((c) => c.id)).toContain(ctx.id);
    } finally {
      await sb.codeInterpreter.deleteContext(ctx);
    }
  });

  it('reports a kernel that died during the cell; the context\'s next cell starts a fresh one', async () => {
    const ctx = await sb.codeInterpreter.createContext();
    try {
      await sb.codeInterpreter.runCode('before = 1', { context: ctx });
      // The TypeScript SDK resolves on close 1001: the error frame is what tells the caller.
      const died = await sb.codeInterpreter.runCode('import os\nos._exit(3)', { context: ctx });
      expect(died.error).toMatchObject({ name: 'WorkerProcessError' });
      const fresh = await sb.codeInterpreter.runCode('print("before" in globals())', { context: ctx });
      expect(fresh.stdout).toBe('False\n');
      expect((await sb.codeInterpreter.listContexts()).map((c) => c.id)).toContain(ctx.id);
    } finally {
      await sb.codeInterpreter.deleteContext(ctx);
    }
  });

  it('runs one context\'s cells in order, one at a time', async () => {
    const ctx = await sb.codeInterpreter.createContext();
    try {
      await sb.codeInterpreter.runCode('order = []', { context: ctx });
      // The second is sent once the first has started (its "started" is seen), while it still
      // sleeps: it waits for the first to end before it runs.
      let started!: () => void;
      const firstStarted = new Promise<void>((r) => (started = r));
      const firstRun = sb.codeInterpreter.runCode('import time\nprint("started", flush=True)\ntime.sleep(1)\norder.append(1)\nprint(order)', {
        context: ctx,
        onStdout: (m) => void (m.output.includes('started') && started()),
      });
      await firstStarted;
      const [first, second] = await Promise.all([firstRun, sb.codeInterpreter.runCode('order.append(2)\nprint(order)', { context: ctx })]);
      expect(first.stdout).toBe('started\n[1]\n');
      expect(second.stdout).toBe('[1, 2]\n');
    } finally {
      await sb.codeInterpreter.deleteContext(ctx);
    }
  });

  it('SDK 0.129 runs code over the same socket', async () => {
    const legacy = new LegacyDaytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey, target: 'local' });
    const old = await legacy.get(sb.id);
    const r = await old.codeInterpreter.runCode('print(6 * 7)');
    expect(r.stdout).toBe('42\n');
    const err = await old.codeInterpreter.runCode('raise ValueError("legacy")');
    expect(err.error).toMatchObject({ name: 'ValueError', value: 'legacy' });
  });
});

describe('codeInterpreter in a sandbox of the default image', () => {
  it('runs python in a kernel there, without the data stack of the code-interpreter image', async () => {
    const ctx = await plain.codeInterpreter.createContext();
    try {
      await plain.codeInterpreter.runCode('base = 40', { context: ctx });
      expect((await plain.codeInterpreter.runCode('print(base + 2)', { context: ctx })).stdout).toBe('42\n');
      const numpy = await plain.codeInterpreter.runCode('import numpy', { context: ctx });
      expect(numpy.error).toMatchObject({ name: 'ModuleNotFoundError', value: "No module named 'numpy'" });
    } finally {
      await plain.codeInterpreter.deleteContext(ctx);
    }
  });
});
