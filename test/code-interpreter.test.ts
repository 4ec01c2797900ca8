// Core's code interpreter (core/services/code-interpreter.ts) over the real toolbox and a real
// guest agent: contexts, default contexts, the queue of cells, timeouts, restarts, envs.
//
// The guest agent runs in this process on the host (the way host/guest-agent tests run it),
// with the host's /usr/bin/python3 and Debian's IPython kernel (scripts/install-system-deps.sh);
// the toolbox reaches it as the sandbox `sbx-local`. The second part runs the same service in
// a real sandbox of the code-interpreter image, with its other languages.
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { CHART_MIME, DATAFRAME_MIME, type CodeEvent } from '../core/code-interpreter/types.js';
import { NestboxError } from '../core/errors.js';
import { CodeInterpreterService } from '../core/services/code-interpreter.js';
import { Toolbox } from '../core/services/toolbox.js';
import { SCOPES, type Principal } from '../core/types.js';
import { HttpGuestClient } from '../host/agent-protocol/guest-client.js';
import { startProcessTestAgent, type ProcessTestAgent } from '../host/guest-agent/processes/test-support.js';
import { startTestServer, type TestServer } from './harness.js';

// A hang guard, not a timing claim: each kernel start is seconds of CPU, and integration files
// run two at a time on a 2-core machine, so a test that starts several kernels gets more room.
vi.setConfig({ testTimeout: 180_000 });

const SANDBOX = 'sbx-local';
const principal: Principal = { organizationId: 'org-test', keyId: 'key-test', scopes: new Set(SCOPES), sandboxIds: null };

async function collect(events: AsyncGenerator<CodeEvent>): Promise<CodeEvent[]> {
  const out: CodeEvent[] = [];
  for await (const event of events) if (event.type !== 'keepalive') out.push(event);
  return out;
}
const text = (events: CodeEvent[], type: 'stdout' | 'stderr' = 'stdout') =>
  events
    .filter((e) => e.type === type)
    .map((e) => (e as { text: string }).text)
    .join('');
const mainResult = (events: CodeEvent[]) => (events.find((e) => e.type === 'result' && e.main) as { data: Record<string, unknown> } | undefined)?.data['text/plain'];

/** Alive and not a zombie (an orphan on the host may wait a while for its new parent to reap it). */
function isAlive(pid: number): boolean {
  try {
    return !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

async function refusal(call: () => Promise<unknown>): Promise<NestboxError> {
  try {
    await call();
  } catch (error) {
    if (error instanceof NestboxError) return error;
    throw error;
  }
  throw new Error('expected a refusal');
}

describe('code interpreter service over an in-process guest agent', () => {
  let agent: ProcessTestAgent;
  let service: CodeInterpreterService;
  let toolbox: Toolbox;

  beforeAll(async () => {
    agent = await startProcessTestAgent({ env: { PATH: '/usr/bin:/bin', LANG: 'C.UTF-8' } });
    const guest = new HttpGuestClient(
      (r) => agent.client.request({ method: r.method, path: r.path, headers: r.headers, body: r.body, signal: r.signal }),
      (path) => ({ url: agent.wsUrl(path), headers: {} }),
      SANDBOX,
    );
    toolbox = new Toolbox({
      guestFor: async (_p, id) => {
        if (id !== SANDBOX) throw new NestboxError('not_found', `sandbox ${id} not found`);
        return guest;
      },
      noteActivity: async () => undefined,
    });
    service = new CodeInterpreterService(toolbox);
  }, 60_000);
  afterAll(async () => {
    if (agent) for (const p of (await toolbox.listProcesses(principal, SANDBOX)).processes) await toolbox.killProcess(principal, SANDBOX, p.processId);
    await agent?.stop();
  });

  it('starts the default python context on first use, once for concurrent first calls, and keeps its state', async () => {
    const [a, b] = await Promise.all([
      service.run(principal, SANDBOX, { code: 'x = 1\nprint("a")' }).then(collect),
      service.run(principal, SANDBOX, { code: 'x += 1\nprint("b")', language: 'python' }).then(collect),
    ]);
    expect(text(a)).toBe('a\n');
    expect(text(b)).toBe('b\n');
    // Queued in order: the second cell saw the first one's x.
    expect(mainResult(await collect(await service.run(principal, SANDBOX, { code: 'x' })))).toBe('2');
    const contexts = await service.listContexts(principal, SANDBOX);
    expect(contexts).toEqual([expect.objectContaining({ id: 'default-python', language: 'python', isDefault: true })]);
    expect(await service.languages(principal, SANDBOX)).toContain('python');
  });

  it('keeps two contexts apart; restart empties one; delete ends it', async () => {
    const one = await service.createContext(principal, SANDBOX, { language: 'python', envs: { CONTEXT_VAR: 'one' } });
    const two = await service.createContext(principal, SANDBOX, { language: 'Python', cwd: '/tmp' });
    expect(one).toMatchObject({ language: 'python', isDefault: false, cwd: agent.home });
    expect(two.cwd).toBe('/tmp');
    await collect(await service.run(principal, SANDBOX, { contextId: one.id, code: 'v = "in one"' }));
    const inTwo = await collect(await service.run(principal, SANDBOX, { contextId: two.id, code: 'v' }));
    expect(inTwo.find((e) => e.type === 'error')).toMatchObject({ name: 'NameError' });
    expect(await service.getContext(principal, SANDBOX, one.id)).toEqual(one);

    const restarted = await service.restartContext(principal, SANDBOX, one.id);
    expect(restarted).toEqual(one);
    const after = await collect(await service.run(principal, SANDBOX, { contextId: one.id, code: 'import os\nprint(os.environ["CONTEXT_VAR"])\nv' }));
    // The context's envs came back with its new kernel; its variables did not.
    expect(text(after)).toBe('one\n');
    expect(after.find((e) => e.type === 'error')).toMatchObject({ name: 'NameError' });

    // Deleting a context ends what its kernel started too.
    const child = Number(mainResult(await collect(await service.run(principal, SANDBOX, { contextId: two.id, code: 'import subprocess\nsubprocess.Popen(["sleep", "300"]).pid' }))));
    expect(isAlive(child)).toBe(true);
    await service.deleteContext(principal, SANDBOX, two.id);
    expect(isAlive(child)).toBe(false);
    expect((await service.listContexts(principal, SANDBOX)).map((c) => c.id)).not.toContain(two.id);
    expect((await refusal(() => service.run(principal, SANDBOX, { contextId: two.id, code: '1' }))).code).toBe('not_found');
    expect((await refusal(() => service.restartContext(principal, SANDBOX, two.id))).code).toBe('not_found');
    expect((await refusal(() => service.deleteContext(principal, SANDBOX, 'no-such-context'))).code).toBe('not_found');
    await service.deleteContext(principal, SANDBOX, one.id);
  });

  it('interrupts a cell at its timeout; the context keeps its state; envs last one run', async () => {
    await collect(await service.run(principal, SANDBOX, { code: 'kept = 5' }));
    const timedOut = await collect(await service.run(principal, SANDBOX, { code: 'import time\nwhile True: time.sleep(0.05)', timeoutMs: 1000 }));
    expect(timedOut.at(-1)).toMatchObject({ type: 'end', status: 'interrupted' });
    const env = await collect(await service.run(principal, SANDBOX, { code: 'import os\nprint(os.environ.get("RUN_VAR"))\nkept', envs: { RUN_VAR: 'now' } }));
    expect(text(env)).toBe('now\n');
    expect(mainResult(env)).toBe('5');
    expect(text(await collect(await service.run(principal, SANDBOX, { code: 'print(os.environ.get("RUN_VAR"))' })))).toBe('None\n');
  });

  it('starts a context whose kernel died again on its next cell, fresh', async () => {
    const context = await service.createContext(principal, SANDBOX, {});
    await collect(await service.run(principal, SANDBOX, { contextId: context.id, code: 'gone = 1' }));
    const lost = await collect(await service.run(principal, SANDBOX, { contextId: context.id, code: 'import os\nos._exit(1)' }));
    expect(lost.at(-1)).toEqual({ type: 'end', status: 'lost' });
    const next = await collect(await service.run(principal, SANDBOX, { contextId: context.id, code: "'gone' in dir()" }));
    expect(mainResult(next)).toBe('False');
    await service.deleteContext(principal, SANDBOX, context.id);
  });

  it('refuses unknown languages naming the field; runs scripts', async () => {
    const ruby = await refusal(() => service.createContext(principal, SANDBOX, { language: 'ruby' }));
    expect(ruby).toMatchObject({ code: 'validation_failed', details: { field: 'language' } });
    const r = await refusal(() => service.run(principal, SANDBOX, { language: 'r', code: '1' }));
    expect(r.code).toBe('validation_failed');
    expect(r.message).toMatch(/^language: this image has no Jupyter kernel for r/);
    const script = await service.runScript(principal, SANDBOX, { language: 'python', code: 'import sys\nprint(sys.argv[1:])', argv: ['z'] });
    expect(script).toEqual({ exitCode: 0, output: "['z']\n", charts: [], timedOut: false });
    expect((await refusal(() => service.runScript(principal, SANDBOX, { language: 'bash' as 'python', code: '' }))).code).toBe('validation_failed');
  });

  it('answers an aborted caller with the interrupted end and keeps the queue moving', async () => {
    const abort = new AbortController();
    const slow = service.run(principal, SANDBOX, { code: 'import time\ntime.sleep(30)' }, { signal: abort.signal }).then(collect);
    const queued = service.run(principal, SANDBOX, { code: '"next"' }).then(collect);
    await sleep(1000);
    abort.abort();
    expect((await slow).at(-1)).toMatchObject({ type: 'end', status: 'interrupted' });
    expect(mainResult(await queued)).toBe("'next'");
  });
});

// The same service against a real sandbox of the built-in `code-interpreter` image (built by
// the suite's global setup), with no way out (deny-all egress): every language's kernel.
describe('code interpreter service in a code-interpreter sandbox', () => {
  let t: TestServer;
  let id: string;
  let p: Principal;
  let service: CodeInterpreterService;

  beforeAll(async () => {
    t = await startTestServer();
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ image: 'code-interpreter', timeoutSeconds: 0, memoryMiB: 2048, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    id = created.body.id;
    p = await t.server.services.auth.authenticate(t.apiKey);
    service = t.server.services.codeInterpreter;
  }, 300_000);
  afterAll(async () => {
    await t?.close();
  });

  const run = async (input: Parameters<CodeInterpreterService['run']>[2]) => collect(await service.run(p, id, input));

  it('has a kernel for every language', async () => {
    expect((await service.languages(p, id)).sort()).toEqual(['bash', 'javascript', 'python', 'r', 'typescript']);
  });

  it('runs python with the data stack: a chart and a DataFrame; default contexts are listed', async () => {
    const chart = await run({ code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.title("In a sandbox")\nplt.show()' });
    const figure = chart.find((e) => e.type === 'result') as { data: Record<string, any> };
    expect(figure.data[CHART_MIME]).toMatchObject({ type: 'line', title: 'In a sandbox', elements: [{ points: [[1, 3], [2, 4]] }] });
    expect(typeof figure.data['image/png']).toBe('string');
    const frame = await run({ code: 'import pandas as pd\npd.DataFrame({"a": [1, 2]})' });
    expect((frame.find((e) => e.type === 'result') as { data: Record<string, any> }).data[DATAFRAME_MIME]).toEqual({ a: [1, 2] });
    expect((await service.listContexts(p, id)).map((c) => c.id)).toContain('default-python');
  });

  it('refuses a cwd the context\'s account cannot enter as a 400 naming cwd', async () => {
    const refused = await refusal(() => service.createContext(p, id, { language: 'python', user: 'user', cwd: '/root' }));
    expect(refused.code).toBe('validation_failed');
    expect(refused.message, JSON.stringify(refused.details)).toMatch(/^cwd: /);
  });

  it('makes each print one write, so its text and newline reach the client together', async () => {
    // The built-in print() writes its arguments, separators and end apart, and ipykernel flushes
    // its stream on a timer: a flush between two of them split one print into two stdout events.
    // The display hooks' print composes the text first; counted here at the stream's write().
    const events = await run({
      code: 'import sys\nwrites = []\nwrite = sys.stdout.write\nsys.stdout.write = lambda t: (writes.append(t), write(t))[1]\nprint("a", "b", 3)\nprint("c", end="!\\n")\nsys.stdout.write = write\nwrites',
    });
    expect(mainResult(events)).toBe("['a b 3\\n', 'c!\\n']");
    expect(text(events)).toBe('a b 3\nc!\n');
  });

  it('runs JavaScript and TypeScript contexts, with state, errors and envs', async () => {
    const js = await service.createContext(p, id, { language: 'javascript' });
    expect(text(await run({ contextId: js.id, code: 'let n = 40;\nconsole.log("js", n + 2)' }))).toBe('js 42\n');
    expect(mainResult(await run({ contextId: js.id, code: 'n + 1' }))).toBe('41');
    const failed = await run({ contextId: js.id, code: 'throw new Error("boom")' });
    expect(failed.find((e) => e.type === 'error')).toMatchObject({ value: expect.stringContaining('boom') });
    expect(text(await run({ contextId: js.id, code: 'console.log(Deno.env.get("JS_VAR"))', envs: { JS_VAR: 'set' } }))).toBe('set\n');
    expect(text(await run({ contextId: js.id, code: 'console.log(Deno.env.get("JS_VAR"))' }))).toBe('undefined\n');
    const ts = await run({ language: 'typescript', code: 'const t: number = 2;\nconsole.log(t * 21)' });
    expect(text(ts)).toBe('42\n');
  });

  it('runs a bash context with state and envs for one run', async () => {
    const bash = await service.createContext(p, id, { language: 'bash' });
    await run({ contextId: bash.id, code: 'KEPT=yes' });
    expect(text(await run({ contextId: bash.id, code: 'echo "$KEPT $ONE_RUN"', envs: { ONE_RUN: 'now' } }))).toBe('yes now\n');
    expect(text(await run({ contextId: bash.id, code: 'echo "${ONE_RUN:-unset}"' }))).toBe('unset\n');
  });

  it('runs an R context', async () => {
    expect(text(await run({ language: 'r', code: 'x <- 40\ncat(x + 2, "\\n")' }))).toBe('42 \n');
    expect(text(await run({ language: 'r', code: 'cat(Sys.getenv("R_VAR"), "\\n")', envs: { R_VAR: 'r-set' } }))).toBe('r-set \n');
    expect(text(await run({ language: 'r', code: 'cat(Sys.getenv("R_VAR", unset = "none"), "\\n")' }))).toBe('none \n');
  });

  it('interrupts a runaway python cell at its timeout; restart and delete', async () => {
    const context = await service.createContext(p, id, { language: 'python' });
    await run({ contextId: context.id, code: 'kept = 1' });
    const timedOut = await run({ contextId: context.id, code: 'while True: pass', timeoutMs: 1500 });
    expect(timedOut.at(-1)).toMatchObject({ type: 'end', status: 'interrupted' });
    expect(mainResult(await run({ contextId: context.id, code: 'kept' }))).toBe('1');
    await service.restartContext(p, id, context.id);
    expect((await run({ contextId: context.id, code: 'kept' })).find((e) => e.type === 'error')).toMatchObject({ name: 'NameError' });
    await service.deleteContext(p, id, context.id);
    expect((await service.listContexts(p, id)).map((c) => c.id)).not.toContain(context.id);
  });

  it('runs scripts: python with a chart, javascript and typescript with Node', async () => {
    const python = await service.runScript(p, id, { language: 'python', code: 'import sys, matplotlib.pyplot as plt\nprint(sys.argv[1:])\nplt.bar(["a"], [1])\nplt.show()', argv: ['x'] });
    expect(python).toMatchObject({ exitCode: 0, output: "['x']\n", timedOut: false, charts: [{ type: 'bar' }] });
    const js = await service.runScript(p, id, { language: 'javascript', code: 'console.log(process.argv.slice(2))', argv: ['a'] });
    expect(js).toMatchObject({ exitCode: 0, output: "[ 'a' ]\n" });
    const ts = await service.runScript(p, id, { language: 'typescript', code: 'const n: number = 3;\nconsole.log(n)\nprocess.exit(5)' });
    expect(ts).toMatchObject({ exitCode: 5, output: '3\n' });
  });
});
