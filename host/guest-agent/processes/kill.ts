// Signalling groups of processes without starting any: a sandbox that hit its pids.max (a fork
// bomb) must still be killable, so everything here is kill(2) and reads of /proc.
import { readdirSync, readFileSync } from 'node:fs';

/** Sends to a process group; false when the group no longer exists. */
export function signalGroup(pgid: number, signal: NodeJS.Signals): boolean {
  if (!Number.isInteger(pgid) || pgid <= 1) return false;
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false; // ESRCH: the group is gone
  }
}

export function signalProcess(pid: number, signal: NodeJS.Signals): boolean {
  if (!Number.isInteger(pid) || pid <= 1) return false;
  try {
    process.kill(pid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * SIGKILL to a group until it is empty. One kill(-pgid) normally suffices (a process with a
 * pending SIGKILL cannot finish a fork), the repeat is cheap insurance; bounded.
 */
export function killGroup(pgid: number): void {
  for (let attempt = 0; attempt < 8; attempt += 1) {
    if (!signalGroup(pgid, 'SIGKILL')) return;
  }
}

interface ProcStat {
  pid: number;
  ppid: number;
  pgrp: number;
  session: number;
}

function readStat(pid: string): ProcStat | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name is in parentheses and may itself contain spaces or parentheses.
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z' || fields[0] === 'X') return undefined;
    return { pid: Number(pid), ppid: Number(fields[1]), pgrp: Number(fields[2]), session: Number(fields[3]) };
  } catch {
    return undefined; // gone meanwhile
  }
}

function allProcesses(): ProcStat[] {
  const result: ProcStat[] = [];
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return result;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = readStat(entry);
    if (stat) result.push(stat);
  }
  return result;
}

/** SIGKILL to every process of a session (a pty command and all its jobs), group by group. */
export function killSession(sessionId: number): void {
  if (sessionId <= 1) return;
  const groups = new Set<number>([sessionId]);
  for (const entry of allProcesses()) if (entry.session === sessionId) groups.add(entry.pgrp);
  for (const group of groups) killGroup(group);
}

/** The live descendants of a process (not the process itself), from one scan of /proc. */
export function descendantsOf(rootPid: number): ProcStat[] {
  const byParent = new Map<number, ProcStat[]>();
  for (const entry of allProcesses()) {
    const siblings = byParent.get(entry.ppid);
    if (siblings) siblings.push(entry);
    else byParent.set(entry.ppid, [entry]);
  }
  const found: ProcStat[] = [];
  const queue = [rootPid];
  while (queue.length > 0 && found.length < 100_000) {
    for (const child of byParent.get(queue.shift() as number) ?? []) {
      found.push(child);
      queue.push(child.pid);
    }
  }
  return found;
}
