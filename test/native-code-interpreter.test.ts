// The native code interpreter API (openapi/native.yaml, /sandboxes/{id}/code/…) on a real
// server, real sandboxes and real Jupyter kernels: contexts, the three answers of a run (SSE,
// NDJSON, one collected JSON), the WebSocket form and its close codes, timeouts and client
// disconnects that interrupt the cell while its context survives, one-shot scripts, charts
// (the `code-interpreter` image), and the 400/404 answers. The cells run in a sandbox of the
// `code-interpreter` image (every kernel); a default-image sandbox answers for a language its
// image has no kernel for. Sandboxes have deny-all egress.
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { WebSocket } from 'ws';
import { serverSentEvents } from '../host/protocol/sse.js';
import { CHART_MIME, DATAFRAME_MIME } from '../core/code-interpreter/types.js';
import { startTestServer, type TestServer } from './harness.js';

// A hang guard, not a timing claim: each kernel start is seconds of CPU, and integration files
// run two at a time on a 2-core machine, so a test that starts several kernels gets more room.
vi.setConfig({ testTimeout: 180_000 });

let t: TestServer;
/** A sandbox of the code-interpreter image: where the cells run. */
let id: string;
/** A sandbox of the default image. */
let plain: string;

interface CodeEvent {
  type: string;
  text?: string;
  main?: boolean;
  data?: Record<string, unknown>;
  name?: string;
  value?: string;
  traceback?: string;
  status?: string;
  executionCount?: number;
  error?: { code: string; message: string };
}

interface RunResult {
  status: string;
  executionCount: number | null;
  stdout: string;
  stderr: string;
  text: string | null;
  results: { main: boolean; data: Record<string, unknown> }[];
  error: { name: string; value: string; traceback: string } | null;
}

const createSandbox = async (extra: Record<string, unknown> = {}) => {
  const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 1024, egress: { mode: 'deny-all' }, labels: { suite: 'code-interpreter' }, ...extra });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body.id as string;
};

beforeAll(async () => {
  t = await startTestServer();
  id = await createSandbox({ image: 'code-interpreter', memoryMiB: 2048 });
  plain = await createSandbox({ memoryMiB: 512 });
});
afterAll(async () => {
  await t?.close();
});

const api = (sandboxId = id) => `/api/v1/sandboxes/${sandboxId}/code`;

/** One collected run (no Accept: the JSON answer). */
const run = async (body: Record<string, unknown>, sandboxId = id): Promise<RunResult> => {
  const res = await t.http.post(`${api(sandboxId)}/run`).set(t.auth).send(body);
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  expect(res.headers['content-type']).toMatch(/^application\/json/);
  return res.body as RunResult;
};

const createContext = async (body: Record<string, unknown> = {}, sandboxId = id) => {
  const res = await t.http.post(`${api(sandboxId)}/contexts`).set(t.auth).send(body);
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body as { id: string; language: string; cwd: string; user: string; isDefault: boolean; createdAt: string };
};

/** A run as Server-Sent Events, each event with the `event:` name it came under. */
async function runStreamed(body: Record<string, unknown>, onEvent?: (e: CodeEvent, all: CodeEvent[]) => Promise<void> | void, timeoutMs = 60_000): Promise<{ events: CodeEvent[]; names: string[] }> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    const res = await fetch(`${t.url}${api()}/run`, { method: 'POST', headers: { ...t.auth, accept: 'text/event-stream', 'content-type': 'application/json' }, body: JSON.stringify(body), signal: abort.signal });
    expect(res.status, res.status === 200 ? '' : await res.text()).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const events: CodeEvent[] = [];
    const names: string[] = [];
    const raw = (res.body as unknown as AsyncIterable<Uint8Array>);
    // Tee the bytes: the `event:` names from the raw text, the payloads through the shared parser.
    const decoder = new TextDecoder();
    async function* tee(): AsyncGenerator<Uint8Array> {
      for await (const chunk of raw) {
        for (const m of decoder.decode(chunk, { stream: true }).matchAll(/^event: (\S+)$/gm)) names.push(m[1]!);
        yield chunk;
      }
    }
    for await (const e of serverSentEvents<CodeEvent>(tee())) {
      events.push(e);
      await onEvent?.(e, events);
    }
    return { events, names };
  } finally {
    clearTimeout(timer);
  }
}

/** A run over the WebSocket: the frames received and the close code. */
function runOverSocket(request: unknown, sandboxId = id, timeoutMs = 60_000): Promise<{ frames: CodeEvent[]; code: number; reason: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${t.url.replace('http', 'ws')}${api(sandboxId)}/run`, { headers: t.auth });
    const frames: CodeEvent[] = [];
    const timer = setTimeout(() => {
      ws.terminate();
      reject(new Error(`no close within ${timeoutMs} ms; frames ${JSON.stringify(frames).slice(0, 500)}`));
    }, timeoutMs);
    ws.on('open', () => ws.send(typeof request === 'string' ? request : JSON.stringify(request)));
    ws.on('message', (m) => frames.push(JSON.parse(String(m)) as CodeEvent));
    ws.on('close', (code, reason) => {
      clearTimeout(timer);
      resolve({ frames, code, reason: String(reason) });
    });
    ws.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

const expectError = (res: { status: number; body: { error?: { code: string; message: string } } }, status: number, code: string, field?: string) => {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  expect(res.body.error?.code).toBe(code);
  if (field) expect(res.body.error?.message).toMatch(new RegExp(`^${field}\\b`));
};

describe('languages and contexts', () => {
  it("lists the languages of each sandbox's image", async () => {
    const res = await t.http.get(`${api()}/languages`).set(t.auth);
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect([...res.body.languages].sort()).toEqual(['bash', 'javascript', 'python', 'r', 'typescript']);
    const inDefault = await t.http.get(`${api(plain)}/languages`).set(t.auth);
    expect(inDefault.status, JSON.stringify(inDefault.body)).toBe(200);
    expect(inDefault.body.languages).not.toContain('javascript');
  });

  it('creates, lists, gets, restarts and deletes a context; state is kept between runs and envs and cwd apply', async () => {
    const ctx = await createContext({ language: 'python', cwd: '/tmp', envs: { NESTBOX_CTX_VAR: 'from-context' } });
    expect(ctx).toMatchObject({ language: 'python', cwd: '/tmp', isDefault: false });
    expect(ctx.id).toMatch(/^[A-Za-z0-9_.-]{1,64}$/);
    expect(Number.isNaN(Date.parse(ctx.createdAt))).toBe(false);

    const got = await t.http.get(`${api()}/contexts/${ctx.id}`).set(t.auth);
    expect(got.status).toBe(200);
    expect(got.body).toEqual(ctx);
    const listed = await t.http.get(`${api()}/contexts`).set(t.auth);
    expect(listed.status).toBe(200);
    expect(listed.body.contexts.map((c: { id: string }) => c.id)).toContain(ctx.id);

    const first = await run({ code: 'import os\nx = 41\nprint(os.getcwd(), os.environ["NESTBOX_CTX_VAR"])', contextId: ctx.id });
    expect(first).toMatchObject({ status: 'ok', stdout: '/tmp from-context\n', error: null });
    const second = await run({ code: 'x + 1', contextId: ctx.id });
    expect(second).toMatchObject({ status: 'ok', text: '42' });
    expect(second.results).toEqual([{ main: true, data: expect.objectContaining({ 'text/plain': '42' }) }]);
    expect(second.executionCount).toBeGreaterThan(first.executionCount!);
    // A run's envs are for that run only.
    expect((await run({ code: 'import os\nprint(os.environ.get("ONLY_THIS_RUN"))', contextId: ctx.id, envs: { ONLY_THIS_RUN: 'yes' } })).stdout).toBe('yes\n');
    expect((await run({ code: 'import os\nprint(os.environ.get("ONLY_THIS_RUN"))', contextId: ctx.id })).stdout).toBe('None\n');

    const restarted = await t.http.post(`${api()}/contexts/${ctx.id}/restart`).set(t.auth);
    expect(restarted.status, JSON.stringify(restarted.body)).toBe(200);
    expect(restarted.body).toMatchObject({ id: ctx.id, language: 'python', cwd: '/tmp' });
    const afterRestart = await run({ code: 'x', contextId: ctx.id });
    expect(afterRestart.status).toBe('error');
    expect(afterRestart.error).toMatchObject({ name: 'NameError' });

    expect((await t.http.delete(`${api()}/contexts/${ctx.id}`).set(t.auth)).status).toBe(204);
    expectError(await t.http.get(`${api()}/contexts/${ctx.id}`).set(t.auth), 404, 'not_found');
    expectError(await t.http.post(`${api()}/run`).set(t.auth).send({ code: '1', contextId: ctx.id }), 404, 'not_found');
    expect((await t.http.get(`${api()}/contexts`).set(t.auth)).body.contexts.map((c: { id: string }) => c.id)).not.toContain(ctx.id);
  });

  it('runs without a context in the default python context, which then shows in the list', async () => {
    const result = await run({ code: '1+1' });
    expect(result).toMatchObject({ status: 'ok', text: '2', error: null });
    const listed = await t.http.get(`${api()}/contexts`).set(t.auth);
    const defaults = (listed.body.contexts as { language: string; isDefault: boolean }[]).filter((c) => c.isDefault);
    expect(defaults.map((c) => c.language)).toContain('python');
    // language: python names the same default context: its state is shared.
    await run({ code: 'shared_default = "kept"' });
    expect((await run({ code: 'shared_default', language: 'python' })).text).toBe("'kept'");
  });

  it('keeps two contexts apart', async () => {
    const [a, b] = [await createContext(), await createContext()];
    await run({ code: 'who = "a"', contextId: a.id });
    await run({ code: 'who = "b"', contextId: b.id });
    expect((await run({ code: 'who', contextId: a.id })).text).toBe("'a'");
    expect((await run({ code: 'who', contextId: b.id })).text).toBe("'b'");
    for (const c of [a, b]) expect((await t.http.delete(`${api()}/contexts/${c.id}`).set(t.auth)).status).toBe(204);
  });
});

describe('runs', () => {
  it('collects a cell with an error into one answer: output before it, the error with its traceback', async () => {
    const result = await run({ code: 'print("before")\n1/0' });
    expect(result.status).toBe('error');
    expect(result.stdout).toBe('before\n');
    expect(result.error).toMatchObject({ name: 'ZeroDivisionError', value: 'division by zero' });
    expect(result.error!.traceback).toContain('ZeroDivisionError');
    expect(result.text).toBeNull();
  });

  it('streams Server-Sent Events in order, stdout arriving while the cell still runs', async () => {
    const ctx = await createContext();
    const flag = `/tmp/go-${Date.now()}`;
    // The cell prints, then waits (bounded) for a file that this test creates only once it has
    // seen the print: the cell can only end if its stdout was delivered before its end.
    const code = `import os, time\nprint("waiting", flush=True)\nfor _ in range(1200):\n    if os.path.exists(${JSON.stringify(flag)}): break\n    time.sleep(0.05)\nelse:\n    raise RuntimeError("never released")\nprint("released")\nimport sys; print("to stderr", file=sys.stderr)`;
    const { events, names } = await runStreamed({ code, contextId: ctx.id }, async (e) => {
      if (e.type === 'stdout' && e.text === 'waiting\n') {
        const touched = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: `touch ${flag}` });
        expect(touched.status).toBe(200);
      }
    });
    const kinds = events.filter((e) => e.type !== 'keepalive').map((e) => e.type);
    expect(kinds[0]).toBe('start');
    expect(kinds.at(-1)).toBe('end');
    expect(events.at(-1)).toMatchObject({ type: 'end', status: 'ok' });
    const out = events.filter((e) => e.type === 'stdout').map((e) => e.text).join('');
    expect(out).toBe('waiting\nreleased\n');
    expect(events.filter((e) => e.type === 'stderr').map((e) => e.text).join('')).toBe('to stderr\n');
    // Each SSE event is named after its type.
    expect(names).toEqual(events.map((e) => e.type));
    await t.http.delete(`${api()}/contexts/${ctx.id}`).set(t.auth);
  });

  it('answers NDJSON, one event a line, when asked for it', async () => {
    const res = await fetch(`${t.url}${api()}/run`, { method: 'POST', headers: { ...t.auth, accept: 'application/x-ndjson', 'content-type': 'application/json' }, body: JSON.stringify({ code: 'print("nd")\n"value"' }) });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^application\/x-ndjson/);
    const lines = (await res.text()).split('\n').filter(Boolean).map((l) => JSON.parse(l) as CodeEvent);
    expect(lines[0]!.type).toBe('start');
    expect(lines.find((e) => e.type === 'stdout')).toMatchObject({ text: 'nd\n' });
    expect(lines.find((e) => e.type === 'result')).toMatchObject({ main: true, data: { 'text/plain': "'value'" } });
    expect(lines.at(-1)).toMatchObject({ type: 'end', status: 'ok' });
  });

  it('runs over a WebSocket: one frame per event, then a normal close', async () => {
    const { frames, code } = await runOverSocket({ code: 'print("over ws")\n6*7' });
    expect(code).toBe(1000);
    expect(frames[0]!.type).toBe('start');
    expect(frames.find((e) => e.type === 'stdout')).toMatchObject({ text: 'over ws\n' });
    expect(frames.find((e) => e.type === 'result')).toMatchObject({ main: true, data: { 'text/plain': '42' } });
    expect(frames.at(-1)).toMatchObject({ type: 'end', status: 'ok' });
  });

  it('refuses a bad WebSocket request with a failure frame and a close code of 4000 + its status', async () => {
    const invalid = await runOverSocket({ code: 5 });
    expect(invalid.code).toBe(4400);
    expect(invalid.frames).toEqual([{ type: 'failure', error: { code: 'validation_failed', message: expect.stringMatching(/^code\b/) } }]);
    const notJson = await runOverSocket('{not json');
    expect(notJson.code).toBe(4400);
    expect(notJson.frames[0]).toMatchObject({ type: 'failure', error: { code: 'validation_failed' } });
    const both = await runOverSocket({ code: '1', contextId: 'default-python', language: 'python' });
    expect(both.code).toBe(4400);
    expect(both.frames[0]!.error!.message).toMatch(/^language\b/);
    const unknown = await runOverSocket({ code: '1', contextId: 'no-such-context' });
    expect(unknown.code).toBe(4404);
    expect(unknown.frames[0]).toMatchObject({ type: 'failure', error: { code: 'not_found' } });
  });

  it('interrupts a cell at its timeout; the context and its state survive (collected and WebSocket)', async () => {
    const ctx = await createContext();
    await run({ code: 'kept = 5', contextId: ctx.id });
    const timedOut = await run({ code: 'import time\nwhile True:\n    time.sleep(0.1)', contextId: ctx.id, timeoutMs: 1500 });
    expect(timedOut.status).toBe('interrupted');
    expect((await run({ code: 'kept', contextId: ctx.id })).text).toBe('5');
    const overSocket = await runOverSocket({ code: 'import time\nwhile True:\n    time.sleep(0.1)', contextId: ctx.id, timeoutMs: 1500 });
    expect(overSocket.code).toBe(4000);
    expect(overSocket.frames.at(-1)).toMatchObject({ type: 'end', status: 'interrupted' });
    expect((await run({ code: 'kept + 1', contextId: ctx.id })).text).toBe('6');
    await t.http.delete(`${api()}/contexts/${ctx.id}`).set(t.auth);
  });

  it('interrupts the cell when the client goes away mid-cell (SSE and WebSocket); the context survives', async () => {
    const ctx = await createContext();
    // Two minutes of work unless interrupted; `finished` is only set if it runs to the end.
    const long = 'import time\nprint("started", flush=True)\nfor _ in range(1200):\n    time.sleep(0.1)\nfinished = True';
    const abort = new AbortController();
    const res = await fetch(`${t.url}${api()}/run`, { method: 'POST', headers: { ...t.auth, accept: 'text/event-stream', 'content-type': 'application/json' }, body: JSON.stringify({ code: long, contextId: ctx.id }), signal: abort.signal });
    expect(res.status).toBe(200);
    for await (const e of serverSentEvents<CodeEvent>(res.body as unknown as AsyncIterable<Uint8Array>)) {
      if (e.type === 'stdout') break;
    }
    abort.abort();
    // Cells of a context run one at a time: this one answers only once the long cell is over,
    // and says it did not finish, so the disconnect interrupted it.
    const after = await run({ code: '"finished" in globals()', contextId: ctx.id });
    expect(after).toMatchObject({ status: 'ok', text: 'False' });

    await new Promise<void>((resolve, reject) => {
      const ws = new WebSocket(`${t.url.replace('http', 'ws')}${api()}/run`, { headers: t.auth });
      ws.on('open', () => ws.send(JSON.stringify({ code: long, contextId: ctx.id })));
      ws.on('message', (m) => {
        if ((JSON.parse(String(m)) as CodeEvent).type === 'stdout') ws.close();
      });
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(await run({ code: '"finished" in globals()', contextId: ctx.id })).toMatchObject({ status: 'ok', text: 'False' });
    await t.http.delete(`${api()}/contexts/${ctx.id}`).set(t.auth);
  });
});

describe('one-shot scripts', () => {
  it('runs a python script with argv and envs: exit code and merged output', async () => {
    const res = await t.http.post(`${api()}/scripts`).set(t.auth).send({
      language: 'python',
      code: 'import os, sys\nprint("arg", sys.argv[1])\nprint("env", os.environ["SCRIPT_VAR"])\nsys.exit(3)',
      argv: ['first'],
      envs: { SCRIPT_VAR: 'set' },
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toEqual({ exitCode: 3, output: 'arg first\nenv set\n', charts: [], timedOut: false });
  });

  it('kills a script at its timeout', async () => {
    const res = await t.http.post(`${api()}/scripts`).set(t.auth).send({ language: 'python', code: 'import time\ntime.sleep(60)', timeoutMs: 1000 });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ exitCode: null, timedOut: true });
  });
});

describe('bad input', () => {
  it('answers 400 naming the field, and 404 for unknown contexts and sandboxes', async () => {
    const url = `${api()}/run`;
    expectError(await t.http.post(url).set(t.auth).send({}), 400, 'validation_failed', 'code');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', language: 'cobol' }), 400, 'validation_failed', 'language');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', contextId: 'default-python', language: 'python' }), 400, 'validation_failed', 'language');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', timeoutMs: 0 }), 400, 'validation_failed', 'timeoutMs');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', envs: { A: 1 } }), 400, 'validation_failed', 'envs.A');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', contextId: 'has/slash' }), 400, 'validation_failed', 'contextId');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', nope: true }), 400, 'validation_failed', 'nope');
    expectError(await t.http.post(url).set(t.auth).send({ code: '1', contextId: 'no-such-context' }), 404, 'not_found');
    expectError(await t.http.get(url).set(t.auth), 400, 'validation_failed', 'upgrade');
    expectError(await t.http.post(`${api()}/contexts`).set(t.auth).send({ language: 'cobol' }), 400, 'validation_failed', 'language');
    expectError(await t.http.get(`${api()}/contexts/no-such-context`).set(t.auth), 404, 'not_found');
    expectError(await t.http.delete(`${api()}/contexts/no-such-context`).set(t.auth), 404, 'not_found');
    expectError(await t.http.post(`${api()}/contexts/no-such-context/restart`).set(t.auth), 404, 'not_found');
    expectError(await t.http.post(`${api()}/scripts`).set(t.auth).send({ language: 'bash', code: 'echo' }), 400, 'validation_failed', 'language');
    expectError(await t.http.post(`${api()}/scripts`).set(t.auth).send({ language: 'python' }), 400, 'validation_failed', 'code');
    expectError(await t.http.get(`${api('nosuchsandbox')}/contexts`).set(t.auth), 404, 'not_found');
  });

  it("passes on the engine's 400 for a language the sandbox's image has no kernel for", async () => {
    const res = await t.http.post(`${api(plain)}/contexts`).set(t.auth).send({ language: 'javascript' });
    expectError(res, 400, 'validation_failed', 'language');
    expect(res.body.error.message).toContain('javascript');
    expectError(await t.http.post(`${api(plain)}/run`).set(t.auth).send({ code: '1', language: 'javascript' }), 400, 'validation_failed', 'language');
  });
});

describe('rich results and other languages', () => {
  it('returns a matplotlib chart as a PNG and as chart data: collected, over SSE, and from a script', async () => {
    const code = 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9], label="squares")\nplt.title("Squares")\nplt.xlabel("n")\nplt.ylabel("n squared")\nplt.show()';
    const result = await run({ code });
    expect(result.status, JSON.stringify(result.error)).toBe('ok');
    const figure = result.results.find((r) => typeof r.data['image/png'] === 'string');
    expect(figure, JSON.stringify(result.results).slice(0, 500)).toBeDefined();
    expect(Buffer.from(String(figure!.data['image/png']), 'base64').subarray(1, 4).toString()).toBe('PNG');
    expect(figure!.data[CHART_MIME]).toMatchObject({
      type: 'line',
      title: 'Squares',
      x_label: 'n',
      y_label: 'n squared',
      elements: [{ label: 'squares', points: [[1, 1], [2, 4], [3, 9]] }],
    });
    const { events } = await runStreamed({ code });
    const streamed = events.find((e) => e.type === 'result' && e.data?.[CHART_MIME] !== undefined);
    expect(streamed?.data?.[CHART_MIME]).toMatchObject({ type: 'line', title: 'Squares' });
    expect(typeof streamed?.data?.['image/png']).toBe('string');
    const script = await t.http.post(`${api()}/scripts`).set(t.auth).send({ language: 'python', code });
    expect(script.status, JSON.stringify(script.body)).toBe(200);
    expect(script.body.charts).toHaveLength(1);
    expect(script.body.charts[0]).toMatchObject({ type: 'line', title: 'Squares' });
    expect(typeof script.body.charts[0].png).toBe('string');
  });

  it('returns a DataFrame as HTML and as its data', async () => {
    const result = await run({ code: 'import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})' });
    const main = result.results.find((r) => r.main)!;
    expect(String(main.data['text/html'])).toContain('<table');
    expect(main.data[DATAFRAME_MIME]).toEqual({ a: [1, 2], b: ['x', 'y'] });
  });

  it('runs javascript and bash contexts', async () => {
    const js = await createContext({ language: 'javascript' });
    expect((await run({ code: 'console.log("from js")', contextId: js.id })).stdout).toBe('from js\n');
    expect((await run({ code: 'echo from-bash', language: 'bash' })).stdout).toBe('from-bash\n');
  });
});
