// What a sandbox can leave behind on the host, looked up directly in the kernel's views.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

export interface HostSnapshot {
  netns: Set<string>;
  links: Set<string>;
}

export function snapshotHostNetwork(): HostSnapshot {
  const netns = new Set(
    execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })
      .split('\n')
      .map((l) => l.split(' ')[0])
      .filter((n) => n.startsWith('nbx-')),
  );
  const links = new Set(
    execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' })
      .split('\n')
      .map((l) => l.split(':')[1]?.trim().split('@')[0] ?? '')
      .filter((n) => n.startsWith('nbxv')),
  );
  return { netns, links };
}

function processesMentioning(id: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cgroup = readFileSync(`/proc/${entry}/cgroup`, 'utf8');
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cgroup.includes(id) || cmdline.includes(id)) pids.push(Number(entry));
    } catch {
      // The process ended while we looked.
    }
  }
  return pids;
}

function cgroupDirsMentioning(id: string): string[] {
  const found: string[] = [];
  const walk = (dir: string, depth: number) => {
    if (depth > 4) return;
    let entries: string[];
    try {
      entries = readdirSync(dir, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
    } catch {
      return;
    }
    for (const name of entries) {
      const path = join(dir, name);
      if (name.includes(id)) found.push(path);
      else walk(path, depth + 1);
    }
  };
  for (const controller of readdirSync('/sys/fs/cgroup')) walk(join('/sys/fs/cgroup', controller, 'nestbox'), 0);
  walk('/sys/fs/cgroup/nestbox', 0);
  return found;
}

/**
 * Slots waiting in a host agent's pool (built ahead, or scrubbed and recycled after a sandbox):
 * they belong to no sandbox, so they are not anyone's residue.
 */
export function pooledSlotNames(slotsDir = '/run/nestbox/slots'): Set<string> {
  const names = new Set<string>();
  const entries = existsSync(slotsDir) ? readdirSync(slotsDir) : [];
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const claim = JSON.parse(readFileSync(join(slotsDir, entry), 'utf8')) as { pooled?: boolean };
      if (claim.pooled) names.add(`nbx-${entry}`).add(`nbxv${entry}`);
    } catch {
      // Being rewritten right now.
    }
  }
  return names;
}

/** Everything of sandbox `id` still on the host; empty when a delete cleaned up completely. */
export function residueOf(id: string, hostDataDir: string, before: HostSnapshot): string[] {
  const left: string[] = [];
  for (const pid of processesMentioning(id)) left.push(`process ${pid}`);
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) if (line.includes(id)) left.push(`mount ${line}`);
  for (const dir of cgroupDirsMentioning(id)) left.push(`cgroup ${dir}`);
  const after = snapshotHostNetwork();
  const pooled = pooledSlotNames();
  for (const n of after.netns) if (!before.netns.has(n) && !pooled.has(n)) left.push(`netns ${n}`);
  for (const l of after.links) if (!before.links.has(l) && !pooled.has(l)) left.push(`link ${l}`);
  const dir = join(hostDataDir, 'sandboxes', id);
  if (existsSync(dir)) left.push(`directory ${dir}`);
  return left;
}

/** The network names a running sandbox holds, from the local driver's record. */
export function slotNamesOf(id: string, hostDataDir: string): { netns: string; link: string } {
  const record = JSON.parse(readFileSync(join(hostDataDir, 'sandboxes', id, 'record.json'), 'utf8')) as { slot?: { netns: string; hostInterface: string } };
  if (!record.slot) throw new Error(`sandbox ${id} has no slot in its record`);
  return { netns: record.slot.netns, link: record.slot.hostInterface };
}

/** The host's network now, as if the given sandbox's slot did not exist (the baseline to compare a delete with). */
export function snapshotWithout(names: { netns: string; link: string }): HostSnapshot {
  const now = snapshotHostNetwork();
  now.netns.delete(names.netns);
  now.links.delete(names.link);
  return now;
}
