// File-system helpers shared by the image builder, the storage and network modules and both
// drivers: removing trees that may hold mounts, atomic writes, and host paths safe to hand to
// mount options and launcher arguments.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { rename, writeFile } from 'node:fs/promises';
import { mountPointsUnder } from './mounts.js';

/**
 * Removes a tree. debootstrap mounts /proc and /sys inside its target while it runs, so a
 * crashed build can leave mounts behind; they are detached first and `rm --one-file-system`
 * guarantees we never delete through a mount into the host.
 */
export async function removeTree(path: string): Promise<void> {
  for (const mountPoint of mountPointsUnder(path).reverse()) {
    try {
      execFileSync('umount', ['-l', mountPoint], { stdio: 'ignore' });
    } catch {
      // Already gone (a parent's lazy unmount takes children with it).
    }
  }
  execFileSync('rm', ['-rf', '--one-file-system', '--', path], { stdio: 'ignore' });
}

/** Temp file + rename: a kill -9 leaves the old content or the new, never half of it. */
export async function writeFileAtomic(path: string, content: string, mode = 0o644): Promise<void> {
  const temp = `${path}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  await writeFile(temp, content, { mode });
  await rename(temp, path);
}

/** Paths go into comma- and colon-separated mount options: refuse what could break out of them. */
export function assertSafeHostPath(label: string, path: string): void {
  if (!path.startsWith('/') || /[,:\\\n\r\t\0]/.test(path)) {
    throw new Error(`${label} path "${path}" must be absolute and free of commas, colons, backslashes and control characters`);
  }
}
