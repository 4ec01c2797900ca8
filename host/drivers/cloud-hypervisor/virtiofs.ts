// Volumes of a microVM over virtio-fs (issue 19): one virtiofsd per volume mount, sharing the
// volume's directory on the quota'd volume store (the same directory the local driver
// bind-mounts), its vhost-user socket in the sandbox's run dir. CH connects to it at boot (the
// `fs` entries of vm.create); the guest mounts each tag at its mount path (guestMountScript).
//
// Supervision is the VMM's: each virtiofsd is detached (it must outlive the host agent, like
// the VM it serves), its pid and start time are in `run/virtiofsd-<n>.pid`, and teardownRuntime
// (stop, destroy, a VMM found dead by the watcher or at init) kills whatever those files name.
// virtiofsd also exits by itself when the VMM's connection closes.
//
// Read-only mounts are read-only on the host, not only in the guest: virtiofsd runs in a private
// mount namespace where its shared directory is a read-only bind of itself, so a guest kernel
// that ignored its `ro` mount flag still could not write.
import { spawn } from 'node:child_process';
import { constants as fsConstants, closeSync, existsSync, openSync } from 'node:fs';
import { access, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { isProcessAlive, processStartTime } from '../../util/process.js';
import type { SandboxVolumeMount } from '../types.js';
import { killProcess, readPidFile, readTail } from './process.js';

/**
 * Where virtiofsd is looked for, best first: the standalone Rust virtiofsd (the maintained one:
 * QEMU dropped its C daemon in 8.0; Debian ships it as the `virtiofsd` package from trixie on, at
 * /usr/libexec/virtiofsd), then QEMU's C daemon that Debian 12 ships in qemu-system-common.
 */
export const VIRTIOFSD_CANDIDATES = ['/usr/libexec/virtiofsd', '/usr/lib/qemu/virtiofsd'];

export async function findVirtiofsd(configured?: string): Promise<string | undefined> {
  for (const candidate of configured ? [configured] : VIRTIOFSD_CANDIDATES) {
    if (await access(candidate, fsConstants.X_OK).then(() => true, () => false)) return candidate;
  }
  return undefined;
}

export interface VirtiofsShare {
  tag: string;
  socket: string;
  /** The host directory shared (the volume's data directory). */
  source: string;
  readOnly: boolean;
}

/** argv of one virtiofsd: a private mount namespace (read-only bind for `ro`), then the daemon. */
export function virtiofsdCommand(binary: string, share: VirtiofsShare): { file: string; args: string[] } {
  // The Rust daemon takes --long options, QEMU's C daemon -o key=value ones.
  const rust = !binary.endsWith('/qemu/virtiofsd');
  const daemon = rust
    ? [binary, `--socket-path=${share.socket}`, `--shared-dir=${share.source}`, '--sandbox=namespace', '--cache=auto']
    : [binary, `--socket-path=${share.socket}`, '-o', `source=${share.source}`, '-o', 'sandbox=namespace', '-o', 'cache=auto'];
  const readOnly = share.readOnly ? ' && mount -o remount,bind,ro "$1" "$1"' : '';
  const script = `mount --bind "$1" "$1"${readOnly} && shift && exec "$@"`;
  return { file: 'unshare', args: ['--mount', '--propagation', 'private', '--', '/bin/sh', '-c', script, 'nestbox-virtiofsd', share.source, ...daemon] };
}

/** Starts one virtiofsd and resolves once its socket exists (bounded in time). */
export async function launchVirtiofsd(binary: string, share: VirtiofsShare, files: { pidFile: string; logFile: string }, timeoutMs = 10_000): Promise<{ pid: number; startTime: string }> {
  await rm(share.socket, { force: true });
  const { file, args } = virtiofsdCommand(binary, share);
  const logFd = openSync(files.logFile, 'a', 0o600);
  let exitNote: string | undefined;
  let child;
  try {
    child = spawn(file, args, { detached: true, stdio: ['ignore', logFd, logFd], env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } });
  } finally {
    closeSync(logFd);
  }
  child.once('exit', (code, signal) => (exitNote = signal ? `killed by ${signal}` : `exit ${code}`));
  child.once('error', (error) => (exitNote = error.message));
  child.unref();
  const pid = child.pid;
  if (!pid) throw new Error(`could not start ${binary}: ${exitNote ?? 'no pid'}`);
  const startTime = processStartTime(pid) ?? '';
  await writeFile(files.pidFile, `${JSON.stringify({ pid, startTime, binary, apiSocket: share.socket })}\n`, { mode: 0o600 });
  const deadline = Date.now() + timeoutMs;
  while (!exitNote && !existsSync(share.socket) && Date.now() < deadline) await sleep(10);
  if (exitNote || !existsSync(share.socket)) {
    await killProcess(pid, startTime, 1_000).catch(() => {});
    throw new Error(`virtiofsd for ${share.source} did not come up (${exitNote ?? 'no socket'})\n--- virtiofsd output (tail) ---\n${await readTail(files.logFile)}`);
  }
  return { pid, startTime };
}

/** Kills every virtiofsd a sandbox's run dir names (idempotent) and removes their sockets. */
export async function stopVirtiofsds(runDir: string): Promise<void> {
  for (const name of await readdir(runDir).catch(() => [] as string[])) {
    const match = /^virtiofsd-(\d+)\.pid$/.exec(name);
    if (!match) continue;
    const pidFile = await readPidFile(join(runDir, name));
    if (pidFile && isProcessAlive(pidFile.pid, pidFile.startTime)) await killProcess(pidFile.pid, pidFile.startTime, 1_000).catch(() => {});
    await rm(join(runDir, name), { force: true });
    await rm(join(runDir, `fs${match[1]}.sock`), { force: true });
  }
}

/**
 * The guest side, run by the guest agent after every cold boot (POSIX sh: the VM image's dash
 * and an image VM's busybox both run it). Each tag is mounted at its mount path; with a subpath,
 * the tag goes to a staging dir, the subpath (created if missing) is bind-mounted, and the stage
 * is unmounted, so the guest sees only the subpath. The subpath is resolved in the guest: a
 * symbolic link a sandbox planted in the volume leads within the guest's view, never the host's.
 */
export function guestMountScript(mounts: Array<SandboxVolumeMount & { tag: string }>, options: { busybox?: string } = {}): string {
  // An image VM's root may have no mount/mkdir of its own: its busybox's applets then.
  const lines = ['set -e', ...(options.busybox ? ['mkdir mount mountpoint umount rmdir'.split(' ').map((name) => `${name}() { ${options.busybox} ${name} "$@"; }`).join('\n')] : [])];
  for (const mount of mounts) {
    const mode = mount.readOnly ? 'ro' : 'rw';
    const sub = (mount.subpath ?? '').replace(/^\/+|\/+$/g, '');
    // Paths are plain components (volumePathProblem), so single quotes are safe.
    if (!sub) {
      lines.push(`mkdir -p '${mount.mountPath}'`, `mountpoint -q '${mount.mountPath}' || mount -t virtiofs -o ${mode} ${mount.tag} '${mount.mountPath}'`);
      continue;
    }
    const stage = `/run/nestbox-volumes/${mount.tag}`;
    lines.push(
      `mkdir -p '${mount.mountPath}' '${stage}'`,
      `if ! mountpoint -q '${mount.mountPath}'; then`,
      `  mount -t virtiofs -o ${mode} ${mount.tag} '${stage}'`,
      mount.readOnly ? `  [ -d '${stage}/${sub}' ] || { echo 'subpath ${sub} does not exist in the read-only volume' >&2; umount '${stage}'; exit 1; }` : `  mkdir -p '${stage}/${sub}'`,
      `  mount --bind '${stage}/${sub}' '${mount.mountPath}'`,
      ...(mount.readOnly ? [`  mount -o remount,bind,ro '${mount.mountPath}'`] : []),
      `  umount '${stage}' && rmdir '${stage}'`,
      '  rmdir /run/nestbox-volumes 2>/dev/null || true',
      'fi',
    );
  }
  return `${lines.join('\n')}\n`;
}
