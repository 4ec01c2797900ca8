// Where the host keeps a sandbox's current proof key (auth.ts): `agent.key` in the sandbox's
// host directory, next to record.json, mode 0600. The sandbox never sees that directory. It is
// on disk, not only in memory, so that a restarted host agent can adopt running sandboxes and
// still check their answers; each boot writes a fresh key over the last one.
import { randomBytes } from 'node:crypto';
import { readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { decodeAgentKey, encodeAgentKey } from './auth.js';

export const AGENT_KEY_FILE = 'agent.key';

/** Atomic (temp file + rename): a crash leaves the old key or the new one, never half of one. */
export async function writeAgentKeyFile(dir: string, key: Buffer): Promise<void> {
  const path = join(dir, AGENT_KEY_FILE);
  const temp = `${path}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  await writeFile(temp, `${encodeAgentKey(key)}\n`, { mode: 0o600, flag: 'wx' });
  await rename(temp, path);
}

/** The stored key, or undefined when there is none (or it is unreadable or malformed). */
export async function readAgentKeyFile(dir: string): Promise<Buffer | undefined> {
  const text = await readFile(join(dir, AGENT_KEY_FILE), 'utf8').catch(() => undefined);
  return text === undefined ? undefined : decodeAgentKey(text);
}

export async function removeAgentKeyFile(dir: string): Promise<void> {
  await rm(join(dir, AGENT_KEY_FILE), { force: true });
}
