#!/usr/bin/env node
// Entry point of `nestbox`: the commands that run Nestbox (`server`, the default, `host-agent`,
// `host-secret`, `image …`) and the client commands over the native API (create, exec, shell,
// cp, …), one commander program. The modules under src/cli/ register one group each.
import { Command, CommanderError, Option } from 'commander';
import { ConfigError, loadConfig, type Config } from './config.js';
import { registerBuildCommand } from './cli-build.js';
import { registerLoginAndCompletion } from './cli/completion.js';
import { finished } from './cli/context.js';
import { resolveConnection, type ConnectionFlags } from './cli/connection.js';
import { registerCpCommand } from './cli/cp.js';
import { registerInteractiveCommands } from './cli/interactive.js';
import { errorLine, httpUrl } from './cli/output.js';
import { registerSandboxCommands } from './cli/sandbox-commands.js';
import { registerHostCommands } from './cli/host-commands.js';
import { registerOrganizationCommands } from './cli/org-commands.js';
import { registerServerCommands } from './cli/server-commands.js';
import { registerSshCommands } from './cli/ssh-commands.js';

let parsedConfig: Config | undefined;
/** Parsed once, when a command first needs it (so `--help` works with a broken environment). */
const config = (): Config => (parsedConfig ??= loadConfig());

function buildProgram(): Command {
  const program = new Command('nestbox')
    .description('Nestbox: run the server, or use one through its native API (NESTBOX_URL, NESTBOX_API_KEY, or a profile from `nestbox login`; default this machine\'s server and its bootstrap key)')
    .addOption(new Option('--url <url>', 'the server (overrides NESTBOX_URL and the profile)').argParser(httpUrl))
    .option('--api-key <key>', 'the API key (overrides NESTBOX_API_KEY and the profile)')
    .option('--profile <name>', 'the profile saved by `nestbox login` (default "default", or NESTBOX_PROFILE)')
    .option('--json', 'machine-readable output on stdout')
    // Errors come back here as exceptions so that every one ends as one line and an exit code.
    .exitOverride()
    .configureOutput({ outputError: (text, write) => write(`${text.trim().split('\n').join(' ')}\n`) })
    .showSuggestionAfterError(true);
  registerServerCommands(program, config);
  registerSandboxCommands(program, config);
  registerHostCommands(program, config);
  registerInteractiveCommands(program, config);
  registerCpCommand(program, config);
  registerBuildCommand(program, config);
  registerOrganizationCommands(program, config);
  registerSshCommands(program, config);
  registerLoginAndCompletion(program, config);
  program
    .command('mcp')
    .description('an MCP server on stdin/stdout (for MCP clients such as Claude Desktop or Cursor): its tools call this server\'s native API with the resolved key')
    .action(async (_opts: unknown, cmd: Command) => {
      const { runMcpStdio } = await import('./mcp/stdio.js');
      await runMcpStdio(resolveConnection(config(), cmd.optsWithGlobals<ConnectionFlags>()));
    });
  return program;
}

async function main(argv: string[]): Promise<void> {
  // No command at all is `nestbox server`, as it always was.
  await buildProgram().parseAsync(argv.length ? argv : ['server'], { from: 'user' });
  // A client command is done: leave now rather than when idle keep-alive sockets time out.
  if (finished.clientCommand) process.exit(process.exitCode ?? 0);
}

main(process.argv.slice(2)).catch(async (err: unknown) => {
  // Commander has already printed its one line (unknown option, missing argument…), or help.
  if (err instanceof CommanderError) process.exit(err.exitCode);
  console.error(errorLine(err));
  // A supervised worker that cannot start because of its configuration is not restarted.
  const { WORKER_FATAL_EXIT_CODE, WORKER_FLAG } = await import('./supervisor.js');
  process.exit(err instanceof ConfigError && process.argv.includes(WORKER_FLAG) ? WORKER_FATAL_EXIT_CODE : 1);
});
