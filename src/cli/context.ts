// What every client command's action gets: the API client (resolved once from the global
// flags, the environment and the profile), whether to print JSON, and the parsed config.
import type { Command } from 'commander';
import type { NativeClient } from '../client/native-client.js';
import type { Config } from '../config.js';
import { clientFor, type ConnectionFlags } from './connection.js';

export type GlobalFlags = ConnectionFlags & { json?: boolean };

export interface ClientContext {
  client: NativeClient;
  json: boolean;
  config: Config;
  flags: GlobalFlags;
}

/**
 * Set once a client command has finished: the entry point then exits with process.exitCode
 * rather than waiting for idle keep-alive sockets (or a paused stdin) to let the loop end.
 */
export const finished = { clientCommand: false };

/**
 * Wraps a client command's action. Commander calls actions with the positional arguments, then
 * the command's options, then the Command; `fn` gets the context and the same arguments, and
 * answers the exit code (default 0).
 */
export function clientAction<Args extends unknown[]>(config: () => Config, fn: (ctx: ClientContext, ...args: Args) => Promise<number | void>) {
  return async (...all: unknown[]): Promise<void> => {
    const cmd = all[all.length - 1] as Command;
    const flags = cmd.optsWithGlobals<GlobalFlags>();
    const cfg = config();
    const ctx: ClientContext = { client: clientFor(cfg, flags), json: flags.json === true, config: cfg, flags };
    const code = await fn(ctx, ...(all.slice(0, -1) as Args));
    process.exitCode = code ?? 0;
    finished.clientCommand = true;
  };
}
