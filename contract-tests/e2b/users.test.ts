// E2B's default user through the real SDKs: commands, terminals, code and files act as `user`
// (uid 1000, home /home/user, passwordless sudo) unless the SDK names another user (`user:
// 'root'`, sent as envd's `Authorization: Basic root:`).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from 'e2b';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let sbx: Sandbox;

beforeAll(async () => {
  t = await startE2bTestServer();
  sbx = await Sandbox.create(t.opts);
});

afterAll(async () => {
  await sbx?.kill().catch(() => undefined);
  await t?.close();
});

describe('e2b default user', () => {
  it('runs commands as user in /home/user, with HOME and USER set', async () => {
    const r = await sbx.commands.run('whoami; pwd; echo "$HOME $USER"; id -u; id -g');
    expect(r.stdout).toBe('user\n/home/user\n/home/user user\n1000\n1000\n');
  });

  it('has passwordless sudo, and python beside python3', async () => {
    const sudo = await sbx.commands.run('sudo -n true && sudo -n whoami');
    expect(sudo.exitCode).toBe(0);
    expect(sudo.stdout.trim()).toBe('root');
    const python = await sbx.commands.run('python --version');
    expect(python.stdout.trim()).toMatch(/^Python 3\./);
  });

  it("runs as root when asked (user: 'root')", async () => {
    const r = await sbx.commands.run('whoami; pwd; echo $HOME', { user: 'root' });
    expect(r.stdout).toBe('root\n/root\n/root\n');
  });

  it('writes relative paths into /home/user, owned by user', async () => {
    const info = await sbx.files.write('users-a.txt', 'hello');
    expect(info.path).toBe('/home/user/users-a.txt');
    expect(await sbx.files.read('users-a.txt')).toBe('hello');
    expect(await sbx.files.read('~/users-a.txt')).toBe('hello');
    const owner = await sbx.commands.run('stat -c %U:%G /home/user/users-a.txt');
    expect(owner.stdout.trim()).toBe('user:user');
    // The user can change what it was given.
    expect((await sbx.commands.run('echo more >> users-a.txt && cat users-a.txt')).stdout).toBe('hellomore\n');

    expect(await sbx.files.makeDir('users-dir/inner')).toBe(true);
    expect((await sbx.commands.run('stat -c %U /home/user/users-dir /home/user/users-dir/inner')).stdout).toBe('user\nuser\n');
    // Directories a write makes belong to the user too, so it can write beside the file.
    await sbx.files.write('users-nested/deep/c.txt', 'c');
    expect((await sbx.commands.run('stat -c %U users-nested users-nested/deep users-nested/deep/c.txt && touch users-nested/deep/d.txt')).stdout).toBe('user\nuser\nuser\n');
    await sbx.files.write([{ path: 'users-multi/one.txt', data: '1' }, { path: 'users-multi/two.txt', data: '2' }]);
    expect((await sbx.commands.run('stat -c %U users-multi users-multi/one.txt users-multi/two.txt')).stdout).toBe('user\nuser\nuser\n');
    expect((await sbx.files.list('.')).map((e) => e.name)).toEqual(expect.arrayContaining(['users-a.txt', 'users-dir']));
    expect((await sbx.files.getInfo('users-a.txt')).path).toBe('/home/user/users-a.txt');
  });

  it("writes as root into /root with user: 'root'", async () => {
    const info = await sbx.files.write('users-r.txt', 'r', { user: 'root' });
    expect(info.path).toBe('/root/users-r.txt');
    const owner = await sbx.commands.run('stat -c %U /root/users-r.txt', { user: 'root' });
    expect(owner.stdout.trim()).toBe('root');
    expect(await sbx.files.read('users-r.txt', { user: 'root' })).toBe('r');
  });

  it('opens terminals as user', async () => {
    let output = '';
    const decoder = new TextDecoder();
    const terminal = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => void (output += decoder.decode(d, { stream: true })), timeoutMs: 60_000 });
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('echo "who=$(whoami) at=$(pwd)"\n'));
    for (let i = 0; i < 100 && !output.includes('who=user at=/home/user'); i++) await sleep(100);
    expect(output).toContain('who=user at=/home/user');
    await sbx.pty.kill(terminal.pid);
  });

  it("envd's Basic user header picks the account (what SDKs before envd 0.4 always send)", async () => {
    const res = await fetch(`${t.opts.apiUrl}/sandboxes`, {
      method: 'POST',
      headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 120 }),
    });
    const created = (await res.json()) as { sandboxID: string; envdAccessToken: string };
    try {
      const upload = async (authorization?: string) => {
        const form = new FormData();
        form.append('file', new Blob(['x']), 'users-basic.txt');
        const headers: Record<string, string> = { 'X-Access-Token': created.envdAccessToken, 'E2b-Sandbox-Id': created.sandboxID, 'E2b-Sandbox-Port': '49983' };
        if (authorization) headers.authorization = authorization;
        const up = await fetch(`${t.url}/files`, { method: 'POST', headers, body: form });
        expect(up.status).toBe(200);
        return ((await up.json()) as { path: string }[])[0].path;
      };
      expect(await upload()).toBe('/home/user/users-basic.txt');
      expect(await upload(`Basic ${Buffer.from('user:').toString('base64')}`)).toBe('/home/user/users-basic.txt');
      expect(await upload(`Basic ${Buffer.from('root:').toString('base64')}`)).toBe('/root/users-basic.txt');
      expect(await upload(`Basic ${Buffer.from('daytona:').toString('base64')}`)).toBe('/home/daytona/users-basic.txt');
    } finally {
      await fetch(`${t.opts.apiUrl}/sandboxes/${created.sandboxID}`, { method: 'DELETE', headers: { 'X-API-KEY': t.apiKey } });
    }
  });
});
