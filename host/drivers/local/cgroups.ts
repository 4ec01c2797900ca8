// cgroup v1 and v2 behind one small interface. A sandbox group lives at
// `nestbox/<owner>/<sandboxId>` in every controller we use (v1: memory, cpu, pids, freezer, one
// directory per hierarchy; v2: one directory in the unified tree). The owner level keeps
// several host agents on one machine (tests do this) from ever touching each other's groups.
import { existsSync } from 'node:fs';
import { mkdir, readFile, readdir, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export type CgroupVersion = 1 | 2;

export interface CgroupLimits {
  memoryBytes: number;
  /** Whole or fractional vCPUs; turned into a CFS quota of cpus × period. */
  cpus: number;
  pidsMax: number;
}

/** The directories of one sandbox's group (one per v1 controller, or a single v2 directory). */
export interface CgroupGroup {
  version: CgroupVersion;
  paths: string[];
}

const V1_CONTROLLERS = ['memory', 'cpu', 'pids', 'freezer'] as const;
/**
 * Where v1 accounts CPU time: usually co-mounted with `cpu` (cpu,cpuacct); on machines where
 * `cpuacct` is a hierarchy of its own, sandbox groups get a directory there too (appended after
 * the four above, so their indexes stay put), which is what per-sandbox CPU usage is read from.
 */
const V1_CPUACCT = 'cpuacct';
const CFS_PERIOD_US = 100_000;
const DRAIN_TIMEOUT_MS = 5_000;
const FREEZE_TIMEOUT_MS = 2_000;

export class Cgroups {
  /** The v1 hierarchies a group has a directory in (V1_CONTROLLERS, plus a separate cpuacct). */
  private readonly v1Controllers: readonly string[];

  private constructor(
    readonly version: CgroupVersion,
    private readonly root: string,
    /** Whether v1 memory accounting includes swap (memory.memsw.*), so swap can be capped too. */
    readonly swapLimit: boolean,
  ) {
    const separateCpuacct = version === 1 && !existsSync(join(root, 'cpu', 'cpuacct.usage')) && existsSync(join(root, V1_CPUACCT, 'cpuacct.usage'));
    this.v1Controllers = separateCpuacct ? [...V1_CONTROLLERS, V1_CPUACCT] : V1_CONTROLLERS;
  }

  /** Finds a usable layout: v1 with our four controllers, or v2 with memory/cpu/pids delegated. */
  static async detect(root = '/sys/fs/cgroup'): Promise<Cgroups> {
    if (V1_CONTROLLERS.every((controller) => existsSync(join(root, controller, 'cgroup.procs')))) {
      return new Cgroups(1, root, existsSync(join(root, 'memory', 'memory.memsw.limit_in_bytes')));
    }
    const controllers = await readFile(join(root, 'cgroup.controllers'), 'utf8').catch(() => '');
    const available = new Set(controllers.trim().split(/\s+/));
    if (['memory', 'cpu', 'pids'].every((name) => available.has(name))) {
      // v2 has memory.swap.max in every non-root group whenever swap accounting is compiled in.
      return new Cgroups(2, root, true);
    }
    throw new Error(
      `no usable cgroup layout under ${root}: need v1 hierarchies ${V1_CONTROLLERS.join(', ')} or a v2 tree with memory, cpu and pids (found "${controllers.trim()}")`,
    );
  }

  groupFor(relativePath: string): CgroupGroup {
    const paths = this.version === 1 ? this.v1Controllers.map((controller) => join(this.root, controller, relativePath)) : [join(this.root, relativePath)];
    return { version: this.version, paths };
  }

  /** Creates the group (parents included) and writes its limits. */
  async create(relativePath: string, limits: CgroupLimits): Promise<CgroupGroup> {
    if (this.version === 2) await this.enableV2Controllers(relativePath);
    const group = this.groupFor(relativePath);
    for (const path of group.paths) await mkdir(path, { recursive: true });
    if (this.version === 1) await this.writeV1Limits(relativePath, limits);
    else await this.writeV2Limits(group.paths[0], limits);
    return group;
  }

  /**
   * A sandbox's groups: the sandbox group carries its limits; inside it, `agent` holds the guest
   * agent and `work` every workload. `work` gets the limits minus a reserve (memory, pids) and a
   * small CPU share next to `agent`, so a fork bomb or a memory hog exhausts the workload group
   * while the agent still has memory, pids and CPU to answer and to kill it.
   */
  async createSandbox(relativePath: string, limits: CgroupLimits): Promise<SandboxCgroups> {
    const group = await this.create(relativePath, limits);
    const reserve = agentReserve(limits);
    const agent = this.groupFor(join(relativePath, 'agent'));
    const work = this.groupFor(join(relativePath, 'work'));
    for (const path of [...agent.paths, ...work.paths]) await mkdir(path, { recursive: true });
    const workMemory = String(limits.memoryBytes - reserve.memoryBytes);
    const workPids = String(Math.max(1, limits.pidsMax - reserve.pids));
    if (this.version === 1) {
      const [agentDir, workDir] = [agent, work].map((g) => (controller: string) => g.paths[V1_CONTROLLERS.indexOf(controller as (typeof V1_CONTROLLERS)[number])]);
      await writeFile(join(workDir('memory'), 'memory.limit_in_bytes'), workMemory);
      if (this.swapLimit) await writeFile(join(workDir('memory'), 'memory.memsw.limit_in_bytes'), workMemory);
      await writeFile(join(agentDir('cpu'), 'cpu.shares'), String(AGENT_CPU_SHARES));
      await writeFile(join(workDir('cpu'), 'cpu.shares'), String(WORK_CPU_SHARES));
      await writeFile(join(workDir('pids'), 'pids.max'), workPids);
    } else {
      await writeFile(join(work.paths[0], 'memory.max'), workMemory);
      if (existsSync(join(work.paths[0], 'memory.swap.max'))) await writeFile(join(work.paths[0], 'memory.swap.max'), '0');
      await writeFile(join(agent.paths[0], 'cpu.weight'), String(AGENT_CPU_SHARES / 10));
      await writeFile(join(work.paths[0], 'cpu.weight'), String(WORK_CPU_SHARES / 10));
      await writeFile(join(work.paths[0], 'pids.max'), workPids);
    }
    return { group, agent, work };
  }

  private async writeV1Limits(relativePath: string, limits: CgroupLimits): Promise<void> {
    const dir = (controller: string): string => join(this.root, controller, relativePath);
    await writeFile(join(dir('memory'), 'memory.limit_in_bytes'), String(limits.memoryBytes));
    // memsw = memory + swap; equal to the memory limit means "no swap at all".
    if (this.swapLimit) await writeFile(join(dir('memory'), 'memory.memsw.limit_in_bytes'), String(limits.memoryBytes));
    await writeFile(join(dir('cpu'), 'cpu.cfs_period_us'), String(CFS_PERIOD_US));
    await writeFile(join(dir('cpu'), 'cpu.cfs_quota_us'), String(cpuQuotaUs(limits.cpus)));
    await writeFile(join(dir('pids'), 'pids.max'), String(limits.pidsMax));
  }

  private async writeV2Limits(path: string, limits: CgroupLimits): Promise<void> {
    await writeFile(join(path, 'memory.max'), String(limits.memoryBytes));
    if (existsSync(join(path, 'memory.swap.max'))) await writeFile(join(path, 'memory.swap.max'), '0');
    await writeFile(join(path, 'cpu.max'), `${cpuQuotaUs(limits.cpus)} ${CFS_PERIOD_US}`);
    await writeFile(join(path, 'pids.max'), String(limits.pidsMax));
    // Children (agent, work) get the controllers too; the sandbox group itself holds no process.
    await writeFile(join(path, 'cgroup.subtree_control'), '+memory +cpu +pids').catch(() => {});
  }

  /** v2 only hands a controller to a child when every ancestor lists it in subtree_control. */
  private async enableV2Controllers(relativePath: string): Promise<void> {
    const parts = relativePath.split('/').filter(Boolean);
    let current = this.root;
    for (const part of parts.slice(0, -1)) {
      await writeFile(join(current, 'cgroup.subtree_control'), '+memory +cpu +pids').catch(() => {});
      current = join(current, part);
      await mkdir(current, { recursive: true });
    }
    await writeFile(join(current, 'cgroup.subtree_control'), '+memory +cpu +pids');
  }

  /** The files a process writes its own pid into to join the group (the launcher does this). */
  procsFiles(group: CgroupGroup): string[] {
    return group.paths.map((path) => join(path, 'cgroup.procs'));
  }

  /** Every pid in the group and its child groups, across all of its directories. */
  async pids(group: CgroupGroup): Promise<number[]> {
    const all = new Set<number>();
    for (const path of group.paths) {
      for (const dir of await subtree(path)) {
        const text = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
        for (const line of text.split('\n')) if (line.trim()) all.add(Number(line));
      }
    }
    return [...all];
  }

  /**
   * What the group uses now, from a few files (cheap enough to read every few seconds for every
   * sandbox). `cpuNs` is cumulative CPU time (callers take deltas); memory `used` leaves out the
   * inactive page cache, as `docker stats` does; `limit` is the group's own memory limit. A
   * counter whose file is missing or unreadable is left out, never guessed.
   */
  async usage(group: CgroupGroup): Promise<CgroupUsage> {
    const out: CgroupUsage = {};
    if (this.version === 1) {
      const dir = (controller: string): string | undefined => {
        const index = this.v1Controllers.indexOf(controller);
        return index < 0 ? undefined : group.paths[index];
      };
      const cpuDir = this.v1Controllers.includes(V1_CPUACCT) ? dir(V1_CPUACCT) : dir('cpu');
      const cpu = cpuDir ? await readNumber(join(cpuDir, 'cpuacct.usage')) : undefined;
      if (cpu !== undefined) out.cpuNs = cpu;
      const memoryDir = dir('memory') as string;
      const [usage, limit, stat] = await Promise.all([
        readNumber(join(memoryDir, 'memory.usage_in_bytes')),
        readNumber(join(memoryDir, 'memory.limit_in_bytes')),
        readKeyed(join(memoryDir, 'memory.stat')),
      ]);
      if (usage !== undefined && stat) {
        out.memoryUsedBytes = Math.max(0, usage - (stat.get('total_inactive_file') ?? 0));
        out.memoryCacheBytes = stat.get('total_cache') ?? 0;
      }
      if (limit !== undefined) out.memoryLimitBytes = limit;
    } else {
      const path = group.paths[0];
      const [cpuStat, current, max, stat] = await Promise.all([
        readKeyed(join(path, 'cpu.stat')),
        readNumber(join(path, 'memory.current')),
        readFile(join(path, 'memory.max'), 'utf8').catch(() => undefined),
        readKeyed(join(path, 'memory.stat')),
      ]);
      const usec = cpuStat?.get('usage_usec');
      if (usec !== undefined) out.cpuNs = usec * 1000;
      if (current !== undefined && stat) {
        out.memoryUsedBytes = Math.max(0, current - (stat.get('inactive_file') ?? 0));
        out.memoryCacheBytes = stat.get('file') ?? 0;
      }
      if (max !== undefined && /^\d+$/.test(max.trim())) out.memoryLimitBytes = Number(max.trim());
    }
    return out;
  }

  exists(group: CgroupGroup): boolean {
    return group.paths.some((path) => existsSync(path));
  }

  async freeze(group: CgroupGroup): Promise<void> {
    await this.setFrozen(group, true);
  }

  async thaw(group: CgroupGroup): Promise<void> {
    await this.setFrozen(group, false);
  }

  /**
   * Pause/unpause: freezes (or thaws) the group and waits until the kernel reports the new state,
   * so "paused" really means no task of the sandbox can run any more. Throws when the group does
   * not exist or does not settle in time.
   */
  async setFrozenAndWait(group: CgroupGroup, frozen: boolean, timeoutMs = FREEZE_TIMEOUT_MS): Promise<void> {
    const { file } = this.freezerControl(group, frozen);
    if (!existsSync(file)) throw new Error(`cgroup ${group.paths[0]} has no freezer (${file} is missing)`);
    if (!(await this.setFrozen(group, frozen, timeoutMs))) {
      throw new Error(`cgroup ${group.paths[0]} did not become ${frozen ? 'frozen' : 'thawed'} within ${timeoutMs} ms`);
    }
  }

  /** Whether the group is frozen or freezing (v1 FREEZING counts: the freeze was asked for). */
  async isFrozen(group: CgroupGroup): Promise<boolean> {
    if (this.version === 1) {
      const state = await readFile(join(group.paths[V1_CONTROLLERS.indexOf('freezer')], 'freezer.state'), 'utf8').catch(() => 'THAWED');
      return state.trim() !== 'THAWED';
    }
    return (await readFile(join(group.paths[0], 'cgroup.freeze'), 'utf8').catch(() => '0')).trim() === '1';
  }

  /** Returns whether the state was reached within the timeout (a missing group counts as done). */
  private async setFrozen(group: CgroupGroup, frozen: boolean, timeoutMs = FREEZE_TIMEOUT_MS): Promise<boolean> {
    const { file, value, done } = this.freezerControl(group, frozen);
    if (!existsSync(file)) return true;
    await writeFile(file, value);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (await done()) return true;
      if (Date.now() > deadline) return false;
      await sleep(5);
    }
  }

  private freezerControl(group: CgroupGroup, frozen: boolean): { file: string; value: string; done: () => Promise<boolean> } {
    if (this.version === 1) {
      const dir = group.paths[V1_CONTROLLERS.indexOf('freezer')];
      const file = join(dir, 'freezer.state');
      const want = frozen ? 'FROZEN' : 'THAWED';
      return { file, value: want, done: async () => (await readFile(file, 'utf8').catch(() => want)).trim() === want };
    }
    const dir = group.paths[0];
    const events = join(dir, 'cgroup.events');
    return {
      file: join(dir, 'cgroup.freeze'),
      value: frozen ? '1' : '0',
      done: async () => (await readFile(events, 'utf8').catch(() => '')).includes(`frozen ${frozen ? 1 : 0}`),
    };
  }

  /**
   * Kills every process of the group and waits until it is empty. Freezing first means nothing
   * can fork between reading the pid list and the kills; SIGKILL is delivered on thaw.
   */
  async killAll(group: CgroupGroup): Promise<void> {
    if (!this.exists(group)) return;
    // A killed task still needs CPU time to exit; thousands of them (a fork bomb) under the
    // sandbox's CPU quota would take minutes to die, so the quota goes first.
    await this.liftCpuQuota(group);
    const v2Kill = this.version === 2 ? join(group.paths[0], 'cgroup.kill') : undefined;
    if (v2Kill && existsSync(v2Kill)) {
      await writeFile(v2Kill, '1');
    } else {
      await this.freeze(group);
      for (const pid of await this.pids(group)) killQuietly(pid);
      await this.thaw(group);
    }
    await this.waitEmpty(group, DRAIN_TIMEOUT_MS);
  }

  private async liftCpuQuota(group: CgroupGroup): Promise<void> {
    if (this.version === 1) {
      const cpuDir = group.paths[V1_CONTROLLERS.indexOf('cpu')];
      for (const dir of await subtree(cpuDir)) await writeFile(join(dir, 'cpu.cfs_quota_us'), '-1').catch(() => {});
    } else {
      for (const dir of await subtree(group.paths[0])) await writeFile(join(dir, 'cpu.max'), 'max').catch(() => {});
    }
  }

  private async waitEmpty(group: CgroupGroup, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const left = await this.pids(group);
      if (left.length === 0) return;
      if (Date.now() > deadline) throw new Error(`processes ${left.join(', ')} still in cgroup ${group.paths[0]} after ${timeoutMs} ms`);
      // A task forked just before the freeze may have escaped the first round.
      for (const pid of left) killQuietly(pid);
      await sleep(20);
    }
  }

  /** Removes the group's directories, child groups first (all must be empty); missing ones are fine. */
  async remove(group: CgroupGroup): Promise<void> {
    const dirs: string[] = [];
    for (const path of group.paths) dirs.push(...(await subtree(path)).reverse());
    for (const path of dirs) {
      for (let attempt = 0; ; attempt++) {
        try {
          await rmdir(path);
          break;
        } catch (error) {
          const code = (error as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') break;
          // Exiting tasks are dropped from a cgroup a moment after they become zombies.
          if (code === 'EBUSY' && attempt < 50) {
            await sleep(20);
            continue;
          }
          throw error;
        }
      }
    }
  }

  /**
   * Removes the (childless, processless) group's directories and returns whether it is gone;
   * one that still has children or tasks stays, without error.
   */
  async removeIfEmpty(relativePath: string): Promise<boolean> {
    let gone = true;
    for (const path of this.groupFor(relativePath).paths) {
      try {
        await rmdir(path);
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') continue;
        if (code === 'ENOTEMPTY' || code === 'EBUSY') {
          gone = false;
          continue;
        }
        throw error;
      }
    }
    return gone;
  }

  /** Names of the child groups under `relativeParent` (union over hierarchies). */
  async children(relativeParent: string): Promise<string[]> {
    const names = new Set<string>();
    for (const path of this.groupFor(relativeParent).paths) {
      const entries = await readdir(path, { withFileTypes: true }).catch(() => []);
      for (const entry of entries) if (entry.isDirectory()) names.add(entry.name);
    }
    return [...names];
  }
}

/** A group's counters (see Cgroups.usage); absent = not readable here. */
export interface CgroupUsage {
  /** Cumulative CPU time of every task the group has had, in nanoseconds. */
  cpuNs?: number;
  memoryUsedBytes?: number;
  memoryCacheBytes?: number;
  memoryLimitBytes?: number;
}

async function readNumber(path: string): Promise<number | undefined> {
  const text = await readFile(path, 'utf8').catch(() => undefined);
  const value = text === undefined ? NaN : Number(text.trim());
  return Number.isFinite(value) ? value : undefined;
}

/** `key value` lines (memory.stat, cpu.stat) as a map; undefined when the file cannot be read. */
async function readKeyed(path: string): Promise<Map<string, number> | undefined> {
  const text = await readFile(path, 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  const values = new Map<string, number>();
  for (const line of text.split('\n')) {
    const [key, value] = line.split(' ');
    if (key && value !== undefined && Number.isFinite(Number(value))) values.set(key, Number(value));
  }
  return values;
}

export interface SandboxCgroups {
  /** The sandbox's own group (limits; freeze, kill and remove act on it and everything below). */
  group: CgroupGroup;
  /** Where the launcher, and so the guest agent, runs. */
  agent: CgroupGroup;
  /** Where every workload runs (nestbox-enter joins it). */
  work: CgroupGroup;
}

const AGENT_CPU_SHARES = 8192;
const WORK_CPU_SHARES = 1024;

/** What workloads may not take from the agent: an eighth of the memory (32-128 MiB) and 64 pids. */
export function agentReserve(limits: CgroupLimits): { memoryBytes: number; pids: number } {
  const MiB = 1024 * 1024;
  const memoryBytes = Math.min(Math.floor(limits.memoryBytes / 2), Math.max(32 * MiB, Math.min(128 * MiB, Math.floor(limits.memoryBytes / 8))));
  return { memoryBytes, pids: Math.min(64, Math.floor(limits.pidsMax / 2)) };
}

/** A directory and every directory below it (cgroup trees are shallow), parents first. */
async function subtree(path: string): Promise<string[]> {
  const out = [path];
  const entries = await readdir(path, { withFileTypes: true }).catch(() => []);
  for (const entry of entries) if (entry.isDirectory()) out.push(...(await subtree(join(path, entry.name))));
  return out;
}

export function cpuQuotaUs(cpus: number): number {
  // The kernel refuses quotas below 1 ms.
  return Math.max(1_000, Math.round(cpus * CFS_PERIOD_US));
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // Already gone.
  }
}
