// Two figures of issue 20 measured through the native API of a running server: creates at a
// concurrency (creates per second and p95 beside the serial create of the same run), and host
// memory per idle sandbox (PSS of every process a sandbox runs, from /proc/<pid>/smaps_rollup).
import { readdirSync, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { call, ms, quantile, timed } from './measure.js';

/**
 * Small sandboxes: memory is reserved, not used, but 50 of the default 1 GiB would pass this
 * machine's capacity (RAM × NESTBOX_MEMORY_OVERCOMMIT) and be refused.
 */
const BENCH_MEMORY_MIB = 256;

export interface ApiTarget {
  base: string;
  key: string;
  /** Host data dir of the local host agent (its sandbox records name each sandbox's launcher pid). */
  hostDataDir: string;
}

/** `total` creates, `concurrency` in flight: creates/s over the whole batch and per-create p50/p95. */
export async function benchConcurrentCreates(api: ApiTarget, input: { total: number; concurrency: number; serialP50: number }, track: (id: string) => void): Promise<void> {
  if (input.total < 1) return;
  const ids: string[] = [];
  const times: number[] = [];
  let next = 0;
  const cpuBefore = machineCpu();
  const [wall] = await timed(() =>
    Promise.all(
      Array.from({ length: input.concurrency }, async () => {
        while (next < input.total) {
          next++;
          const [t, res] = await timed(() => call(api.base, api.key, 'POST', '/sandboxes', { timeoutSeconds: 0, memoryMiB: BENCH_MEMORY_MIB }));
          if (res.status !== 201) throw new Error(`create failed: ${res.body}`);
          ids.push(JSON.parse(res.body).id as string);
          track(ids[ids.length - 1]);
          times.push(t);
        }
      }),
    ),
  );
  const cpuAfter = machineCpu();
  const busy = (cpuAfter.busy - cpuBefore.busy) / (cpuAfter.total - cpuBefore.total);
  const perSecond = input.total / (wall / 1000);
  const serialPerSecond = 1000 / input.serialP50;
  console.log(
    `${input.total} creates at concurrency ${input.concurrency}: ${perSecond.toFixed(2)} creates/s (wall ${ms(wall)}), per create p50 ${ms(quantile(times, 0.5))}, p95 ${ms(quantile(times, 0.95))}; ` +
      `baseline one at a time ${serialPerSecond.toFixed(2)} creates/s (p50 ${ms(input.serialP50)}) → ×${(perSecond / serialPerSecond).toFixed(2)} the serial rate`,
  );
  // Saturated CPU means the creates are bound by work, not waiting on each other (a lock would
  // show as idle CPU with creates queued). Other load on the machine counts here too.
  console.log(`  machine CPU busy during the burst: ${(busy * 100).toFixed(0)}% of ${availableParallelism()} cores (${((busy * availableParallelism() * wall) / 1000 / input.total).toFixed(2)} CPU-seconds per create, all processes)`);
}

/** Jiffies of the whole machine from /proc/stat: busy (all but idle and iowait) and total. */
function machineCpu(): { busy: number; total: number } {
  const fields = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0].trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((a, b) => a + b, 0);
  return { busy: total - fields[3] - fields[4], total };
}

interface ProcessInfo {
  pid: number;
  ppid: number;
  comm: string;
  cmdline: string;
}

function processTable(): Map<number, ProcessInfo> {
  const table = new Map<number, ProcessInfo>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // comm is in parentheses and may hold spaces: the fields after its last ')' are fixed.
      const close = stat.lastIndexOf(')');
      const comm = stat.slice(stat.indexOf('(') + 1, close);
      const ppid = Number(stat.slice(close + 2).split(' ')[1]);
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
      table.set(Number(entry), { pid: Number(entry), ppid, comm, cmdline });
    } catch {
      // Gone meanwhile.
    }
  }
  return table;
}

/** kB figures of /proc/<pid>/smaps_rollup. */
function rollup(pid: number): { pss: number; pssAnon: number; pssFile: number; rss: number } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
    const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0);
    return { pss: field('Pss'), pssAnon: field('Pss_Anon'), pssFile: field('Pss_File'), rss: field('Rss') };
  } catch {
    return undefined;
  }
}

/**
 * `count` idle sandboxes running at once: the PSS of every process of each (the launcher's
 * tree: unshare, tini, the guest agent and anything it started), median per sandbox, and the
 * guest agent's share. PSS splits shared pages (node's code, the base image's files) among
 * the processes mapping them, so the sum over sandboxes is what they cost the host together.
 */
export async function benchIdlePss(api: ApiTarget, input: { count: number; settleMs: number }, track: (id: string) => void): Promise<void> {
  if (input.count < 1) return;
  const ids: string[] = [];
  for (let i = 0; i < input.count; i++) {
    const res = await call(api.base, api.key, 'POST', '/sandboxes', { timeoutSeconds: 0, memoryMiB: BENCH_MEMORY_MIB });
    if (res.status !== 201) throw new Error(`create failed: ${res.body}`);
    ids.push(JSON.parse(res.body).id as string);
    track(ids[ids.length - 1]);
  }
  // Let start-up garbage be collected and lazy work settle, as an idle sandbox would.
  await new Promise((r) => setTimeout(r, input.settleMs));
  const table = processTable();
  const children = new Map<number, number[]>();
  for (const p of table.values()) children.set(p.ppid, [...(children.get(p.ppid) ?? []), p.pid]);
  const totals: number[] = [];
  const agents: number[] = [];
  const agentAnon: number[] = [];
  const processCounts: number[] = [];
  for (const id of ids) {
    const record = JSON.parse(readFileSync(`${api.hostDataDir}/sandboxes/${id}/record.json`, 'utf8')) as { pid?: number };
    if (!record.pid) throw new Error(`sandbox ${id} has no launcher pid`);
    const tree: number[] = [];
    const queue = [record.pid];
    while (queue.length && tree.length < 1000) {
      const pid = queue.shift()!;
      tree.push(pid);
      queue.push(...(children.get(pid) ?? []));
    }
    let total = 0;
    for (const pid of tree) {
      const r = rollup(pid);
      if (!r) continue;
      total += r.pss;
      const p = table.get(pid)!;
      if (p.cmdline.includes('guest-agent.mjs') && p.comm !== 'tini' && p.comm !== 'unshare') {
        agents.push(r.pss);
        agentAnon.push(r.pssAnon);
      }
    }
    totals.push(total);
    processCounts.push(tree.length);
  }
  const mib = (kb: number) => `${(kb / 1024).toFixed(1)} MiB`;
  const [total, agent, anon] = [totals, agents, agentAnon].map((xs) => quantile(xs, 0.5));
  console.log(
    `PSS per idle sandbox with ${input.count} running (median, ${quantile(processCounts, 0.5)} processes each): ${mib(total)}; of it the guest agent ${mib(agent)} (${mib(anon)} anonymous: heap and stacks) → ${((agent / total) * 100).toFixed(0)}%; all ${input.count} together ${mib(totals.reduce((a, b) => a + b, 0))} (goal ≤ 15 MiB each)`,
  );
}
