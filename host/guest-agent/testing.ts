// Test support: an in-process guest agent on a Unix socket in a fresh temp directory, with its
// own home directory so tests never depend on the machine's HOME.
import { mkdtemp, rm } from 'node:fs/promises';
import type { Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createAgentServer, type AgentServerOptions } from './server.js';

export interface TestAgent {
  server: Server;
  socketPath: string;
  home: string;
  root: string;
  stop(): Promise<void>;
}

export async function startTestAgent(options: Partial<AgentServerOptions> = {}): Promise<TestAgent> {
  const root = await mkdtemp(join(tmpdir(), 'nestbox-guest-agent-'));
  const home = options.home ?? (await mkdtemp(join(root, 'home-')));
  const socketPath = join(root, 'agent.sock');
  const server = createAgentServer({ log: () => {}, ...options, home });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, resolve);
  });
  return {
    server,
    socketPath,
    home,
    root,
    async stop() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await rm(root, { recursive: true, force: true });
    },
  };
}
