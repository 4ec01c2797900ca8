// Shared by the local driver's integration tests (never imported by the program).
import { randomBytes } from 'node:crypto';
import { AgentClient } from '../../agent-protocol/client.js';

export function uniqueId(prefix: string): string {
  return `${prefix}${randomBytes(4).toString('hex')}`;
}

/** One command through a sandbox's guest agent, on a connection of its own. */
export async function sh(socket: string, cmd: string, timeoutMs = 30_000): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
  const client = new AgentClient(socket);
  try {
    return await client.exec({ cmd, timeoutMs });
  } finally {
    client.close();
  }
}
