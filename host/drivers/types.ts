// The Driver interface: the only thing the host agent knows about how a sandbox is run.
// Two implementations are planned: `local` (namespaces + overlayfs + cgroups + netns, for hosts
// without KVM) and `cloud-hypervisor` (microVMs). Everything a driver does must survive a
// kill -9 of the host agent: a driver keeps its own per-sandbox record on disk and `init()`
// adopts what is still running and reports what is not.
import type { HostImage, HostImageConfig } from '../../core/host-client.js';
import type { VolumeStore } from '../storage/volumes.js';

export interface DriverCapabilities {
  /** Stop can keep memory (resume continues running processes). */
  memorySnapshot: boolean;
  /** Copy-on-write fork of a sandbox. */
  fork: boolean;
  /** Pause/unpause without releasing memory (freezer / vm.pause). */
  pause: boolean;
  /** The sandbox sees a usable /dev/kvm. */
  nestedVirt: boolean;
  hotResize: boolean;
  maxVcpus: number;
  /** Human-readable facts found by probes (cgroup version, reflink, …), for diagnostics. */
  probes: Record<string, string | number | boolean>;
}

export interface SandboxSpec {
  /** Sandbox id: lowercase letters and digits only, at most 32 chars. */
  id: string;
  /** Image name known to the host (`default` = the Debian base image). */
  image: string;
  /** vCPUs; the local driver turns this into a CFS quota. */
  cpu: number;
  memoryMiB: number;
  /** Environment every process in the sandbox starts with. */
  env: Record<string, string>;
  /** Create from this named snapshot (template) on this host instead of the bare image. */
  snapshot?: string;
  /** Outbound network policy (default allow all); drivers without egress control refuse others. */
  egress?: EgressPolicySpec;
  /**
   * Size of the sandbox's writable disk in GiB: writes beyond it fail with ENOSPC inside, and
   * `df` there shows it. Default: the driver's. A fork's children keep their source's size.
   */
  diskGiB?: number;
  /** Inode limit of that disk (default: the driver's inodes per GiB × diskGiB). */
  diskInodes?: number;
  /** Volumes of this host (issue 19) mounted into the sandbox at every start; they must exist here. */
  volumes?: SandboxVolumeMount[];
  /**
   * A warm-pool member (issue 20): started before anyone asked, for no one, until claimWarm()
   * hands it to a create. Kept in the sandbox's record, so a host agent restart adopts it as one.
   */
  warm?: boolean;
}

export interface SandboxVolumeMount {
  volumeId: string;
  /** Absolute path inside the sandbox. */
  mountPath: string;
  readOnly: boolean;
  /** A directory inside the volume to mount instead of its top. */
  subpath?: string;
}

/** New sizes of a sandbox (resize); absent fields stay as they are. */
export interface ResizeSpec {
  cpu?: number;
  memoryMiB?: number;
  diskGiB?: number;
}

/** The sizes in force after a resize, and whether they were applied to a running sandbox. */
export interface ResizeResult {
  cpu: number;
  memoryMiB: number;
  diskGiB: number | null;
  live: boolean;
}

/** Outbound network policy of a sandbox (isolation rules apply whatever it says). */
export interface EgressPolicySpec {
  mode: 'allow-all' | 'deny-all' | 'allow-list';
  /** allow-list: IPv4 addresses, IPv4 CIDRs and domain names (resolved by the host agent). */
  allow?: string[];
  /** allow-all and allow-list: the same kinds of entries, never reachable (deny wins over allow). */
  deny?: string[];
}

export interface EgressResult {
  egress: EgressPolicySpec;
  /** Addresses in force now (allow-list), domains resolved. */
  addresses: string[];
  /** Addresses denied now (the deny list, domains resolved). */
  denied?: string[];
  /** Domains that resolved to nothing; retried at every refresh. */
  unresolved: string[];
  /** false when the sandbox is not running: the policy is kept and applied at its next start. */
  applied: boolean;
}

/** `paused`: processes and memory kept, no CPU (freezer); the guest agent cannot answer. */
export type RuntimeStatus = 'running' | 'paused' | 'stopped';

/** How a disk was copied: `reflink` shares blocks (cost independent of size), `copy` writes them. */
export type DiskCopyMode = 'reflink' | 'copy';

export interface ForkResult {
  /** The new sandboxes, running, in the order of the specs given. */
  children: SandboxRuntime[];
  /** Whether running processes and memory came along (never, without a memory snapshot). */
  memoryCopied: boolean;
  diskCopy: DiskCopyMode;
}

export interface SnapshotResult {
  snapshotId: string;
  /** Bytes in this snapshot's own layer (not its parents or the base image). */
  sizeBytes: number;
  diskCopy: DiskCopyMode;
  /** The chain a sandbox created from it mounts, topmost first: this snapshot, then its parents. */
  layers: string[];
}

export interface SnapshotInfo extends SnapshotResult {
  /** The sandbox it was taken of (which may have been deleted since). */
  sourceId: string;
  image: string;
  createdAt: string;
}

/** What a moved sandbox's disk sits on and how big it is (sent ahead of its data). */
export interface SandboxDiskInfo {
  /** Snapshot layers under its upper dir, topmost first (they must be on the receiving host). */
  layers: string[];
  /** Its own disk's size and inodes; null for a sandbox older than disk quotas. */
  disk: { sizeBytes: number; inodes: number } | null;
}

export interface FileView {
  /** Host-side socket of a guest agent serving the stopped sandbox's files, read-only. */
  agentSocket: string;
  /** The view agent's proof key (agent-protocol/auth.ts); never serialise it. */
  agentProofKey?: Buffer;
  /** Changes whenever a new view process is started (cache clients by it, not by the path). */
  viewId: string;
}

export interface SandboxRuntime {
  id: string;
  status: RuntimeStatus;
  /** Host pid of the sandbox's outermost process while running. */
  pid?: number;
  /** Path of the Unix socket on which the guest agent listens (host side), while running. */
  agentSocket?: string;
  /**
   * This boot's key with which the guest agent proves its answers (agent-protocol/auth.ts).
   * Host-side only: never serialise it (the host agent's API sends picked fields, never a runtime).
   */
  agentProofKey?: Buffer;
  /** Network addresses of the sandbox's slot, while running. */
  network?: { hostAddress: string; sandboxAddress: string; netns: string };
  /** An unclaimed warm-pool member (SandboxSpec.warm). */
  warm?: boolean;
}

export interface StartResult extends SandboxRuntime {
  /** Whether processes and memory survived the stop (false on a cold start). */
  memoryRestored: boolean;
  /** Why memory was not restored, when it was not (e.g. `driver_has_no_memory_snapshot`). */
  resumeReason?: string;
}

/** What an OCI image's config says processes start with, and an image of the host's OCI store
 * (host/images/oci): core's wire types, declared once in core/host-client.ts. */
export type ImageConfigInfo = HostImageConfig;
export type ImageInfo = HostImage;

export interface PullImageOptions {
  /** Registry credentials for this pull only: never stored, logged or put in argv. */
  credentials?: { username: string; password: string };
  onProgress?: (line: string) => void;
  /** Aborting kills the pull; nothing half-pulled stays in the store. */
  signal?: AbortSignal;
}

/**
 * What one live sandbox uses right now (Driver.usage), as counters: the host agent's sampler
 * (host/agent/usage-sampler.ts) turns cumulative CPU time into a percentage between two reads.
 * A field the driver cannot know is absent (never a guess or a 0).
 */
export interface SandboxUsageCounters {
  id: string;
  status: 'running' | 'paused';
  /** Cumulative CPU time of everything the sandbox has run, in nanoseconds. */
  cpuNs?: number;
  /** vCPUs the sandbox may use (its limit). */
  cpuLimit: number;
  /** Memory in use, page cache the kernel can drop left out (as `docker stats`). */
  memoryUsedBytes?: number;
  /** Page cache charged to the sandbox. */
  memoryCacheBytes?: number;
  memoryLimitBytes?: number;
  /** Its own disk: used and total bytes as `df` inside it shows them. */
  diskUsedBytes?: number;
  diskTotalBytes?: number;
  /** Bytes the sandbox received and sent, from its slot's host-side interface. */
  netRxBytes?: number;
  netTxBytes?: number;
}

export interface Driver {
  readonly name: 'local' | 'cloud-hypervisor';
  /** Persistent named volumes on this host (issue 19); absent = the driver has none. */
  readonly volumes?: VolumeStore;
  /** Probe the machine, reclaim leftovers of crashed runs, adopt sandboxes that still run. */
  init(): Promise<void>;
  capabilities(): DriverCapabilities;
  /** Build the root filesystem, network, cgroups; start the guest agent; resolve once it answers /health. */
  create(spec: SandboxSpec, onProgress?: (line: string) => void): Promise<SandboxRuntime>;
  /** Stop every process; keep the sandbox's disk. Idempotent. */
  stop(id: string): Promise<{ memorySaved: boolean }>;
  /** Start a stopped sandbox from its kept disk; resolves once the guest agent answers. */
  start(spec: SandboxSpec): Promise<StartResult>;
  /** Remove everything the sandbox owns (processes, mounts, netns, veth, cgroups, files). Idempotent, also for half-created sandboxes. */
  destroy(id: string): Promise<void>;
  /** Freeze every process of a running sandbox (idempotent; paused survives a host-agent restart). */
  pause(id: string): Promise<SandboxRuntime>;
  /** Thaw a paused sandbox (idempotent). */
  unpause(id: string): Promise<SandboxRuntime>;
  /**
   * New running sandboxes, each with a copy of the source's disk (running sources are frozen
   * during the copy). All or nothing: on failure no child is left and the source is untouched.
   */
  fork(sourceId: string, children: SandboxSpec[]): Promise<ForkResult>;
  /** Save the sandbox's disk as an immutable named layer that sandboxes can be created from. */
  snapshot(id: string, snapshotId: string): Promise<SnapshotResult>;
  /** Idempotent; throws a `conflict` DriverError while a sandbox or another snapshot uses it. */
  deleteSnapshot(snapshotId: string): Promise<void>;
  listSnapshots(): Promise<SnapshotInfo[]>;
  /**
   * Host-to-host transfers (optional; host/storage/transfer.ts). Export streams a snapshot's
   * layer, or a stopped sandbox's disk, into what `begin` returns (called once the lock is held
   * and the info is known, so it can write headers); the snapshot or sandbox cannot be deleted
   * or started meanwhile. Import takes such a stream in, all or nothing.
   */
  exportSnapshot?(snapshotId: string, begin: (parents: string[]) => NodeJS.WritableStream): Promise<void>;
  importSnapshot?(snapshotId: string, source: NodeJS.ReadableStream): Promise<SnapshotInfo>;
  exportSandbox?(id: string, begin: (info: SandboxDiskInfo) => NodeJS.WritableStream): Promise<void>;
  /** A stopped sandbox from another host's export; an already complete one (a retry) is answered as it is. */
  importSandbox?(spec: SandboxSpec, info: SandboxDiskInfo, source: NodeJS.ReadableStream): Promise<SandboxRuntime>;
  /**
   * A guest agent over a read-only view of a stopped sandbox's disk (no network, small limits).
   * Reused while in use; stopped after a while without use and before any lifecycle change.
   */
  fileView(id: string): Promise<FileView>;
  /** Marks the file view as in use (keeps it alive). */
  touchFileView(id: string): void;
  /** What the driver knows right now (after init: adopted, stopped or absent). */
  get(id: string): Promise<SandboxRuntime | undefined>;
  list(): Promise<SandboxRuntime[]>;
  /** Release in-memory resources (timers); sandboxes keep running. */
  close(): Promise<void>;
  /**
   * Usage counters of every running or paused sandbox. Cheap (a few small files per sandbox,
   * no process started, no lock taken): the host agent calls it every few seconds.
   */
  usage(): Promise<SandboxUsageCounters[]>;
  /**
   * Resize (issue 19): CPU and memory of a running sandbox changed live, the disk of a stopped
   * one grown; a stopped sandbox's CPU and memory only change its spec (its next start uses
   * them). Optional: drivers without it answer 501.
   */
  resize?(id: string, change: ResizeSpec): Promise<ResizeResult>;
  /** Change the egress policy of a sandbox, live if it runs (optional: drivers without it answer 501). */
  setEgress?(id: string, egress: EgressPolicySpec): Promise<EgressResult>;
  /**
   * Hands the running warm-pool member `spec.id` to its new owner: the create's environment and
   * egress policy are put in force, then the member stops being one (warm cleared in its
   * record). Idempotent: a sandbox claimed already gets the same spec again. Its size and image
   * must be the member's. Optional: drivers without it keep no warm pool.
   */
  claimWarm?(spec: SandboxSpec): Promise<SandboxRuntime>;
  /**
   * Pulls an OCI image into the host's store (an image already there is answered at once).
   * Errors carry core's codes: validation_failed, not_found, unauthorized, timeout,
   * host_unavailable (the registry), internal. Optional: drivers without a store answer 501.
   */
  pullImage?(reference: string, options?: PullImageOptions): Promise<ImageInfo>;
  listImages?(): Promise<ImageInfo[]>;
  /** Idempotent; a `conflict` DriverError while a sandbox (running or stopped), a create in flight or a snapshot uses it. */
  deleteImage?(id: string): Promise<void>;
}
