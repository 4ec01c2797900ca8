// `nestbox completion bash|zsh`: a completion script generated from the commander command tree
// (so it cannot drift from the commands), and `nestbox login`, which saves a checked profile.
import { Argument, type Command } from 'commander';
import { NativeApiError, NativeClient } from '../client/native-client.js';
import type { Config } from '../config.js';
import { profileName, readProfiles, writeProfile } from './connection.js';
import { finished, type GlobalFlags } from './context.js';
import { printJson, CliError } from './output.js';

interface Node { path: string; subcommands: string[]; options: string[] }

function walk(cmd: Command, path: string, out: Node[]): void {
  const help = cmd.createHelp();
  const subcommands = help.visibleCommands(cmd).map((c) => c.name());
  const options = help.visibleOptions(cmd).flatMap((o) => [o.short, o.long].filter((f): f is string => !!f));
  out.push({ path, subcommands, options });
  for (const sub of cmd.commands) if (subcommands.includes(sub.name())) walk(sub, path ? `${path} ${sub.name()}` : sub.name(), out);
}

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

export function bashCompletion(program: Command): string {
  const nodes: Node[] = [];
  walk(program, '', nodes);
  const cases = (pick: (n: Node) => string[]) => nodes.map((n) => `    ${quote(n.path)}) echo ${quote(pick(n).join(' '))} ;;`).join('\n');
  return `# bash completion for nestbox, generated from its commands: source <(nestbox completion bash)
_nestbox_subcommands() {
  case "$1" in
${cases((n) => n.subcommands)}
  esac
}
_nestbox_options() {
  case "$1" in
${cases((n) => n.options)}
  esac
}
_nestbox() {
  local cur="\${COMP_WORDS[COMP_CWORD]}" path="" i w subs
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="\${COMP_WORDS[i]}"
    # After --, the words are the sandbox's command (exec): nothing to offer.
    [[ "$w" == "--" ]] && return 0
    [[ "$w" == -* ]] && continue
    subs=" $(_nestbox_subcommands "$path") "
    [[ "$subs" == *" $w "* ]] && path="\${path:+$path }$w"
  done
  if [[ "$cur" == -* ]]; then
    COMPREPLY=( $(compgen -W "$(_nestbox_options "$path") $(_nestbox_options "")" -- "$cur") )
  else
    subs="$(_nestbox_subcommands "$path")"
    [[ -n "$subs" ]] && COMPREPLY=( $(compgen -W "$subs" -- "$cur") )
  fi
}
complete -o default -F _nestbox nestbox
`;
}

export function zshCompletion(program: Command): string {
  // zsh runs bash completion functions through its bashcompinit layer.
  return `# zsh completion for nestbox: source <(nestbox completion zsh)
autoload -U +X compinit && compinit
autoload -U +X bashcompinit && bashcompinit
${bashCompletion(program).split('\n').slice(1).join('\n')}`;
}

/** The key typed at a terminal without echo, or the first line of a pipe. */
async function readApiKey(): Promise<string> {
  const stdin = process.stdin;
  if (!stdin.isTTY) {
    const chunks: Buffer[] = [];
    for await (const chunk of stdin) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks).toString('utf8').split(/\r?\n/)[0]!.trim();
  }
  process.stderr.write('API key: ');
  stdin.setRawMode(true);
  try {
    return await new Promise<string>((resolve, reject) => {
      let typed = '';
      const onData = (chunk: Buffer) => {
        for (const ch of chunk.toString('utf8')) {
          if (ch === '\r' || ch === '\n') {
            stdin.off('data', onData);
            process.stderr.write('\n');
            resolve(typed.trim());
            return;
          }
          if (ch === '\u0003') {
            stdin.off('data', onData);
            reject(new CliError('login cancelled'));
            return;
          }
          if (ch === '\u007f') typed = typed.slice(0, -1);
          else typed += ch;
        }
      };
      stdin.on('data', onData);
      stdin.resume();
    });
  } finally {
    stdin.setRawMode(false);
    stdin.pause();
  }
}

export function registerLoginAndCompletion(program: Command, config: () => Config): void {
  program
    .command('login')
    .description('check an API key against a server and save both as a profile (--profile, default "default") for later commands; the key from --api-key, else typed or piped on stdin')
    .action(async (_opts: unknown, cmd: Command) => {
      const cfg = config();
      const flags = cmd.optsWithGlobals<GlobalFlags>();
      const name = profileName(cfg, { ...flags, profile: flags.profile });
      const saved = readProfiles(cfg.client.profileFile).profiles[name];
      const url = flags.url ?? cfg.client.url ?? saved?.url ?? `http://127.0.0.1:${cfg.port}`;
      const apiKey = flags.apiKey ?? (await readApiKey());
      if (!apiKey) throw new CliError('no API key given (--api-key, or type or pipe it)');
      // Any authenticated route proves the key; a key without the sandboxes scope is still a key.
      try {
        await new NativeClient({ url, apiKey }).listSandboxes({ limit: 1 });
      } catch (err) {
        if (!(err instanceof NativeApiError && err.code === 'forbidden')) throw err;
      }
      await writeProfile(cfg.client.profileFile, name, { url, apiKey });
      if (flags.json) printJson({ profile: name, url, file: cfg.client.profileFile });
      else process.stderr.write(`saved profile "${name}" (${url}) in ${cfg.client.profileFile}\n`);
      finished.clientCommand = true;
    });

  program
    .command('completion')
    .description('print a shell completion script: source <(nestbox completion bash)')
    .addArgument(new Argument('<shell>', 'the shell').choices(['bash', 'zsh']))
    .action((shell: 'bash' | 'zsh') => {
      process.stdout.write(shell === 'bash' ? bashCompletion(program) : zshCompletion(program));
      finished.clientCommand = true;
    });
}
