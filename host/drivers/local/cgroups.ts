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
  /** cpuset CPUs of the sandbox (e.g. "0-1"), so `nproc` shows its vCPUs; absent = no cpuset. */
  cpusetCpus?: string;
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
/**
 * The v1 cpuset hierarchy, when the machine has it (appended last, so the other indexes stay):
 * a sandbox's tasks get an affinity of its own vCPU count, which is what `nproc` (and
 * sched_getaffinity) and LXCFS's cpuinfo report; the CFS quota stays the real limit.
 */
const V1_CPUSET = 'cpuset';
/**
 * v2 has no cpuset hierarchy of its own: when the unified tree offers the `cpuset` controller,
 * it is enabled down to every sandbox group, which carries `cpuset.cpus`; `agent` and `work`
 * inherit it (an empty v2 `cpuset.cpus` means the parent's), and v2 needs no `cpuset.mems`.
 */
const V2_CONTROLLERS = '+memory +cpu +pids';
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
    /** v2: whether the tree offers the cpuset controller (v1 looks for its hierarchy itself). */
    private readonly v2Cpuset = false,
  ) {
    const separateCpuacct = version === 1 && !existsSync(join(root, 'cpu', 'cpuacct.usage')) && existsSync(join(root, V1_CPUACCT, 'cpuacct.usage'));
    const cpuset = version === 1 && existsSync(join(root, V1_CPUSET, 'cpuset.cpus'));
    this.v1Controllers = [...V1_CONTROLLERS, ...(separateCpuacct ? [V1_CPUACCT] : []), ...(cpuset ? [V1_CPUSET] : [])];
  }

  /** Whether sandbox groups get a cpuset (v1 with a cpuset hierarchy, v2 with the cpuset controller). */
  get hasCpuset(): boolean {
    return this.version === 1 ? this.v1Controllers.includes(V1_CPUSET) : this.v2Cpuset;
  }

  /** Where cpuset files live: the v1 cpuset hierarchy, or the unified tree. */
  private get cpusetRoot(): string {
    return this.version === 1 ? join(this.root, V1_CPUSET) : this.root;
  }

  /** The controllers a v2 group hands its children. */
  private get v2Controllers(): string {
    return this.v2Cpuset ? `${V2_CONTROLLERS} +cpuset` : V2_CONTROLLERS;
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
      return new Cgroups(2, root, true, available.has('cpuset'));
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
    const reserve = agentReserve(limits);
    // The workloads get the sandbox's whole memory (what `free` shows them through LXCFS, which
    // reads the reader's group); the agent's reserve comes on top, in the sandbox group.
    const group = await this.create(relativePath, { ...limits, memoryBytes: limits.memoryBytes + reserve.memoryBytes });
    const agent = this.groupFor(join(relativePath, 'agent'));
    const work = this.groupFor(join(relativePath, 'work'));
    for (const path of [...agent.paths, ...work.paths]) await mkdir(path, { recursive: true });
    if (this.version === 1 && this.hasCpuset && limits.cpusetCpus) for (const child of [agent, work]) await this.writeCpuset(this.v1Dir(child, V1_CPUSET), limits.cpusetCpus);
    const workMemory = String(limits.memoryBytes);
    const workPids = String(Math.max(1, limits.pidsMax - reserve.pids));
    if (this.version === 1) {
      const [agentDir, workDir] = [agent, work].map((g) => (controller: string) => g.paths[V1_CONTROLLERS.indexOf(controller as (typeof V1_CONTROLLERS)[number])]);
      // The agent's group gets the same cap as the workloads': LXCFS answers from the cgroups of
      // the reader's init (tini, in `agent`), so this is the memory `free` shows inside.
      for (const dir of [workDir('memory'), agentDir('memory')]) {
        await writeFile(join(dir, 'memory.limit_in_bytes'), workMemory);
        if (this.swapLimit) await writeFile(join(dir, 'memory.memsw.limit_in_bytes'), workMemory);
      }
      await writeFile(join(agentDir('cpu'), 'cpu.shares'), String(AGENT_CPU_SHARES));
      await writeFile(join(workDir('cpu'), 'cpu.shares'), String(WORK_CPU_SHARES));
      await writeFile(join(workDir('pids'), 'pids.max'), workPids);
    } else {
      await writeFile(join(work.paths[0], 'memory.max'), workMemory);
      await writeFile(join(agent.paths[0], 'memory.max'), workMemory);
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
    if (this.hasCpuset) {
      // A v1 cpuset takes no task without CPUs: groups without a set of their own (file views) get all.
      await this.prepareCpusetAncestors(relativePath);
      await this.writeCpuset(dir(V1_CPUSET), limits.cpusetCpus ?? formatCpuList(await this.machineCpus()));
    }
  }

  private v1Dir(group: CgroupGroup, controller: string): string {
    return group.paths[this.v1Controllers.indexOf(controller)];
  }

  /** A v1 cpuset takes no task until it has mems and cpus; a child's must lie within its parent's. */
  private async writeCpuset(dir: string, cpus: string): Promise<void> {
    const mems = (await readFile(join(this.root, V1_CPUSET, 'cpuset.mems'), 'utf8')).trim();
    if ((await readFile(join(dir, 'cpuset.mems'), 'utf8')).trim() === '') await writeFile(join(dir, 'cpuset.mems'), mems);
    await writeFile(join(dir, 'cpuset.cpus'), cpus);
  }

  /** `nestbox` and `nestbox/<owner>` get every CPU of the machine (their children pick from them). */
  private async prepareCpusetAncestors(relativePath: string): Promise<void> {
    const all = (await readFile(join(this.root, V1_CPUSET, 'cpuset.effective_cpus'), 'utf8').catch(() => readFile(join(this.root, V1_CPUSET, 'cpuset.cpus'), 'utf8'))).trim();
    const parts = relativePath.split('/').filter(Boolean);
    let current = join(this.root, V1_CPUSET);
    for (const part of parts.slice(0, -1)) {
      current = join(current, part);
      if ((await readFile(join(current, 'cpuset.cpus'), 'utf8')).trim() !== all) await this.writeCpuset(current, all);
    }
  }

  /** The machine's CPUs a cpuset can use (the v1 cpuset root's, the v2 root's effective set), e.g. [0, 1]. */
  async machineCpus(): Promise<number[]> {
    const text =
      this.version === 1
        ? await readFile(join(this.root, V1_CPUSET, 'cpuset.effective_cpus'), 'utf8').catch(() => readFile(join(this.root, V1_CPUSET, 'cpuset.cpus'), 'utf8'))
        : await readFile(join(this.root, 'cpuset.cpus.effective'), 'utf8');
    return parseCpuList(text);
  }

  /**
   * `count` CPUs for a sandbox, spreading sandboxes over the machine: the CPUs fewest other
   * sandbox cpusets (of every owner under nestbox/) hold, lowest number first. `keep` (a resize)
   * stays in the set: growing adds to it, shrinking keeps its first CPUs, so the new set is a
   * superset or a subset of the old one and can be written parents-first or children-first.
   */
  async pickCpus(count: number, keep: number[] = [], self?: string): Promise<string> {
    const machine = await this.machineCpus();
    const want = Math.max(1, Math.min(machine.length, count));
    if (keep.length >= want) return formatCpuList(keep.slice(0, want));
    const load = new Map(machine.map((cpu) => [cpu, 0]));
    const base = join(this.cpusetRoot, 'nestbox');
    for (const owner of await readdir(base, { withFileTypes: true }).catch(() => [])) {
      if (!owner.isDirectory()) continue;
      for (const sandbox of await readdir(join(base, owner.name), { withFileTypes: true }).catch(() => [])) {
        if (!sandbox.isDirectory() || join('nestbox', owner.name, sandbox.name) === self) continue;
        const cpus = await readFile(join(base, owner.name, sandbox.name, 'cpuset.cpus'), 'utf8').catch(() => '');
        for (const cpu of parseCpuList(cpus)) load.set(cpu, (load.get(cpu) ?? 0) + 1);
      }
    }
    const others = machine.filter((cpu) => !keep.includes(cpu)).sort((a, b) => (load.get(a)! - load.get(b)!) || a - b);
    return formatCpuList([...keep, ...others.slice(0, want - keep.length)]);
  }

  /** The cpuset of a sandbox group (empty when it has none). */
  async cpusetOf(relativePath: string): Promise<number[]> {
    if (!this.hasCpuset) return [];
    return parseCpuList(await readFile(join(this.cpusetRoot, relativePath, 'cpuset.cpus'), 'utf8').catch(() => ''));
  }

  /**
   * Live resize of a sandbox's groups (createSandbox's layout): memory (workloads get
   * `memoryBytes`, the sandbox group that plus the agent's reserve), CFS quota and cpuset.
   * Growing writes parents first, shrinking children first (v1 refuses a child above its parent
   * for cpusets; memsw must stay ≥ memory). A memory limit below what the workloads use now is
   * refused by the kernel (v1: EBUSY after it tried to reclaim; v2 is checked first, since it
   * would OOM-kill instead): then every value is put back and `MemoryInUseError` is thrown.
   */
  async resizeSandbox(relativePath: string, from: CgroupLimits, to: CgroupLimits): Promise<void> {
    const group = this.groupFor(relativePath);
    const agent = this.groupFor(join(relativePath, 'agent'));
    const work = this.groupFor(join(relativePath, 'work'));
    if (to.memoryBytes !== from.memoryBytes) {
      try {
        await this.writeMemory(group, [work, agent], to);
      } catch (error) {
        await this.writeMemory(group, [work, agent], from).catch(() => {});
        throw error;
      }
    }
    if (to.cpus !== from.cpus) {
      if (this.version === 1) await writeFile(join(this.v1Dir(group, 'cpu'), 'cpu.cfs_quota_us'), String(cpuQuotaUs(to.cpus)));
      else await writeFile(join(group.paths[0], 'cpu.max'), `${cpuQuotaUs(to.cpus)} ${CFS_PERIOD_US}`);
    }
    if (this.hasCpuset && to.cpusetCpus && to.cpusetCpus !== from.cpusetCpus) {
      // v2: agent and work inherit the group's set, and a child may name CPUs its parent lacks
      // (it gets the intersection), so one write in any order.
      if (this.version === 2) {
        await writeFile(join(group.paths[0], 'cpuset.cpus'), to.cpusetCpus);
        return;
      }
      const growing = parseCpuList(to.cpusetCpus).length >= parseCpuList(from.cpusetCpus ?? '').length;
      const dirs = [group, agent, work].map((g) => this.v1Dir(g, V1_CPUSET));
      for (const dir of growing ? dirs : dirs.reverse()) await this.writeCpuset(dir, to.cpusetCpus);
    }
  }

  private async writeMemory(group: CgroupGroup, children: CgroupGroup[], to: CgroupLimits): Promise<void> {
    if (to.memoryBytes < 0) return;
    const groupBytes = to.memoryBytes + agentReserve(to).memoryBytes;
    const key = this.version === 1 ? 'memory.limit_in_bytes' : 'memory.max';
    const groupDir = this.version === 1 ? this.v1Dir(group, 'memory') : group.paths[0];
    const childDirs = children.map((child) => (this.version === 1 ? this.v1Dir(child, 'memory') : child.paths[0]));
    const write = async (dir: string, bytes: number) => {
      if (this.version === 2) {
        // v2 would OOM-kill instead of refusing: check what the group uses first.
        const current = await readNumber(join(dir, 'memory.current'));
        if (current !== undefined && current > bytes) throw new MemoryInUseError(current, bytes);
        await writeFile(join(dir, 'memory.max'), String(bytes));
        return;
      }
      const current = (await readNumber(join(dir, 'memory.limit_in_bytes'))) ?? 0;
      // memsw ≥ memory at every moment: raise memsw first, lower it last.
      const files = this.swapLimit ? (bytes >= current ? ['memory.memsw.limit_in_bytes', 'memory.limit_in_bytes'] : ['memory.limit_in_bytes', 'memory.memsw.limit_in_bytes']) : ['memory.limit_in_bytes'];
      for (const file of files) {
        try {
          await writeFile(join(dir, file), String(bytes));
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code === 'EBUSY') throw new MemoryInUseError((await readNumber(join(dir, 'memory.usage_in_bytes'))) ?? bytes, bytes);
          throw error;
        }
      }
    };
    const growing = groupBytes >= ((await readNumber(join(groupDir, key))) ?? 0);
    if (growing) {
      await write(groupDir, groupBytes);
      for (const dir of childDirs) await write(dir, to.memoryBytes);
    } else {
      for (const dir of childDirs) await write(dir, to.memoryBytes);
      await write(groupDir, groupBytes);
    }
  }


  private async writeV2Limits(path: string, limits: CgroupLimits): Promise<void> {
    await writeFile(join(path, 'memory.max'), String(limits.memoryBytes));
    if (existsSync(join(path, 'memory.swap.max'))) await writeFile(join(path, 'memory.swap.max'), '0');
    await writeFile(join(path, 'cpu.max'), `${cpuQuotaUs(limits.cpus)} ${CFS_PERIOD_US}`);
    await writeFile(join(path, 'pids.max'), String(limits.pidsMax));
    if (this.v2Cpuset && limits.cpusetCpus) await writeFile(join(path, 'cpuset.cpus'), limits.cpusetCpus);
    // Children (agent, work) get the controllers too; the sandbox group itself holds no process.
    // With cpuset among them, agent and work have their own (inherited) effective set, which
    // LXCFS reads for the reader's cgroup.
    await writeFile(join(path, 'cgroup.subtree_control'), this.v2Controllers).catch(() => {});
  }

  /** v2 only hands a controller to a child when every ancestor lists it in subtree_control. */
  private async enableV2Controllers(relativePath: string): Promise<void> {
    const parts = relativePath.split('/').filter(Boolean);
    let current = this.root;
    for (const part of parts.slice(0, -1)) {
      await writeFile(join(current, 'cgroup.subtree_control'), this.v2Controllers).catch(() => {});
      current = join(current, part);
      await mkdir(current, { recursive: true });
    }
    await writeFile(join(current, 'cgroup.subtree_control'), this.v2Controllers);
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

/** A memory limit below what the sandbox's workloads use now (the kernel could not reclaim enough). */
export class MemoryInUseError extends Error {
  constructor(
    readonly usedBytes: number,
    readonly limitBytes: number,
  ) {
    super(`the sandbox uses ${Math.ceil(usedBytes / 2 ** 20)} MiB of memory now, more than the ${Math.floor(limitBytes / 2 ** 20)} MiB asked for, and the kernel could not reclaim enough; free some memory in it (or stop it) and resize again`);
  }
}

/** "0-2,5" → [0, 1, 2, 5]. */
export function parseCpuList(text: string): number[] {
  const out: number[] = [];
  for (const part of text.trim().split(',').filter(Boolean)) {
    const [a, b] = part.split('-').map(Number);
    for (let cpu = a; cpu <= (b ?? a); cpu++) out.push(cpu);
  }
  return out;
}

/** [0, 1, 2, 5] → "0-2,5". */
export function formatCpuList(cpus: number[]): string {
  const sorted = [...new Set(cpus)].sort((a, b) => a - b);
  const ranges: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    ranges.push(i === j ? String(sorted[i]) : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return ranges.join(',');
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
