// Core's code interpreter (core/services/code-interpreter.ts) over the real toolbox and a real
// guest agent: contexts, default contexts, the queue of cells, timeouts, restarts, envs.
//
// The guest agent runs in this process on the host (the way host/guest-agent tests run it),
// with the host's /usr/bin/python3 and Debian's IPython kernel (scripts/install-system-deps.sh);
// the toolbox reaches it as the sandbox `sbx-local`. (The same service against real sandboxes
// of the code-interpreter image, with its other languages, is in the second part below.)
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CodeEvent } from '../core/code-interpreter/types.js';
import { NestboxError } from '../core/errors.js';
import { CodeInterpreterService } from '../core/services/code-interpreter.js';
import { Toolbox } from '../core/services/toolbox.js';
import { SCOPES, type Principal } from '../core/types.js';
import { HttpGuestClient } from '../host/agent-protocol/guest-client.js';
import { startProcessTestAgent, type ProcessTestAgent } from '../host/guest-agent/processes/test-support.js';

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

    await service.deleteContext(principal, SANDBOX, two.id);
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
