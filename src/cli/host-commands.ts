// `nestbox hosts ls|get|cordon|uncordon|drain|evacuate|move`: the operator's view of the host agents (needs a
// key with platform:hosts, e.g. the bootstrap key, which carries the `operator` preset).
import type { Command } from 'commander';
import type { Host } from '../client/native-client.js';
import type { Config } from '../config.js';
import { clientAction } from './context.js';
import { age, printJson, printTable } from './output.js';

const labelsText = (labels: Record<string, string>): string => Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(',');

/** `used/allocatable` of one resource, `-` when the host reports no capacity. */
function usage(h: Host, key: 'cpu' | 'memoryMiB' | 'diskGiB'): string {
  return h.allocatable ? `${h.allocated[key]}/${h.allocatable[key]}` : `${h.allocated[key]}/-`;
}

function printHost(h: Host): void {
  const rows: [string, string][] = [
    ['id', h.id],
    ['state', h.state + (h.lostAt ? ` (since ${h.lostAt})` : '')],
    ['region', h.region],
    ['labels', labelsText(h.labels) || '-'],
    ['driver', h.driver],
    ['version', h.version ?? '-'],
    ['url', h.url],
    ['capacity', h.capacity ? `${h.capacity.cpu} vCPU, ${h.capacity.memoryMiB} MiB, ${h.capacity.diskGiB} GiB` : '-'],
    ['placed', `${h.allocated.sandboxes} sandboxes; vCPU ${usage(h, 'cpu')}, MiB ${usage(h, 'memoryMiB')}, GiB ${usage(h, 'diskGiB')}`],
    ['reported', h.reported ? `${h.reported.sandboxes} sandboxes; ${h.reported.cpu} vCPU, ${h.reported.memoryMiB} MiB, ${h.reported.diskGiB} GiB` : '-'],
    ['heartbeat', `${h.lastHeartbeatAt} (${age(h.lastHeartbeatAt)} ago)`],
  ];
  for (const [k, v] of rows) process.stdout.write(`${k.padEnd(9)} ${v}\n`);
}

export function registerHostCommands(program: Command, config: () => Config): void {
  const act = <A extends unknown[]>(fn: Parameters<typeof clientAction<A>>[1]) => clientAction<A>(config, fn);
  const hosts = program.command('hosts').description('host agents: capacity, what is placed on them, state (operators: platform:hosts)');

  hosts
    .command('ls')
    .description('every registered host agent')
    .action(act(async ({ client, json }) => {
      const items = await client.listHosts();
      if (json) return printJson(items);
      printTable(
        ['ID', 'STATE', 'REGION', 'SANDBOXES', 'VCPU', 'MEMORY MIB', 'DISK GIB', 'LABELS', 'VERSION', 'HEARTBEAT'],
        items.map((h) => [h.id, h.state, h.region, h.allocated.sandboxes, usage(h, 'cpu'), usage(h, 'memoryMiB'), usage(h, 'diskGiB'), labelsText(h.labels) || '-', h.version ?? '-', `${age(h.lastHeartbeatAt)} ago`]),
      );
    }));

  hosts
    .command('get')
    .description('one host agent in detail')
    .argument('<hostId>', 'host id')
    .action(act(async ({ client, json }, hostId: string) => {
      const host = await client.getHost(hostId);
      if (json) printJson(host);
      else printHost(host);
    }));

  for (const [action, what] of [
    ['cordon', 'place no new sandboxes on the host (its sandboxes carry on)'],
    ['uncordon', 'place new sandboxes on the host again'],
    ['drain', 'cordon the host and mark it draining (then `hosts evacuate` moves its stopped sandboxes away)'],
  ] as const) {
    hosts
      .command(action)
      .description(what)
      .argument('<hostId>', 'host id')
      .action(act(async ({ client, json }, hostId: string) => {
        const host = await client.setHostState(hostId, action);
        if (json) printJson(host);
        else process.stdout.write(`${host.id} ${host.state}\n`);
      }));
  }

  hosts
    .command('evacuate')
    .description('move every stopped sandbox of a cordoned or draining host to other hosts (disks copied host to host)')
    .argument('<hostId>', 'host id')
    .option('--to <hostId>', 'send them all to this host (default: wherever there is room)')
    .action(act(async ({ client, json }, hostId: string, opts: { to?: string }) => {
      const result = await client.evacuateHost(hostId, opts.to);
      if (json) return printJson(result);
      for (const m of result.moved) process.stdout.write(`moved   ${m.sandboxId} ${m.fromHostId} → ${m.toHostId} (${m.ms} ms)\n`);
      for (const f of result.failed) process.stdout.write(`failed  ${f.sandboxId}: ${f.error.code}: ${f.error.message}\n`);
      for (const k of result.skipped) process.stdout.write(`skipped ${k.sandboxId} (${k.state}: stop it to move it)\n`);
      if (result.failed.length) process.exitCode = 1;
    }));

  hosts
    .command('move')
    .description('move one stopped sandbox to another host (disk copied host to host)')
    .argument('<sandboxId>', 'sandbox id')
    .option('--to <hostId>', 'the target host (default: any ready host with room)')
    .action(act(async ({ client, json }, sandboxId: string, opts: { to?: string }) => {
      const result = await client.moveSandbox(sandboxId, opts.to);
      if (json) return printJson(result);
      process.stdout.write(`${sandboxId} moved ${result.fromHostId} → ${result.toHostId} in ${result.ms} ms${result.layersCopied.length ? ` (layers copied: ${result.layersCopied.join(', ')})` : ''}\n`);
    }));
}
