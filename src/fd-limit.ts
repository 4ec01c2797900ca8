// Every stream, upload and proxied connection holds a descriptor in the server and in the host
// agent, so both run with their soft RLIMIT_NOFILE at the hard limit. Node already raises the
// soft limit to the hard one when it starts (node.cc, PlatformInit); this checks that it did and
// otherwise does it with util-linux `prlimit` on our own pid (Node has no setrlimit). The hard
// limit itself is the operator's to set (systemd LimitNOFILE=, `ulimit -Hn`): a low one is
// reported, not silently lived with.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type { Logger } from '../core/logger.js';

/** Below this hard limit a busy host runs out of descriptors before the stream caps bite. */
const LOW_HARD_LIMIT = 65_536;

export interface OpenFileLimit {
  soft: number;
  hard: number;
}

/** RLIMIT_NOFILE of a process, from /proc (Infinity for "unlimited"). */
export function openFileLimit(pid: number | 'self' = 'self'): OpenFileLimit | undefined {
  try {
    const line = readFileSync(`/proc/${pid}/limits`, 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'));
    const [soft, hard] = (line ?? '').replace('Max open files', '').trim().split(/\s+/);
    const value = (v: string | undefined) => (v === 'unlimited' ? Infinity : Number(v));
    const limit = { soft: value(soft), hard: value(hard) };
    return Number.isNaN(limit.soft) || Number.isNaN(limit.hard) ? undefined : limit;
  } catch {
    return undefined;
  }
}

/** Soft limit up to the hard limit (if Node has not done it); the limit in effect afterwards. */
export function raiseOpenFileLimit(log: Logger): OpenFileLimit | undefined {
  const before = openFileLimit();
  if (!before) return undefined;
  if (before.soft < before.hard) {
    try {
      const hard = before.hard === Infinity ? 'unlimited' : String(before.hard);
      execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${hard}:${hard}`], { stdio: 'ignore', timeout: 5_000 });
    } catch (err) {
      log.warn(`could not raise the open files limit from ${before.soft} (prlimit from util-linux is needed): ${(err as Error).message}`);
    }
  }
  const after = openFileLimit() ?? before;
  if (after.hard < LOW_HARD_LIMIT) log.warn(`the open files limit is ${after.soft} (hard ${after.hard}); raise the hard limit (systemd LimitNOFILE=, ulimit -Hn) for many concurrent streams`);
  return after;
}
