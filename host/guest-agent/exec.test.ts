import { readFile } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { startTestAgent, type TestAgent } from './testing.js';

/** Alive means running: a zombie waiting for PID 1 to reap it is already dead for our purpose. */
function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

async function waitFor<T>(probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 5_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await sleep(25);
  }
}

async function rawExec(agent: TestAgent, body: string | undefined): Promise<{ status: number; json: any }> {
  const client = new AgentClient(agent.socketPath);
  try {
    const response = await client.request({ method: 'POST', path: '/exec', body, headers: { 'content-type': 'application/json' } });
    const chunks: Buffer[] = [];
    for await (const chunk of response) chunks.push(chunk as Buffer);
    return { status: response.statusCode ?? 0, json: JSON.parse(Buffer.concat(chunks).toString('utf8')) };
  } finally {
    client.close();
  }
}

describe('POST /exec', () => {
  let agent: TestAgent;
  let client: AgentClient;

  beforeAll(async () => {
    agent = await startTestAgent({ env: { PATH: process.env.PATH ?? '/usr/bin:/bin', FROM_AGENT: 'agent-value', SHARED: 'agent' } });
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  it('runs argv directly and reports output, exit code and duration', async () => {
    const result = await client.exec({ argv: ['printf', '%s|%s', 'a b', '$HOME'] });
    expect(result).toMatchObject({ exitCode: 0, signal: null, stdout: 'a b|$HOME', stderr: '', timedOut: false, truncated: false });
    expect(result.durationMs).toBeGreaterThan(0);
  });

  it('runs as another user, whose home, USER and LOGNAME it gets (cwd / when the home is missing)', async () => {
    const result = await client.exec({ cmd: 'id -u; id -g; echo "$HOME $USER $LOGNAME"; pwd', user: 'nobody' });
    expect(result.stdout).toBe('65534\n65534\n/nonexistent nobody nobody\n/\n');
    const root = await client.exec({ cmd: 'id -u; echo $HOME', user: 'root' });
    expect(root.stdout).toBe('0\n/root\n');
    await expect(client.exec({ cmd: 'true', user: 'no-such-user' })).rejects.toMatchObject({ status: 400, message: expect.stringMatching(/^user: /) });
  });

  it('runs cmd through a bash login shell', async () => {
    const result = await client.exec({ cmd: 'shopt -q login_shell && echo login; echo "$0"; echo err >&2; exit 3' });
    expect(result.stdout).toBe('login\nbash\n');
    expect(result.stderr).toBe('err\n');
    expect(result.exitCode).toBe(3);
  });

  it('uses home as the default cwd and resolves a relative cwd against it', async () => {
    expect((await client.exec({ argv: ['pwd'] })).stdout).toBe(`${agent.home}\n`);
    await client.exec({ argv: ['mkdir', '-p', 'sub/dir'] });
    expect((await client.exec({ argv: ['pwd'], cwd: 'sub/dir' })).stdout).toBe(`${join(agent.home, 'sub/dir')}\n`);
    expect((await client.exec({ argv: ['pwd'], cwd: '/' })).stdout).toBe('/\n');
  });

  it('merges the request env over the agent env and sets HOME', async () => {
    const result = await client.exec({
      cmd: 'echo "$FROM_AGENT $SHARED $ONLY_REQUEST $HOME"',
      env: { SHARED: 'request', ONLY_REQUEST: 'yes' },
    });
    expect(result.stdout).toBe(`agent-value request yes ${agent.home}\n`);
  });

  it('writes decoded stdin and then closes it', async () => {
    const bytes = Buffer.from('line one\nline two\n\u00e9');
    const result = await client.exec({ argv: ['cat'], stdinBase64: bytes.toString('base64') });
    expect(result.stdout).toBe(bytes.toString('utf8'));
  });

  it('closes stdin at once when none is given, so cat ends', async () => {
    const result = await client.exec({ argv: ['cat'], timeoutMs: 5_000 });
    expect(result).toMatchObject({ exitCode: 0, stdout: '', timedOut: false });
  });

  it('answers exit code 127 like a shell when argv[0] does not exist', async () => {
    const result = await client.exec({ argv: ['definitely-not-a-command-xyz', 'arg'] });
    expect(result.exitCode).toBe(127);
    expect(result.stderr).toMatch(/definitely-not-a-command-xyz: command not found/);
  });

  it('answers 126 when argv[0] is not executable', async () => {
    await client.exec({ cmd: 'echo "echo hi" > not-exec.sh && chmod 644 not-exec.sh' });
    const result = await client.exec({ argv: [join(agent.home, 'not-exec.sh')] });
    // Even root cannot execute a file that has no x bit at all.
    expect(result.exitCode).toBe(126);
    expect(result.stderr).toMatch(/permission denied/);
  });

  it('reports the signal that killed the process', async () => {
    const result = await client.exec({ cmd: 'kill -TERM $$' });
    expect(result).toMatchObject({ exitCode: null, signal: 'SIGTERM', timedOut: false });
  });

  it('decodes UTF-8 and replaces invalid sequences', async () => {
    const result = await client.exec({ cmd: "printf 'h\\xc3\\xa9 \\xff'" });
    expect(result.stdout).toBe('h\u00e9 \ufffd');
  });

  it('keeps the head of output beyond the cap, sets truncated and keeps draining', async () => {
    const small = await startTestAgent({ maxOutputBytes: 1024 });
    const smallClient = new AgentClient(small.socketPath);
    try {
      const result = await smallClient.exec({ cmd: 'head -c 200000 /dev/zero | tr "\\0" a; echo done >&2', timeoutMs: 10_000 });
      expect(result.stdout).toBe('a'.repeat(1024));
      expect(result.stderr).toBe('done\n');
      expect(result.truncated).toBe(true);
      // Exit 0, not SIGPIPE: the writer was never cut off.
      expect(result.exitCode).toBe(0);
      const fits = await smallClient.exec({ cmd: 'head -c 1024 /dev/zero | tr "\\0" b' });
      expect(fits.truncated).toBe(false);
      expect(fits.stdout).toHaveLength(1024);
    } finally {
      smallClient.close();
      await small.stop();
    }
  });

  it('on timeout kills the whole process group, grandchildren included', async () => {
    const pidFile = join(agent.home, 'timeout-pids');
    const started = Date.now();
    const result = await client.exec({
      cmd: `sleep 100 & echo $! > ${pidFile}; bash -c 'sleep 100 & echo $! >> ${pidFile}; wait' & sleep 100`,
      timeoutMs: 500,
    });
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(result).toMatchObject({ exitCode: null, signal: 'SIGKILL', timedOut: true });
    const pids = (await readFile(pidFile, 'utf8')).trim().split('\n').map(Number);
    expect(pids).toHaveLength(2);
    await waitFor(() => (pids.some(isAlive) ? undefined : true));
    for (const pid of pids) expect(isAlive(pid)).toBe(false);
  });

  it('kills the process group when the HTTP client disconnects', async () => {
    const pidFile = join(agent.home, 'disconnect-pids');
    const req = request({ socketPath: agent.socketPath, method: 'POST', path: '/exec', headers: { 'content-type': 'application/json' } });
    req.on('error', () => {});
    req.end(JSON.stringify({ cmd: `echo $$ > ${pidFile}.tmp; sleep 100 & echo $! >> ${pidFile}.tmp; mv ${pidFile}.tmp ${pidFile}; wait` }));
    const pids = await waitFor(async () => {
      const text = await readFile(pidFile, 'utf8').catch(() => undefined);
      return text?.trim().split('\n').map(Number);
    });
    expect(pids).toHaveLength(2);
    for (const pid of pids) expect(isAlive(pid)).toBe(true);
    req.destroy();
    await waitFor(() => (pids.some(isAlive) ? undefined : true));
    for (const pid of pids) expect(isAlive(pid)).toBe(false);
  });

  describe('validation', () => {
    it.each([
      ['a wrongly typed field', JSON.stringify({ cmd: 'true', cwd: 5 }), /^cwd: .*expected string/],
      ['a wrongly typed env value', JSON.stringify({ cmd: 'true', env: { A: 1 } }), /^env\.A: /],
      ['an empty argv', JSON.stringify({ argv: [] }), /^argv: /],
      ['a negative timeout', JSON.stringify({ cmd: 'true', timeoutMs: -1 }), /^timeoutMs: /],
      ['an unknown field', JSON.stringify({ cmd: 'true', shell: 'zsh' }), /^shell: unknown field/],
      ['both argv and cmd', JSON.stringify({ cmd: 'true', argv: ['true'] }), /^cmd: exactly one of argv or cmd/],
      ['neither argv nor cmd', JSON.stringify({ cwd: '/' }), /^cmd: exactly one of argv or cmd/],
      ['invalid JSON', '{"cmd": ', /^body: invalid JSON/],
      ['a JSON array', '[]', /^body: /],
      ['no body at all', undefined, /^body: required/],
      ['a missing cwd', JSON.stringify({ cmd: 'true', cwd: 'no/such/dir' }), /^cwd: no such directory: .*no\/such\/dir/],
      ['a cwd that is a file', JSON.stringify({ argv: ['true'], cwd: '/etc/hostname' }), /^cwd: not a directory/],
      ['a NUL byte in argv', JSON.stringify({ argv: ['echo', 'a\0b'] }), /^argv\[1\]: .*NUL/],
      ['a NUL byte in cmd', JSON.stringify({ cmd: 'echo a\0b' }), /^cmd: .*NUL/],
      ['an invalid env name', JSON.stringify({ cmd: 'true', env: { 'A=B': 'x' } }), /^env\.A=B: invalid variable name/],
      ['invalid base64 stdin', JSON.stringify({ argv: ['cat'], stdinBase64: 'not base64!' }), /^stdinBase64: not valid base64/],
    ])('rejects %s with 400 validation_failed naming the field', async (_name, body, message) => {
      const { status, json } = await rawExec(agent, body);
      expect(status).toBe(400);
      expect(json.error.code).toBe('validation_failed');
      expect(json.error.message).toMatch(message);
    });
  });
});
