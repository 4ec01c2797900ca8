// Daytona's default user through the real SDK: commands, code runs, sessions, terminals, git and
// files act as `daytona` (home /home/daytona, which is also the work dir; passwordless sudo).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '@daytonaio/sdk';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;
let sb: Sandbox;

beforeAll(async () => {
  env = await startDaytonaEnv();
  sb = await env.daytona.create({ labels: { suite: 'users' } });
});

afterAll(async () => {
  await sb?.delete().catch(() => undefined);
  await env?.server.close();
});

async function waitFor(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 100 && !check(); i++) await new Promise((r) => setTimeout(r, 100));
  if (!check()) throw new Error(`timed out waiting for ${what}`);
}

describe('daytona default user', () => {
  it('runs commands as daytona in /home/daytona', async () => {
    expect(sb.user).toBe('daytona');
    const r = await sb.process.executeCommand('whoami; pwd; echo "$HOME $USER"');
    expect(r.exitCode).toBe(0);
    expect(r.result).toBe('daytona\n/home/daytona\n/home/daytona daytona\n');
    expect(await sb.getUserHomeDir()).toBe('/home/daytona');
    expect(await sb.getWorkDir()).toBe('/home/daytona');
    const code = await sb.process.codeRun('import getpass, os; print(getpass.getuser(), os.getcwd())');
    expect(code.result.trim()).toBe('daytona /home/daytona');
  });

  it('has passwordless sudo, and python beside python3', async () => {
    const sudo = await sb.process.executeCommand('sudo -n whoami');
    expect(sudo).toMatchObject({ exitCode: 0, result: 'root\n' });
    const python = await sb.process.executeCommand('python --version');
    expect(python.exitCode).toBe(0);
    expect(python.result).toMatch(/^Python 3\./);
  });

  it('runs sessions and terminals as daytona', async () => {
    await sb.process.createSession('users-s');
    const r = await sb.process.executeSessionCommand('users-s', { command: 'whoami; pwd' });
    expect(r.output ?? r.stdout).toBe('daytona\n/home/daytona\n');
    await sb.process.deleteSession('users-s');

    let output = '';
    const pty = await sb.process.createPty({ id: 'users-pty', onData: (d) => void (output += new TextDecoder().decode(d)) });
    await pty.waitForConnection();
    await pty.sendInput('echo "who=$(whoami)"\n');
    await waitFor(() => output.includes('who=daytona'), 'the terminal');
    await pty.kill();
  });

  it('writes relative paths into /home/daytona, owned by daytona', async () => {
    await sb.fs.uploadFile(Buffer.from('mine'), 'users-a.txt');
    const info = await sb.fs.getFileDetails('/home/daytona/users-a.txt');
    expect(info).toMatchObject({ owner: 'daytona', group: 'daytona', size: 4 });
    expect((await sb.fs.downloadFile('users-a.txt')).toString()).toBe('mine');
    await sb.fs.uploadFiles([{ source: Buffer.from('bulk'), destination: 'users-dir/b.txt' }]);
    expect((await sb.fs.getFileDetails('/home/daytona/users-dir/b.txt')).owner).toBe('daytona');
    expect((await sb.fs.getFileDetails('/home/daytona/users-dir')).owner).toBe('daytona');
    await sb.fs.createFolder('users-made/inner', '755');
    expect((await sb.fs.getFileDetails('/home/daytona/users-made')).owner).toBe('daytona');
    expect((await sb.fs.getFileDetails('/home/daytona/users-made/inner')).owner).toBe('daytona');
    expect((await sb.fs.listFiles('.')).map((f) => f.name)).toEqual(expect.arrayContaining(['users-a.txt', 'users-made']));
    // The user can change what it was given.
    expect((await sb.process.executeCommand('echo more >> users-a.txt && cat users-a.txt')).result).toBe('minemore\n');
  });
});
