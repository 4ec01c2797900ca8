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
const CFS_PERIOD_US = 100_000;
const DRAIN_TIMEOUT_MS = 5_000;
const FREEZE_TIMEOUT_MS = 2_000;

export class Cgroups {
  private constructor(
    readonly version: CgroupVersion,
    private readonly root: string,
    /** Whether v1 memory accounting includes swap (memory.memsw.*), so swap can be capped too. */
    readonly swapLimit: boolean,
  ) {}

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
    const paths = this.version === 1 ? V1_CONTROLLERS.map((controller) => join(this.root, controller, relativePath)) : [join(this.root, relativePath)];
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

  /** Every pid in the group, across all of its directories. */
  async pids(group: CgroupGroup): Promise<number[]> {
    const all = new Set<number>();
    for (const path of group.paths) {
      const text = await readFile(join(path, 'cgroup.procs'), 'utf8').catch(() => '');
      for (const line of text.split('\n')) if (line.trim()) all.add(Number(line));
    }
    return [...all];
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

  private async setFrozen(group: CgroupGroup, frozen: boolean): Promise<void> {
    const { file, value, done } = this.freezerControl(group, frozen);
    if (!existsSync(file)) return;
    await writeFile(file, value);
    const deadline = Date.now() + FREEZE_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (await done()) return;
      await sleep(10);
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

  /** Removes the group's directories (it must be empty); missing directories are fine. */
  async remove(group: CgroupGroup): Promise<void> {
    for (const path of group.paths) {
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
