// Every workload process (exec, detached processes, terminals, session shells) starts through
// nestbox-enter when the sandbox provides it: it joins the sandbox's workload cgroup, raises its
// oom_score_adj and drops to the target user before the program runs (see nestbox-enter.c).
// The workload cgroup is reached through descriptors the launcher opened on the host and the
// agent inherited (--work-cgroup-fds): each child gets them right after its stdio, and
// nestbox-enter closes them before the program runs. The workloads' user namespace (see
// nestbox-seccomp.c --agent-uid) comes the same way, right after them.
// Outside a sandbox (tests), processes start directly, and the agent adjusts oom_score_adj
// after the fact.
import { existsSync } from 'node:fs';

export const DEFAULT_ENTER_HELPER = '/.nestbox/bin/nestbox-enter';
export const DEFAULT_WORKLOAD_OOM_SCORE_ADJ = 800;

export interface WorkloadSpawn {
  file: string;
  args: string[];
  /** Set only when the process must be started as that user directly (no helper). */
  uid?: number;
  gid?: number;
  /** Whether the helper took care of oom_score_adj (so the caller must not). */
  adjusted: boolean;
  /** Descriptors to hand the child right after its stdio (`stdio: [...own, ...extraStdio]`). */
  extraStdio: number[];
}

export class WorkloadLauncher {
  private readonly available: boolean;

  constructor(
    private readonly helper: string = DEFAULT_ENTER_HELPER,
    private readonly oomScoreAdj: number | undefined = DEFAULT_WORKLOAD_OOM_SCORE_ADJ,
    /** The agent's descriptors of the workload cgroup's procs files (one per hierarchy). */
    private readonly workCgroupFds: number[] = [],
    /** The agent's descriptor of the workloads' user namespace; absent = workloads stay in the agent's. */
    private readonly workloadUsernsFd?: number,
  ) {
    this.available = existsSync(helper);
  }

  /**
   * `stdioCount`: how many of the child's first descriptors are its stdio (3, or 5 for the PTY
   * helper's control and status pipes); the helper closes every descriptor above them.
   */
  wrap(file: string, args: string[], runAs?: { uid?: number; gid?: number }, stdioCount = 3): WorkloadSpawn {
    if (!this.available) return { file, args, uid: runAs?.uid, gid: runAs?.gid, adjusted: false, extraStdio: [] };
    const id = (v: number | undefined) => (v === undefined ? '-' : String(v));
    const oom = this.oomScoreAdj === undefined ? '-' : String(this.oomScoreAdj);
    const cgroupArgs = this.workCgroupFds.map((_, index) => `--cgroup-fd=${stdioCount + index}`);
    const usernsArgs = this.workloadUsernsFd === undefined ? [] : [`--userns-fd=${stdioCount + this.workCgroupFds.length}`];
    return {
      file: this.helper,
      args: [...cgroupArgs, ...usernsArgs, `--keep-fds=${stdioCount}`, oom, id(runAs?.uid), id(runAs?.gid), file, ...args],
      adjusted: true,
      extraStdio: [...this.workCgroupFds, ...(this.workloadUsernsFd === undefined ? [] : [this.workloadUsernsFd])],
    };
  }
}
