// Entry point of the guest agent inside a sandbox:
//   node guest-agent.mjs --socket /.nestbox/run/agent.sock
// It runs under tini as PID 1, which reaps orphans, so nothing here deals with zombies.
import { lstat, mkdir, unlink } from 'node:fs/promises';
import type { Server } from 'node:http';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import { createAgentServer } from './server.js';

const SHUTDOWN_GRACE_MS = 2_000;

function log(message: string): void {
  process.stderr.write(`nestbox guest agent: ${message}\n`);
}

function socketPathFromArgs(): string {
  const { values } = parseArgs({ options: { socket: { type: 'string' } }, strict: true });
  if (!values.socket) {
    log('usage: guest-agent --socket <path>');
    process.exit(2);
  }
  return values.socket;
}

/** A socket file left by a previous agent would make listen fail with EADDRINUSE. */
async function removeStaleSocket(socketPath: string): Promise<void> {
  const existing = await lstat(socketPath).catch(() => undefined);
  if (existing?.isSocket()) await unlink(socketPath);
}

function listen(server: Server, socketPath: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => {
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
  const socketPath = socketPathFromArgs();
  const home = process.env.HOME || '/root';
  const server = createAgentServer({ home, env: process.env });
  await mkdir(dirname(socketPath), { recursive: true });
  await removeStaleSocket(socketPath);
  // No chmod of the socket: the agent can only reach what the sandbox can reach anyway, and the
  // host side may be running under a mapped uid that a tighter mode would lock out.
  await listen(server, socketPath);
  installShutdown(server);
  log(`listening on ${socketPath} (pid ${process.pid}, home ${home})`);
}

main().catch((error: unknown) => {
  log(`failed to start: ${(error as Error)?.stack ?? String(error)}`);
  process.exit(1);
});
