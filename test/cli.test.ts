// The `nestbox` CLI as a user runs it: the real binary (node dist/src/cli.js) against a real
// server, one sandbox shared by the cases. `shell` runs in a real terminal under tmux, and what
// the screen shows is checked.
import { execFile, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { projectPath } from '../src/paths.js';

const CLI = projectPath('dist/src/cli.js');

let t: TestServer;
let work: string;
let id: string;

interface Run { code: number; stdout: string; stderr: string }

/** The environment a user would have: the server and key from the environment, nothing else of ours. */
function userEnv(extra: Record<string, string> = {}): Record<string, string> {
  return { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, XDG_CONFIG_HOME: join(work, 'config'), NESTBOX_DATA_DIR: join(work, 'data'), NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey, ...extra };
}

function cli(args: string[], opts: { env?: Record<string, string>; stdin?: string | Buffer } = {}): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(process.execPath, [CLI, ...args], { env: opts.env ?? userEnv(), timeout: 60_000, maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
    child.stdin?.end(opts.stdin ?? '');
  });
}

/** A one-line error, as every CLI failure must be. */
function expectOneLineError(run: Run, pattern: RegExp): void {
  expect(run.code, run.stdout).not.toBe(0);
  expect(run.stderr.trimEnd().split('\n'), run.stderr).toHaveLength(1);
  expect(run.stderr).toMatch(pattern);
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'nestbox-cli-'));
  t = await startTestServer();
  const created = await cli(['create', '--egress', 'deny-all', '--label', 'suite=cli', '--label', 'case=shared', '--env', 'GREETING=hi there']);
  expect(created.code, created.stderr).toBe(0);
  id = created.stdout.trim();
}, 180_000);

afterAll(async () => {
  await t?.close();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('nestbox CLI', () => {
  it('create printed an id that ls --json (by label) and get show, running with deny-all egress', async () => {
    expect(id).toMatch(/^[a-z0-9]+$/);
    // Independent reads, run at once to keep the file short.
    const [listed, none, table, got, human] = await Promise.all([
      cli(['ls', '--json', '--label', 'suite=cli']),
      cli(['ls', '--json', '--label', 'suite=other']),
      cli(['ls', '--state', 'running']),
      cli(['get', id, '--json']),
      cli(['get', id]),
    ]);
    expect(listed.code, listed.stderr).toBe(0);
    const items = JSON.parse(listed.stdout) as { id: string; state: string; labels: Record<string, string> }[];
    expect(items.map((s) => s.id)).toEqual([id]);
    expect(items[0]!.labels).toEqual({ suite: 'cli', case: 'shared' });
    // A label no sandbox has lists nothing; the table form names the sandbox.
    expect(JSON.parse(none.stdout)).toEqual([]);
    expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+STATE\s+IMAGE/);
    expect(table.stdout).toMatch(new RegExp(`^${id}\\s+running\\s`, 'm'));
    expect(JSON.parse(got.stdout)).toMatchObject({ id, state: 'running', egress: { mode: 'deny-all' } });
    expect(human.stdout).toMatch(/^state\s+running$/m);
  });

  it('exec streams output live, passes env, takes stdin from a pipe and exits with the command\'s exit code', async () => {
    const [failing, argv, piped, json] = await Promise.all([
      cli(['exec', id, '--', 'echo "$GREETING"; echo to-stderr >&2; exit 3']),
      // Several words are argv, not a shell line.
      cli(['exec', id, '--', 'printf', '%s|', 'a b', '$HOME']),
      cli(['exec', id, '--', 'tr a-z A-Z; exit 0'], { stdin: 'from the pipe\nsecond line\n' }),
      cli(['exec', id, '--json', '--', 'echo j; exit 2']),
    ]);
    expect(failing).toEqual({ code: 3, stdout: 'hi there\n', stderr: 'to-stderr\n' });
    expect(argv).toMatchObject({ code: 0, stdout: 'a b|$HOME|' });
    expect(piped).toMatchObject({ code: 0, stdout: 'FROM THE PIPE\nSECOND LINE\n' });
    expect(json.code).toBe(2);
    expect(JSON.parse(json.stdout)).toMatchObject({ exitCode: 2, stdout: 'j\n', stderr: '' });
    // Live: the first line is on the CLI's stdout while the command is still waiting for a file
    // that only this test creates afterwards.
    const child = spawn(process.execPath, [CLI, 'exec', id, '--', 'echo waiting; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo released'], { env: userEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    try {
      await waitFor('the first line while the command runs', async () => out === 'waiting\n', 20_000, 50);
      expect((await cli(['exec', id, '--', 'touch /tmp/go'])).code).toBe(0);
      expect(await exited).toBe(0);
      expect(out).toBe('waiting\nreleased\n');
    } finally {
      child.kill();
    }
  });

  it('cp copies a file and a directory tree into the sandbox and back, byte for byte', async () => {
    // The file and the tree travel at once (independent paths), to keep the file short.
    const oneFile = async () => {
      const big = randomBytes(5 * 1024 * 1024 + 123);
      writeFileSync(join(work, 'big.bin'), big);
      const up = await cli(['cp', join(work, 'big.bin'), `${id}:/tmp/big.bin`]);
      expect(up.code, up.stderr).toBe(0);
      expect((await cli(['exec', id, '--', 'sha256sum /tmp/big.bin'])).stdout.split(' ')[0]).toBe(createHash('sha256').update(big).digest('hex'));
      const down = await cli(['cp', `${id}:/tmp/big.bin`, join(work, 'big.back')]);
      expect(down.code, down.stderr).toBe(0);
      expect(readFileSync(join(work, 'big.back')).equals(big)).toBe(true);

    };
    const aTree = async () => {
      const tree = join(work, 'tree');
      mkdirSync(join(tree, 'sub', 'deeper'), { recursive: true });
      mkdirSync(join(tree, 'empty'));
      writeFileSync(join(tree, 'top.txt'), 'top\n');
      writeFileSync(join(tree, 'sub', 'run.sh'), '#!/bin/sh\necho ran\n', { mode: 0o755 });
      writeFileSync(join(tree, 'sub', 'deeper', 'data.bin'), randomBytes(70_000));
      // Into an existing directory: it lands under its own name, as with cp -r.
      expect((await cli(['exec', id, '--', 'mkdir -p /tmp/into'])).code).toBe(0);
      const upTree = await cli(['cp', tree, `${id}:/tmp/into`, '--json']);
      expect(upTree.code, upTree.stderr).toBe(0);
      expect(JSON.parse(upTree.stdout)).toMatchObject({ files: 3, destination: `${id}:/tmp/into/tree` });
      const listing = await cli(['exec', id, '--', 'cd /tmp/into/tree && find . | sort && ./sub/run.sh']);
      expect(listing.stdout).toBe('.\n./empty\n./sub\n./sub/deeper\n./sub/deeper/data.bin\n./sub/run.sh\n./top.txt\nran\n');
      const back = join(work, 'tree.back');
      const downTree = await cli(['cp', `${id}:/tmp/into/tree`, back]);
      expect(downTree.code, downTree.stderr).toBe(0);
      for (const rel of ['top.txt', 'sub/run.sh', 'sub/deeper/data.bin']) expect(readFileSync(join(back, rel)).equals(readFileSync(join(tree, rel))), rel).toBe(true);
      expect(readdirSync(join(back, 'empty'))).toEqual([]);
      expect(statSync(join(back, 'sub', 'run.sh')).mode & 0o111).not.toBe(0);
    };
    await Promise.all([oneFile(), aTree()]);
    // Both sides local (or both remote) is a mistake, said in one line.
    const [bothLocal, missing] = await Promise.all([cli(['cp', join(work, 'big.bin'), join(work, 'x')]), cli(['cp', `${id}:/tmp/nope`, join(work, 'x')])]);
    expectOneLineError(bothLocal, /^error: cp needs one side in a sandbox/);
    expectOneLineError(missing, /no such file or directory/);
  });

  it('exec -d starts a server that ps lists and ports publish serves at its URL with the token; kill ends it', async () => {
    expect((await cli(['exec', id, '--', 'mkdir -p /tmp/www && echo served-by-python > /tmp/www/hello.txt'])).code).toBe(0);
    const started = await cli(['exec', '-d', id, '--', 'python3', '-m', 'http.server', '8000', '--bind', '0.0.0.0', '--directory', '/tmp/www']);
    expect(started.code, started.stderr).toBe(0);
    const processId = started.stdout.trim();
    const ps = JSON.parse((await cli(['ps', id, '--json'])).stdout) as { processId: string; status: string }[];
    expect(ps.find((p) => p.processId === processId)?.status).toBe('running');

    const published = await cli(['ports', 'publish', id, '8000']);
    expect(published.code, published.stderr).toBe(0);
    const [url, tokenLine] = published.stdout.trim().split('\n');
    expect(url).toBe(`${t.url}/p/${id}/8000/`);
    const token = tokenLine!.replace(/^token: /, '');
    expect(token.length).toBeGreaterThan(10);
    // Without the token the proxy refuses; with it the file comes back (once python listens).
    expect((await fetch(`${url}hello.txt`)).status).toBe(401);
    const body = await waitFor('python serving through the port URL', async () => {
      const res = await fetch(`${url}hello.txt?_token=${token}`);
      return res.status === 200 ? res.text() : undefined;
    }, 20_000);
    expect(body).toBe('served-by-python\n');
    const ports = JSON.parse((await cli(['ports', id, '--json'])).stdout) as { port: number }[];
    expect(ports.map((p) => p.port)).toEqual([8000]);
    expect((await cli(['ports', 'unpublish', id, '8000'])).code).toBe(0);
    expect(JSON.parse((await cli(['ports', 'ls', id, '--json'])).stdout)).toEqual([]);

    expect((await cli(['kill', id, processId])).code).toBe(0);
    await waitFor('the server process ended', async () => {
      const all = JSON.parse((await cli(['ps', id, '--all', '--json'])).stdout) as { processId: string; status: string }[];
      return all.find((p) => p.processId === processId)?.status !== 'running';
    }, 10_000);
    const [logs, followed] = await Promise.all([cli(['logs', id, processId]), cli(['logs', id, processId, '-f'])]);
    expect(logs.code).toBe(0);
    expect(logs.stderr).toContain('GET /hello.txt');
    // -f replays what was kept and ends at the process's exit (it has exited already).
    expect(followed.code).toBe(0);
    expect(followed.stderr).toContain('GET /hello.txt');
  });

  it('keys create / ls / rm: a revoked key then fails with one line and a non-zero exit', async () => {
    const created = await cli(['keys', 'create', '--name', 'cli-test', '--preset', 'sandbox', '--json']);
    expect(created.code, created.stderr).toBe(0);
    const key = JSON.parse(created.stdout) as { id: string; key: string; preset: string };
    expect(key.preset).toBe('sandbox');
    const listed = JSON.parse((await cli(['keys', 'ls', '--json'])).stdout) as { id: string; name: string }[];
    expect(listed.find((k) => k.id === key.id)?.name).toBe('cli-test');
    expect(JSON.stringify(listed)).not.toContain(key.key);
    const withKey = await cli(['ls', '--json', '--api-key', key.key]);
    expect(withKey.code, withKey.stderr).toBe(0);
    expect((JSON.parse(withKey.stdout) as { id: string }[]).map((s) => s.id)).toContain(id);
    expect((await cli(['keys', 'rm', key.id])).code).toBe(0);
    expect((JSON.parse((await cli(['keys', '--json'])).stdout) as { id: string }[]).map((k) => k.id)).not.toContain(key.id);
    expectOneLineError(await cli(['ls', '--api-key', key.key]), /^error: unauthorized: /);
  });

  it('login checks the key, writes a 0600 profile, and later commands use it', async () => {
    const home = join(work, 'login-home');
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home, XDG_CONFIG_HOME: join(home, 'cfg'), NESTBOX_DATA_DIR: join(home, 'data') };
    // A wrong key is refused by the server and nothing is saved.
    expectOneLineError(await cli(['login', '--url', t.url], { env, stdin: 'nbx_wrong\n' }), /^error: unauthorized: /);
    expect(existsSync(join(home, 'cfg', 'nestbox', 'profiles.json'))).toBe(false);
    const login = await cli(['login', '--url', t.url], { env, stdin: `${t.apiKey}\n` });
    expect(login.code, login.stderr).toBe(0);
    const file = join(home, 'cfg', 'nestbox', 'profiles.json');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(JSON.parse(readFileSync(file, 'utf8'))).toEqual({ profiles: { default: { url: t.url, apiKey: t.apiKey } } });
    // No NESTBOX_URL / NESTBOX_API_KEY: the profile is what reaches the server.
    const listed = await cli(['ls', '--json'], { env });
    expect(listed.code, listed.stderr).toBe(0);
    expect((JSON.parse(listed.stdout) as { id: string }[]).map((s) => s.id)).toContain(id);
    // A named profile that was never saved is an error, not a silent fallback.
    expectOneLineError(await cli(['ls', '--profile', 'staging'], { env }), /no profile "staging"/);
  });

  it('bad arguments and unknown ids are one-line errors with a non-zero exit', async () => {
    const cases: [string[], RegExp][] = [
      [['create', '--cpu', 'lots'], /^error: .*--cpu.*must be a positive number/],
      [['ports', 'publish', id, '99999'], /port.*1-65535/],
      [['ls', '--state', 'sleepy'], /^error: --state "sleepy"/],
      [['get'], /^error: missing required argument 'id'/],
      [['get', 'sbxdoesnotexist'], /^error: not_found: /],
      [['frobnicate'], /^error: unknown command 'frobnicate'/],
    ];
    const runs = await Promise.all(cases.map(([args]) => cli(args)));
    cases.forEach(([, pattern], i) => expectOneLineError(runs[i]!, pattern));
  });

  it('completion bash is valid bash and completes commands from the command tree', async () => {
    const script = await cli(['completion', 'bash']);
    expect(script.code).toBe(0);
    const file = join(work, 'completion.bash');
    writeFileSync(file, script.stdout);
    const check = await new Promise<Run>((resolve) => execFile('bash', ['-n', file], (error, stdout, stderr) => resolve({ code: error ? 1 : 0, stdout, stderr })));
    expect(check, check.stderr).toMatchObject({ code: 0 });
    const complete = (words: string[]) => new Promise<string>((resolve, reject) => execFile('bash', ['-c', `source ${file}; COMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length - 1}; _nestbox; echo "\${COMPREPLY[*]}"`], (error, stdout) => (error ? reject(error) : resolve(stdout.trim()))));
    expect(await complete(['nestbox', 'por'])).toBe('ports');
    expect((await complete(['nestbox', 'ports', ''])).split(' ').sort()).toEqual(['help', 'ls', 'publish', 'unpublish']);
    expect((await complete(['nestbox', 'ports', 'publish', '--p'])).split(' ')).toContain('--public');
  });

  it('shell: an interactive PTY in a real terminal (tmux) that answers, follows a resize and exits with the shell\'s code; cp draws a progress bar there', async () => {
    const socket = `nbx-cli-test-${process.pid}`;
    const exitFile = join(work, 'shell-exit');
    const tmux = (...args: string[]) => new Promise<string>((resolve, reject) => execFile('tmux', ['-L', socket, ...args], { timeout: 10_000 }, (error, stdout, stderr) => (error ? reject(new Error(`tmux ${args[0]}: ${stderr}`)) : resolve(stdout))));
    const env = userEnv();
    const envArgs = Object.entries(env).flatMap(([k, v]) => ['-e', `${k}=${v}`]);
    const screen = () => tmux('capture-pane', '-p', '-t', 'cli');
    try {
      await tmux('new-session', '-d', '-s', 'cli', '-x', '100', '-y', '30', ...envArgs, `sh -c '${process.execPath} ${CLI} shell ${id}; echo EXIT=$? > ${exitFile}'`);
      await tmux('send-keys', '-t', 'cli', 'echo $((6*7))', 'Enter');
      await waitFor('42 on the screen', async () => /^42$/m.test(await screen()), 20_000, 100);
      await tmux('send-keys', '-t', 'cli', 'stty size', 'Enter');
      await waitFor('the first size', async () => /^30 100$/m.test(await screen()), 10_000, 100);
      await tmux('resize-window', '-t', 'cli', '-x', '120', '-y', '40');
      // The resize reaches the shell asynchronously (SIGWINCH, a control message, the PTY helper):
      // ask again until it shows.
      await waitFor('the new size', async () => {
        await tmux('send-keys', '-t', 'cli', 'clear; stty size', 'Enter');
        await new Promise((r) => setTimeout(r, 200));
        return /^40 120$/m.test(await screen());
      }, 15_000, 100);
      await tmux('send-keys', '-t', 'cli', 'exit 5', 'Enter');
      const exit = await waitFor('the CLI to exit', async () => (existsSync(exitFile) ? readFileSync(exitFile, 'utf8').trim() : undefined), 15_000, 100);
      expect(exit).toBe('EXIT=5');

      // On a terminal, a large cp draws its progress bar on stderr (the pane stays open after it).
      const cpExit = join(work, 'cp-exit');
      writeFileSync(join(work, 'bar.bin'), randomBytes(6 * 1024 * 1024));
      await tmux('new-session', '-d', '-s', 'cp', '-x', '100', '-y', '10', ...envArgs, `sh -c '${process.execPath} ${CLI} cp ${join(work, 'bar.bin')} ${id}:/tmp/bar.bin; echo CP=$? > ${cpExit}; sleep 60'`);
      expect(await waitFor('cp to finish', async () => (existsSync(cpExit) ? readFileSync(cpExit, 'utf8').trim() : undefined), 30_000, 100)).toBe('CP=0');
      expect(await tmux('capture-pane', '-p', '-t', 'cp')).toMatch(/100% \| 6\/6 MiB/);
    } finally {
      await tmux('kill-server').catch(() => undefined);
    }
  });

  it('resize: CPU and memory change live (PATCH), the disk only while stopped, no size is a one-line error', async () => {
    const resized = await cli(['resize', id, '--cpu', '2', '--memory', '768']);
    expect(resized.code, resized.stderr).toBe(0);
    expect(resized.stdout).toMatch(new RegExp(`^${id} 2 vCPU 768 MiB \\S+ GiB\n$`));
    expect(JSON.parse((await cli(['get', id, '--json'])).stdout)).toMatchObject({ cpu: 2, memoryMiB: 768, state: 'running' });
    const back = await cli(['resize', id, '--memory', '512', '--json']);
    expect(back.code, back.stderr).toBe(0);
    expect(JSON.parse(back.stdout)).toMatchObject({ id, cpu: 2, memoryMiB: 512 });
    expectOneLineError(await cli(['resize', id]), /--cpu, --memory and --disk/);
    expectOneLineError(await cli(['resize', id, '--disk', '100']), /^error: (invalid_state|validation_failed): /);
    expectOneLineError(await cli(['resize', id, '--cpu', 'two']), /cpu/);
  });

  it('pause and unpause, stop and resume: the sandbox keeps its disk across them; rm deletes it', async () => {
    expect((await cli(['exec', id, '--', 'echo kept > /root/kept.txt'])).code).toBe(0);
    expect(await cli(['pause', id])).toMatchObject({ code: 0, stdout: `${id} paused\n` });
    expect(await cli(['unpause', id])).toMatchObject({ code: 0, stdout: `${id} running\n` });
    const stopped = await cli(['stop', id]);
    expect(stopped).toMatchObject({ code: 0, stdout: `${id} stopped\n` });
    expect(JSON.parse((await cli(['get', id, '--json'])).stdout).state).toBe('stopped');
    const resumed = await cli(['resume', id, '--json']);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(JSON.parse(resumed.stdout)).toMatchObject({ id, state: 'running' });
    expect((await cli(['exec', id, '--', 'cat /root/kept.txt'])).stdout).toBe('kept\n');
    const removed = await cli(['rm', id]);
    expect(removed).toMatchObject({ code: 0, stdout: `${id}\n` });
    expectOneLineError(await cli(['get', id]), /^error: not_found: /);
  });
});
