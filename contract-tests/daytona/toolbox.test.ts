// Toolbox through the real @daytonaio/sdk 0.218 (daytona.md (c), (d), (e)).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaFileNotFoundError, DaytonaNotFoundError, DaytonaTimeoutError, type Sandbox } from '@daytonaio/sdk';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

describe('Daytona toolbox with @daytonaio/sdk', () => {
  let env: DaytonaTestEnv;
  let sb: Sandbox;
  beforeAll(async () => {
    env = await startDaytonaEnv();
    sb = await env.daytona.create({ labels: { suite: 'toolbox' } });
  });
  afterAll(async () => {
    await env?.server.close();
  });

  describe('process', () => {
    it('executes a command with cwd and env; stderr is merged into the result; exit codes pass through', async () => {
      const r = await sb.process.executeCommand('echo out; echo err >&2; echo "$FOO"; pwd', '/tmp', { FOO: 'bar' });
      expect(r.exitCode).toBe(0);
      expect(r.result).toBe('out\nerr\nbar\n/tmp\n');
      expect(r.artifacts?.stdout).toBe(r.result);
      const failed = await sb.process.executeCommand('exit 3');
      expect(failed.exitCode).toBe(3);
    });

    it('times out with DaytonaTimeoutError', async () => {
      await expect(sb.process.executeCommand('sleep 5', undefined, undefined, 1)).rejects.toBeInstanceOf(DaytonaTimeoutError);
    });

    // typescript, javascript, charts and timeouts: code-run.test.ts.
    it('runs python code, with argv', async () => {
      const r = await sb.process.codeRun('import sys\nprint("py", sum([1, 2, 3]), sys.argv[1:])', { argv: ['a', 'b'] });
      expect(r.exitCode).toBe(0);
      expect(r.result).toBe("py 6 ['a', 'b']\n");
      const err = await sb.process.codeRun('raise SystemExit(4)');
      expect(err.exitCode).toBe(4);
    });

    it('runs session commands: sync output, state carried over, async with logs, follow, input', async () => {
      await sb.process.createSession('s1');
      const first = await sb.process.executeSessionCommand('s1', { command: 'cd /tmp && export V=42 && echo out; echo err >&2' });
      expect(first.exitCode).toBe(0);
      expect(first.stdout).toBe('out\n');
      expect(first.stderr).toBe('err\n');
      const second = await sb.process.executeSessionCommand('s1', { command: 'echo "$V $(pwd)"' });
      expect(second.stdout).toBe('42 /tmp\n');

      const started = await sb.process.executeSessionCommand('s1', { command: 'for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.2; done', runAsync: true });
      expect(started.cmdId).toBeTruthy();
      const running = await sb.process.getSessionCommand('s1', started.cmdId!);
      expect(running.exitCode).toBeUndefined();
      let out = '';
      let err = '';
      await sb.process.getSessionCommandLogs('s1', started.cmdId!, (c) => (out += c), (c) => (err += c));
      expect(out).toBe('line1\nline2\nline3\n');
      expect(err).toBe('e1\ne2\ne3\n');
      const done = await sb.process.getSessionCommand('s1', started.cmdId!);
      expect(done.exitCode).toBe(0);
      const logs = await sb.process.getSessionCommandLogs('s1', started.cmdId!);
      expect(logs.stdout).toBe('line1\nline2\nline3\n');
      expect(logs.stderr).toBe('e1\ne2\ne3\n');

      const reader = await sb.process.executeSessionCommand('s1', { command: 'read name; echo "hello $name"', runAsync: true });
      await sb.process.sendSessionCommandInput('s1', reader.cmdId!, 'nestbox\n');
      let greeting = '';
      await sb.process.getSessionCommandLogs('s1', reader.cmdId!, (c) => (greeting += c), () => undefined);
      // The daemon echoes input into the log (daemon-fidelity.test.ts).
      expect(greeting).toBe('nestbox\nhello nestbox\n');

      const session = await sb.process.getSession('s1');
      expect(session.sessionId).toBe('s1');
      expect(session.commands?.length).toBe(4);
      expect(session.commands?.[0]).toMatchObject({ command: 'cd /tmp && export V=42 && echo out; echo err >&2', exitCode: 0 });
      expect((await sb.process.listSessions()).map((s) => s.sessionId)).toContain('s1');
      const entry = await sb.process.getEntrypointSession();
      expect(entry.commands).toEqual([]);
      await sb.process.deleteSession('s1');
      await expect(sb.process.getSession('s1')).rejects.toBeInstanceOf(DaytonaNotFoundError);
    });

    it('opens a PTY over the WebSocket with envs and exit control, resizes, lists and kills', async () => {
      let output = '';
      const pty = await sb.process.createPty({ id: 'pty1', cols: 100, rows: 30, envs: { PTY_VAR: 'from-env' }, onData: (d) => {
        output += new TextDecoder().decode(d);
      } });
      await pty.waitForConnection();
      await pty.sendInput('echo "value=$PTY_VAR cols=$(tput cols 2>/dev/null || stty size)"\n');
      const deadline = Date.now() + 10_000;
      while (!output.includes('value=from-env') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(output).toContain('value=from-env');
      const info = await sb.process.resizePtySession('pty1', 120, 40);
      expect(info).toMatchObject({ id: 'pty1', active: true, cols: 120, rows: 40 });
      expect((await sb.process.listPtySessions()).map((s) => s.id)).toContain('pty1');
      expect((await sb.process.getPtySessionInfo('pty1')).active).toBe(true);
      await pty.sendInput('exit 3\n');
      const result = await pty.wait();
      expect(result.exitCode).toBe(3);
      await pty.disconnect();

      const killed = await sb.process.createPty({ id: 'pty2', onData: () => undefined });
      await killed.waitForConnection();
      await sb.process.killPtySession('pty2');
      const r2 = await killed.wait();
      expect(r2.exitCode).not.toBe(0);
      await expect(sb.process.getPtySessionInfo('nope')).rejects.toBeInstanceOf(DaytonaNotFoundError);
    });
  });

  describe('files', () => {
    it('uploads several files (bulk, relative and absolute), lists, stats, downloads them', async () => {
      await sb.fs.uploadFiles([
        { source: Buffer.from('alpha'), destination: '/home/daytona/up/a.txt' },
        { source: Buffer.from([0, 1, 2, 255]), destination: 'up/b.bin' },
      ]);
      expect((await sb.fs.downloadFile('/home/daytona/up/a.txt')).toString()).toBe('alpha');
      expect([...(await sb.fs.downloadFile('/home/daytona/up/b.bin'))]).toEqual([0, 1, 2, 255]);
      const listing = await sb.fs.listFiles('/home/daytona/up');
      expect(listing.map((f) => f.name).sort()).toEqual(['a.txt', 'b.bin']);
      const info = await sb.fs.getFileDetails('/home/daytona/up/a.txt');
      expect(info).toMatchObject({ name: 'a.txt', isDir: false, size: 5, permissions: '0644', mode: '-rw-r--r--', owner: 'daytona' });
      const dir = await sb.fs.getFileDetails('/home/daytona/up');
      expect(dir.isDir).toBe(true);
    });

    it('bulk-downloads with per-file errors and non-ASCII names', async () => {
      await sb.fs.uploadFile(Buffer.from('ünïcode'), '/home/daytona/up/naïve ü.txt');
      const results = await sb.fs.downloadFiles([{ source: '/home/daytona/up/a.txt' }, { source: '/home/daytona/up/naïve ü.txt' }, { source: '/home/daytona/up/missing.txt' }]);
      expect(results[0].result?.toString()).toBe('alpha');
      expect(results[1].result?.toString()).toBe('ünïcode');
      expect(results[2].error).toBe('no such file or directory: /home/daytona/up/missing.txt');
      expect(results[2].result).toBeUndefined();
      await expect(sb.fs.downloadFile('/home/daytona/up/missing.txt')).rejects.toBeInstanceOf(DaytonaFileNotFoundError);
      await expect(sb.fs.getFileDetails('/home/daytona/nope')).rejects.toBeInstanceOf(DaytonaFileNotFoundError);
    });

    it('creates folders, sets permissions, moves, finds, searches, replaces and deletes', async () => {
      await sb.fs.createFolder('/home/daytona/work/sub', '750');
      expect((await sb.fs.getFileDetails('/home/daytona/work/sub')).permissions).toBe('0750');
      await sb.fs.uploadFile(Buffer.from('hello world\nsecond hello\n'), '/home/daytona/work/one.txt');
      await sb.fs.setFilePermissions('/home/daytona/work/one.txt', { mode: '600', owner: 'root', group: 'root' });
      expect((await sb.fs.getFileDetails('/home/daytona/work/one.txt')).permissions).toBe('0600');
      await sb.fs.moveFiles('/home/daytona/work/one.txt', '/home/daytona/work/sub/two.txt');
      const found = await sb.fs.findFiles('/home/daytona/work', 'hello');
      expect(found.map((m) => [m.file, m.line, m.content])).toEqual([
        ['/home/daytona/work/sub/two.txt', 1, 'hello world'],
        ['/home/daytona/work/sub/two.txt', 2, 'second hello'],
      ]);
      const searched = await sb.fs.searchFiles('/home/daytona/work', '*.txt');
      expect(searched.files).toEqual(['/home/daytona/work/sub/two.txt']);
      const replaced = await sb.fs.replaceInFiles(['/home/daytona/work/sub/two.txt', '/home/daytona/work/none.txt'], 'hello', 'bye');
      expect(replaced[0]).toMatchObject({ file: '/home/daytona/work/sub/two.txt', success: true });
      expect(replaced[1].success).toBe(false);
      expect((await sb.fs.downloadFile('/home/daytona/work/sub/two.txt')).toString()).toBe('bye world\nsecond bye\n');
      expect((await sb.fs.listFiles('/home/daytona/work')).map((f) => f.name)).toEqual(['sub']);
      await sb.fs.deleteFile('/home/daytona/work', true);
      await expect(sb.fs.getFileDetails('/home/daytona/work')).rejects.toBeInstanceOf(DaytonaFileNotFoundError);
    });

    it('serves signed download and upload URLs without a bearer key, and rejects tampered ones', async () => {
      await sb.fs.uploadFile(Buffer.from('signed bytes'), '/home/daytona/signed.txt');
      const url = await sb.downloadUrl('/home/daytona/signed.txt', 60);
      const got = await fetch(url);
      expect(got.status).toBe(200);
      expect(await got.text()).toBe('signed bytes');
      const tampered = await fetch(url.replace('signed.txt', 'other.txt'));
      expect(tampered.status).toBe(403);
      const up = await sb.uploadUrl('/home/daytona/via-url.txt', 60);
      const form = new FormData();
      form.append('file', new Blob([Buffer.from('uploaded by url')]), 'via-url.txt');
      const posted = await fetch(up, { method: 'POST', body: form });
      expect(posted.status).toBe(200);
      expect((await sb.fs.downloadFile('/home/daytona/via-url.txt')).toString()).toBe('uploaded by url');
      // A download URL does not authorise an upload.
      const wrong = await fetch(url, { method: 'POST', body: form });
      expect(wrong.status).toBe(401);
    });
  });

  describe('info', () => {
    it('answers the home and work dirs and the latest metrics', async () => {
      expect(await sb.getUserHomeDir()).toBe('/home/daytona');
      expect(await sb.getWorkDir()).toBe('/home/daytona');
      const m = await sb.getMetricsLatest();
      expect(m.cpuCount).toBeGreaterThan(0);
      expect(m.memTotal).toBeGreaterThan(0);
      expect(m.diskTotal).toBeGreaterThan(0);
    });

    // LSP: lsp.test.ts; the code interpreter: code-interpreter.test.ts.
    it('answers computer use with not_supported', async () => {
      await expect(sb.computerUse.start()).rejects.toThrow(/computer use is not supported/);
    });

    it('accepts the legacy {apiUrl}/toolbox/{id}/toolbox/... route', async () => {
      const res = await rawFetch(env, `/daytona/api/toolbox/${sb.id}/toolbox/process/execute`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ command: 'echo legacy' }) });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ exitCode: 0, result: 'legacy\n' });
      const missing = await rawFetch(env, `/daytona/toolbox/${sb.id}/files/info?path=/nope`);
      expect(missing.status).toBe(404);
      expect(await missing.json()).toMatchObject({ statusCode: 404, code: 'FILE_NOT_FOUND', source: 'DAYTONA_DAEMON' });
    });
  });
});
