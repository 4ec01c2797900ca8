import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, chown, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createAgentServer } from '../guest-agent/server.js';
import { startTestAgent, type TestAgent } from '../guest-agent/testing.js';
import { AgentClient, AgentRequestError } from './client.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const MiB = 1024 * 1024;

async function rejection(promise: Promise<unknown>): Promise<AgentRequestError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof AgentRequestError) return error;
    throw error;
  }
  throw new Error('expected the call to fail');
}

async function sha256Of(stream: Readable): Promise<{ digest: string; bytes: number }> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const chunk of stream) {
    hash.update(chunk as Buffer);
    bytes += (chunk as Buffer).length;
  }
  return { digest: hash.digest('hex'), bytes };
}

/** Peak resident set of a process, from the kernel's own accounting. */
async function peakRssBytes(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const match = /^VmHWM:\s+(\d+) kB$/m.exec(status);
  if (!match) throw new Error(`no VmHWM for ${pid}`);
  return Number(match[1]) * 1024;
}

function exited(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolveExit) => child.once('exit', (code, signal) => resolveExit({ code, signal })));
}

describe('AgentClient against an in-process agent', () => {
  let agent: TestAgent;
  let client: AgentClient;

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  it('turns agent errors into AgentRequestError with status and code', async () => {
    const error = await rejection(client.exec({ argv: ['true'], cwd: 'does/not/exist' }));
    expect(error).toBeInstanceOf(AgentRequestError);
    expect(error).toMatchObject({ status: 400, code: 'validation_failed' });
    expect(error.message).toMatch(/^cwd: no such directory/);
  });

  it('reuses one keep-alive connection for sequential requests', async () => {
    let connections = 0;
    const count = (): void => {
      connections++;
    };
    agent.server.on('connection', count);
    const fresh = new AgentClient(agent.socketPath);
    try {
      for (let index = 0; index < 5; index++) await fresh.stat('/');
      await fresh.exec({ argv: ['true'] });
      expect(connections).toBe(1);
    } finally {
      agent.server.off('connection', count);
      fresh.close();
    }
  });

  it('passes requests through request() streaming in both directions', async () => {
    await writeFile(join(agent.home, 'source.bin'), randomBytes(3 * MiB));
    const download = await client.request({ method: 'GET', path: '/files/content?path=source.bin' });
    expect(download.statusCode).toBe(200);
    // The download's body becomes the upload's body without ever being collected.
    const upload = await client.request({ method: 'PUT', path: '/files/content?path=copy.bin&mode=600', body: download });
    const answer = JSON.parse((await readAllText(upload)) || '{}');
    expect(upload.statusCode).toBe(200);
    expect(answer).toMatchObject({ size: 3 * MiB, mode: 0o600 });
    expect((await readFile(join(agent.home, 'copy.bin'))).equals(await readFile(join(agent.home, 'source.bin')))).toBe(true);
  });

  it('returns non-2xx answers from request() untouched for the caller to pass on', async () => {
    const response = await client.request({ method: 'GET', path: '/files/stat?path=nothing-here' });
    expect(response.statusCode).toBe(404);
    expect(JSON.parse(await readAllText(response)).error.code).toBe('not_found');
  });
});

async function readAllText(response: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

describe('AgentClient when the agent is not there', () => {
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'nestbox-agent-client-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reports a missing socket as 503 host_unavailable', async () => {
    const client = new AgentClient(join(dir, 'missing.sock'));
    const error = await rejection(client.health());
    expect(error).toMatchObject({ status: 503, code: 'host_unavailable' });
    expect(error.message).toMatch(/guest agent is not reachable/);
    client.close();
  });

  it('reports a socket nobody listens on (ECONNREFUSED) as 503 host_unavailable', async () => {
    const stale = join(dir, 'stale.sock');
    // A listener killed with SIGKILL leaves its socket file behind, as a crashed agent would.
    try {
      execFileSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(stale)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    } catch {
      // Expected: the child died by SIGKILL.
    }
    const client = new AgentClient(stale);
    const error = await rejection(client.stat('/'));
    expect(error).toMatchObject({ status: 503, code: 'host_unavailable' });
    expect(error.message).toMatch(/not reachable.*ECONNREFUSED/);
    client.close();
  });

  it('waitReady gives up with the last failure in the message', async () => {
    const client = new AgentClient(join(dir, 'never.sock'));
    const started = Date.now();
    const error = await rejection(client.waitReady({ timeoutMs: 300, intervalMs: 50 }));
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(error).toMatchObject({ status: 503, code: 'host_unavailable' });
    expect(error.message).toMatch(/not ready within 300 ms; last failure: .*not reachable.*ENOENT/);
    client.close();
  });

  it('waitReady resolves once an agent starts listening', async () => {
    const socketPath = join(dir, 'late.sock');
    const client = new AgentClient(socketPath);
    const ready = client.waitReady({ timeoutMs: 5_000, intervalMs: 20 });
    // The agent appears only after several polls have failed, like a booting sandbox.
    await sleep(200);
    const server = createAgentServer({ home: dir, log: () => {} });
    await new Promise<void>((listening) => server.listen(socketPath, listening));
    try {
      expect((await ready).status).toBe('ok');
    } finally {
      client.close();
      server.closeAllConnections();
      await new Promise((closed) => server.close(closed));
    }
  });
});

describe('the bundled guest agent as a separate process', () => {
  let workDir: string;
  let bundlePath: string;

  beforeAll(async () => {
    workDir = await mkdtemp(join(tmpdir(), 'nestbox-bundled-agent-'));
    bundlePath = join(workDir, 'guest-agent.mjs');
    execFileSync(process.execPath, [join(repoRoot, 'scripts/bundle-guest-agent.mjs'), '--outfile', bundlePath]);
  }, 60_000);
  afterAll(async () => {
    await rm(workDir, { recursive: true, force: true });
  });

  async function launch(name: string, options: { uid?: number; gid?: number } = {}) {
    const home = join(workDir, `${name}-home`);
    const runDir = join(workDir, `${name}-run`);
    await mkdir(home, { recursive: true });
    await mkdir(runDir, { recursive: true });
    if (options.uid !== undefined) {
      await chown(home, options.uid, options.gid ?? options.uid);
      await chown(runDir, options.uid, options.gid ?? options.uid);
      await chmod(workDir, 0o755);
    }
    const socketPath = join(runDir, 'agent.sock');
    const child = spawn(process.execPath, [bundlePath, '--socket', socketPath], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home },
      stdio: ['ignore', 'ignore', 'pipe'],
      uid: options.uid,
      gid: options.gid,
    });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const client = new AgentClient(socketPath);
    await client.waitReady({ timeoutMs: 10_000, intervalMs: 50 });
    return { child, client, home, logs: () => stderr };
  }

  it('round-trips a 50 MiB file byte-identically without buffering it', async () => {
    const { child, client, home } = await launch('big');
    try {
      const localSource = join(workDir, 'random-50mib.bin');
      const sourceHash = createHash('sha256');
      const out = createWriteStream(localSource);
      for (let index = 0; index < 50; index++) {
        const chunk = randomBytes(MiB);
        sourceHash.update(chunk);
        if (!out.write(chunk)) await new Promise<void>((drain) => out.once('drain', () => drain()));
      }
      await new Promise<void>((done, fail) => out.end((error?: Error | null) => (error ? fail(error) : done())));
      const expectedDigest = sourceHash.digest('hex');

      // Warm up the code paths so the baseline includes JIT code and stream buffers.
      await client.writeFile('warmup.bin', Readable.from([randomBytes(MiB)]));
      await sha256Of(await client.readFile('warmup.bin'));
      const baseline = await peakRssBytes(child.pid as number);

      const info = await client.writeFile('nested/big.bin', createReadStream(localSource), { mode: '0640' });
      expect(info).toMatchObject({ size: 50 * MiB, mode: 0o640, path: join(home, 'nested/big.bin') });
      const readBack = await sha256Of(await client.readFile('nested/big.bin'));
      expect(readBack).toEqual({ digest: expectedDigest, bytes: 50 * MiB });
      const onDisk = await sha256Of(createReadStream(join(home, 'nested/big.bin')));
      expect(onDisk.digest).toBe(expectedDigest);

      const growth = (await peakRssBytes(child.pid as number)) - baseline;
      expect(growth).toBeLessThan(30 * MiB);
    } finally {
      client.close();
      child.kill('SIGKILL');
    }
  }, 120_000);

  it('exits 0 on SIGTERM and SIGINT', async () => {
    for (const signal of ['SIGTERM', 'SIGINT'] as const) {
      const { child, client, logs } = await launch(`signal-${signal}`);
      client.close();
      const exit = exited(child);
      child.kill(signal);
      expect(await exit).toEqual({ code: 0, signal: null });
      expect(logs()).toMatch(new RegExp(`${signal} received`));
    }
  });

  it('exits 2 with a usage line without --socket', async () => {
    const child = spawn(process.execPath, [bundlePath], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    expect((await exited(child)).code).toBe(2);
    expect(stderr).toMatch(/usage: guest-agent --socket <path>/);
  });

  it.runIf(process.getuid?.() === 0)('answers 403 forbidden for a file the sandbox user cannot read', async () => {
    const nobody = 65534;
    const { child, client, home } = await launch('unprivileged', { uid: nobody, gid: nobody });
    try {
      const secret = join(home, 'secret.txt');
      await writeFile(secret, 'root only');
      await chmod(secret, 0o600);
      const readError = await rejection(client.readFile('secret.txt'));
      expect(readError).toMatchObject({ status: 403, code: 'forbidden' });
      expect(readError.message).toContain(secret);
      const writeError = await rejection(client.writeFile('/root-owned-dir-that-nobody-can-create/x', Readable.from([Buffer.from('x')])));
      expect(writeError).toMatchObject({ status: 403, code: 'forbidden' });
    } finally {
      client.close();
      child.kill('SIGKILL');
    }
  });

  // Root reads every directory, so unreadable ones only exist for an unprivileged agent.
  it.runIf(process.getuid?.() === 0)('counts directories find cannot read instead of failing', async () => {
    const nobody = 65534;
    const { child, client, home } = await launch('unreadable', { uid: nobody, gid: nobody });
    try {
      await mkdir(join(home, 'proj', 'open'), { recursive: true });
      await mkdir(join(home, 'proj', 'locked'), { recursive: true });
      await writeFile(join(home, 'proj', 'open', 'a.ts'), 'x');
      await writeFile(join(home, 'proj', 'locked', 'b.ts'), 'x');
      await chmod(join(home, 'proj', 'locked'), 0o700); // root-owned: nobody cannot enter
      const res = await client.request({ method: 'GET', path: '/files/find?path=proj&pattern=*.ts' });
      const chunks: Buffer[] = [];
      for await (const c of res) chunks.push(c as Buffer);
      expect(res.statusCode).toBe(200);
      const found = JSON.parse(Buffer.concat(chunks).toString()) as { paths: string[]; unreadableDirs: number };
      expect(found.paths).toEqual([join(home, 'proj', 'open', 'a.ts')]);
      expect(found.unreadableDirs).toBe(1);
    } finally {
      client.close();
      child.kill('SIGKILL');
    }
  });
});
