// commands.* and pty.* through the real `e2b` SDK (envd process.Process over Connect, e2b.md (c)).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CommandExitError, Sandbox, TimeoutError } from 'e2b';
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

describe('e2b commands', () => {
  it('runs a foreground command with stdout, stderr, cwd and envs', async () => {
    const stdout: string[] = [];
    const stderr: string[] = [];
    const result = await sbx.commands.run('echo out; echo err >&2; pwd; echo $FOO', {
      cwd: '/tmp',
      envs: { FOO: 'bar' },
      onStdout: (d) => void stdout.push(d),
      onStderr: (d) => void stderr.push(d),
    });
    expect(result.exitCode).toBe(0);
    expect(result.stdout).toBe('out\n/tmp\nbar\n');
    expect(result.stderr).toBe('err\n');
    expect(stdout.join('')).toBe('out\n/tmp\nbar\n');
    expect(stderr.join('')).toBe('err\n');
  });

  it('throws CommandExitError for a non-zero exit', async () => {
    const err = await sbx.commands.run('echo partial; echo bad >&2; exit 3').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    const e = err as CommandExitError;
    expect(e.exitCode).toBe(3);
    expect(e.stdout).toBe('partial\n');
    expect(e.stderr).toBe('bad\n');
    expect(e.error).toBe('exit status 3');
  });

  it('kills a command at its timeout (Connect-Timeout-Ms is the process lifetime)', async () => {
    const started = Date.now();
    await expect(sbx.commands.run('sleep 30', { timeoutMs: 1500 })).rejects.toBeInstanceOf(TimeoutError);
    expect(Date.now() - started).toBeLessThan(10_000);
    await sleep(500);
    const procs = await sbx.commands.list();
    expect(procs.some((p) => p.args.join(' ').includes('sleep 30'))).toBe(false);
  });

  it('runs in the background, lists, connects, streams stdin and kills', async () => {
    const handle = await sbx.commands.run('cat', { background: true, stdin: true });
    expect(handle.pid).toBeGreaterThan(0);
    const listed = await sbx.commands.list();
    const mine = listed.find((p) => p.pid === handle.pid);
    expect(mine).toBeDefined();
    expect(mine!.cmd).toBe('/bin/bash');
    expect(mine!.args).toEqual(['-l', '-c', 'cat']);

    const seen: string[] = [];
    const attached = await sbx.commands.connect(handle.pid, { onStdout: (d) => void seen.push(d) });
    await sbx.commands.sendStdin(handle.pid, 'hello stdin\n');
    for (let i = 0; i < 50 && !seen.join('').includes('hello stdin'); i++) await sleep(100);
    expect(seen.join('')).toBe('hello stdin\n');

    expect(await sbx.commands.kill(handle.pid)).toBe(true);
    const err = await handle.wait().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect((err as CommandExitError).exitCode).toBe(137);
    await attached.wait().catch(() => undefined);
    // Gone: kill answers not_found → false.
    expect(await sbx.commands.kill(handle.pid)).toBe(false);
    expect((await sbx.commands.list()).some((p) => p.pid === handle.pid)).toBe(false);
  });

  it('closes stdin so a reader finishes', async () => {
    const handle = await sbx.commands.run('wc -c', { background: true, stdin: true });
    await sbx.commands.sendStdin(handle.pid, 'abcd');
    await sbx.commands.closeStdin(handle.pid);
    const result = await handle.wait();
    expect(result.stdout.trim()).toBe('4');
  });

  it('collects background output through wait()', async () => {
    const out: string[] = [];
    const handle = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.1; done', { background: true, onStdout: (d) => void out.push(d) });
    const result = await handle.wait();
    expect(result.exitCode).toBe(0);
    expect(result.stdout).toBe('line1\nline2\nline3\n');
    expect(out.join('')).toBe('line1\nline2\nline3\n');
  });

  it('reports an unknown pid as not found', async () => {
    expect(await sbx.commands.kill(999_999)).toBe(false);
    await expect(sbx.commands.connect(999_999)).rejects.toThrow(/not found/);
  });
});

describe('e2b commands when the sandbox dies', () => {
  it('ends a streaming command the way envd does when its sandbox is killed', async () => {
    const victim = await Sandbox.create(t.opts);
    const background = await victim.commands.run('sleep 600', { background: true });
    const foreground = victim.commands.run('sleep 600').catch((e: unknown) => e);
    // Both streams are open once the foreground command is listed.
    for (let i = 0; i < 50 && (await victim.commands.list()).filter((p) => p.args.join(' ').includes('sleep 600')).length < 2; i++) await sleep(100);
    // Killed by another client, as E2B users do from elsewhere.
    expect(await Sandbox.kill(victim.sandboxId, t.opts)).toBe(true);
    for (const err of [await background.wait().catch((e: unknown) => e), await foreground]) {
      // The connection breaks (no Connect error), the SDK's health probe then sees the sandbox gone.
      expect(err).toBeInstanceOf(TimeoutError);
      expect(String((err as Error).message)).toContain('The sandbox was killed or reached its end of life while the request was in flight');
    }
  });
});

describe('e2b pty', () => {
  it('creates a terminal, sends input, resizes and kills it', async () => {
    const decoder = new TextDecoder();
    let output = '';
    const terminal = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => void (output += decoder.decode(d, { stream: true })), timeoutMs: 60_000 });
    expect(terminal.pid).toBeGreaterThan(0);
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size; echo pty-$((40+2))\n'));
    for (let i = 0; i < 50 && !output.includes('pty-42'); i++) await sleep(100);
    expect(output).toContain('24 80');
    expect(output).toContain('pty-42');

    await sbx.pty.resize(terminal.pid, { cols: 100, rows: 30 });
    await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size\n'));
    for (let i = 0; i < 50 && !output.includes('30 100'); i++) await sleep(100);
    expect(output).toContain('30 100');

    expect(await sbx.pty.kill(terminal.pid)).toBe(true);
    const err = await terminal.wait().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CommandExitError);
  });
});
