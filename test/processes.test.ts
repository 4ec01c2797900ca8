// Processes, streams, stdin, signals, terminals and sessions through the native API, on the
// real local driver.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { outputOf, readEvents, startTestServer, waitFor, type TestServer } from './harness.js';

let t: TestServer;
let id: string;

beforeAll(async () => {
  t = await startTestServer();
  const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 512 });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  id = created.body.id;
});
afterAll(async () => {
  await t?.close();
});

const api = () => `/api/v1/sandboxes/${id}`;
const detach = async (body: Record<string, unknown>) => {
  const res = await t.http.post(`${api()}/commands`).set(t.auth).send({ detach: true, ...body });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  return res.body as { processId: string; pid: number; status: string };
};
const info = async (processId: string) => (await t.http.get(`${api()}/commands/${processId}`).set(t.auth)).body;
const finished = (processId: string) => waitFor(`process ${processId} to end`, async () => {
  const p = await info(processId);
  return p.status !== 'running' ? p : undefined;
}, 30_000, 50);
const logs = async (processId: string, query: Record<string, string | number> = {}) =>
  (await t.http.get(`${api()}/commands/${processId}/logs`).query(query).set(t.auth)).body;

describe('detached processes', () => {
  it('starts at once, then reports status, exit code and output by offset', async () => {
    const p = await detach({ cmd: 'echo out; echo err >&2; sleep 0.3; exit 4' });
    expect(p.processId).toBeTruthy();
    expect(p.status).toBe('running');
    const done = await finished(p.processId);
    expect(done).toMatchObject({ status: 'exited', exitCode: 4 });
    const all = await logs(p.processId);
    expect(all).toMatchObject({ stdout: 'out\n', stderr: 'err\n', stdoutOffset: 4, stderrOffset: 4, status: 'exited', exitCode: 4 });
    const rest = await logs(p.processId, { stdoutOffset: 2, stderrOffset: 4 });
    expect(rest).toMatchObject({ stdout: 't\n', stderr: '' });
  });

  it('loses nothing and repeats nothing when a stream is resumed from its offsets', async () => {
    const lines = 3000;
    const expected = Array.from({ length: lines }, (_, i) => `line ${i + 1}`).join('\n') + '\n';
    const p = await detach({ cmd: `for i in $(seq 1 ${lines}); do echo "line $i"; if (( i % 300 == 0 )); then sleep 0.05; fi; done` });
    const url = `${t.url}${api()}/commands/${p.processId}/stream`;
    // First connection: stop after a few chunks, mid-output.
    const first = await readEvents<{ type: string; offset: number; data: string }>(url, t.auth, (_e, all) => all.filter((x) => x.type === 'stdout').length >= 3);
    const firstText = outputOf(first, 'stdout');
    const last = first.filter((e) => e.type === 'stdout').at(-1)!;
    const resumeAt = last.offset + Buffer.from(last.data, 'base64').length;
    expect(resumeAt).toBe(Buffer.byteLength(firstText));
    // Second connection continues from where the first stopped, through to the exit event.
    const second = await readEvents<{ type: string; offset: number; data: string; exitCode?: number }>(`${url}?stdoutOffset=${resumeAt}&stderrOffset=0`, t.auth, (e) => e.type === 'exit');
    expect(second.filter((e) => e.type === 'stdout')[0].offset).toBe(resumeAt);
    expect(firstText + outputOf(second, 'stdout')).toBe(expected);
    expect(second.at(-1)).toMatchObject({ type: 'exit', exitCode: 0 });
    // And the logs endpoint, read in small pages, gives the same bytes.
    let offset = 0;
    let paged = '';
    for (let page = 0; page < 200; page++) {
      const chunk = await logs(p.processId, { stdoutOffset: offset, stderrOffset: 0, maxBytes: 4096 });
      paged += chunk.stdout;
      if (chunk.stdoutOffset === offset) break;
      offset = chunk.stdoutOffset;
    }
    expect(paged).toBe(expected);
  });

  it('streams over a WebSocket too', async () => {
    const p = await detach({ cmd: 'for i in 1 2 3; do echo ws$i; sleep 0.05; done' });
    const ws = new WebSocket(`${t.url.replace('http', 'ws')}${api()}/commands/${p.processId}/stream`, { headers: t.auth });
    const messages: { type: string; data?: string; exitCode?: number }[] = [];
    await new Promise<void>((resolve, reject) => {
      ws.on('message', (m) => messages.push(JSON.parse(String(m))));
      ws.on('close', () => resolve());
      ws.on('error', reject);
      setTimeout(() => reject(new Error('no close')), 20_000);
    });
    expect(outputOf(messages, 'stdout')).toBe('ws1\nws2\nws3\n');
    expect(messages.at(-1)).toMatchObject({ type: 'exit', exitCode: 0 });
  });

  it('round-trips stdin and ends on close', async () => {
    const p = await detach({ cmd: 'cat', stdin: true });
    const w = await t.http.post(`${api()}/commands/${p.processId}/stdin`).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from('hello stdin\n'));
    expect(w.status).toBe(204);
    await waitFor('the echo', async () => ((await logs(p.processId)).stdout === 'hello stdin\n' ? true : undefined), 10_000, 50);
    expect((await t.http.post(`${api()}/commands/${p.processId}/stdin/close`).set(t.auth)).status).toBe(204);
    expect(await finished(p.processId)).toMatchObject({ status: 'exited', exitCode: 0 });
    const late = await t.http.post(`${api()}/commands/${p.processId}/stdin`).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from('x'));
    expect(late.status).toBe(409);
  });

  it('delivers signals, kills, and lists running and finished processes', async () => {
    const trap = await detach({ cmd: "trap 'echo got USR1; exit 7' USR1; echo ready; while true; do sleep 0.05; done" });
    await waitFor('ready', async () => ((await logs(trap.processId)).stdout === 'ready\n' ? true : undefined), 10_000, 50);
    const sleeper = await detach({ cmd: 'sleep 300', tag: 'long one' });
    const running = (await t.http.get(`${api()}/commands`).set(t.auth)).body.processes as { processId: string; tag: string | null }[];
    expect(running.map((p) => p.processId)).toEqual(expect.arrayContaining([trap.processId, sleeper.processId]));
    expect(running.find((p) => p.processId === sleeper.processId)?.tag).toBe('long one');

    expect((await t.http.post(`${api()}/commands/${trap.processId}/signal`).set(t.auth).send({ signal: 'SIGUSR1' })).status).toBe(204);
    expect(await finished(trap.processId)).toMatchObject({ status: 'exited', exitCode: 7 });
    expect((await logs(trap.processId)).stdout).toBe('ready\ngot USR1\n');

    expect((await t.http.delete(`${api()}/commands/${sleeper.processId}`).set(t.auth)).status).toBe(204);
    expect(await finished(sleeper.processId)).toMatchObject({ status: 'killed', signal: 'SIGKILL' });
    const all = (await t.http.get(`${api()}/commands`).query({ all: true }).set(t.auth)).body.processes as { processId: string }[];
    expect(all.map((p) => p.processId)).toEqual(expect.arrayContaining([trap.processId, sleeper.processId]));
    const after = (await t.http.get(`${api()}/commands`).set(t.auth)).body.processes as { processId: string }[];
    expect(after.map((p) => p.processId)).not.toContain(sleeper.processId);
  });

  it('refuses bad process requests with clear errors', async () => {
    expect((await t.http.get(`${api()}/commands/nosuchprocess`).set(t.auth)).status).toBe(404);
    const bad = await t.http.post(`${api()}/commands/nosuchprocess/signal`).set(t.auth).send({ signal: 'SIGNOPE' });
    expect(bad.status).toBe(400);
    expect(bad.body.error.message).toMatch(/^signal/);
    const both = await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd: 'true', argv: ['true'] });
    expect(both.status).toBe(400);
    const fgOnly = await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd: 'true', tag: 'x' });
    expect(fgOnly.status).toBe(400);
    expect(fgOnly.body.error.message).toMatch(/^tag/);
  });
});

describe('users', () => {
  it('runs as root in /root by default (the native API\'s documented user); a named user gets its home, and sudo works', async () => {
    const run = async (body: Record<string, unknown>) => {
      const res = await t.http.post(`${api()}/commands`).set(t.auth).send(body);
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      return res.body as { exitCode: number; stdout: string };
    };
    expect((await run({ cmd: 'whoami; pwd; echo $HOME' })).stdout).toBe('root\n/root\n/root\n');
    expect((await run({ cmd: 'whoami; pwd; echo "$HOME $USER"; id -u', user: 'user' })).stdout).toBe('user\n/home/user\n/home/user user\n1000\n');
    expect((await run({ cmd: 'whoami; id -u', user: 'daytona' })).stdout).toBe('daytona\n1001\n');
    expect(await run({ cmd: 'sudo -n whoami', user: 'user' })).toMatchObject({ exitCode: 0, stdout: 'root\n' });
    expect((await run({ cmd: 'python --version' })).stdout).toMatch(/^Python 3\./);
    const written = await t.http.put(`${api()}/files`).query({ path: 'native-default.txt' }).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from('n'));
    expect(written.status, JSON.stringify(written.body)).toBeLessThan(300);
    expect((await run({ cmd: 'stat -c %U /root/native-default.txt' })).stdout).toBe('root\n');
    const unknown = await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd: 'true', user: 'no-such-user' });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error.message).toMatch(/user/);
  });
});

describe('terminals', () => {
  it('runs an interactive bash over a WebSocket: input, output, resize, exit code', async () => {
    const created = await t.http.post(`${api()}/terminals`).set(t.auth).send({ cols: 100, rows: 30 });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const processId = created.body.processId as string;
    const ws = new WebSocket(`${t.url.replace('http', 'ws')}${api()}/commands/${processId}/pty`, { headers: t.auth });
    let screen = '';
    let exit: { exitCode?: number } | undefined;
    const closed = new Promise<void>((resolve) => ws.on('close', () => resolve()));
    ws.on('message', (data, isBinary) => {
      if (isBinary) screen += Buffer.from(data as Buffer).toString('utf8');
      else exit = JSON.parse(String(data));
    });
    await new Promise((r) => ws.on('open', r));
    ws.send(Buffer.from('echo $((6*7))\r'), { binary: true });
    await waitFor("42 on the terminal", async () => (/[\r\n]42\r?\n/.test(screen) ? true : undefined), 15_000, 50);
    ws.send(JSON.stringify({ type: 'resize', cols: 120, rows: 40 }));
    await new Promise((r) => setTimeout(r, 200));
    ws.send(Buffer.from('stty size\r'), { binary: true });
    await waitFor('the new size', async () => (screen.includes('40 120') ? true : undefined), 15_000, 50);
    ws.send(Buffer.from('exit 5\r'), { binary: true });
    await closed;
    expect(exit).toMatchObject({ type: 'exit', exitCode: 5 });
  });
});

describe('sessions', () => {
  it('keeps cwd and environment between commands, with an exit code and logs per command', async () => {
    const s = await t.http.post(`${api()}/sessions`).set(t.auth).send({ sessionId: 'build' });
    expect(s.status, JSON.stringify(s.body)).toBe(201);
    const first = await t.http.post(`${api()}/sessions/build/commands`).set(t.auth).send({ cmd: 'cd /tmp && export FOO=bar && echo set' });
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ exitCode: 0, stdout: 'set\n' });
    const second = await t.http.post(`${api()}/sessions/build/commands`).set(t.auth).send({ cmd: 'pwd; echo $FOO; echo warn >&2; false' });
    expect(second.body).toMatchObject({ exitCode: 1, stdout: '/tmp\nbar\n', stderr: 'warn\n' });
    const asyncRun = await t.http.post(`${api()}/sessions/build/commands`).set(t.auth).send({ cmd: 'sleep 0.2; echo later', async: true });
    expect(asyncRun.status).toBe(202);
    const commandId = asyncRun.body.commandId as string;
    await waitFor('async command', async () => {
      const c = await t.http.get(`${api()}/sessions/build/commands/${commandId}`).set(t.auth);
      return c.body.status === 'exited' ? c.body : undefined;
    }, 15_000, 50);
    expect((await logs(commandId)).stdout).toBe('later\n');
    const listed = await t.http.get(`${api()}/sessions`).set(t.auth);
    expect(listed.body.sessions.map((x: { sessionId: string }) => x.sessionId)).toContain('build');
    expect((await t.http.post(`${api()}/sessions`).set(t.auth).send({ sessionId: 'build' })).status).toBe(409);
    expect((await t.http.delete(`${api()}/sessions/build`).set(t.auth)).status).toBe(204);
    expect((await t.http.get(`${api()}/sessions/build`).set(t.auth)).status).toBe(404);
  });
});

describe('containment', () => {
  it('a fork bomb and a memory hog hit the sandbox limits; the agent keeps answering', { timeout: 180_000 }, async () => {
    const bomb = await detach({ cmd: 'bomb() { bomb | bomb & }; bomb', timeoutMs: 20_000 });
    await new Promise((r) => setTimeout(r, 2000));
    const during = await t.http.post(`${api()}/commands`).set(t.auth).send({ argv: ['/bin/true'], timeoutMs: 10_000 });
    // Spawning may fail while pids are exhausted, but the API answers (no hang, no 500).
    expect([200, 400]).toContain(during.status);
    expect((await t.http.delete(`${api()}/commands/${bomb.processId}`).set(t.auth)).status).toBe(204);
    await waitFor('the sandbox to calm down', async () => {
      const r = await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd: 'ps -e --no-headers | wc -l', timeoutMs: 5_000 });
      return r.status === 200 && Number(r.body.stdout.trim()) < 20 ? true : undefined;
    }, 60_000, 500);
    const hog = await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd: 'python3 -c "a = bytearray(2 * 1024**3); print(len(a))"', timeoutMs: 60_000 });
    expect(hog.status).toBe(200);
    expect(hog.body.exitCode).not.toBe(0);
    const ok = await t.http.post(`${api()}/commands`).set(t.auth).send({ cmd: 'echo still here' });
    expect(ok.body.stdout).toBe('still here\n');
  });
});
