// Client commands over the native API that are one or two requests each: sandboxes (create,
// ls, get, lifecycle, fork, rm), processes (ps, kill, logs), ports, snapshots, images, keys.
import { constants } from 'node:os';
import { Option, type Command } from 'commander';
import type { ApiKeyPreset, EgressPolicy, Sandbox, SandboxState, StreamMessage } from '../client/native-client.js';
import type { Config } from '../config.js';
import { clientAction } from './context.js';
import { age, egressPolicy, keyValue, portNumber, positiveInteger, positiveNumber, printJson, printTable, repeatable, CliError } from './output.js';

const STATES: SandboxState[] = ['creating', 'running', 'stopping', 'stopped', 'starting', 'pausing', 'paused', 'resuming', 'deleting', 'error'];

function labelsText(labels: Record<string, string>): string {
  return Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(',');
}

function printSandbox(s: Sandbox): void {
  const rows: [string, string][] = [
    ['id', s.id],
    ['state', s.state + (s.errorMessage ? ` (${s.errorMessage})` : '')],
    ['image', s.image],
    ['cpu', String(s.cpu)],
    ['memory', `${s.memoryMiB} MiB`],
    ['disk', s.diskGiB ? `${s.diskGiB} GiB` : '-'],
    ['labels', labelsText(s.labels) || '-'],
    ['egress', s.egress ? (s.egress.mode === 'allow-list' ? `allow ${s.egress.allow?.join(',') ?? ''}` : s.egress.mode) : '-'],
    ['timeout', `${s.timeoutSeconds} s`],
    ['expires', s.expiresAt ?? '-'],
    ['created', s.createdAt],
    // Shown to operators only (keys with platform:hosts).
    ...(s.hostId ? [['host', s.hostId] as [string, string]] : []),
  ];
  for (const [k, v] of rows) process.stdout.write(`${k.padEnd(8)} ${v}\n`);
}

/** `exit` → the code a shell would give: the exit code, or 128 + the signal's number. */
export function exitCodeOf(exit: Extract<StreamMessage, { type: 'exit' }>): number {
  if (exit.exitCode !== null) return exit.exitCode;
  // The sandbox is Linux, as is the host this runs on (the local driver): the same numbers.
  return 128 + (constants.signals[(exit.signal ?? '') as NodeJS.Signals] ?? 1);
}

export function registerSandboxCommands(program: Command, config: () => Config): void {
  const act = <A extends unknown[]>(fn: Parameters<typeof clientAction<A>>[1]) => clientAction<A>(config, fn);

  program
    .command('create')
    .description('create a sandbox (answers once it is running) and print its id')
    .option('--image <name>', 'image name[:tag] or id (default: the default image)')
    .option('--cpu <n>', 'vCPUs', positiveNumber)
    .option('--memory <MiB>', 'memory in MiB', positiveInteger)
    .option('--disk <GiB>', 'disk in GiB', positiveInteger)
    .option('--env <K=V>', 'an environment variable (repeatable)', keyValue)
    .option('--label <K=V>', 'a label (repeatable)', keyValue)
    .option('--timeout <seconds>', 'stop it after this long (0: never)', (v: string) => (v === '0' ? 0 : positiveInteger(v)))
    .option('--egress <policy>', 'outbound network: deny-all, allow-all or host,cidr,…', egressPolicy)
    .option('--snapshot <name>', 'start from this snapshot (its disk)')
    .option('--region <name>', 'run on a host of this region (its region label)')
    .option('--host-label <K=V>', 'run on a host carrying this label (repeatable)', keyValue)
    .option('--host <id>', 'run on this host (operators: platform:hosts)')
    .action(act(async ({ client, json }, opts: { image?: string; cpu?: number; memory?: number; disk?: number; env?: Record<string, string>; label?: Record<string, string>; timeout?: number; egress?: EgressPolicy; snapshot?: string; region?: string; hostLabel?: Record<string, string>; host?: string }) => {
      const placement = opts.region || opts.hostLabel || opts.host ? { region: opts.region, labels: opts.hostLabel, hostId: opts.host } : undefined;
      const sandbox = await client.createSandbox({ image: opts.image, cpu: opts.cpu, memoryMiB: opts.memory, diskGiB: opts.disk, env: opts.env, labels: opts.label, timeoutSeconds: opts.timeout, egress: opts.egress, snapshot: opts.snapshot, placement });
      if (json) printJson(sandbox);
      else process.stdout.write(`${sandbox.id}\n`);
    }));

  program
    .command('ls')
    .description('list sandboxes, newest first')
    .option('--label <K=V>', 'only those with this label (repeatable: all of them)', repeatable)
    .option('--state <state>', `only those in this state (repeatable, or comma-separated): ${STATES.join(', ')}`, repeatable)
    .action(act(async ({ client, json }, opts: { label?: string[]; state?: string[] }) => {
      for (const l of opts.label ?? []) if (l.indexOf('=') <= 0) throw new CliError(`--label "${l}" is not KEY=VALUE`);
      const states = (opts.state ?? []).flatMap((s) => s.split(',')).filter(Boolean);
      for (const s of states) if (!STATES.includes(s as SandboxState)) throw new CliError(`--state "${s}" is not one of ${STATES.join(', ')}`);
      const items = await client.listAllSandboxes({ label: opts.label, state: states as SandboxState[] });
      if (json) return printJson(items);
      printTable(['ID', 'STATE', 'IMAGE', 'CPU', 'MEMORY', 'LABELS', 'AGE'], items.map((s) => [s.id, s.state, s.image, s.cpu, `${s.memoryMiB}M`, labelsText(s.labels) || '-', age(s.createdAt)]));
    }));

  program
    .command('get')
    .description('one sandbox in detail')
    .argument('<id>', 'sandbox id')
    .action(act(async ({ client, json }, id: string) => {
      const sandbox = await client.getSandbox(id);
      if (json) printJson(sandbox);
      else printSandbox(sandbox);
    }));

  const lifecycle = [
    ['stop', 'stop a sandbox (its disk is kept)', 'stopSandbox'],
    ['resume', 'start a stopped sandbox again', 'resumeSandbox'],
    ['pause', 'pause a running sandbox (processes frozen)', 'pauseSandbox'],
    ['unpause', 'continue a paused sandbox', 'unpauseSandbox'],
  ] as const;
  for (const [name, description, method] of lifecycle) {
    program
      .command(name)
      .description(description)
      .argument('<id>', 'sandbox id')
      .action(act(async ({ client, json }, id: string) => {
        const sandbox = await client[method](id);
        if (json) printJson(sandbox);
        else process.stdout.write(`${sandbox.id} ${sandbox.state}\n`);
      }));
  }

  program
    .command('resize')
    .description('new vCPUs, memory or disk for a sandbox: CPU and memory live while it runs, the disk grows while it is stopped')
    .argument('<id>', 'sandbox id')
    .option('--cpu <n>', 'vCPUs', positiveInteger)
    .option('--memory <MiB>', 'memory in MiB', positiveInteger)
    .option('--disk <GiB>', 'disk in GiB (grows only; the sandbox must be stopped)', positiveInteger)
    .action(act(async ({ client, json }, id: string, opts: { cpu?: number; memory?: number; disk?: number }) => {
      if (opts.cpu === undefined && opts.memory === undefined && opts.disk === undefined) throw new CliError('resize: give at least one of --cpu, --memory and --disk');
      const sandbox = await client.updateSandbox(id, { cpu: opts.cpu, memoryMiB: opts.memory, diskGiB: opts.disk });
      if (json) printJson(sandbox);
      else process.stdout.write(`${sandbox.id} ${sandbox.cpu} vCPU ${sandbox.memoryMiB} MiB ${sandbox.diskGiB ?? '-'} GiB\n`);
    }));

  program
    .command('fork')
    .description('new sandboxes with a copy of this one\'s disk; prints their ids')
    .argument('<id>', 'sandbox id')
    .option('--count <n>', 'how many', positiveInteger)
    .option('--label <K=V>', 'a label for the children (repeatable)', keyValue)
    .action(act(async ({ client, json }, id: string, opts: { count?: number; label?: Record<string, string> }) => {
      const forked = await client.forkSandbox(id, { count: opts.count, labels: opts.label });
      if (json) return printJson(forked);
      for (const s of forked.sandboxes) process.stdout.write(`${s.id}\n`);
    }));

  program
    .command('rm')
    .description('delete sandboxes')
    .argument('<id...>', 'sandbox ids')
    .action(act(async ({ client, json }, ids: string[]) => {
      // Every id is tried; the first failure is reported after the rest were deleted.
      const removed: string[] = [];
      let failure: unknown;
      for (const id of ids) {
        try {
          await client.deleteSandbox(id);
          removed.push(id);
          if (!json) process.stdout.write(`${id}\n`);
        } catch (err) {
          failure ??= err;
        }
      }
      if (json) printJson({ removed });
      if (failure) throw failure;
    }));

  // ── processes ──
  program
    .command('ps')
    .description('the processes started through the API in a sandbox')
    .argument('<id>', 'sandbox id')
    .option('-a, --all', 'also those that have exited')
    .action(act(async ({ client, json }, id: string, opts: { all?: boolean }) => {
      const processes = await client.listCommands(id, opts.all === true);
      if (json) return printJson(processes);
      printTable(['PROCESS ID', 'PID', 'STATUS', 'EXIT', 'AGE', 'COMMAND'], processes.map((p) => [p.processId, p.pid, p.status, p.exitCode ?? p.signal, age(p.startedAt), [p.cmd, ...p.args].join(' ')]));
    }));

  program
    .command('kill')
    .description('end a process (SIGKILL by default)')
    .argument('<id>', 'sandbox id')
    .argument('<processId>', 'process id (from ps)')
    .addOption(new Option('-s, --signal <signal>', 'send this signal instead').choices(['SIGTERM', 'SIGINT', 'SIGKILL', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT']))
    .action(act(async ({ client, json }, id: string, processId: string, opts: { signal?: string }) => {
      if (opts.signal) await client.signalCommand(id, processId, opts.signal);
      else await client.killCommand(id, processId);
      if (json) printJson({ processId, signal: opts.signal ?? 'SIGKILL' });
    }));

  program
    .command('logs')
    .description('a process\'s output (its retained output; -f: then live until it exits)')
    .argument('<id>', 'sandbox id')
    .argument('<processId>', 'process id (from ps)')
    .option('-f, --follow', 'keep printing until the process exits')
    .action(act(async ({ client, json }, id: string, processId: string, opts: { follow?: boolean }) => {
      if (!opts.follow) {
        const logs = await client.getCommandLogs(id, processId);
        const text = (s: string) => (logs.encoding === 'base64' ? Buffer.from(s, 'base64') : s);
        if (json) return printJson(logs);
        process.stdout.write(text(logs.stdout));
        process.stderr.write(text(logs.stderr));
        return;
      }
      for await (const message of client.streamCommand(id, processId)) {
        if (json) {
          if (message.type !== 'keepalive') process.stdout.write(`${JSON.stringify(message)}\n`);
        } else if (message.type === 'stdout' || message.type === 'stderr') {
          (message.type === 'stdout' ? process.stdout : process.stderr).write(Buffer.from(message.data, 'base64'));
        }
        if (message.type === 'exit') return;
      }
    }));

  // ── ports ──
  const ports = program.command('ports').description('hosted ports of a sandbox: ls (default), publish, unpublish');
  ports
    .command('ls', { isDefault: true })
    .description('the published ports and their URLs')
    .argument('<id>', 'sandbox id')
    .action(act(async ({ client, json }, id: string) => {
      const items = await client.listPorts(id);
      if (json) return printJson(items);
      printTable(['PORT', 'PUBLIC', 'URL'], items.map((p) => [p.port, p.public ? 'yes' : 'no', p.pathUrl]));
    }));
  ports
    .command('publish')
    .description('serve a port of the sandbox at a URL; prints the URL and, for a private port, its token')
    .argument('<id>', 'sandbox id')
    .argument('<port>', 'the port the sandbox\'s server listens on (0.0.0.0)', portNumber)
    .option('--public', 'no token needed')
    .action(act(async ({ client, json }, id: string, port: number, opts: { public?: boolean }) => {
      const published = await client.publishPort(id, port, opts.public === true);
      if (json) return printJson(published);
      process.stdout.write(`${published.pathUrl}\n`);
      if (published.url !== published.pathUrl) process.stdout.write(`${published.url}\n`);
      if (published.token) process.stdout.write(`token: ${published.token}\n`);
    }));
  ports
    .command('unpublish')
    .description('stop serving a port')
    .argument('<id>', 'sandbox id')
    .argument('<port>', 'port', portNumber)
    .action(act(async ({ client, json }, id: string, port: number) => {
      await client.unpublishPort(id, port);
      if (json) printJson({ port, published: false });
    }));

  // ── snapshots ──
  program
    .command('snapshot')
    .description('snapshot a sandbox\'s disk under a name')
    .argument('<id>', 'sandbox id')
    .argument('<name>', 'snapshot name')
    .action(act(async ({ client, json }, id: string, name: string) => {
      const snapshot = await client.createSnapshot(id, name);
      if (json) printJson(snapshot);
      else process.stdout.write(`${snapshot.id} ${snapshot.name} ${snapshot.state}\n`);
    }));
  const snapshots = program.command('snapshots').description('snapshots: ls (default), rm');
  snapshots
    .command('ls', { isDefault: true })
    .description('list snapshots')
    .action(act(async ({ client, json }) => {
      const items = await client.listSnapshots();
      if (json) return printJson(items);
      printTable(['ID', 'NAME', 'STATE', 'SOURCE', 'SIZE', 'AGE'], items.map((s) => [s.id, s.name, s.state, s.sourceSandboxId, s.sizeBytes, age(s.createdAt)]));
    }));
  snapshots
    .command('rm')
    .description('delete snapshots')
    .argument('<snapshot...>', 'snapshot ids or names')
    .action(act(async ({ client, json }, refs: string[]) => {
      for (const ref of refs) await client.deleteSnapshot(ref);
      if (json) printJson({ removed: refs });
    }));

  // ── images (the server's; `image` is this machine's local store) ──
  const images = program.command('images').description('the server\'s images: ls (default), rm (build one with `nestbox build`)');
  images
    .command('ls', { isDefault: true })
    .description('list images')
    .option('--name <name>', 'only this name')
    .option('-a, --all', 'also untagged ones')
    .action(act(async ({ client, json }, opts: { name?: string; all?: boolean }) => {
      const items = await client.listImages({ name: opts.name, all: opts.all });
      if (json) return printJson(items);
      printTable(['ID', 'NAME', 'TAGS', 'STATE'], items.map((i) => [i.id, i.name, (i.tags ?? []).join(',') || '-', typeof i.state === 'string' ? i.state : '-']));
    }));
  images
    .command('rm')
    .description('delete images')
    .argument('<image...>', 'image ids or name:tag')
    .action(act(async ({ client, json }, refs: string[]) => {
      for (const ref of refs) await client.deleteImage(ref);
      if (json) printJson({ removed: refs });
    }));

  // ── API keys ──
  const keys = program.command('keys').description('API keys: ls (default), create, rm');
  keys
    .command('ls', { isDefault: true })
    .description('list API keys (never the keys themselves)')
    .action(act(async ({ client, json }) => {
      const items = await client.listApiKeys();
      if (json) return printJson(items);
      printTable(['ID', 'NAME', 'PRESET', 'PREFIX', 'LAST USED', 'AGE'], items.map((k) => [k.id, k.name, k.preset, k.keyPrefix, k.lastUsedAt ? age(k.lastUsedAt) : 'never', age(k.createdAt)]));
    }));
  keys
    .command('create')
    .description('create an API key; prints the key (shown only this once)')
    .requiredOption('--name <name>', 'what the key is for')
    .addOption(new Option('--preset <preset>', 'what it may do').choices(['read-only', 'sandbox', 'ci', 'admin', 'operator']).default('sandbox'))
    .option('--sandbox <id>', 'limit it to this sandbox (repeatable)', repeatable)
    .action(act(async ({ client, json }, opts: { name: string; preset: ApiKeyPreset; sandbox?: string[] }) => {
      const created = await client.createApiKey({ name: opts.name, preset: opts.preset, sandboxIds: opts.sandbox });
      if (json) return printJson(created);
      process.stdout.write(`${created.key}\n`);
      process.stderr.write(`key ${created.id} (${created.preset}); save it now, it is not shown again\n`);
    }));
  keys
    .command('rm')
    .description('revoke API keys')
    .argument('<keyId...>', 'key ids (from keys ls)')
    .action(act(async ({ client, json }, ids: string[]) => {
      for (const id of ids) await client.deleteApiKey(id);
      if (json) printJson({ removed: ids });
    }));
}
