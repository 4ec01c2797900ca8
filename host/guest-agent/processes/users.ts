// Which account a process runs as. Names come from the sandbox's own /etc/passwd (the agent
// runs inside the sandbox's root), read on every start: accounts created in the sandbox with
// useradd are usable at once, and a start is rare enough that caching would buy nothing.
import { readFile, stat } from 'node:fs/promises';
import { validationFailed } from '../errors.js';

export interface RunAs {
  /** Set only when the caller asked for a user; absent = the agent's own user. */
  uid?: number;
  gid?: number;
  /** Reported in ProcessInfo.user. */
  name: string;
  /** The account's home directory, when it has one in /etc/passwd. */
  home?: string;
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

async function readPasswd(path: string): Promise<PasswdEntry[]> {
  const text = await readFile(path, 'utf8').catch(() => '');
  const entries: PasswdEntry[] = [];
  for (const line of text.split('\n')) {
    const fields = line.split(':');
    if (fields.length < 7 || !/^\d+$/.test(fields[2]) || !/^\d+$/.test(fields[3])) continue;
    entries.push({ name: fields[0], uid: Number(fields[2]), gid: Number(fields[3]), home: fields[5] });
  }
  return entries;
}

export async function resolveRunAs(user: string | undefined, passwdPath = '/etc/passwd'): Promise<RunAs> {
  const entries = await readPasswd(passwdPath);
  if (user === undefined) {
    // The effective uid: in a sandbox the agent's real uid is its own (see main.ts), not a user's.
    const uid = process.geteuid?.() ?? 0;
    const own = entries.find((entry) => entry.uid === uid);
    // The agent's own user keeps the agent's home (the configured one), as /exec does.
    return { name: own?.name ?? String(uid) };
  }
  if (/^\d+$/.test(user)) {
    const uid = Number(user);
    if (uid > 0xfffffffe) throw validationFailed('user', `uid out of range: ${user}`);
    const entry = entries.find((candidate) => candidate.uid === uid);
    return { uid, gid: entry?.gid ?? uid, name: entry?.name ?? user, home: entry?.home };
  }
  const entry = entries.find((candidate) => candidate.name === user);
  if (!entry) throw validationFailed('user', `no such user in the sandbox: ${user}`);
  return { uid: entry.uid, gid: entry.gid, name: entry.name, home: entry.home };
}

/** Who a workload runs as, where it starts and what HOME/USER/LOGNAME it sees. */
export interface Account {
  runAs: RunAs;
  /** HOME, and where relative paths of the request resolve. */
  home: string;
  /** The cwd when the request names none: the home, or / when another user's home is missing. */
  defaultDir: string;
  /** USER and LOGNAME for another user (the agent's own keeps its environment's). */
  identityEnv: Record<string, string>;
}

/**
 * The account of a request's `user` (absent = the agent's own, with the agent's home). Shared
 * by /exec, /processes, /kernels and /sessions, so every way of running something agrees.
 */
export async function resolveAccount(user: string | undefined, settings: { home: string; passwdPath?: string }): Promise<Account> {
  const runAs = await resolveRunAs(user, settings.passwdPath);
  if (runAs.uid === undefined) return { runAs, home: settings.home, defaultDir: settings.home, identityEnv: {} };
  const home = runAs.home ?? '/';
  // Another user's home may not exist (nobody's is /nonexistent): start in / then, like login.
  const homeExists = (await stat(home).catch(() => undefined))?.isDirectory() ?? false;
  return { runAs, home, defaultDir: homeExists ? home : '/', identityEnv: { USER: runAs.name, LOGNAME: runAs.name } };
}
