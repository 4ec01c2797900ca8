// Escape tests: real sandboxes on the real kernel, attacked from inside as their own root.
// Each block pins one finding of issue 11 (fd leaks, user namespaces and keyrings, seccomp,
// the guest agent's protection from its workloads, host paths in mountinfo).
// Runs as root. The fd-leak test runs a host agent in a child process (the compiled driver in
// dist/, which `npm test` builds first) so that it can hand that process a descriptor without
// close-on-exec, exactly like a shell or supervisor would.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver } from './driver.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const COMPILED_DRIVER = join(REPO, 'dist', 'host', 'drivers', 'local', 'driver.js');
const isRoot = process.getuid?.() === 0;

function spec(id: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 256, env: {}, ...overrides };
}

function uniqueId(prefix: string): string {
  return `${prefix}${randomBytes(4).toString('hex')}`;
}

async function sh(socket: string, cmd: string, timeoutMs = 30_000): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
  const client = new AgentClient(socket);
  try {
    return await client.exec({ cmd, timeoutMs });
  } finally {
    client.close();
  }
}

/** fd number → link target of every open descriptor of a host pid. */
function fdsOf(pid: number): Map<number, string> {
  const fds = new Map<number, string>();
  for (const entry of readdirSync(`/proc/${pid}/fd`)) {
    try {
      fds.set(Number(entry), readlinkSync(`/proc/${pid}/fd/${entry}`));
    } catch {
      // Closed meanwhile.
    }
  }
  return fds;
}

/** Host pids of every process of the sandbox (its cgroup subtree). */
async function sandboxPids(cgroups: Cgroups, ownerId: string, id: string): Promise<number[]> {
  return cgroups.pids(cgroups.groupFor(`nestbox/${ownerId}/${id}`));
}

/** The host pid of the sandbox's guest agent (the node process under tini). */
function agentPidOf(pids: number[]): number {
  const agent = pids.find((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('guest-agent.mjs') && readFileSync(`/proc/${pid}/comm`, 'utf8').trim() !== 'tini';
    } catch {
      return false;
    }
  });
  if (!agent) throw new Error(`no guest agent among ${pids.join(', ')}`);
  return agent;
}

describe.skipIf(!isRoot)('escape tests (real sandboxes)', () => {
  const dataDir = mkdtempSync('/tmp/nbxe-');
  const ownerId = uniqueId('esc');
  let cgroups: Cgroups;
  let driver: LocalDriver;
  const created = new Set<string>();

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE) || !existsSync(COMPILED_DRIVER)) execFileSync('npm', ['run', 'build'], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0, watchIntervalMs: 500 });
    await driver.init();
  }, 600_000);

  afterAll(async () => {
    for (const id of created) await driver.destroy(id).catch(() => {});
    await driver.close();
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  describe('finding 8: no host descriptor reaches the sandbox', () => {
    it('a descriptor the host agent inherited without close-on-exec is in no sandbox process; workloads hold only stdio', async () => {
      // A host agent in its own process that inherited fd 100 without close-on-exec, as from a
      // shell's `exec 100<file` (Node itself marks a few low descriptors close-on-exec at start,
      // but not these).
      const childDataDir = mkdtempSync('/tmp/nbxf-');
      const marker = join(childDataDir, 'inherited-marker');
      writeFileSync(marker, 'host only\n');
      const childOwner = uniqueId('escfd');
      const id = uniqueId('fd');
      const script = `
        import { LocalDriver } from ${JSON.stringify(COMPILED_DRIVER)};
        const driver = new LocalDriver({ dataDir: ${JSON.stringify(childDataDir)}, imagesDir: ${JSON.stringify(IMAGES_DIR)}, guestAgentBundle: ${JSON.stringify(AGENT_BUNDLE)}, ownerId: ${JSON.stringify(childOwner)}, slotPoolSize: 0 });
        await driver.init();
        const runtime = await driver.create({ id: ${JSON.stringify(id)}, image: 'default', cpu: 1, memoryMiB: 256, env: {} });
        process.stdout.write(JSON.stringify(runtime) + '\\n');
        process.stdin.resume();
        process.stdin.on('end', async () => { await driver.destroy(${JSON.stringify(id)}); await driver.close(); process.exit(0); });
      `;
      const host = spawn('/bin/bash', ['-c', 'exec 100<"$0"; exec "$1" --input-type=module -e "$2"', marker, process.execPath, script], { stdio: ['pipe', 'pipe', 'inherit'] });
      try {
        const line = await new Promise<string>((resolveLine, reject) => {
          const lines = createInterface({ input: host.stdout! });
          lines.once('line', resolveLine);
          host.once('exit', (code) => reject(new Error(`host agent child exited (${code}) before the sandbox ran`)));
        });
        const runtime = JSON.parse(line) as { agentSocket: string; pid: number };
        const leaked = fdsOf(host.pid!).get(100);
        expect(leaked).toBe(marker);

        const pids = [runtime.pid, ...(await sandboxPids(cgroups, childOwner, id))];
        expect(pids.length).toBeGreaterThan(2);
        for (const pid of pids) {
          const holding = [...fdsOf(pid)].filter(([, target]) => target === leaked);
          expect(holding, `process ${pid} (${readFileSync(`/proc/${pid}/comm`, 'utf8').trim()}) holds the host's descriptor`).toEqual([]);
        }
        // tini and the agent: stdio, then only the agent's listening socket (tini passes it on).
        const tini = pids.find((pid) => readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'tini')!;
        expect([...fdsOf(tini).keys()].sort((a, b) => a - b)).toEqual([0, 1, 2, 3]);
        expect(fdsOf(tini).get(3)).toMatch(/^socket:/);
        // A workload: stdio and the directory `ls` itself opened, nothing else.
        const listing = await sh(runtime.agentSocket, 'ls -l /proc/self/fd');
        const links = Object.fromEntries([...listing.stdout.matchAll(/ (\d+) -> (.+)$/gm)].map((match) => [Number(match[1]), match[2]]));
        expect(Object.keys(links).map(Number).sort((a, b) => a - b)).toEqual([0, 1, 2, 3]);
        expect(links[3]).toMatch(/^\/proc\/\d+\/fd$/);
      } finally {
        host.stdin!.end();
        await new Promise((resolveExit) => {
          if (host.exitCode !== null) resolveExit(undefined);
          else host.once('exit', resolveExit);
          setTimeout(() => host.kill('SIGKILL'), 60_000).unref();
        });
        await cgroups.remove(cgroups.groupFor(`nestbox/${childOwner}`)).catch(() => {});
        rmSync(childDataDir, { recursive: true, force: true });
      }
    }, 180_000);
  });
});
