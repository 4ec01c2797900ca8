// Execute-only copies of the programs that hold the sandbox's privileged descriptors (the
// agent's listening socket, the workload cgroup's procs files): the loader the guest agent's
// node is exec'd through (see hostLoaderFor), tini (which passes them on), nestbox-enter (which
// holds the cgroup files until it closes them), nestbox-pty and nestbox-seccomp.
//
// Why: those processes run as the sandbox's root, the same uid as its workloads, and the kernel
// lets a process ptrace (or pidfd_getfd from, or read /proc/<pid>/fd|mem of) any process of its
// own uid that is "dumpable". Node has no prctl(PR_SET_DUMPABLE). The kernel makes a process
// non-dumpable at exec when its program file is not readable by it (would_dump() in
// fs/exec.c), and then only CAP_SYS_PTRACE in the sandbox's user namespace lets anyone trace
// it, a capability no sandbox process can have (it is outside the bounding set). A copy owned
// by host root with mode 0711 is exactly that: executable by everyone, readable by no sandbox
// uid (host root is unmapped inside, so no capability there overrides the mode). The
// protection holds from the first instruction, with no window between exec and a prctl.
//
// The copies live in one host directory (default /var/lib/nestbox/runtime), named after their
// source's size and modification time, so host agents of different builds sharing a machine
// never replace each other's files and an upgraded node is picked up at the next start. Not in
// the data dir: a bind mount's source path shows in the sandbox's /proc/self/mountinfo, and the
// data dir's path (sandbox ids, layout) is none of the sandbox's business.
import { chmod, copyFile, mkdir, rename, rm, stat, utimes } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { copyGuestAgentBundle, guestAgentBundleSha256 } from '../../util/guest-agent-bundle.js';

export const EXECUTE_ONLY_MODE = 0o711;
export const DEFAULT_RUNTIME_DIR = '/var/lib/nestbox/runtime';

/** Returns the path of an execute-only copy of `source` in `dir` (made if needed). */
export async function executeOnlyCopy(source: string, dir: string, name = basename(source)): Promise<string> {
  return runtimeCopy(source, dir, name, EXECUTE_ONLY_MODE);
}

/**
 * A copy of `source` in `dir` with `mode` (0644 for files the agent must read, such as its
 * bundle), named `<name>-<size>-<mtime>`.
 */
export async function runtimeCopy(source: string, dir: string, name: string, mode: number): Promise<string> {
  await mkdir(dir, { recursive: true, mode: 0o711 });
  const from = await stat(source);
  const target = join(dir, `${name}-${from.size}-${Math.trunc(from.mtimeMs)}`);
  const existing = await stat(target).catch(() => undefined);
  if (existing && existing.size === from.size && (existing.mode & 0o7777) === mode && existing.uid === 0) return target;
  const temp = `${target}.tmp-${process.pid}`;
  await rm(temp, { force: true });
  await copyFile(source, temp);
  await chmod(temp, mode);
  await utimes(temp, from.atime, from.mtime);
  // Atomic: a sandbox starting right now execs either the old copy or the new one.
  await rename(temp, target);
  return target;
}

/**
 * A copy of the guest agent bundle (its entry and its chunk directory, util/guest-agent-bundle.ts)
 * in a directory of its own under `dir`, named after the bundle's digest; returns the copy's
 * entry. Owned by host root, files 0644 and directories 0755: readable inside the sandbox,
 * writable by no sandbox uid, even before spawn.ts binds them read-only.
 */
export async function runtimeAgentBundleCopy(entry: string, dir: string): Promise<string> {
  await mkdir(dir, { recursive: true, mode: 0o711 });
  const target = join(dir, `guest-agent-${(await guestAgentBundleSha256(entry)).slice(0, 32)}`);
  const targetEntry = join(target, 'guest-agent.mjs');
  const existing = await stat(target).catch(() => undefined);
  if (existing?.isDirectory() && existing.uid === 0 && (existing.mode & 0o7777) === 0o755) return targetEntry;
  // Not ours (wrong owner or mode): never used, replaced.
  if (existing) await rm(target, { recursive: true, force: true });
  const temp = `${target}.tmp-${process.pid}`;
  await rm(temp, { recursive: true, force: true });
  await mkdir(temp, { mode: 0o755 });
  await chmod(temp, 0o755);
  await copyGuestAgentBundle(entry, join(temp, 'guest-agent.mjs'));
  // Atomic: a sandbox starting right now binds either no copy or the whole of this one. Another
  // host agent may have made the same copy meanwhile (same digest, same content): keep theirs.
  await rename(temp, target).catch(async (error: NodeJS.ErrnoException) => {
    await rm(temp, { recursive: true, force: true });
    if (error.code !== 'ENOTEMPTY' && error.code !== 'EEXIST') throw error;
  });
  return targetEntry;
}

/** The host's dynamic loader and the shared libraries a host program needs (from `ldd`). */
export interface HostLoader {
  /** Execute-only copy of the host's ld.so. */
  loader: string;
  /** Readable copies of the libraries, by the name the loader looks for. */
  libs: { soname: string; path: string }[];
}

/**
 * Why the guest agent runs on the host's loader and libraries: node is dynamically linked, and
 * started the usual way inside the sandbox's root it would get its ld.so and libc from the
 * sandbox's own disk, which the sandbox can replace — and so run its code inside its agent at
 * the next start. Exec'd as `ld.so --inhibit-cache --library-path <host libs> node …`, every
 * library comes from these copies (--library-path also replaces LD_LIBRARY_PATH; the cache is
 * not read). The loader is the program the kernel execs, so its copy is the execute-only one
 * (the agent stays non-dumpable); node itself is then only mapped and must be readable.
 */
export async function hostLoaderFor(program: string, dir: string): Promise<HostLoader> {
  const { execFile } = await import('node:child_process');
  const output = await new Promise<string>((resolveOutput, reject) =>
    execFile('ldd', [program], { encoding: 'utf8' }, (error, stdout) => (error ? reject(new Error(`ldd ${program}: ${error.message}`)) : resolveOutput(stdout))),
  );
  let interpreter: string | undefined;
  const libs: { soname: string; path: string }[] = [];
  for (const line of output.split('\n')) {
    const linked = /^\s*(\S+) => (\/\S+) \(0x[0-9a-f]+\)$/.exec(line);
    if (linked) {
      libs.push({ soname: linked[1], path: await runtimeCopy(linked[2], dir, linked[1], 0o644) });
      continue;
    }
    const loader = /^\s*(\/\S+) \(0x[0-9a-f]+\)$/.exec(line);
    if (loader) interpreter = loader[1];
  }
  if (!interpreter) throw new Error(`ldd ${program} names no dynamic loader`);
  for (const { soname } of libs) if (!/^[A-Za-z0-9._+-]+$/.test(soname)) throw new Error(`unexpected library name ${soname}`);
  return { loader: await executeOnlyCopy(interpreter, dir, 'ld.so'), libs };
}
