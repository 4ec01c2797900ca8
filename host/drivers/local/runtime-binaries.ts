// Execute-only copies of the programs that hold the sandbox's privileged descriptors (the
// agent's listening socket, the workload cgroup's procs files): node (the guest agent), tini
// (which passes them on), nestbox-enter (which holds the cgroup files until it closes them)
// and nestbox-pty.
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
// The copies live in `<dataDir>/runtime/` and are refreshed when the source changes (size or
// modification time differ), so an upgraded node is picked up at the next host-agent start.
import { chmod, copyFile, mkdir, rename, rm, stat, utimes } from 'node:fs/promises';
import { basename, join } from 'node:path';

export const EXECUTE_ONLY_MODE = 0o711;

/** Returns the path of an execute-only copy of `source` in `dir` (made or refreshed as needed). */
export async function executeOnlyCopy(source: string, dir: string, name = basename(source)): Promise<string> {
  await mkdir(dir, { recursive: true, mode: 0o711 });
  await chmod(dir, 0o711);
  const target = join(dir, name);
  const [from, existing] = await Promise.all([stat(source), stat(target).catch(() => undefined)]);
  const current =
    existing &&
    existing.size === from.size &&
    Math.trunc(existing.mtimeMs) === Math.trunc(from.mtimeMs) &&
    (existing.mode & 0o7777) === EXECUTE_ONLY_MODE &&
    existing.uid === 0;
  if (current) return target;
  const temp = `${target}.tmp-${process.pid}`;
  await rm(temp, { force: true });
  await copyFile(source, temp);
  await chmod(temp, EXECUTE_ONLY_MODE);
  await utimes(temp, from.atime, from.mtime);
  // Atomic: a sandbox starting right now execs either the old copy or the new one.
  await rename(temp, target);
  return target;
}
