// The older SDK generation (@daytonaio/sdk 0.129, installed as daytona-sdk-legacy): toolbox base
// from GET /config → proxyToolboxUrl, commands wrapped in `sh -c` with base64, session logs as
// text with stream markers, PTY created with POST /process/pty then attached (daytona.md appendix A).
// The pre-0.112 route {apiUrl}/toolbox/{id}/toolbox/... is covered in toolbox.test.ts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Daytona as LegacyDaytona, DaytonaNotFoundError as LegacyNotFound } from 'daytona-sdk-legacy';
import { startTestServer, type TestServer } from '../../test/harness.js';

describe('Daytona compat with @daytonaio/sdk 0.129', () => {
  let server: TestServer;
  let daytona: LegacyDaytona;
  beforeAll(async () => {
    for (const k of Object.keys(process.env)) if (k.startsWith('DAYTONA_')) delete process.env[k];
    server = await startTestServer();
    daytona = new LegacyDaytona({ apiUrl: `${server.url}/daytona/api`, apiKey: server.apiKey, target: 'local' });
  });
  afterAll(async () => {
    await server?.close();
  });

  it('creates, runs commands and code, uses files, sessions, PTY and git, lists and deletes', async () => {
    const sb = await daytona.create({ labels: { legacy: 'yes' } });
    expect(sb.state).toBe('started');

    const r = await sb.process.executeCommand('echo "$A-$B"; exit 2', '/tmp', { A: 'x', B: 'y' });
    expect(r.result.trim()).toBe('x-y');
    expect(r.exitCode).toBe(2);
    const code = await sb.process.codeRun('print(6 * 7)');
    expect(code.result.trim()).toBe('42');

    await sb.fs.uploadFile(Buffer.from('legacy bytes'), '/home/daytona/l.txt');
    expect((await sb.fs.downloadFile('/home/daytona/l.txt')).toString()).toBe('legacy bytes');
    expect((await sb.fs.listFiles('/home/daytona')).map((f) => f.name)).toContain('l.txt');

    await sb.process.createSession('ls1');
    const sync = await sb.process.executeSessionCommand('ls1', { command: 'echo out; echo err >&2' });
    expect(sync.stdout).toBe('out\n');
    expect(sync.stderr).toBe('err\n');
    const bg = await sb.process.executeSessionCommand('ls1', { command: 'echo later; echo oops >&2', runAsync: true });
    let out = '';
    let err = '';
    await sb.process.getSessionCommandLogs('ls1', bg.cmdId!, (c) => (out += c), (c) => (err += c));
    expect(out).toBe('later\n');
    expect(err).toBe('oops\n');
    const logs = await sb.process.getSessionCommandLogs('ls1', bg.cmdId!);
    expect(logs.stdout).toBe('later\n');
    expect(logs.stderr).toBe('oops\n');

    let screen = '';
    const pty = await sb.process.createPty({ id: 'lp1', cols: 80, rows: 24, onData: (d: Uint8Array) => {
      screen += new TextDecoder().decode(d);
    } });
    await pty.sendInput('echo legacy-pty-$((6*7))\n');
    const deadline = Date.now() + 10_000;
    while (!screen.includes('legacy-pty-42') && Date.now() < deadline) await new Promise((res) => setTimeout(res, 50));
    expect(screen).toContain('legacy-pty-42');
    await pty.sendInput('exit 5\n');
    expect((await pty.wait()).exitCode).toBe(5);

    await sb.process.executeCommand('git init -q -b main /home/daytona/repo');
    expect((await sb.git.status('/home/daytona/repo')).currentBranch).toBe('main');

    const page = await daytona.list({ legacy: 'yes' });
    expect(page.items.map((s) => s.id)).toEqual([sb.id]);
    expect(page.total).toBe(1);

    await sb.stop();
    expect(sb.state).toBe('stopped');
    await sb.start();
    expect(sb.state).toBe('started');
    await sb.delete();
    await expect(daytona.get(sb.id)).rejects.toBeInstanceOf(LegacyNotFound);
  });
});
