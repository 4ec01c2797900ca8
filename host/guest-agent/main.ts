// Entry point of the guest agent inside a sandbox:
//   node guest-agent.mjs --listen-fd <n> [--work-cgroup-fds <a,b,…>|-]
//                                            serve a listening socket inherited from the launcher;
//                                            the workload cgroup's procs files come as inherited
//                                            descriptors too (handed to nestbox-enter, see workload.ts)
//   node guest-agent.mjs --socket <path>     bind a Unix socket itself (tests, other transports)
// The local driver uses --listen-fd: the socket is bound on the host side, in a directory the
// sandbox cannot see, so the sandbox cannot replace it. It runs under tini as PID 1, which
// reaps orphans, so nothing here deals with zombies.
import { lstat, mkdir, unlink } from 'node:fs/promises';
import type { Server } from 'node:http';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { createAgentServer } from './server.js';

const SHUTDOWN_GRACE_MS = 2_000;

function log(message: string): void {
  process.stderr.write(`nestbox guest agent: ${message}\n`);
}

type ListenTarget = { socket: string } | { fd: number };

function usage(): never {
  log('usage: guest-agent --socket <path> | --listen-fd <n> [--work-cgroup-fds <a,b,…>|-]');
  process.exit(2);
}

function argsOf(): { target: ListenTarget; workCgroupFds: number[] } {
  const { values } = parseArgs({ options: { socket: { type: 'string' }, 'listen-fd': { type: 'string' }, 'work-cgroup-fds': { type: 'string' } }, strict: true });
  const fd = values['listen-fd'];
  const cgroupList = values['work-cgroup-fds'];
  if (cgroupList !== undefined && cgroupList !== '-' && !/^\d+(,\d+)*$/.test(cgroupList)) usage();
  const workCgroupFds = cgroupList && cgroupList !== '-' ? cgroupList.split(',').map(Number) : [];
  if (fd !== undefined && /^\d+$/.test(fd) && values.socket === undefined) return { target: { fd: Number(fd) }, workCgroupFds };
  if (values.socket && fd === undefined) return { target: { socket: values.socket }, workCgroupFds };
  usage();
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
  const { target, workCgroupFds } = argsOf();
  const home = process.env.HOME || '/root';
  const server = createAgentServer({ home, env: process.env, processes: { workCgroupFds } });
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
  log(`listening on ${'fd' in target ? `inherited fd ${target.fd}` : target.socket} (pid ${process.pid}, home ${home})`);
}

main().catch((error: unknown) => {
  log(`failed to start: ${(error as Error)?.stack ?? String(error)}`);
  process.exit(1);
});
