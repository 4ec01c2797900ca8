// The SSH gateway (issue 19) end to end: a real server with PostgreSQL and the local driver,
// and Debian's OpenSSH client binaries (ssh, scp, sftp) as the users run them. Tokens from the
// native API (exec, exit status, stdin, PTY, scp, sftp, `-L` forwarding; revoked and expired
// tokens refused), organisation public keys (username = sandbox id; another organisation's key
// refused), a stopped and a paused sandbox woken by a connection, failed logins limited.
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { projectPath } from '../src/paths.js';

let t: TestServer;
let work: string;
let sshPort: number;
let sandboxId: string;

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

interface Run { code: number; stdout: string; stderr: string }
const COMMON = ['-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'BatchMode=yes', '-o', 'LogLevel=ERROR', '-o', 'ConnectTimeout=10'];

/** Run an OpenSSH client binary with a clean HOME (no ~/.ssh keys or config of this machine). */
function run(bin: string, args: string[], input?: string | Buffer, timeoutMs = 90_000, env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(bin, args, { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, ...env }, timeout: timeoutMs, encoding: 'utf8', maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof (error as { code?: unknown }).code === 'number' ? ((error as { code: number }).code) : -1) : 0, stdout, stderr });
    });
    if (input !== undefined) child.stdin!.end(input);
    else child.stdin!.end();
  });
}
const ssh = (user: string, command: string[], extra: string[] = [], input?: string) => run('ssh', [...COMMON, '-p', String(sshPort), ...extra, `${user}@127.0.0.1`, ...command], input);

async function token(id = sandboxId, body: Record<string, unknown> = {}): Promise<string> {
  const res = await t.http.post(`/api/v1/sandboxes/${id}/ssh-access`).set(t.auth).send(body);
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.token as string;
}

async function newSandbox(auth = t.auth): Promise<string> {
  const res = await t.http.post('/api/v1/sandboxes').set(auth).send({ timeoutSeconds: 0, memoryMiB: 512 });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.id as string;
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'nestbox-ssh-'));
  sshPort = await freePort();
  t = await startTestServer({ env: { NESTBOX_SSH_PORT: String(sshPort), NESTBOX_SSH_MAX_AUTH_FAILURES_PER_MINUTE: '12' } });
  sandboxId = await newSandbox();
}, 240_000);
afterAll(async () => {
  await t?.close();
  if (work) rmSync(work, { recursive: true, force: true });
}, 180_000);

describe('SSH with an access token', () => {
  it('creates a token whose sshCommand names the gateway, and `ssh` with it runs `echo ok`', async () => {
    const res = await t.http.post(`/api/v1/sandboxes/${sandboxId}/ssh-access`).set(t.auth).send({ expiresInMinutes: 30 });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    expect(res.body.token).toMatch(/^[A-Za-z0-9]{32}$/);
    expect(res.body.sandboxId).toBe(sandboxId);
    expect(res.body.sshCommand).toBe(`ssh -p ${sshPort} ${res.body.token}@127.0.0.1`);
    const minutes = (Date.parse(res.body.expiresAt) - Date.parse(res.body.createdAt)) / 60_000;
    expect(minutes).toBeCloseTo(30, 1);
    const r = await ssh(res.body.token, ['echo ok']);
    expect(r, r.stderr).toMatchObject({ code: 0, stdout: 'ok\n' });
    // It ran in the sandbox (the sandbox's hostname is its id).
    expect((await ssh(res.body.token, ['cat /etc/hostname'])).stdout.trim()).toBe(sandboxId);
  }, 120_000);

  it('passes the exit status, stdout and stderr apart, and stdin through to its EOF', async () => {
    const tok = await token();
    expect((await ssh(tok, ['exit 3'])).code).toBe(3);
    const both = await ssh(tok, ['echo out; echo err >&2; exit 0']);
    expect(both).toMatchObject({ code: 0, stdout: 'out\n', stderr: 'err\n' });
    const piped = await ssh(tok, ['tr a-z A-Z'], [], 'hello over ssh\n');
    expect(piped).toMatchObject({ code: 0, stdout: 'HELLO OVER SSH\n' });
  }, 120_000);

  it('runs a PTY session (ssh -tt): a command typed in, its output read, the shell\'s exit status', async () => {
    const tok = await token();
    // The client's TERM travels with its pty request.
    const r = await run('ssh', [...COMMON, '-p', String(sshPort), '-tt', `${tok}@127.0.0.1`], 'echo "tty:$(tty)" "$((6*7))" "term:$TERM"\nexit 5\n', 90_000, { TERM: 'xterm-nestbox' });
    expect(r.code, r.stdout + r.stderr).toBe(5);
    expect(r.stdout).toMatch(/tty:\/dev\/pts\/\d+ 42 term:xterm-nestbox/);
  }, 120_000);

  it('copies a file both ways with scp (SFTP, OpenSSH\'s default), byte for byte', async () => {
    const tok = await token();
    const data = randomBytes(3 * 1024 * 1024 + 17);
    const local = join(work, 'up.bin');
    writeFileSync(local, data);
    const up = await run('scp', [...COMMON, '-P', String(sshPort), local, `${tok}@127.0.0.1:/tmp/up.bin`]);
    expect(up.code, up.stderr).toBe(0);
    // The sandbox has it, as the file API sees it.
    const stat = await t.http.get(`/api/v1/sandboxes/${sandboxId}/files/stat`).query({ path: '/tmp/up.bin' }).set(t.auth);
    expect(stat.body.size).toBe(data.length);
    const back = join(work, 'down.bin');
    const down = await run('scp', [...COMMON, '-P', String(sshPort), `${tok}@127.0.0.1:/tmp/up.bin`, back]);
    expect(down.code, down.stderr).toBe(0);
    expect(readFileSync(back).equals(data)).toBe(true);
  }, 120_000);

  it('serves sftp: mkdir, put, ls, get, rename, rm', async () => {
    const tok = await token();
    writeFileSync(join(work, 'hello.txt'), 'hello sftp\n');
    const batch = join(work, 'batch');
    writeFileSync(batch, [`mkdir /tmp/sf`, `put ${join(work, 'hello.txt')} /tmp/sf/a.txt`, 'ls -l /tmp/sf', `get /tmp/sf/a.txt ${join(work, 'got.txt')}`, 'rename /tmp/sf/a.txt /tmp/sf/b.txt', 'ls /tmp/sf', 'rm /tmp/sf/b.txt', 'rmdir /tmp/sf'].join('\n') + '\n');
    const r = await run('sftp', [...COMMON, '-P', String(sshPort), '-b', batch, `${tok}@127.0.0.1`]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/a\.txt/);
    expect(r.stdout).toMatch(/b\.txt/);
    expect(readFileSync(join(work, 'got.txt'), 'utf8')).toBe('hello sftp\n');
    expect((await ssh(tok, ['test -e /tmp/sf && echo there || echo gone'])).stdout).toBe('gone\n');
  }, 120_000);

  it('forwards a local port (ssh -L) to a server listening on 127.0.0.1 inside the sandbox', async () => {
    const tok = await token();
    const started = await t.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(t.auth).send({ cmd: 'mkdir -p /tmp/www && echo inside > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8123 --bind 127.0.0.1', detach: true });
    expect(started.status, JSON.stringify(started.body)).toBe(202);
    await waitFor('the server inside', async () => (await ssh(tok, ['python3 -c "import socket; socket.create_connection((\'127.0.0.1\', 8123))" && echo up'])).stdout === 'up\n' || undefined, 30_000, 500);
    const local = await freePort();
    const tunnel = spawn('ssh', [...COMMON, '-p', String(sshPort), '-N', '-o', 'ExitOnForwardFailure=yes', '-L', `127.0.0.1:${local}:127.0.0.1:8123`, `${tok}@127.0.0.1`], { env: { PATH: process.env.PATH ?? '', HOME: work }, stdio: 'ignore' });
    try {
      const body = await waitFor('the page through the tunnel', async () => {
        const res = await fetch(`http://127.0.0.1:${local}/index.html`).catch(() => undefined);
        return res?.ok ? await res.text() : undefined;
      }, 30_000, 300);
      expect(body).toBe('inside\n');
      // From the host, that loopback-only server is not reachable any other way.
    } finally {
      tunnel.kill('SIGTERM');
    }
  }, 120_000);

  it('refuses a revoked token and an expired one, and a token of another sandbox cannot be used on this one', async () => {
    const tok = await token();
    expect((await ssh(tok, ['true'])).code).toBe(0);
    const revoke = await t.http.delete(`/api/v1/sandboxes/${sandboxId}/ssh-access`).query({ token: tok }).set(t.auth);
    expect(revoke.status).toBe(200);
    expect(revoke.body.revoked).toBe(1);
    const refused = await ssh(tok, ['echo no']);
    expect(refused.code).toBe(255);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(/Permission denied/);

    const expiring = await token(sandboxId, { expiresInMinutes: 1 });
    expect((await ssh(expiring, ['true'])).code).toBe(0);
    // Its minute passes (the gateway compares with the clock on every login).
    await t.server.db('ssh_access_tokens').where('expires_at', '>', new Date()).where({ sandbox_id: sandboxId }).whereNull('revoked_at').update({ expires_at: new Date(Date.now() - 1000) });
    const late = await ssh(expiring, ['echo no']);
    expect(late.code).toBe(255);
    expect(late.stdout).toBe('');
  }, 120_000);

  it('validates its input: a bad expiry is a 400 naming the field, an unknown sandbox a 404', async () => {
    const bad = await t.http.post(`/api/v1/sandboxes/${sandboxId}/ssh-access`).set(t.auth).send({ expiresInMinutes: 0 });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body)).toMatch(/expiresInMinutes/);
    const tooLong = await t.http.post(`/api/v1/sandboxes/${sandboxId}/ssh-access`).set(t.auth).send({ expiresInMinutes: 100_000 });
    expect(tooLong.status).toBe(400);
    const unknown = await t.http.post('/api/v1/sandboxes/nosuchsandbox0/ssh-access').set(t.auth).send({});
    expect(unknown.status).toBe(404);
  });
});

describe('SSH with an organisation\'s public key', () => {
  let keyFile: string;
  let other: { key: string; sandbox: string; keyFile: string };

  beforeAll(async () => {
    keyFile = join(work, 'id_a');
    expect((await run('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'alice@test', '-f', keyFile])).code).toBe(0);
    const org = await t.http.post('/api/v1/organizations').set(t.auth).send({ name: 'ssh-other' });
    expect(org.status, JSON.stringify(org.body)).toBe(201);
    const key = await t.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(t.auth).send({});
    const otherKey = join(work, 'id_b');
    expect((await run('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'bob@test', '-f', otherKey])).code).toBe(0);
    other = { key: key.body.key, sandbox: await newSandbox({ Authorization: `Bearer ${key.body.key}` }), keyFile: otherKey };
  }, 180_000);

  const withKey = (file: string) => ['-i', file, '-o', 'IdentitiesOnly=yes'];

  it('registers a key (list, duplicate 409, bad key 400) and logs in as the sandbox id with it', async () => {
    const pub = readFileSync(`${keyFile}.pub`, 'utf8').trim();
    const before = await ssh(sandboxId, ['echo no'], withKey(keyFile));
    expect(before.code).toBe(255);
    const added = await t.http.post('/api/v1/ssh-keys').set(t.auth).send({ publicKey: pub });
    expect(added.status, JSON.stringify(added.body)).toBe(201);
    expect(added.body).toMatchObject({ keyType: 'ssh-ed25519', comment: 'alice@test' });
    const fp = await run('ssh-keygen', ['-l', '-E', 'sha256', '-f', `${keyFile}.pub`]);
    expect(fp.stdout).toContain(added.body.fingerprint);
    expect((await t.http.post('/api/v1/ssh-keys').set(t.auth).send({ publicKey: pub })).status).toBe(409);
    const bad = await t.http.post('/api/v1/ssh-keys').set(t.auth).send({ publicKey: 'ssh-ed25519 notakey' });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.body)).toMatch(/publicKey/);
    const listed = await t.http.get('/api/v1/ssh-keys').set(t.auth);
    expect(listed.body.items.map((k: { id: string }) => k.id)).toContain(added.body.id);

    const r = await ssh(sandboxId, ['echo ok'], withKey(keyFile));
    expect(r, r.stderr).toMatchObject({ code: 0, stdout: 'ok\n' });
  }, 120_000);

  it('keeps organisations apart: a key of one cannot open the other\'s sandbox, nor see its keys', async () => {
    const otherAuth = { Authorization: `Bearer ${other.key}` };
    const added = await t.http.post('/api/v1/ssh-keys').set(otherAuth).send({ publicKey: readFileSync(`${other.keyFile}.pub`, 'utf8') });
    expect(added.status).toBe(201);
    // Each key opens its own organisation's sandbox…
    expect((await ssh(other.sandbox, ['echo ok'], withKey(other.keyFile))).stdout).toBe('ok\n');
    // …and not the other one's.
    expect((await ssh(other.sandbox, ['echo no'], withKey(keyFile))).code).toBe(255);
    expect((await ssh(sandboxId, ['echo no'], withKey(other.keyFile))).code).toBe(255);
    // A token of org A's sandbox never opens org B's, and B cannot mint one for A's sandbox.
    expect((await t.http.post(`/api/v1/sandboxes/${sandboxId}/ssh-access`).set(otherAuth).send({})).status).toBe(404);
    const listed = await t.http.get('/api/v1/ssh-keys').set(otherAuth);
    expect(listed.body.items).toHaveLength(1);
    expect((await t.http.delete(`/api/v1/ssh-keys/${(await t.http.get('/api/v1/ssh-keys').set(t.auth)).body.items[0].id}`).set(otherAuth)).status).toBe(404);
  }, 120_000);

  it('refuses a deleted key', async () => {
    const listed = await t.http.get('/api/v1/ssh-keys').set({ Authorization: `Bearer ${other.key}` });
    expect((await t.http.delete(`/api/v1/ssh-keys/${listed.body.items[0].id}`).set({ Authorization: `Bearer ${other.key}` })).status).toBe(204);
    expect((await ssh(other.sandbox, ['echo no'], withKey(other.keyFile))).code).toBe(255);
  }, 60_000);
});

describe('a connection wakes its sandbox', () => {
  it('starts a stopped sandbox and resumes a paused one, then runs the command', async () => {
    const tok = await token();
    const stopped = await t.http.post(`/api/v1/sandboxes/${sandboxId}/stop`).set(t.auth).send({});
    expect(stopped.body.state, JSON.stringify(stopped.body)).toBe('stopped');
    const a = await ssh(tok, ['echo woke']);
    expect(a, a.stderr).toMatchObject({ code: 0, stdout: 'woke\n' });
    expect((await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set(t.auth)).body.state).toBe('running');

    const paused = await t.http.post(`/api/v1/sandboxes/${sandboxId}/pause`).set(t.auth).send({});
    expect(paused.body.state, JSON.stringify(paused.body)).toBe('paused');
    const b = await ssh(tok, ['echo unpaused']);
    expect(b, b.stderr).toMatchObject({ code: 0, stdout: 'unpaused\n' });
    expect((await t.http.get(`/api/v1/sandboxes/${sandboxId}`).set(t.auth)).body.state).toBe('running');
  }, 180_000);
});

describe('the CLI', () => {
  it('`nestbox ssh <id> <command>` runs it over OpenSSH with a fresh token; `nestbox ssh-keys` lists the keys', async () => {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, XDG_CONFIG_HOME: join(work, 'config'), NESTBOX_DATA_DIR: join(work, 'cli-data'), NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey };
    const cli = (args: string[]) =>
      new Promise<Run>((resolve) => {
        execFile(process.execPath, [projectPath('dist/src/cli.js'), ...args], { env, timeout: 60_000, encoding: 'utf8' }, (error, stdout, stderr) => {
          resolve({ code: error ? Number((error as { code?: number }).code ?? -1) : 0, stdout, stderr });
        });
      });
    // ssh's own options for a test machine, then the command.
    const r = await cli(['ssh', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'LogLevel=ERROR', '-o', 'BatchMode=yes', sandboxId, 'echo via-cli; exit 4']);
    expect(r.stdout, r.stderr).toBe('via-cli\n');
    expect(r.code).toBe(4);
    const printed = await cli(['ssh', sandboxId, '--print']);
    expect(printed.stdout).toMatch(new RegExp(`^ssh -p ${sshPort} [A-Za-z0-9]{32}@127\\.0\\.0\\.1\n$`));
    const keys = await cli(['ssh-keys', 'ls', '--json']);
    expect(keys.code, keys.stderr).toBe(0);
    expect(JSON.parse(keys.stdout).map((k: { comment: string }) => k.comment)).toContain('alice@test');
  }, 120_000);
});

describe('failed logins', () => {
  it('are limited per client address: past the limit even a good token is refused for a while', async () => {
    const tok = await token();
    for (let i = 0; i < 12; i++) await ssh('A'.repeat(32), ['true']);
    const r = await ssh(tok, ['echo no']);
    expect(r.code).toBe(255);
    // The gateway's log says why, and never carries a token.
    expect(t.logs.some((l) => l.includes('too many failed attempts'))).toBe(true);
    expect(t.logs.some((l) => l.includes(tok))).toBe(false);
  }, 120_000);
});
