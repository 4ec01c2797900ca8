// The systemd units of docs/deployment.md: systemd's own checker accepts them, what they run is
// this build's entry point, the settings they fix are ones the config knows, and the server unit's
// promise (a control plane needs no root) holds for the real program run as an unprivileged user.
import { spawn, spawnSync } from 'node:child_process';
import { chownSync, mkdtempSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { projectPath } from '../src/paths.js';
import { createTestDatabase, freePort, removeDataDir, waitFor } from './harness.js';

const UNITS = ['nestbox-server.service', 'nestbox-host-agent.service'].map((name) => projectPath(`deploy/systemd/${name}`));

/** `Key=value` lines of a unit's [Service] section (repeated keys kept in order). */
function serviceSettings(path: string): [string, string][] {
  const lines = readFileSync(path, 'utf8').split('\n');
  const start = lines.indexOf('[Service]');
  const settings: [string, string][] = [];
  for (const line of lines.slice(start + 1)) {
    if (line.startsWith('[')) break;
    const match = /^([A-Za-z]+)=(.*)$/.exec(line);
    if (match) settings.push([match[1], match[2]]);
  }
  return settings;
}

/** The NESTBOX_* variables a unit sets with Environment= (space-separated assignments). */
function unitEnvironment(path: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [key, value] of serviceSettings(path)) {
    if (key !== 'Environment') continue;
    for (const assignment of value.split(/\s+/).filter(Boolean)) {
      const eq = assignment.indexOf('=');
      env[assignment.slice(0, eq)] = assignment.slice(eq + 1);
    }
  }
  return env;
}

describe('systemd units', () => {
  it('pass systemd-analyze verify without a single complaint', () => {
    // Unknown keys and bad values are only warnings (exit 0), so any output at all is a failure.
    const result = spawnSyncText('systemd-analyze', ['verify', ...UNITS]);
    expect(result.output, result.output).toBe('');
    expect(result.status).toBe(0);
  });

  it('run this build\'s entry point with settings the config accepts', () => {
    const bin = (JSON.parse(readFileSync(projectPath('package.json'), 'utf8')) as { bin: { nestbox: string } }).bin.nestbox;
    for (const unit of UNITS) {
      const exec = serviceSettings(unit).find(([key]) => key === 'ExecStart')![1].split(' ');
      expect(exec[0]).toBe('/usr/bin/node');
      expect(exec[1]).toBe(`/opt/nestbox/${bin}`);
      expect(['server', 'host-agent']).toContain(exec[2]);
      const env = unitEnvironment(unit);
      expect(Object.keys(env).length).toBeGreaterThan(0);
      // Every variable is one the one schema knows (a typo would be silently ignored by it).
      expect(() => loadConfig(env)).not.toThrow();
      const known = readFileSync(projectPath('src/config.ts'), 'utf8');
      for (const name of Object.keys(env)) expect(known, name).toContain(`${name}:`);
    }
    const agent = serviceSettings(UNITS[1]);
    // Sandboxes outlive their agent: stopping or restarting the unit must not kill them.
    expect(agent).toContainEqual(['KillMode', 'process']);
  });

  it('the server unit\'s control plane runs as an unprivileged user and stops on SIGTERM', async () => {
    const env = unitEnvironment(UNITS[0]);
    const dataDir = mkdtempSync('/tmp/nbx-unit-');
    chownSync(dataDir, 65534, 65534);
    const database = await createTestDatabase();
    const port = await freePort();
    const output: string[] = [];
    // As systemd would start it: the unit's environment, a data dir of its own, user nobody.
    const child = spawn('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', '--', process.execPath, projectPath('dist/src/cli.js'), 'server'], {
      env: { PATH: process.env.PATH, ...env, NESTBOX_DATA_DIR: dataDir, NESTBOX_HOST: '127.0.0.1', NESTBOX_PORT: String(port), NESTBOX_DATABASE_URL: database.url, NESTBOX_HOST_SECRET: 'a'.repeat(40) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout!.on('data', (d) => output.push(String(d)));
    child.stderr!.on('data', (d) => output.push(String(d)));
    const exited = new Promise<number | string | null>((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal)));
    try {
      const health = await waitFor('the unprivileged server', async () => {
        const res = await fetch(`http://127.0.0.1:${port}/api/v1/health`).catch(() => undefined);
        return res?.ok ? ((await res.json()) as { hostsAvailable: number }) : undefined;
      }, 180_000).catch((err) => {
        throw new Error(`${(err as Error).message}\n${output.join('').slice(-3000)}`);
      });
      // No embedded host agent: host agents are their own units.
      expect(health.hostsAvailable).toBe(0);
      expect(readFileSync(`/proc/${child.pid}/status`, 'utf8')).toMatch(/^Uid:\s+65534\s/m);
      child.kill('SIGTERM');
      expect(await Promise.race([exited, new Promise((resolve) => setTimeout(() => resolve('still running'), 30_000))])).toBe(0);
    } finally {
      child.kill('SIGKILL');
      await database.drop();
      removeDataDir(dataDir);
    }
  }, 300_000);
});

function spawnSyncText(file: string, args: string[]): { status: number | null; output: string } {
  // Both streams: systemd-analyze prints its warnings on stderr and still exits 0.
  const result = spawnSync(file, args, { encoding: 'utf8' });
  if (result.error) throw result.error;
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}
