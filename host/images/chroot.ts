// Running programs inside an image tree while it is built (apt, pip, checks): chrooted, with
// /proc, /sys and /dev mounted as debootstrap does, in a mount namespace of the command's own.
// The mounts vanish with that namespace, even when the build is killed, so a stale build
// directory never holds the host's /dev (which removing the directory would then empty).
import { execFile } from 'node:child_process';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runWithProgress } from './run-with-progress.js';

/** The environment of every command run in a tree: nothing of the builder's leaks in. */
export const TREE_ENV: Readonly<Record<string, string>> = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', HOME: '/root', LANG: 'C.UTF-8', DEBIAN_FRONTEND: 'noninteractive' };

const APT_TIMEOUT_MS = 30 * 60_000;
const DEFAULT_TIMEOUT_MS = 10 * 60_000;

function chrootArgv(rootfs: string, argv: string[], env: Record<string, string>): string[] {
  const script = 'set -e; r=$1; shift; mount -t proc proc "$r/proc"; mount -t sysfs sysfs "$r/sys"; mount --rbind /dev "$r/dev"; exec chroot "$r" env -i "$@"';
  return ['--mount', '--propagation', 'private', '--', 'sh', '-c', script, 'sh', rootfs, ...Object.entries(env).map(([k, v]) => `${k}=${v}`), ...argv];
}

/** `argv` in the tree, each output line to `onLine`; rejects with the last lines unless it exits 0. */
export function runInTree(rootfs: string, argv: string[], onLine: (line: string) => void, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
  return runWithProgress('unshare', chrootArgv(rootfs, argv, { ...TREE_ENV }), onLine, { what: `${argv.slice(0, 3).join(' ')} (in the image)`, timeoutMs });
}

/** `argv` in the tree; its stdout, trimmed. `what` names the image in the error. */
export function captureInTree(rootfs: string, argv: string[], what: string, extraEnv: Record<string, string> = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile('unshare', chrootArgv(rootfs, argv, { ...TREE_ENV, ...extraEnv }), { timeout: DEFAULT_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${what}: ${argv.join(' ')} failed in the image: ${stderr.trim().slice(-2000) || error.message}`));
      else resolve(stdout.trim());
    });
  });
}

/**
 * Runs `fn` with the host's resolver in the tree (an image's resolv.conf is empty: each sandbox
 * gets its own), and empties it again afterwards.
 */
export async function withHostResolver<T>(rootfs: string, fn: () => Promise<T>): Promise<T> {
  await writeFile(join(rootfs, 'etc', 'resolv.conf'), await readFile('/etc/resolv.conf'));
  try {
    return await fn();
  } finally {
    await writeFile(join(rootfs, 'etc', 'resolv.conf'), '');
  }
}

/**
 * `apt-get install --no-install-recommends` of Debian packages into the tree, from the mirror its
 * sources.list names; the downloaded .debs are removed (apt-get clean), the fresh package lists
 * stay (so `apt-get install` works in a sandbox before any `apt-get update`, as in the default
 * image). No maintainer script may start a daemon here (Debian's policy-rc.d convention).
 */
export async function aptInstall(rootfs: string, packages: readonly string[], onLine: (line: string) => void): Promise<void> {
  const policy = join(rootfs, 'usr', 'sbin', 'policy-rc.d');
  await writeFile(policy, '#!/bin/sh\nexit 101\n', { mode: 0o755 });
  try {
    await withHostResolver(rootfs, async () => {
      const apt = ['apt-get', '-o', 'Dpkg::Use-Pty=0', '-o', 'Acquire::Retries=3', '-q'];
      await runInTree(rootfs, [...apt, 'update'], onLine, APT_TIMEOUT_MS);
      await runInTree(rootfs, [...apt, 'install', '-y', '--no-install-recommends', ...packages], onLine, APT_TIMEOUT_MS);
      await runInTree(rootfs, ['apt-get', 'clean'], onLine, DEFAULT_TIMEOUT_MS);
    });
  } finally {
    await rm(policy, { force: true });
  }
}
