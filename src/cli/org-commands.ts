// `nestbox orgs …`: organisations through the native API's admin routes (an operator key, such
// as this machine's bootstrap key): create, ls, get, suspend, unsuspend, limits, keys create,
// usage. `orgs usage` without an organisation, and `orgs current`, work with any key.
import { InvalidArgumentError, Option, type Command } from 'commander';
import type { ApiKeyPreset, Organization, OrganizationLimitOverrides, UsageRecord } from '../client/native-client.js';
import type { Config } from '../config.js';
import { clientAction } from './context.js';
import { age, printJson, printTable } from './output.js';

/** Flag → limit, in the order `orgs get` prints them. */
const LIMIT_FLAGS: { flag: string; option: string; field: keyof OrganizationLimitOverrides; what: string }[] = [
  { flag: '--max-sandboxes <n>', option: 'maxSandboxes', field: 'maxSandboxes', what: 'sandboxes that are not stopped' },
  { flag: '--max-cpu <n>', option: 'maxCpu', field: 'maxCpu', what: 'their vCPUs' },
  { flag: '--max-memory-mib <n>', option: 'maxMemoryMib', field: 'maxMemoryMiB', what: 'their memory (MiB)' },
  { flag: '--max-disk-gib <n>', option: 'maxDiskGib', field: 'maxDiskGiB', what: 'GiB of sandbox disks' },
  { flag: '--max-snapshots <n>', option: 'maxSnapshots', field: 'maxSnapshots', what: 'snapshots' },
  { flag: '--max-images <n>', option: 'maxImages', field: 'maxImages', what: 'images' },
  { flag: '--requests-per-second <n>', option: 'requestsPerSecond', field: 'requestsPerSecond', what: 'requests per second of the organisation, 0 = none' },
  { flag: '--request-burst <n>', option: 'requestBurst', field: 'requestBurst', what: "the organisation's request burst" },
  { flag: '--key-requests-per-second <n>', option: 'keyRequestsPerSecond', field: 'keyRequestsPerSecond', what: 'requests per second of each key, 0 = none' },
  { flag: '--key-request-burst <n>', option: 'keyRequestBurst', field: 'keyRequestBurst', what: "each key's request burst" },
  { flag: '--max-volumes <n>', option: 'maxVolumes', field: 'maxVolumes', what: 'live volumes' },
  { flag: '--max-volume-total-gib <n>', option: 'maxVolumeTotalGib', field: 'maxVolumeTotalGiB', what: 'GiB of volume sizes in all' },
  { flag: '--max-volume-size-gib <n>', option: 'maxVolumeSizeGib', field: 'maxVolumeSizeGiB', what: 'GiB of the largest volume' },
];

/**
 * A limit's value: a whole number (0 allowed), or `default` for the server's default (kept as
 * the word: commander replaces a parser's null by an empty string).
 */
function limitValue(value: string): number | 'default' {
  if (value === 'default') return 'default';
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n)) throw new InvalidArgumentError('must be a whole number, or "default" for the server\'s default');
  return n;
}

/** A rate: a number of requests per second, fractions allowed (0.25: one every 4 s). */
function rateValue(value: string): number | 'default' {
  if (value === 'default') return 'default';
  if (!/^\d+(\.\d+)?$/.test(value)) throw new InvalidArgumentError('must be a number of requests per second (such as 0.5), or "default" for the server\'s default');
  return Number(value);
}

function addLimitOptions(cmd: Command): Command {
  for (const l of LIMIT_FLAGS) cmd.addOption(new Option(l.flag, `limit on ${l.what} (a number, or "default")`).argParser(l.field.endsWith('PerSecond') ? rateValue : limitValue));
  return cmd;
}

function limitsOf(opts: Record<string, unknown>): Partial<OrganizationLimitOverrides> {
  const limits: Partial<OrganizationLimitOverrides> = {};
  for (const l of LIMIT_FLAGS) if (opts[l.option] !== undefined) limits[l.field] = opts[l.option] === 'default' ? null : (opts[l.option] as number);
  return limits;
}

function printOrganization(org: Organization & { usage?: Record<string, number> }): void {
  process.stdout.write(`${org.id} ${org.name}${org.suspended ? ` (suspended ${age(org.suspendedAt)} ago)` : ''}\n`);
  // Request rates are limits on a flow, not on something held: no IN USE figure.
  const usageKey: Partial<Record<keyof OrganizationLimitOverrides, string>> = { maxSandboxes: 'sandboxes', maxCpu: 'cpu', maxMemoryMiB: 'memoryMiB', maxDiskGiB: 'diskGiB', maxSnapshots: 'snapshots', maxImages: 'images' };
  printTable(['LIMIT', 'VALUE', 'SOURCE', ...(org.usage ? ['IN USE'] : [])], LIMIT_FLAGS.map((l) => [
    l.field,
    org.limits[l.field],
    org.customLimits[l.field] === null ? 'default' : 'own',
    ...(org.usage ? [usageKey[l.field] === undefined ? '' : org.usage[usageKey[l.field]!]] : []),
  ]));
}

/** ISO date-times are checked by the server (a 400 naming the field); here only that one is given. */
function printUsage(items: UsageRecord[]): void {
  printTable(['HOUR', 'SANDBOX-S', 'CPU-S', 'STORAGE GIB-H', 'CLOSED'], items.map((u) => [u.hourStart, u.sandboxSeconds, u.cpuSeconds, Math.round(u.storageGiBHours * 1000) / 1000, u.closed ? 'yes' : 'no']));
}

export function registerOrganizationCommands(program: Command, config: () => Config): void {
  const act = <A extends unknown[]>(fn: Parameters<typeof clientAction<A>>[1]) => clientAction<A>(config, fn);
  const orgs = program.command('orgs').description('organisations (an operator key): ls (default), create, get, suspend, unsuspend, limits, keys create, usage, current');

  orgs
    .command('ls', { isDefault: true })
    .description('list organisations')
    .action(act(async ({ client, json }) => {
      const items = await client.listOrganizations();
      if (json) return printJson(items);
      printTable(['ID', 'NAME', 'SUSPENDED', 'MAX SANDBOXES', 'MAX CPU', 'AGE'], items.map((o) => [o.id, o.name, o.suspended ? 'yes' : 'no', o.limits.maxSandboxes, o.limits.maxCpu, age(o.createdAt)]));
    }));

  addLimitOptions(
    orgs
      .command('create')
      .description('create an organisation (prints its id); mint its first key with `orgs keys create <id>`')
      .argument('<name>', 'unique name (letters, digits, "_", "." or "-")'),
  ).action(act(async ({ client, json }, name: string, opts: Record<string, unknown>) => {
    const limits = limitsOf(opts);
    const org = await client.createOrganization({ name, ...(Object.keys(limits).length ? { limits } : {}) });
    if (json) return printJson(org);
    process.stdout.write(`${org.id}\n`);
  }));

  orgs
    .command('get')
    .description('one organisation and its limits')
    .argument('<org>', 'organisation id')
    .action(act(async ({ client, json }, id: string) => {
      const org = await client.getOrganization(id);
      if (json) return printJson(org);
      printOrganization(org);
    }));

  orgs
    .command('current')
    .description("the key's own organisation: its limits and what it holds against them (any key)")
    .action(act(async ({ client, json }) => {
      const org = await client.ownOrganization();
      if (json) return printJson(org);
      printOrganization(org);
    }));

  for (const [verb, suspended] of [['suspend', true], ['unsuspend', false]] as const) {
    orgs
      .command(verb)
      .description(suspended ? 'suspend an organisation: its keys are refused (403) and its sandboxes stopped, disks kept' : 'lift a suspension (its sandboxes can then be resumed)')
      .argument('<org>', 'organisation id')
      .action(act(async ({ client, json }, id: string) => {
        const org = await client.updateOrganization(id, { suspended });
        if (json) return printJson(org);
        process.stdout.write(`${org.id} ${org.suspended ? 'suspended' : 'active'}\n`);
      }));
  }

  addLimitOptions(
    orgs
      .command('limits')
      .description('show an organisation\'s limits, or set them ("default" returns one to the server\'s default)')
      .argument('<org>', 'organisation id'),
  ).action(act(async ({ client, json }, id: string, opts: Record<string, unknown>) => {
    const limits = limitsOf(opts);
    const org = Object.keys(limits).length ? await client.updateOrganization(id, { limits }) : await client.getOrganization(id);
    if (json) return printJson(org);
    printOrganization(org);
  }));

  const keys = orgs.command('keys').description("an organisation's API keys: create");
  keys
    .command('create')
    .description('mint an API key of the organisation; prints the key (shown only this once)')
    .argument('<org>', 'organisation id')
    .option('--name <name>', 'what the key is for', 'admin')
    .addOption(new Option('--preset <preset>', 'what it may do').choices(['read-only', 'sandbox', 'ci', 'admin', 'operator']).default('admin'))
    .action(act(async ({ client, json }, id: string, opts: { name: string; preset: ApiKeyPreset }) => {
      const created = await client.createOrganizationApiKey(id, { name: opts.name, preset: opts.preset });
      if (json) return printJson(created);
      process.stdout.write(`${created.key}\n`);
      process.stderr.write(`key ${created.id} (${created.preset}) of ${id}; save it now, it is not shown again\n`);
    }));

  orgs
    .command('usage')
    .description('hourly usage records (sandbox-seconds, CPU-seconds, storage GiB-hours); without <org>, the key\'s own organisation')
    .argument('[org]', 'organisation id (operator key)')
    .requiredOption('--from <time>', 'ISO 8601 date-time (rounded down to its hour)')
    .requiredOption('--to <time>', 'ISO 8601 date-time (exclusive)')
    .action(act(async ({ client, json }, id: string | undefined, opts: { from: string; to: string }) => {
      const items = id ? await client.organizationUsage(id, opts) : await client.ownUsage(opts);
      if (json) return printJson(items);
      printUsage(items);
    }));
}
