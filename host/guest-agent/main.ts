// Entry point of the guest agent inside a sandbox:
//   node guest-agent.mjs --listen-fd <n> [--work-cgroup-fds <a,b,…>|-]
//                                            serve a listening socket inherited from the launcher;
//                                            the workload cgroup's procs files come as inherited
//                                            descriptors too (handed to nestbox-enter, see workload.ts)
//   node guest-agent.mjs --socket <path>     bind a Unix socket itself (tests, other transports)
//   … --key-fd <n>                           read the per-boot proof key (agent-protocol/auth.ts)
//                                            from this inherited descriptor, then close it
//   … --workload-userns-fd <n>               the workloads' user namespace (nestbox-seccomp.c
//                                            --agent-uid): every workload is moved into it, and
//                                            the agent, started as its own uid, takes root as its
//                                            effective uid only
// Without --key-fd the agent starts keyless and takes its key on PUT /auth/key (a Cloud
// Hypervisor guest, whose agent is started by the image). The key never travels in argv or the
// environment: both are inherited by every workload.
// The local driver uses --listen-fd: the socket is bound on the host side, in a directory the
// sandbox cannot see, so the sandbox cannot replace it. It runs under tini as PID 1, which
// reaps orphans, so nothing here deals with zombies.
import { closeSync, readSync } from 'node:fs';
import { lstat, mkdir, unlink } from 'node:fs/promises';
import type { Server } from 'node:http';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { AgentKeyHolder, decodeAgentKey } from '../agent-protocol/auth.js';
import { createAgentServer } from './server.js';

const SHUTDOWN_GRACE_MS = 2_000;

function log(message: string): void {
  process.stderr.write(`nestbox guest agent: ${message}\n`);
}

type ListenTarget = { socket: string } | { fd: number };

const USAGE = 'usage: guest-agent --socket <path> | --listen-fd <n>, then optionally --work-cgroup-fds <a,b,…>|-, --workload-userns-fd <n> and --key-fd <n>';
const KEY_READ_LIMIT_MS = 10_000;

function usage(): never {
  log(USAGE);
  process.exit(2);
}

interface AgentArgs {
  target: ListenTarget;
  workCgroupFds: number[];
  workloadUsernsFd?: number;
  keyFd?: number;
}

function argsOf(): AgentArgs {
  const { values } = parseArgs({
    options: { socket: { type: 'string' }, 'listen-fd': { type: 'string' }, 'work-cgroup-fds': { type: 'string' }, 'workload-userns-fd': { type: 'string' }, 'key-fd': { type: 'string' } },
    strict: true,
  });
  const fd = values['listen-fd'];
  const cgroupList = values['work-cgroup-fds'];
  const keyFd = values['key-fd'];
  const usernsFd = values['workload-userns-fd'];
  if (cgroupList !== undefined && cgroupList !== '-' && !/^\d+(,\d+)*$/.test(cgroupList)) usage();
  if (keyFd !== undefined && !/^\d+$/.test(keyFd)) usage();
  if (usernsFd !== undefined && !/^\d+$/.test(usernsFd)) usage();
  const common = {
    workCgroupFds: cgroupList && cgroupList !== '-' ? cgroupList.split(',').map(Number) : [],
    ...(keyFd === undefined ? {} : { keyFd: Number(keyFd) }),
    ...(usernsFd === undefined ? {} : { workloadUsernsFd: Number(usernsFd) }),
  };
  if (fd !== undefined && /^\d+$/.test(fd) && values.socket === undefined) return { target: { fd: Number(fd) }, ...common };
  if (values.socket && fd === undefined) return { target: { socket: values.socket }, ...common };
  usage();
}

/**
 * Reads the key to its end (the host wrote it and closed its side before we ran) and closes the
 * descriptor, so no workload started later can inherit it. Blocking is fine: nothing else runs yet.
 */
function readKeyFromFd(fd: number): Buffer {
  const chunks: Buffer[] = [];
  const deadline = Date.now() + KEY_READ_LIMIT_MS;
  try {
    for (let total = 0; total <= 1024; ) {
      const chunk = Buffer.alloc(256);
      let read: number;
      try {
        read = readSync(fd, chunk, 0, chunk.length, null);
      } catch (error) {
        // A descriptor left non-blocking: wait a little for the host's write.
        if ((error as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() > deadline) throw error;
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
        continue;
      }
      if (read === 0) break;
      chunks.push(chunk.subarray(0, read));
      total += read;
    }
  } finally {
    closeSync(fd);
  }
  const key = decodeAgentKey(Buffer.concat(chunks).toString('latin1'));
  if (!key) throw new Error(`descriptor ${fd} did not hold a proof key`);
  return key;
}

/** A socket file left by a previous agent would make listen fail with EADDRINUSE. */
async function removeStaleSocket(socketPath: string): Promise<void> {
  const existing = await lstat(socketPath).catch(() => undefined);
  if (existing?.isSocket()) await unlink(socketPath);
}

function listen(server: Server, target: string | { fd: number }): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(target, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

function installShutdown(server: Server): void {
  const shutdown = (signal: string): void => {
    log(`${signal} received, shutting down`);
    server.close(() => process.exit(0));
    server.closeIdleConnections();
    // A running exec would keep close() waiting; the sandbox is going away regardless.
    setTimeout(() => process.exit(0), SHUTDOWN_GRACE_MS).unref();
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
}

function installCrashGuards(): void {
  // The agent is the sandbox's only way in; a bug in one request must not take it down.
  process.on('uncaughtException', (error) => log(`uncaught exception: ${error.stack ?? error.message}`));
  process.on('unhandledRejection', (reason) => log(`unhandled rejection: ${(reason as Error)?.stack ?? String(reason)}`));
}

async function main(): Promise<void> {
  installCrashGuards();
  const { target, workCgroupFds, workloadUsernsFd, keyFd } = argsOf();
  // Started as the agent's own uid with its capabilities (nestbox-seccomp --agent-uid): root
  // becomes the effective uid only, so files are read and written as root while the real and
  // saved uid, the ones the kernel compares when a workload tries to signal us, stay ours.
  if (workloadUsernsFd !== undefined && process.geteuid?.() !== 0) process.seteuid?.(0);
  const keys = new AgentKeyHolder(keyFd === undefined ? undefined : readKeyFromFd(keyFd));
  const home = process.env.HOME || '/root';
  const server = createAgentServer({ home, env: process.env, keys, processes: { workCgroupFds, workloadUsernsFd } });
  if ('fd' in target) {
    await listen(server, { fd: target.fd });
  } else {
    await mkdir(dirname(target.socket), { recursive: true });
    await removeStaleSocket(target.socket);
    // No chmod of the socket: the agent can only reach what the sandbox can reach anyway, and
    // the host side may be running under a mapped uid that a tighter mode would lock out.
    await listen(server, target.socket);
  }
  installShutdown(server);
  log(`listening on ${'fd' in target ? `inherited fd ${target.fd}` : target.socket} (pid ${process.pid}, home ${home}, ${keys.key ? 'proof key from the host' : 'no proof key yet'})`);
}

main().catch((error: unknown) => {
  log(`failed to start: ${(error as Error)?.stack ?? String(error)}`);
  process.exit(1);
});
