// `exec` (a detached process whose output streams live over Server-Sent Events, stdin from a
// pipe, the CLI exiting with the command's exit code) and `shell` (a terminal over the PTY
// WebSocket, in raw mode, resized with the local window).
import { constants } from 'node:os';
import type { Command } from 'commander';
import { NativeApiError, type NativeClient, type StreamMessage } from '../client/native-client.js';
import type { Config } from '../config.js';
import { clientAction } from './context.js';
import { keyValue, positiveInteger, printJson, CliError } from './output.js';
import { exitCodeOf } from './sandbox-commands.js';

type Exit = Extract<StreamMessage, { type: 'exit' }>;

/** How often a dropped output stream is reopened (from the offsets seen) before giving up. */
const STREAM_RECONNECTS = 10;

/** Follows a process's output to the end, reconnecting from the offsets seen if the stream drops. */
async function followOutput(client: NativeClient, id: string, processId: string, onData: (stream: 'stdout' | 'stderr', bytes: Buffer) => void): Promise<Exit> {
  const offsets = { stdout: 0, stderr: 0 };
  let lastError: unknown;
  for (let attempt = 0; attempt <= STREAM_RECONNECTS; attempt++) {
    try {
      for await (const message of client.streamCommand(id, processId, { stdoutOffset: offsets.stdout, stderrOffset: offsets.stderr })) {
        if (message.type === 'stdout' || message.type === 'stderr') {
          const bytes = Buffer.from(message.data, 'base64');
          // A replay after a reconnect may start before what was already printed.
          const skip = Math.max(0, offsets[message.type] - message.offset);
          if (skip < bytes.length) onData(message.type, bytes.subarray(skip));
          offsets[message.type] = Math.max(offsets[message.type], message.offset + bytes.length);
        } else if (message.type === 'exit') {
          return message;
        }
      }
    } catch (err) {
      // The API said no (not found, forbidden…): that is the answer, not a dropped connection.
      if (err instanceof NativeApiError) throw err;
      lastError = err;
    }
    await new Promise((r) => setTimeout(r, Math.min(2000, 100 * 2 ** attempt)));
  }
  throw lastError ?? new Error(`the output stream of process ${processId} ended without its exit`);
}

/** Copies this process's stdin (a pipe or file) to the remote process's stdin, then closes it. */
async function pumpStdin(client: NativeClient, id: string, processId: string): Promise<void> {
  try {
    for await (const chunk of process.stdin) await client.writeStdin(id, processId, new Uint8Array(chunk as Buffer));
    await client.closeStdin(id, processId);
  } catch (err) {
    // The process may exit (and its stdin close) before all input was read: that is its choice.
    if (err instanceof NativeApiError && (err.code === 'invalid_state' || err.code === 'not_found' || err.status === 409)) return;
    throw err;
  }
}

export function registerInteractiveCommands(program: Command, config: () => Config): void {
  program
    .command('exec')
    .description('run a command in a sandbox, its output live, exiting with its exit code; stdin comes from a pipe when stdin is not a terminal. One argument is a shell command line (bash -lc), several are argv; put -- before it')
    .argument('<id>', 'sandbox id')
    .argument('<command...>', 'the command (after --)')
    .option('--cwd <dir>', 'working directory')
    .option('--env <K=V>', 'an environment variable (repeatable)', keyValue)
    .option('--user <name>', 'run as this user (default root)')
    .option('--timeout <seconds>', 'kill it after this long', positiveInteger)
    .option('-d, --detach', 'start it in the background and print its process id (see ps, logs, kill)')
    .action(clientAction(config, async ({ client, json }, id: string, command: string[], opts: { cwd?: string; env?: Record<string, string>; user?: string; timeout?: number; detach?: boolean }) => {
      // A background process's input is not this terminal's or pipe's.
      const withStdin = !opts.detach && !process.stdin.isTTY;
      const started = await client.runCommand(id, {
        ...(command.length === 1 ? { cmd: command[0] } : { argv: command }),
        cwd: opts.cwd, env: opts.env, user: opts.user,
        timeoutMs: opts.timeout ? opts.timeout * 1000 : undefined,
        detach: true, stdin: withStdin,
      });
      if (opts.detach) {
        if (json) printJson(started);
        else process.stdout.write(`${started.processId}\n`);
        return 0;
      }
      // Ctrl-C interrupts the remote command (its exit code then says so); a second one gives up.
      let interrupts = 0;
      process.on('SIGINT', () => {
        if (++interrupts > 1) process.exit(130);
        void client.signalCommand(id, started.processId, 'SIGINT').catch(() => undefined);
      });
      const collected = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
      // Input that cannot be sent is said once, and the remote stdin closed so nothing waits on it.
      if (withStdin) {
        void pumpStdin(client, id, started.processId).catch((err: unknown) => {
          process.stderr.write(`error: stdin: ${err instanceof Error ? err.message : String(err)}\n`);
          void client.closeStdin(id, started.processId).catch(() => undefined);
        });
      }
      const exit = await followOutput(client, id, started.processId, (stream, bytes) => {
        if (json) collected[stream].push(bytes);
        else (stream === 'stdout' ? process.stdout : process.stderr).write(bytes);
      });
      // Input not yet sent when the process ended is not waited for: the process is done with it.
      if (json) printJson({ processId: started.processId, exitCode: exit.exitCode, signal: exit.signal, timedOut: exit.timedOut ?? false, stdout: Buffer.concat(collected.stdout).toString('utf8'), stderr: Buffer.concat(collected.stderr).toString('utf8') });
      return exitCodeOf(exit);
    }));

  program
    .command('shell')
    .description('an interactive shell in a sandbox in this terminal (a PTY over the terminal WebSocket); exits with the shell\'s exit code')
    .argument('<id>', 'sandbox id')
    .option('--cwd <dir>', 'working directory')
    .option('--user <name>', 'as this user (default root)')
    .option('--shell <path>', 'the shell to start (default the user\'s)')
    .action(clientAction(config, async ({ client, json }, id: string, opts: { cwd?: string; user?: string; shell?: string }) => {
      const size = () => ({ cols: process.stdout.columns || 80, rows: process.stdout.rows || 24 });
      const terminal = await client.createTerminal(id, { ...size(), cwd: opts.cwd, user: opts.user, shell: opts.shell });
      const code = await attachTerminal(client, id, terminal.processId, size);
      if (json) printJson({ processId: terminal.processId, exitCode: code });
      return code;
    }));
}

async function attachTerminal(client: NativeClient, id: string, processId: string, size: () => { cols: number; rows: number }): Promise<number> {
  const { url, headers } = client.terminalWebSocket(id, processId);
  // Loaded by the one command that needs it, so the others start faster.
  const { default: WebSocket } = await import('ws');
  const ws = new WebSocket(url, { headers });
  const stdin = process.stdin;
  const raw = stdin.isTTY === true;
  // Whatever ends the CLI (an error, a signal, process.exit) gives the terminal back as it was.
  const restore = () => {
    if (raw && stdin.isTTY) stdin.setRawMode(false);
  };
  process.once('exit', restore);
  // A signal that ends the CLI skips 'exit' handlers: restore first, then end as that signal would.
  const onSignal = (signal: NodeJS.Signals) => {
    restore();
    process.exit(128 + (constants.signals[signal] ?? 1));
  };
  for (const signal of ['SIGTERM', 'SIGHUP', 'SIGQUIT'] as const) process.once(signal, onSignal);
  const onResize = () => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', ...size() }));
  };
  const onInput = (chunk: Buffer) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(chunk, { binary: true });
  };
  try {
    return await new Promise<number>((resolve, reject) => {
      let exit: { exitCode: number | null; signal: string | null } | undefined;
      ws.on('unexpected-response', (_req, res) => {
        // A refused upgrade is an ordinary API error response: report it as one.
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          try {
            const { error } = JSON.parse(text) as { error: { code: string; message: string } };
            reject(new NativeApiError(res.statusCode ?? 0, error.code, error.message));
          } catch {
            reject(new NativeApiError(res.statusCode ?? 0, `http_${res.statusCode}`, text.slice(0, 200) || 'the terminal WebSocket was refused'));
          }
        });
      });
      ws.on('open', () => {
        if (raw) stdin.setRawMode(true);
        stdin.on('data', onInput);
        stdin.resume();
        // SIGWINCH arrives as the TTY stream's resize event.
        process.stdout.on('resize', onResize);
        // The window may have changed between create and attach.
        onResize();
      });
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (isBinary) {
          process.stdout.write(data);
          return;
        }
        const control = JSON.parse(data.toString('utf8')) as { type: string; exitCode?: number | null; signal?: string | null; message?: string };
        if (control.type === 'exit') exit = { exitCode: control.exitCode ?? null, signal: control.signal ?? null };
        else if (control.type === 'error') process.stderr.write(`\r\nerror: ${control.message ?? 'terminal error'}\r\n`);
      });
      ws.on('error', (err) => reject(err));
      ws.on('close', (code, reason) => {
        if (exit) resolve(exitCodeOf({ type: 'exit', status: 'exited', ...exit }));
        else reject(new CliError(`the terminal connection closed (${code}${reason.length ? ` ${reason.toString('utf8')}` : ''}) before the shell exited`));
      });
    });
  } finally {
    stdin.off('data', onInput);
    stdin.pause();
    process.stdout.off('resize', onResize);
    for (const signal of ['SIGTERM', 'SIGHUP', 'SIGQUIT'] as const) process.off(signal, onSignal);
    restore();
    ws.terminate();
  }
}
