// Running a host tool (ip, mount, mkfs, losetup, fsfreeze, …) and failing with what it said: the
// error names the command and carries its stderr, so a log line is enough to see what went wrong.
import { execFile } from 'node:child_process';

export interface RunOptions {
  /** Killed after this long (0: never; default 60 s). */
  timeoutMs?: number;
  /** Written to its stdin, which is then closed. */
  input?: string;
}

/** Resolves with stdout; rejects with `<file> <args> failed: <stderr or reason>` and `.stderr`. */
export function runCommand(file: string, args: string[], options: RunOptions = {}): Promise<string> {
  return new Promise((resolveRun, reject) => {
    const child = execFile(file, args, { timeout: options.timeoutMs ?? 60_000, maxBuffer: 4 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(Object.assign(new Error(`${file} ${args.join(' ')} failed: ${stderr.trim() || error.message}`), { stderr }));
      else resolveRun(stdout);
    });
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}
