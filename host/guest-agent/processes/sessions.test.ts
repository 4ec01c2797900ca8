import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { collectEvents, startProcessTestAgent, waitUntil, type ProcessTestAgent } from './test-support.js';

describe('sessions', () => {
  let agent: ProcessTestAgent;

  beforeAll(async () => {
    agent = await startProcessTestAgent({ processes: { maxSessions: 4 } });
  });
  afterAll(async () => {
    await agent.stop();
  });

  const run = async (sessionId: string, body: Record<string, unknown>) => agent.call('POST', `/sessions/${sessionId}/commands`, body);

  it('keeps cd, export and variables between commands, with an exit code and separate logs per command', async () => {
    const created = await agent.call('POST', '/sessions', { sessionId: 'persist', env: { GREETING: 'hi' } });
    expect(created.status).toBe(201);
    expect(created.json).toEqual({ sessionId: 'persist', createdAt: expect.any(String) });

    const first = await run('persist', { cmd: 'cd /tmp && export FOO=bar; LOCAL=kept; echo out; echo err >&2; exit_code_test() { return 4; }' });
    expect(first.status).toBe(200);
    expect(first.json).toMatchObject({ commandId: expect.stringMatching(/^p\d+$/), status: 'exited', exitCode: 0, stdout: 'out\n', stderr: 'err\n' });
    const second = await run('persist', { cmd: 'pwd; echo "$FOO $LOCAL $GREETING"; exit_code_test' });
    expect(second.json).toMatchObject({ exitCode: 4, stdout: '/tmp\nbar kept hi\n', stderr: '' });
    const third = await run('persist', { cmd: 'printf "no newline"; false' });
    expect(third.json).toMatchObject({ exitCode: 1, stdout: 'no newline' });

    const command = await agent.call('GET', `/sessions/persist/commands/${second.json.commandId}`);
    expect(command.json).toEqual({ commandId: second.json.commandId, cmd: expect.stringContaining('pwd'), status: 'exited', exitCode: 4, startedAt: expect.any(String), endedAt: expect.any(String) });
    // The command is also a process.
    const output = await agent.call('GET', `/processes/${second.json.commandId}/output`);
    expect(output.json).toMatchObject({ stdout: '/tmp\nbar kept hi\n', status: 'exited', exitCode: 4 });
    const session = await agent.call('GET', '/sessions/persist');
    expect(session.json.commands.map((entry: { commandId: string }) => entry.commandId)).toEqual([first.json.commandId, second.json.commandId, third.json.commandId]);
    expect((await agent.call('GET', '/sessions')).json.sessions.map((entry: { sessionId: string }) => entry.sessionId)).toContain('persist');
    expect((await agent.call('DELETE', '/sessions/persist')).status).toBe(204);
    expect((await agent.call('GET', '/sessions/persist')).status).toBe(404);
  });

  it('runs async commands, whose logs can be followed and read afterwards', async () => {
    await agent.call('POST', '/sessions', { sessionId: 'async' });
    const started = await run('async', { cmd: 'for i in 1 2 3; do echo line$i; sleep 0.1; done; echo done >&2; exit_status=9; (exit $exit_status)', async: true });
    expect(started.status).toBe(202);
    expect(started.json).toMatchObject({ status: 'running', exitCode: null, endedAt: null });
    const events = await collectEvents(agent.wsUrl(`/processes/${started.json.commandId}/events`));
    expect(events.stdout.toString()).toBe('line1\nline2\nline3\n');
    expect(events.stderr.toString()).toBe('done\n');
    expect(events.events.at(-1)).toMatchObject({ type: 'exit', status: 'exited', exitCode: 9 });
    const command = await agent.call('GET', `/sessions/async/commands/${started.json.commandId}`);
    expect(command.json).toMatchObject({ status: 'exited', exitCode: 9 });
    // Commands queue: the next one runs after the previous finished.
    const slow = await run('async', { cmd: 'sleep 0.3; echo slow', async: true });
    const next = await run('async', { cmd: 'echo next' });
    expect(next.json).toMatchObject({ exitCode: 0, stdout: 'next\n' });
    expect((await agent.call('GET', `/sessions/async/commands/${slow.json.commandId}`)).json.status).toBe('exited');
    await agent.call('DELETE', '/sessions/async');
  });

  it("runs the shell as the session's user, whose FIFOs it can read", async () => {
    await agent.call('POST', '/sessions', { sessionId: 'as-nobody', user: 'nobody' });
    const who = await run('as-nobody', { cmd: 'id -u; echo "$HOME $USER"; pwd' });
    expect(who.json.stdout).toBe('65534\n/nonexistent nobody\n/\n');
    const started = await run('as-nobody', { cmd: 'read name; echo "hi $name"', async: true, stdin: true });
    expect((await agent.call('POST', `/processes/${started.json.commandId}/stdin`, 'there\n')).status).toBe(204);
    const command = await waitUntil(async () => {
      const { json } = await agent.call('GET', `/sessions/as-nobody/commands/${started.json.commandId}`);
      return json.status === 'exited' ? json : undefined;
    });
    expect(command.exitCode).toBe(0);
    expect((await agent.call('GET', `/processes/${started.json.commandId}/output`)).json.stdout).toBe('hi there\n');
    expect((await agent.call('POST', '/sessions', { sessionId: 'bad-user', user: 'no-such-user' })).status).toBe(400);
    await agent.call('DELETE', '/sessions/as-nobody');
  });

  it('feeds stdin to a command that asked for it', async () => {
    await agent.call('POST', '/sessions', { sessionId: 'stdin' });
    // Queued behind a slow command: stdin written before its turn waits for it.
    await run('stdin', { cmd: 'sleep 0.2', async: true });
    const started = await run('stdin', { cmd: 'read name; echo "hello $name"; cat', async: true, stdin: true });
    expect((await agent.call('POST', `/processes/${started.json.commandId}/stdin`, 'world\nrest\n')).status).toBe(204);
    expect((await agent.call('POST', `/processes/${started.json.commandId}/stdin/close`)).status).toBe(204);
    const command = await waitUntil(async () => {
      const { json } = await agent.call('GET', `/sessions/stdin/commands/${started.json.commandId}`);
      return json.status === 'exited' ? json : undefined;
    });
    expect(command.exitCode).toBe(0);
    expect((await agent.call('GET', `/processes/${started.json.commandId}/output`)).json.stdout).toBe('hello world\nrest\n');
    // Without stdin: true, stdin is /dev/null and writes are refused.
    const plain = await run('stdin', { cmd: 'cat; echo after-cat', async: true });
    const refused = await agent.call('POST', `/processes/${plain.json.commandId}/stdin`, 'x');
    expect([409]).toContain(refused.status);
    await waitUntil(async () => ((await agent.call('GET', `/processes/${plain.json.commandId}`)).json.status === 'exited' ? true : undefined));
    await agent.call('DELETE', '/sessions/stdin');
  });

  it('ends the session cleanly when a command exits the shell', async () => {
    await agent.call('POST', '/sessions', { sessionId: 'ending' });
    const exit = await run('ending', { cmd: 'echo bye; exit 3' });
    expect(exit.json).toMatchObject({ status: 'exited', exitCode: 3, stdout: 'bye\n' });
    const later = await run('ending', { cmd: 'true' });
    expect(later.status).toBe(409);
    expect(later.json.error).toMatchObject({ code: 'invalid_state', message: expect.stringContaining('session ended') });
    expect((await agent.call('GET', '/sessions/ending')).json.commands).toHaveLength(1);
    await agent.call('DELETE', '/sessions/ending');
  });

  it('times out and kills a command without ending the session; DELETE of a command works too', async () => {
    await agent.call('POST', '/sessions', { sessionId: 'timeout' });
    const timedOut = await run('timeout', { cmd: 'sleep 30', timeoutMs: 200 });
    expect(timedOut.json).toMatchObject({ status: 'exited', exitCode: 137 });
    expect((await agent.call('GET', `/processes/${timedOut.json.commandId}`)).json).toMatchObject({ status: 'killed', timedOut: true });
    const killed = await run('timeout', { cmd: 'sleep 30', async: true });
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect((await agent.call('DELETE', `/processes/${killed.json.commandId}`)).status).toBe(204);
    await waitUntil(async () => ((await agent.call('GET', `/processes/${killed.json.commandId}`)).json.status === 'killed' ? true : undefined));
    expect((await run('timeout', { cmd: 'echo alive' })).json).toMatchObject({ stdout: 'alive\n', exitCode: 0 });
    await agent.call('DELETE', '/sessions/timeout');
  });

  it('answers the error cases', async () => {
    expect((await agent.call('POST', '/sessions', { sessionId: 'dup' })).status).toBe(201);
    const duplicate = await agent.call('POST', '/sessions', { sessionId: 'dup' });
    expect(duplicate.status).toBe(409);
    expect(duplicate.json.error.code).toBe('conflict');
    const badId = await agent.call('POST', '/sessions', { sessionId: 'no spaces' });
    expect(badId.status).toBe(400);
    expect(badId.json.error.message.startsWith('sessionId')).toBe(true);
    expect((await agent.call('POST', '/sessions', { cwd: '/no/such/dir' })).json.error.message.startsWith('cwd')).toBe(true);
    expect((await agent.call('GET', '/sessions/nope')).status).toBe(404);
    expect((await run('nope', { cmd: 'true' })).status).toBe(404);
    expect((await agent.call('GET', '/sessions/dup/commands/p999999')).status).toBe(404);
    // The bound on live sessions (4 in this agent).
    const extra: string[] = [];
    for (let index = 0; index < 3; index += 1) {
      const { json } = await agent.call('POST', '/sessions', {});
      extra.push(json.sessionId);
    }
    const tooMany = await agent.call('POST', '/sessions', {});
    expect(tooMany.status).toBe(409);
    expect(tooMany.json.error.code).toBe('invalid_state');
    for (const id of ['dup', ...extra]) expect((await agent.call('DELETE', `/sessions/${id}`)).status).toBe(204);
  });
});
