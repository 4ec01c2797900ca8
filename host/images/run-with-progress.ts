// Image builds run long external programs (debootstrap, npm): each line they print goes to the
// build's progress, and a failure quotes their last lines, which is where the reason is.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/** How many of the program's last lines a failure quotes. */
const TAIL_LINES = 20;

export interface RunWithProgressOptions {
  /** What the program does, for the error: "debootstrap", "npm install …". */
  what: string;
  /** Killed (SIGKILL) after this long, if given. */
  timeoutMs?: number;
}

/** Runs `program args`, passing each output line to `progress`; rejects with its tail unless it exits 0. */
export function runWithProgress(program: string, args: string[], progress: (line: string) => void, options: RunWithProgressOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const tail: string[] = [];
    const onLine = (line: string): void => {
      tail.push(line);
      if (tail.length > TAIL_LINES) tail.shift();
      progress(line);
    };
    createInterface({ input: child.stdout }).on('line', onLine);
    createInterface({ input: child.stderr }).on('line', onLine);
    const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => child.kill('SIGKILL'), options.timeoutMs);
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(new Error(`${options.what} could not be run: ${error.message}`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new Error(`${options.what} failed (${signal ?? `exit ${code}`}):\n${tail.join('\n')}`));
    });
  });
}
