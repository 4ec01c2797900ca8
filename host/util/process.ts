// Telling a live process from a later one that reuses its pid: every record of the drivers and
// the image build lock keep a pid together with its start time, and compare both.
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Field 22 of /proc/<pid>/stat: distinguishes a live process from a later one with the same pid.
 * Zombies count as gone (undefined): they run nothing and only wait for their parent.
 */
export function processStartTime(pid: number): string | undefined {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const afterName = fields.slice(fields.lastIndexOf(')') + 2).split(' ');
    return afterName[0] === 'Z' ? undefined : afterName[19];
  } catch {
    return undefined;
  }
}

/** /proc reports CPU times in USER_HZ ticks, which Linux fixes at 100 per second for user space. */
const USER_HZ = 100;

/**
 * CPU time (user + system, all its threads) of the process recorded as `pid` + `startTime`, in
 * nanoseconds; undefined once it is gone or replaced. One small file read.
 */
export async function processCpuNs(pid: number, startTime: string): Promise<number | undefined> {
  const text = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
  if (!text) return undefined;
  const afterName = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // Fields 14 (utime) and 15 (stime) of proc(5); field 22 is the start time.
  if (afterName[19] !== startTime) return undefined;
  const ticks = Number(afterName[11]) + Number(afterName[12]);
  return Number.isFinite(ticks) ? (ticks * 1e9) / USER_HZ : undefined;
}

/** The process recorded as `pid` + `startTime` still runs (not a successor with its pid). */
export function isProcessAlive(pid: number | undefined, startTime: string | undefined): boolean {
  return !!pid && !!startTime && processStartTime(pid) === startTime;
}

/** Waits for the process to be gone (or replaced: another start time means ours is gone); false on timeout. */
export async function waitForProcessExit(pid: number, startTime: string, timeoutMs: number, pollMs = 10): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (isProcessAlive(pid, startTime)) {
    if (Date.now() > deadline) return false;
    await sleep(pollMs);
  }
  return true;
}
