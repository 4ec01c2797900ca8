// The guest agent bundle's file layout (scripts/bundle-guest-agent.mjs): an entry file, run as
// `node <entry>`, and the chunks it imports lazily (dynamic import()) in a directory beside it.
// Whoever ships the agent into a sandbox or a VM image ships the chunk directory with the entry,
// as /.nestbox/lib/guest-agent-chunks/ next to /.nestbox/lib/guest-agent.mjs, and as unwritable
// by the sandbox as the entry: the agent imports a chunk at the first request that needs it,
// long after the sandbox's workloads have started. A bundle without a chunk directory (a test's
// stand-in) is just its entry.
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/** Must match CHUNKS_DIR in scripts/bundle-guest-agent.mjs, which writes the entry's imports. */
export const GUEST_AGENT_CHUNKS_DIR = 'guest-agent-chunks';

/** The chunk directory of the bundle whose entry is `entry`. */
export function guestAgentChunksOf(entry: string): string {
  return join(dirname(entry), GUEST_AGENT_CHUNKS_DIR);
}

/** The chunk files' names, sorted; none when the bundle has no chunk directory. */
export async function guestAgentChunkNames(entry: string): Promise<string[]> {
  const dir = guestAgentChunksOf(entry);
  if (!existsSync(dir)) return [];
  return (await readdir(dir, { withFileTypes: true }))
    .filter((item) => item.isFile() && item.name.endsWith('.mjs'))
    .map((item) => item.name)
    .sort();
}

/** A digest of the entry and every chunk (names and contents). */
export async function guestAgentBundleSha256(entry: string): Promise<string> {
  const hash = createHash('sha256').update(await readFile(entry));
  for (const name of await guestAgentChunkNames(entry)) hash.update(`\0${name}\0`).update(await readFile(join(guestAgentChunksOf(entry), name)));
  return hash.digest('hex');
}

/**
 * Copies the bundle to `targetEntry` and its chunks into the chunk directory beside it (always
 * made, empty for a bundle without chunks, so a mount point for it exists; an earlier bundle's
 * chunks there are removed): files 0644, the directory 0755.
 */
export async function copyGuestAgentBundle(entry: string, targetEntry: string): Promise<void> {
  const targetChunks = guestAgentChunksOf(targetEntry);
  await rm(targetChunks, { recursive: true, force: true });
  await mkdir(targetChunks, { recursive: true, mode: 0o755 });
  await chmod(targetChunks, 0o755);
  await copyFile(entry, targetEntry);
  await chmod(targetEntry, 0o644);
  for (const name of await guestAgentChunkNames(entry)) {
    await copyFile(join(guestAgentChunksOf(entry), name), join(targetChunks, name));
    await chmod(join(targetChunks, name), 0o644);
  }
}
