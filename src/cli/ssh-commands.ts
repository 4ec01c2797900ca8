// `nestbox ssh <id> [command…]`: OpenSSH into a sandbox with a fresh 10-minute access token
// (POST /sandboxes/{id}/ssh-access), running the `sshCommand` the server answers; and
// `nestbox ssh-keys ls|add|rm`, the organisation's public keys (username = sandbox id).
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import type { Command } from 'commander';
import type { Config } from '../config.js';
import { clientAction } from './context.js';
import { printJson, printTable, repeatable, CliError } from './output.js';

interface SshAccess { token: string; sshCommand: string; expiresAt: string }
interface SshKey { id: string; fingerprint: string; keyType: string; comment: string; createdAt: string }

export function registerSshCommands(program: Command, config: () => Config): void {
  const act = <A extends unknown[]>(fn: Parameters<typeof clientAction<A>>[1]) => clientAction<A>(config, fn);
  program
    .command('ssh')
    .description('SSH into a sandbox with OpenSSH (a 10-minute token; a stopped or paused sandbox is started)')
    .argument('<id>', 'sandbox id')
    .argument('[command...]', 'run this instead of a login shell')
    .option('--print', 'only print the ssh command (with its token) and exit')
    .option('-o, --ssh-option <option>', 'an OpenSSH option (`-o` of ssh, e.g. ServerAliveInterval=30); repeatable', repeatable)
    .action(act(async ({ client, json }, id: string, command: string[], opts: { print?: boolean; sshOption?: string[] }) => {
      const access = await client.request<SshAccess>('POST', `/sandboxes/${encodeURIComponent(id)}/ssh-access`, { json: { expiresInMinutes: 10 } });
      if (json) return printJson(access);
      if (opts.print) {
        process.stdout.write(`${access.sshCommand}\n`);
        return 0;
      }
      const [bin, ...args] = access.sshCommand.split(' ');
      const options = (opts.sshOption ?? []).flatMap((o) => ['-o', o]);
      // The gateway's host key is the same on every replica: remembered on first use.
      const child = spawn(bin!, ['-o', 'StrictHostKeyChecking=accept-new', ...options, ...args, ...command], { stdio: 'inherit' });
      return new Promise<number>((resolve, reject) => {
        child.once('error', (err) => reject(new CliError(`cannot run ssh (install OpenSSH's client): ${err.message}`)));
        child.once('exit', (code, signal) => resolve(code ?? (signal ? 128 + (constants.signals[signal] ?? 0) : 255)));
      });
    }));

  const keys = program.command('ssh-keys').description('the organisation\'s SSH public keys: ls (default), add, rm');
  keys
    .command('ls', { isDefault: true })
    .description('registered keys')
    .action(act(async ({ client, json }) => {
      const { items } = await client.request<{ items: SshKey[] }>('GET', '/ssh-keys');
      if (json) return printJson(items);
      printTable(['ID', 'TYPE', 'FINGERPRINT', 'COMMENT'], items.map((k) => [k.id, k.keyType, k.fingerprint, k.comment]));
    }));
  keys
    .command('add')
    .description('register a public key (a .pub file); then `ssh -p <port> <sandbox id>@<host>` opens any sandbox of the organisation')
    .argument('<file>', 'public key file, e.g. ~/.ssh/id_ed25519.pub')
    .option('--comment <text>', 'instead of the key line\'s own comment')
    .action(act(async ({ client, json }, file: string, opts: { comment?: string }) => {
      const key = await client.request<SshKey>('POST', '/ssh-keys', { json: { publicKey: readFileSync(file, 'utf8').trim(), ...(opts.comment !== undefined ? { comment: opts.comment } : {}) } });
      if (json) return printJson(key);
      process.stdout.write(`${key.id} ${key.fingerprint}\n`);
    }));
  keys
    .command('rm')
    .description('remove a key')
    .argument('<keyId>', 'key id')
    .action(act(async ({ client, json }, keyId: string) => {
      await client.request('DELETE', `/ssh-keys/${encodeURIComponent(keyId)}`);
      if (json) printJson({ id: keyId, deleted: true });
    }));
}
