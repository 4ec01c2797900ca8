// SSH access through the real @daytonaio/sdk (wave 2 §6): createSshAccess, validateSshAccess,
// revokeSshAccess, and then Debian's OpenSSH client running the `sshCommand` the SDK got, as a
// Daytona user would paste it. Creating access again revokes the earlier token.
import { execFile } from 'node:child_process';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '@daytonaio/sdk';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;
let sb: Sandbox;

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

/** Run the SDK's `sshCommand` (split into words) with a remote command, non-interactively. */
function runSshCommand(sshCommand: string, remote: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const [bin, ...args] = sshCommand.split(' ');
  const opts = ['-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'BatchMode=yes', '-o', 'LogLevel=ERROR', '-o', 'ConnectTimeout=10'];
  return new Promise((resolve) => {
    execFile(bin!, [...opts, ...args, remote], { timeout: 60_000, encoding: 'utf8' }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: number }).code ?? -1) : 0, stdout, stderr });
    });
  });
}

beforeAll(async () => {
  env = await startDaytonaEnv({ NESTBOX_SSH_PORT: String(await freePort()) });
  sb = await env.daytona.create();
}, 240_000);
afterAll(async () => {
  await env?.server.close();
}, 120_000);

describe('Daytona SSH access', () => {
  it('createSshAccess answers the SshAccessDto, and OpenSSH runs a command with its sshCommand', async () => {
    const access = await sb.createSshAccess(30);
    expect(access.sandboxId).toBe(sb.id);
    expect(access.token).toMatch(/^[A-Za-z0-9]{32}$/);
    expect(typeof access.id).toBe('string');
    for (const field of ['expiresAt', 'createdAt', 'updatedAt'] as const) expect(Number.isNaN(Date.parse(String(access[field])))).toBe(false);
    expect((Date.parse(String(access.expiresAt)) - Date.parse(String(access.createdAt))) / 60_000).toBeCloseTo(30, 1);
    expect(access.sshCommand).toMatch(new RegExp(`^ssh -p \\d+ ${access.token}@127\\.0\\.0\\.1$`));
    const r = await runSshCommand(access.sshCommand, 'echo ok; whoami >/dev/null; exit 0');
    expect(r, r.stderr).toMatchObject({ code: 0, stdout: 'ok\n' });
    // The default expiry is 60 minutes.
    const byDefault = await sb.createSshAccess();
    expect((Date.parse(String(byDefault.expiresAt)) - Date.parse(String(byDefault.createdAt))) / 60_000).toBeCloseTo(60, 1);
  }, 120_000);

  it('validateSshAccess: valid for the live token, not for an earlier one (creating access revokes it) nor an unknown one', async () => {
    const first = await sb.createSshAccess();
    const second = await sb.createSshAccess();
    expect(await sb.validateSshAccess(second.token)).toEqual({ valid: true, sandboxId: sb.id });
    expect(await sb.validateSshAccess(first.token)).toEqual({ valid: false, sandboxId: null });
    expect(await sb.validateSshAccess('A'.repeat(32))).toEqual({ valid: false, sandboxId: null });
    expect((await runSshCommand(first.sshCommand, 'echo no')).code).toBe(255);
    expect((await runSshCommand(second.sshCommand, 'echo yes')).stdout).toBe('yes\n');
  }, 120_000);

  it('revokeSshAccess(token) refuses the token from then on; revoking without one ends them all', async () => {
    const access = await sb.createSshAccess();
    expect((await runSshCommand(access.sshCommand, 'true')).code).toBe(0);
    await sb.revokeSshAccess(access.token);
    expect(await sb.validateSshAccess(access.token)).toEqual({ valid: false, sandboxId: null });
    const refused = await runSshCommand(access.sshCommand, 'echo no');
    expect(refused.code).toBe(255);
    expect(refused.stdout).toBe('');

    const another = await sb.createSshAccess();
    const all = await rawFetch(env, `/daytona/api/sandbox/${sb.id}/ssh-access`, { method: 'DELETE' });
    expect(all.status).toBe(200);
    expect((await all.json()).id).toBe(sb.id);
    expect(await sb.validateSshAccess(another.token)).toEqual({ valid: false, sandboxId: null });
  }, 120_000);

  it('answers 404 for an unknown sandbox and 400 for a bad expiry, in Daytona\'s error shape', async () => {
    const unknown = await rawFetch(env, '/daytona/api/sandbox/nosuchsandbox0/ssh-access', { method: 'POST' });
    expect(unknown.status).toBe(404);
    const bad = await rawFetch(env, `/daytona/api/sandbox/${sb.id}/ssh-access?expiresInMinutes=abc`, { method: 'POST' });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(await bad.json())).toMatch(/expiresInMinutes/);
  });
});
