// Running skopeo and umoci: bounded in time, stderr kept for the error, and skopeo's failures
// sorted into the catalogue (a missing tag is not_found, refused credentials unauthorized, an
// unreachable registry host_unavailable) so callers never have to read Go log lines.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { ImageError } from './errors.js';

export interface ToolOptions {
  timeoutMs: number;
  env?: NodeJS.ProcessEnv;
  signal?: AbortSignal;
  /** Options before the verb (args[0] stays the verb named in errors). */
  globalArgs?: string[];
}

const STDERR_KEEP_BYTES = 16_384;
const SETPRIV = '/usr/bin/setpriv';

/** Runs a program to completion; resolves with its stdout, rejects with an ImageError. */
export function runTool(program: string, args: string[], options: ToolOptions): Promise<Buffer> {
  // A signal that fired before the spawn has no 'abort' event left to fire: never start then.
  if (options.signal?.aborted) return Promise.reject(new ImageError('internal', `${program} ${args[0]} was cancelled`));
  return new Promise((resolve, reject) => {
    // Under setpriv --pdeathsig: a puller killed with -9 takes its skopeo or umoci with it, so
    // no orphan keeps writing into a temp dir the next puller of that digest sweeps.
    const argv = [...(options.globalArgs ?? []), ...args];
    const child = existsSync(SETPRIV)
      ? spawn(SETPRIV, ['--pdeathsig', 'KILL', '--', program, ...argv], { stdio: ['ignore', 'pipe', 'pipe'], env: options.env ?? process.env })
      : spawn(program, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: options.env ?? process.env });
    const stdout: Buffer[] = [];
    let stderr = '';
    let timedOut = false;
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP_BYTES);
    });
    const kill = (): void => {
      child.kill('SIGKILL');
    };
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, options.timeoutMs);
    options.signal?.addEventListener('abort', kill, { once: true });
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(new ImageError('internal', `${program} could not run: ${error.message} (is it installed? see scripts/install-system-deps.sh)`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', kill);
      if (code === 0) return resolve(Buffer.concat(stdout));
      if (timedOut) return reject(new ImageError('timeout', `${program} ${args[0]} did not finish within ${options.timeoutMs} ms`));
      if (options.signal?.aborted) return reject(new ImageError('internal', `${program} ${args[0]} was cancelled`));
      reject(classifyFailure(program, args[0] ?? '', stderr, signal ?? `exit ${code}`));
    });
  });
}

/** The message of a Go program's `level=fatal msg="…"` line, unquoted; otherwise the stderr tail. */
export function toolMessage(stderr: string): string {
  const fatal = /msg="((?:[^"\\]|\\.)*)"/.exec(stderr.split('\n').filter((line) => line.includes('level=fatal')).pop() ?? '');
  if (fatal) return fatal[1].replace(/\\"/g, '"').replace(/\\\\/g, '\\');
  return stderr.trim().split('\n').slice(-5).join('\n');
}

export function classifyFailure(program: string, verb: string, stderr: string, how: string): ImageError {
  const message = toolMessage(stderr);
  if (/^setpriv: failed to execute/m.test(stderr)) return new ImageError('internal', `${program} could not run: ${message} (is it installed? see scripts/install-system-deps.sh)`);
  const text = `${program} ${verb} failed (${how}): ${message}`;
  // Status codes as whole words only: a registry's port (127.0.0.1:40412) is in most messages.
  if (/manifest unknown|name unknown|not found|\b404\b/i.test(message)) return new ImageError('not_found', text);
  if (/unauthorized|authentication required|\b40[13]\b|denied/i.test(message)) return new ImageError('unauthorized', text);
  if (/connection refused|no such host|i\/o timeout|network is unreachable|server gave HTTP response to HTTPS client|tls:|x509:/i.test(message)) return new ImageError('host_unavailable', text);
  return new ImageError('internal', text);
}
