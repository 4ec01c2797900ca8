import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ProcessEvent } from '../../agent-protocol/processes.js';
import { collectEvents, startProcessTestAgent, waitUntil, type ProcessTestAgent } from './test-support.js';

const SEQ_LINES = 20_000;
const expectedSeq = execFileSync('seq', ['1', String(SEQ_LINES)]).toString();
// Prints 1..20000, pausing every 500 lines, so readers can disconnect mid-output.
const SLOW_SEQ = `for i in $(seq 1 ${SEQ_LINES}); do echo $i; if [ $((i % 500)) = 0 ]; then sleep 0.02; fi; done`;

function processesOfUid(uid: number): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (statSync(`/proc/${entry}`).uid !== uid) continue;
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
      if (state !== 'Z') found.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

describe('detached processes', () => {
  let agent: ProcessTestAgent;

  beforeAll(async () => {
    agent = await startProcessTestAgent();
  });
  afterAll(async () => {
    await agent.stop();
  });

  it('starts detached, reports status and output with offsets', async () => {
    const started = await agent.start({ cmd: 'printf "out1\\n"; printf "err1\\n" >&2; sleep 0.2; printf "out2\\n"; exit 3', tag: 'demo' });
    expect(started).toMatchObject({ processId: expect.stringMatching(/^p\d+$/), status: 'running', cmd: 'bash', args: ['-lc', expect.any(String)], tag: 'demo', user: 'root', pty: false, exitCode: null, endedAt: null });
    expect(started.pid).toBeGreaterThan(1);
    expect(started.cwd).toBe(agent.home);
    const ended = await agent.waitForEnd(started.processId);
    expect(ended).toMatchObject({ status: 'exited', exitCode: 3, signal: null, timedOut: false, stdout: { bytes: 10, retainedFrom: 0 }, stderr: { bytes: 5, retainedFrom: 0 } });
    expect(Date.parse(ended.endedAt as string)).toBeGreaterThanOrEqual(Date.parse(ended.startedAt));

    const all = await agent.call('GET', `/processes/${started.processId}/output`);
    expect(all.json).toEqual({ stdout: 'out1\nout2\n', stderr: 'err1\n', stdoutOffset: 10, stderrOffset: 5, stdoutRetainedFrom: 0, stderrRetainedFrom: 0, encoding: 'utf8', status: 'exited', exitCode: 3, signal: null });
    const tail = await agent.call('GET', `/processes/${started.processId}/output?stdoutOffset=5&stderrOffset=5`);
    expect(tail.json).toMatchObject({ stdout: 'out2\n', stderr: '', stdoutOffset: 10, stderrOffset: 5 });
    const both = await agent.call('GET', `/processes/${started.processId}/output?offset=2&maxBytes=3&encoding=base64`);
    expect(both.json).toMatchObject({ stdout: Buffer.from('t1\no').toString('base64').slice(0, 4), stdoutOffset: 5, stderr: Buffer.from('r1\n').toString('base64'), stderrOffset: 5, encoding: 'base64' });
  });

  it('never cuts a UTF-8 character and reports the offset accordingly', async () => {
    const started = await agent.start({ argv: ['printf', 'a€b'] }); // € is 3 bytes
    await agent.waitForEnd(started.processId);
    const first = await agent.call('GET', `/processes/${started.processId}/output?maxBytes=2`);
    expect(first.json).toMatchObject({ stdout: 'a', stdoutOffset: 1 });
    const second = await agent.call('GET', `/processes/${started.processId}/output?stdoutOffset=1&maxBytes=2`);
    expect(second.json).toMatchObject({ stdout: '€', stdoutOffset: 4 }); // one whole character, even above maxBytes
    const rest = await agent.call('GET', `/processes/${started.processId}/output?stdoutOffset=4`);
    expect(rest.json).toMatchObject({ stdout: 'b', stdoutOffset: 5 });
  });

  it('resumes via /output from offsets without losing or repeating anything', async () => {
    const started = await agent.start({ cmd: SLOW_SEQ });
    let text = '';
    let offset = 0;
    for (let round = 0; round < 5000; round += 1) {
      const { json } = await agent.call('GET', `/processes/${started.processId}/output?stdoutOffset=${offset}&maxBytes=4096`);
      expect(json.stdoutRetainedFrom).toBe(0);
      text += json.stdout;
      offset = json.stdoutOffset;
      if (json.status !== 'running' && json.stdout === '') break;
      if (json.stdout === '') await sleep(10);
    }
    expect(text).toBe(expectedSeq);
  });

  it('resumes via events from offsets without losing or repeating anything', async () => {
    const started = await agent.start({ cmd: SLOW_SEQ });
    const url = agent.wsUrl(`/processes/${started.processId}/events`);
    const first = await collectEvents(url, (collected) => collected.stdout.length > 20_000);
    expect(first.events.some((event) => event.type === 'exit')).toBe(false);
    // Chunk offsets are contiguous: each starts where the previous ended.
    let position = 0;
    for (const event of first.events) {
      if (event.type !== 'stdout') continue;
      expect(event.offset).toBe(position);
      position += Buffer.from(event.data, 'base64').length;
    }
    const second = await collectEvents(`${url}?stdoutOffset=${first.stdout.length}&stderrOffset=0`);
    expect(second.closeCode).toBe(1000);
    const firstChunk = second.events.find((event) => event.type === 'stdout') as Extract<ProcessEvent, { type: 'stdout' | 'stderr' }>;
    expect(firstChunk.offset).toBe(first.stdout.length);
    expect(Buffer.concat([first.stdout, second.stdout]).toString()).toBe(expectedSeq);
    expect(second.events.at(-1)).toEqual({ type: 'exit', status: 'exited', exitCode: 0, signal: null, timedOut: false });
  });

  it('serves events as Server-Sent Events', async () => {
    const started = await agent.start({ cmd: 'echo one; echo two >&2; exit 5' });
    const response = await agent.client.request({ method: 'GET', path: `/processes/${started.processId}/events`, headers: { accept: 'text/event-stream' } });
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toBe('text/event-stream');
    let body = '';
    for await (const chunk of response) body += chunk.toString();
    const events = body
      .split('\n\n')
      .filter((block) => block.startsWith('data: '))
      .map((block) => JSON.parse(block.slice('data: '.length)) as ProcessEvent);
    const text = (type: 'stdout' | 'stderr') =>
      events
        .filter((event) => event.type === type)
        .map((event) => Buffer.from((event as { data: string }).data, 'base64').toString())
        .join('');
    expect(text('stdout')).toBe('one\n');
    expect(text('stderr')).toBe('two\n');
    expect(events.at(-1)).toEqual({ type: 'exit', status: 'exited', exitCode: 5, signal: null, timedOut: false });
  });

  it('sends keepalives while idle', async () => {
    const quick = await startProcessTestAgent({ processes: { keepaliveIntervalMs: 50 } });
    try {
      const started = await quick.start({ argv: ['sleep', '0.4'] });
      const collected = await collectEvents(quick.wsUrl(`/processes/${started.processId}/events`));
      expect(collected.events.filter((event) => event.type === 'keepalive').length).toBeGreaterThanOrEqual(2);
      expect(collected.events.at(-1)?.type).toBe('exit');
    } finally {
      await quick.stop();
    }
  });

  it('round-trips stdin through cat, and closing stdin ends cat', async () => {
    const started = await agent.start({ argv: ['cat'], stdin: true });
    const write = await agent.call('POST', `/processes/${started.processId}/stdin`, 'hello ');
    expect(write.status).toBe(204);
    await agent.call('POST', `/processes/${started.processId}/stdin`, Buffer.from('wörld\n'));
    const echoed = await waitUntil(async () => {
      const { json } = await agent.call('GET', `/processes/${started.processId}/output`);
      return json.stdout === 'hello wörld\n' ? json : undefined;
    });
    expect(echoed.status).toBe('running');
    expect((await agent.call('POST', `/processes/${started.processId}/stdin/close`)).status).toBe(204);
    expect(await agent.waitForEnd(started.processId)).toMatchObject({ status: 'exited', exitCode: 0 });
    const late = await agent.call('POST', `/processes/${started.processId}/stdin`, 'more');
    expect(late.status).toBe(409);
    expect(late.json.error.code).toBe('invalid_state');
  });

  it('answers 409 for stdin after close while the process still runs, and for stdin: false', async () => {
    const started = await agent.start({ cmd: 'sleep 5', stdin: true });
    await agent.call('POST', `/processes/${started.processId}/stdin/close`);
    const closed = await agent.call('POST', `/processes/${started.processId}/stdin`, 'x');
    expect(closed.status).toBe(409);
    expect(closed.json.error).toMatchObject({ code: 'invalid_state', message: expect.stringContaining('stdin') });
    const noStdin = await agent.start({ argv: ['cat'] }); // stdin defaults to closed: cat ends at once
    expect(await agent.waitForEnd(noStdin.processId)).toMatchObject({ exitCode: 0 });
    await agent.call('DELETE', `/processes/${started.processId}`);
  });

  it('delivers signals to the process group (a bash trap)', async () => {
    const started = await agent.start({ cmd: 'trap "echo got-usr1" USR1; echo ready; for i in $(seq 1 200); do sleep 0.05; done' });
    await waitUntil(async () => ((await agent.call('GET', `/processes/${started.processId}/output`)).json.stdout === 'ready\n' ? true : undefined));
    expect((await agent.call('POST', `/processes/${started.processId}/signal`, { signal: 'SIGUSR1' })).status).toBe(204);
    await waitUntil(async () => ((await agent.call('GET', `/processes/${started.processId}/output`)).json.stdout.includes('got-usr1') ? true : undefined));
    await agent.call('POST', `/processes/${started.processId}/signal`, { signal: 'SIGTERM' });
    expect(await agent.waitForEnd(started.processId)).toMatchObject({ status: 'killed', exitCode: null, signal: 'SIGTERM', timedOut: false });
    const late = await agent.call('POST', `/processes/${started.processId}/signal`, { signal: 'SIGTERM' });
    expect(late.status).toBe(409);
  });

  it('kills the whole process group with DELETE, and DELETE of an ended process is a no-op', async () => {
    const started = await agent.start({ cmd: 'sleep 30 & sleep 30 & wait' });
    await sleep(100);
    expect((await agent.call('DELETE', `/processes/${started.processId}`)).status).toBe(204);
    const ended = await agent.waitForEnd(started.processId);
    expect(ended).toMatchObject({ status: 'killed', signal: 'SIGKILL', timedOut: false });
    expect((await agent.call('DELETE', `/processes/${started.processId}`)).status).toBe(204);
  });

  it('kills on timeout', async () => {
    const startedAt = Date.now();
    const started = await agent.start({ cmd: 'echo before; sleep 30', timeoutMs: 300 });
    const ended = await agent.waitForEnd(started.processId);
    expect(ended).toMatchObject({ status: 'killed', timedOut: true, exitCode: null, signal: 'SIGKILL' });
    expect(Date.now() - startedAt).toBeLessThan(5_000);
    expect((await agent.call('GET', `/processes/${started.processId}/output`)).json.stdout).toBe('before\n');
  });

  it('lists running processes by default and the history with all=true, newest first', async () => {
    const running = await agent.start({ argv: ['sleep', '30'], tag: 'listed' });
    const finished = await agent.start({ argv: ['true'] });
    await agent.waitForEnd(finished.processId);
    const { json: runningList } = await agent.call('GET', '/processes');
    expect(runningList.processes.every((process: { status: string }) => process.status === 'running')).toBe(true);
    expect(runningList.processes.map((process: { processId: string }) => process.processId)).toContain(running.processId);
    const { json: allList } = await agent.call('GET', '/processes?all=true');
    const ids = allList.processes.map((process: { processId: string }) => process.processId);
    expect(ids).toContain(finished.processId);
    expect(ids.indexOf(finished.processId)).toBeLessThan(ids.indexOf(running.processId));
    await agent.call('DELETE', `/processes/${running.processId}`);
  });

  it('starts a missing program as a process that exits 127', async () => {
    const started = await agent.start({ argv: ['/no/such/program'] });
    const ended = await agent.waitForEnd(started.processId);
    expect(ended).toMatchObject({ status: 'exited', exitCode: 127 });
    expect((await agent.call('GET', `/processes/${started.processId}/output`)).json.stderr).toContain('command not found');
  });

  it('runs as another user, with oom_score_adj raised', async () => {
    const started = await agent.start({ cmd: 'id -u; id -g; echo $USER; cat /proc/self/oom_score_adj; pwd', user: 'nobody' });
    expect(started.user).toBe('nobody');
    expect(started.cwd).toBe('/'); // nobody's home does not exist
    await agent.waitForEnd(started.processId);
    expect((await agent.call('GET', `/processes/${started.processId}/output`)).json.stdout).toBe('65534\n65534\nnobody\n800\n/\n');
  });

  it.each([
    [{ cmd: 'true', cwd: '/no/such/dir' }, 'cwd'],
    [{ cmd: 'true', user: 'no-such-user' }, 'user'],
    [{ cmd: 'true', argv: ['true'] }, 'cmd'],
    [{ cmd: 'true', timeoutMs: -1 }, 'timeoutMs'],
    [{ cmd: 'true', pty: { cols: 0, rows: 10 } }, 'pty.cols'],
    [{ cmd: 'true', bogus: 1 }, 'bogus'],
  ])('answers 400 naming the field for %j', async (body, field) => {
    const { status, json } = await agent.call('POST', '/processes', body);
    expect(status).toBe(400);
    expect(json.error.code).toBe('validation_failed');
    expect(json.error.message.startsWith(field)).toBe(true);
  });

  it('answers the error cases of the per-process routes', async () => {
    for (const [method, path] of [
      ['GET', '/processes/p999999'],
      ['GET', '/processes/p999999/output'],
      ['POST', '/processes/p999999/stdin'],
      ['DELETE', '/processes/p999999'],
    ] as const) {
      const { status, json } = await agent.call(method, path);
      expect(status, `${method} ${path}`).toBe(404);
      expect(json.error.code).toBe('not_found');
    }
    const started = await agent.start({ argv: ['sleep', '30'] });
    const badSignal = await agent.call('POST', `/processes/${started.processId}/signal`, { signal: 'SIGFOO' });
    expect(badSignal.status).toBe(400);
    expect(badSignal.json.error.message.startsWith('signal')).toBe(true);
    const resize = await agent.call('POST', `/processes/${started.processId}/resize`, { cols: 100, rows: 30 });
    expect(resize.status).toBe(400);
    expect(resize.json.error.message.startsWith('pty')).toBe(true);
    const badOffset = await agent.call('GET', `/processes/${started.processId}/output?stdoutOffset=-1`);
    expect(badOffset.status).toBe(400);
    expect(badOffset.json.error.message.startsWith('stdoutOffset')).toBe(true);
    const plainEvents = await agent.call('GET', `/processes/${started.processId}/events`);
    expect(plainEvents.status).toBe(400);
    const wrongMethod = await agent.call('PUT', `/processes/${started.processId}`);
    expect(wrongMethod.status).toBe(405);
    await agent.call('DELETE', `/processes/${started.processId}`);
  });

  it('keeps /exec working next to the registry', async () => {
    expect(await agent.client.exec({ cmd: 'echo via-exec' })).toMatchObject({ exitCode: 0, stdout: 'via-exec\n' });
  });

  it('contains a fork bomb: the agent stays responsive and DELETE kills it', async () => {
    // Without the sandbox's pids.max, the bomb is bounded by RLIMIT_NPROC, which only binds a
    // non-root user: so it runs as nobody under prlimit. Killing needs no new process.
    expect(processesOfUid(65534)).toEqual([]);
    const started = await agent.start({ argv: ['prlimit', '--nproc=200:200', '--', 'bash', '-c', ':(){ :|:& };:'], user: 'nobody' });
    await sleep(500);
    const healthStarted = Date.now();
    expect((await agent.client.health()).status).toBe('ok');
    expect(Date.now() - healthStarted).toBeLessThan(2_000);
    expect((await agent.call('DELETE', `/processes/${started.processId}`)).status).toBe(204);
    // The bomb's first process had already exited 0; the DELETE still counts as a kill.
    expect(await agent.waitForEnd(started.processId, 15_000)).toMatchObject({ status: 'killed' });
    await waitUntil(() => (processesOfUid(65534).length === 0 ? true : undefined), 10_000, 'all fork-bomb processes gone');
  });
});

describe('bounds', () => {
  let agent: ProcessTestAgent;

  beforeAll(async () => {
    agent = await startProcessTestAgent({ processes: { maxFinishedProcesses: 3, maxRetainedBytesPerStream: 64 * 1024 } });
  });
  afterAll(async () => {
    await agent.stop();
  });

  it('forgets the oldest finished process beyond the history bound', async () => {
    const ids: string[] = [];
    for (let index = 0; index < 5; index += 1) {
      const started = await agent.start({ argv: ['true'] });
      await agent.waitForEnd(started.processId);
      ids.push(started.processId);
    }
    const { json } = await agent.call('GET', '/processes?all=true');
    expect(json.processes.map((process: { processId: string }) => process.processId)).toEqual(ids.slice(2).reverse());
    expect((await agent.call('GET', `/processes/${ids[0]}`)).status).toBe(404);
    expect((await agent.call('GET', `/processes/${ids[4]}`)).status).toBe(200);
  });

  it('drops the oldest output beyond the retained-bytes bound; offsets keep their meaning', async () => {
    const started = await agent.start({ cmd: 'seq 1 100000' });
    const ended = await agent.waitForEnd(started.processId);
    expect(ended.stdout.bytes).toBe(Buffer.byteLength(execFileSync('seq', ['1', '100000'])));
    expect(ended.stdout.retainedFrom).toBeGreaterThan(0);
    const { json } = await agent.call('GET', `/processes/${started.processId}/output?stdoutOffset=0&maxBytes=10000000`);
    expect(json.stdoutRetainedFrom).toBe(ended.stdout.retainedFrom);
    expect(json.stdoutOffset).toBe(ended.stdout.bytes);
    expect(json.stdout).toBe(execFileSync('seq', ['1', '100000']).subarray(ended.stdout.retainedFrom).toString());
    const events = await collectEvents(agent.wsUrl(`/processes/${started.processId}/events`));
    const firstChunk = events.events.find((event) => event.type === 'stdout') as { offset: number };
    expect(firstChunk.offset).toBe(ended.stdout.retainedFrom); // the gap is visible
  });
});
