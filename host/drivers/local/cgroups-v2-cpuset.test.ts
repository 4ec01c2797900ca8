// The cgroup v2 cpuset path of Cgroups (sandboxes see their own vCPUs through their cpuset),
// against a directory shaped like a v2 cgroupfs: this machine is cgroup v1, so no real v2 tree
// is at hand. What this checks is Nestbox's side of the protocol: which controllers it asks for
// at which level, which `cpuset.cpus` it writes, what it reads back and how it spreads
// sandboxes over the CPUs. What it cannot check is the kernel's: that the writes are accepted
// (`+cpuset` in subtree_control, a set outside the parent's) and that affinity follows; on a v2
// machine test/own-limits' `nproc` checks do that.
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { Cgroups } from './cgroups.js';

const roots: string[] = [];
function fakeV2Root(controllers: string, cpus = '0-3'): string {
  const root = mkdtempSync(join(tmpdir(), 'nbx-cgroup-v2-'));
  roots.push(root);
  writeFileSync(join(root, 'cgroup.controllers'), `${controllers}\n`);
  writeFileSync(join(root, 'cgroup.subtree_control'), '');
  writeFileSync(join(root, 'cpuset.cpus.effective'), `${cpus}\n`);
  return root;
}
afterEach(() => {
  for (const root of roots.splice(0)) rmSync(root, { recursive: true, force: true });
});

const read = (root: string, path: string) => readFileSync(join(root, path), 'utf8').trim();
const limits = (cpusetCpus?: string) => ({ memoryBytes: 512 * 2 ** 20, cpus: 2, pidsMax: 1024, ...(cpusetCpus ? { cpusetCpus } : {}) });

describe('cgroup v2 cpusets (fake cgroupfs)', () => {
  it('enables cpuset down to the sandbox group, writes its set there, and agent and work inherit it', async () => {
    const root = fakeV2Root('cpuset cpu io memory hugetlb pids rdma misc');
    const cgroups = await Cgroups.detect(root);
    expect(cgroups.version).toBe(2);
    expect(cgroups.hasCpuset).toBe(true);
    expect(await cgroups.machineCpus()).toEqual([0, 1, 2, 3]);

    const first = await cgroups.pickCpus(2, [], 'nestbox/owner/sb1');
    expect(first).toBe('0-1');
    await cgroups.createSandbox('nestbox/owner/sb1', limits(first));
    for (const level of ['', 'nestbox', 'nestbox/owner', 'nestbox/owner/sb1']) expect(read(root, join(level, 'cgroup.subtree_control'))).toBe('+memory +cpu +pids +cpuset');
    expect(read(root, 'nestbox/owner/sb1/cpuset.cpus')).toBe('0-1');
    // v2 needs no cpuset.mems, and agent and work carry no set of their own (empty = the parent's).
    expect(existsSync(join(root, 'nestbox/owner/sb1/cpuset.mems'))).toBe(false);
    for (const child of ['agent', 'work']) expect(existsSync(join(root, 'nestbox/owner/sb1', child, 'cpuset.cpus'))).toBe(false);
    expect(await cgroups.cpusetOf('nestbox/owner/sb1')).toEqual([0, 1]);

    // The next sandbox, of another owner too, goes where fewest sandboxes are.
    mkdirSync(join(root, 'nestbox/other'), { recursive: true });
    expect(await cgroups.pickCpus(2, [], 'nestbox/other/sb2')).toBe('2-3');
    await cgroups.createSandbox('nestbox/other/sb2', limits('2-3'));
    expect(await cgroups.pickCpus(1, [], 'nestbox/owner/sb3')).toBe('0');
  });

  it('resizes by rewriting the sandbox group\'s set alone, growing or shrinking', async () => {
    const root = fakeV2Root('cpuset cpu memory pids');
    const cgroups = await Cgroups.detect(root);
    await cgroups.createSandbox('nestbox/owner/sb1', limits('0'));
    const grown = await cgroups.pickCpus(3, await cgroups.cpusetOf('nestbox/owner/sb1'), 'nestbox/owner/sb1');
    expect(grown).toBe('0-2');
    await cgroups.resizeSandbox('nestbox/owner/sb1', limits('0'), limits(grown));
    expect(read(root, 'nestbox/owner/sb1/cpuset.cpus')).toBe('0-2');
    await cgroups.resizeSandbox('nestbox/owner/sb1', limits(grown), limits('0'));
    expect(read(root, 'nestbox/owner/sb1/cpuset.cpus')).toBe('0');
    for (const child of ['agent', 'work']) expect(existsSync(join(root, 'nestbox/owner/sb1', child, 'cpuset.cpus'))).toBe(false);
  });

  it('without the cpuset controller: no cpuset asked for or written', async () => {
    const root = fakeV2Root('cpu io memory pids');
    const cgroups = await Cgroups.detect(root);
    expect(cgroups.hasCpuset).toBe(false);
    await cgroups.createSandbox('nestbox/owner/sb1', limits());
    for (const level of ['', 'nestbox', 'nestbox/owner', 'nestbox/owner/sb1']) expect(read(root, join(level, 'cgroup.subtree_control'))).toBe('+memory +cpu +pids');
    expect(existsSync(join(root, 'nestbox/owner/sb1/cpuset.cpus'))).toBe(false);
    expect(await cgroups.cpusetOf('nestbox/owner/sb1')).toEqual([]);
  });
});
