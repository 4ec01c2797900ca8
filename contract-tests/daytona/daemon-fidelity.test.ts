// Answers that must be the Daytona daemon's and API's own (issue 13, Daytona items 17–24), through
// the real @daytonaio/sdk 0.218 (and 0.129 where it behaves differently). Paths are absolute under
// /tmp so nothing here depends on the sandbox's default user.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Daytona, DaytonaError, DaytonaProcessExecutionTimeoutError, DaytonaTimeoutError, DaytonaValidationError, type Sandbox } from '@daytonaio/sdk';
import { Daytona as LegacyDaytona } from 'daytona-sdk-legacy';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

describe('Daytona daemon and API fidelity', () => {
  let env: DaytonaTestEnv;
  let sb: Sandbox;
  beforeAll(async () => {
    env = await startDaytonaEnv();
    sb = await env.daytona.create({ labels: { suite: 'fidelity' } });
  });
  afterAll(async () => {
    await env?.server.close();
  });

  it('answers a command past its timeout with 408 and a message about the timeout (SDK 0.218 and 0.129)', async () => {
    const err = await sb.process.executeCommand('sleep 5', '/tmp', undefined, 1).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaProcessExecutionTimeoutError);
    expect(err).toBeInstanceOf(DaytonaTimeoutError);
    expect((err as DaytonaError).statusCode).toBe(408);
    expect((err as Error).message).toMatch(/timeout/);
    const code = await sb.process.codeRun('import time; time.sleep(5)', undefined, 1).catch((e: unknown) => e);
    expect((code as DaytonaError).statusCode).toBe(408);

    const legacy = new LegacyDaytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey, target: 'local' });
    const old = await legacy.get(sb.id);
    const legacyErr = await old.process.executeCommand('sleep 5', '/tmp', undefined, 1).catch((e: unknown) => e);
    expect((legacyErr as { statusCode?: number }).statusCode).toBe(408);
    expect((legacyErr as Error).message).toMatch(/timeout/);
  });

  it('completes session input with a newline and echoes it into the command log, as the daemon does', async () => {
    await sb.process.createSession('input');
    const reader = await sb.process.executeSessionCommand('input', { command: 'read name; echo "hello $name"', runAsync: true });
    // No newline: the daemon adds it, so `read` returns.
    await sb.process.sendSessionCommandInput('input', reader.cmdId!, 'nestbox');
    let followed = '';
    await sb.process.getSessionCommandLogs('input', reader.cmdId!, (c) => (followed += c), () => undefined);
    expect(followed).toBe('nestbox\nhello nestbox\n');
    const logs = await sb.process.getSessionCommandLogs('input', reader.cmdId!);
    expect(logs.stdout).toBe('nestbox\nhello nestbox\n');
    expect((await sb.process.getSessionCommand('input', reader.cmdId!)).exitCode).toBe(0);
    // Input to a command of another session is the daemon's 404, not a write to it.
    await sb.process.createSession('other');
    const res = await rawFetch(env, `/daytona/toolbox/${sb.id}/process/session/other/command/${reader.cmdId}/input`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ data: 'x' }) });
    expect(res.status).toBe(404);
  });

  it('answers JSON where the daemon does: PTY delete and upload-v2', async () => {
    const pty = await sb.process.createPty({ id: 'fid-pty', onData: () => undefined });
    await pty.waitForConnection();
    const res = await rawFetch(env, `/daytona/toolbox/${sb.id}/process/pty/fid-pty`, { method: 'DELETE' });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ message: 'PTY session deleted' });
    await pty.disconnect();

    const form = new FormData();
    form.append('file', new Blob(['v2 bytes']), 'x.txt');
    const up = await rawFetch(env, `/daytona/toolbox/${sb.id}/files/upload-v2?path=/tmp/fid/v2.txt`, { method: 'POST', body: form });
    expect(up.status).toBe(200);
    expect(await up.json()).toEqual({ name: 'v2.txt', path: '/tmp/fid/v2.txt', type: 'file' });
    expect((await sb.fs.downloadFile('/tmp/fid/v2.txt')).toString()).toBe('v2 bytes');
  });

  it('reports the sandbox disk size: the configured default when none was asked for', async () => {
    expect(sb.disk).toBe(10);
    expect((await env.daytona.get(sb.id)).disk).toBe(10);
  });

  it('accepts target unset or the server region and refuses any other naming target; refuses linkedSandbox', async () => {
    expect(sb.target).toBe('local');
    const inRegion = await new Daytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey, target: 'local' }).create();
    expect(inRegion.target).toBe('local');
    await inRegion.delete();
    const elsewhere = new Daytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey, target: 'eu' });
    const refused = await elsewhere.create().catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(DaytonaValidationError);
    // The message names the field and the regions the live hosts are in (placement, issue 16).
    expect((refused as Error).message).toMatch(/^target: no live host satisfies target=eu \(live hosts' regions: local\)/);

    const linked = await env.daytona.create({ linkedSandbox: sb.id, autoDeleteInterval: 0 }).catch((e: unknown) => e);
    expect((linked as DaytonaError).statusCode).toBe(501);
    expect((linked as Error).message).toMatch(/linkedSandbox/);
  });
});
