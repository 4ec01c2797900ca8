// Commands in an image tree (chroot.ts) see /proc, /sys and /dev, and those mounts live only in
// the command's own mount namespace: nothing is mounted under the tree on the host, not while it
// runs and not after it was killed (a build directory removed later must never hold the host's
// /dev). Runs in the suite's real default image (built by the global setup), which it only reads.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { TEST_IMAGES_DIR } from '../../test/harness.js';
import { readCompleteImage } from './base-image.js';
import { captureInTree, runInTree } from './chroot.js';

/** Every mount table on the machine (sandboxes and builds have their own namespaces) that names `path`. */
function mountsNaming(path: string, exceptPid?: number): string[] {
  const found: string[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p) && Number(p) !== exceptPid)) {
    let table = '';
    try {
      table = readFileSync(`/proc/${pid}/mountinfo`, 'utf8');
    } catch {
      continue;
    }
    if (table.includes(`${path}/`)) found.push(pid);
  }
  return found;
}

describe('running in an image tree', () => {
  it('mounts /proc, /sys and /dev for the command only, and leaves nothing mounted when the command is killed', async () => {
    const image = await readCompleteImage(join(TEST_IMAGES_DIR, 'default'));
    expect(image, 'the default image (global setup)').toBeDefined();
    const rootfs = image!.rootfs;
    const inside = await captureInTree(rootfs, ['sh', '-c', 'cat /proc/self/mounts; test -c /dev/null && echo dev-ok; test -d /sys/kernel && echo sys-ok'], 'test');
    expect(inside).toMatch(/^proc \/proc proc /m);
    expect(inside).toContain('dev-ok');
    expect(inside).toContain('sys-ok');
    expect(mountsNaming(rootfs)).toEqual([]);

    // Killed by its timeout (SIGKILL) while it runs: the namespace, and its mounts, go with it.
    const lines: string[] = [];
    const running = runInTree(rootfs, ['sh', '-c', 'echo started; exec sleep 60'], (line) => lines.push(line), 3_000);
    await expect(running).rejects.toThrow(/SIGKILL/);
    expect(lines).toContain('started');
    expect(mountsNaming(rootfs)).toEqual([]);
    // The host's /dev is whole.
    expect(readdirSync('/dev')).toEqual(expect.arrayContaining(['null', 'zero', 'urandom', 'tty']));
  }, 60_000);
});
