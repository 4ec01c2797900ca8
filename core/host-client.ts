// What core needs from a host agent. The control plane never touches a sandbox directly: it
// asks the host agent that owns it. The HTTP implementation lives with the host-agent protocol
// (host/protocol/client.ts); core sees only this interface.
import type { Readable } from 'node:stream';
import type { GuestClient, GuestView } from './guest.js';
import type { EgressPolicy, HostRecord } from './types.js';

export interface HostSandboxSpec {
  id: string;
  image: string;
  cpu: number;
  memoryMiB: number;
  env: Record<string, string>;
  /** Create from this named snapshot (it must exist on the host; 404 not_found otherwise). */
  snapshot?: string;
  /** Outbound network policy, applied before the sandbox's first process runs. */
  egress?: EgressPolicy;
  /** Start it as a warm-pool member, for no one until claimWarm (core/services/warm-pool.ts). */
  warm?: boolean;
}

// Declared with the sandbox it belongs to (types.ts); re-exported for the host-side callers.
export type { EgressPolicy } from './types.js';

export interface HostEgressResult {
  egress: EgressPolicy;
  addresses: string[];
  denied?: string[];
  unresolved: string[];
  applied: boolean;
}

/** Where to send a hosted-port request: the sandbox's host agent, with the credentials it wants. */
export interface PortProxyTarget {
  /** `http://host:port/v1/sandboxes/{id}/ports/{port}`: append the path inside the sandbox's server. */
  baseUrl: string;
  /** The host secret, in a header that leaves the user's own Authorization header alone. */
  headers: Record<string, string>;
}

export interface HostSandboxRuntime {
  id: string;
  /** `paused`: frozen with its memory kept; its agent cannot answer until unpaused. */
  status: 'running' | 'paused' | 'stopped';
  /** An unclaimed warm-pool member (core/services/warm-pool.ts). */
  warm?: boolean;
}

export interface HostForkResult {
  /** The children, running, in the order given. */
  children: HostSandboxRuntime[];
  /** Whether processes and memory came along (false on the local driver). */
  memoryCopied: boolean;
  /** `reflink`: copy-on-write, cost independent of size; `copy`: a full copy of the disk. */
  diskCopy: 'reflink' | 'copy';
}

export interface HostSnapshotResult {
  snapshotId: string;
  /** Bytes in the snapshot's own layer. */
  sizeBytes: number;
  diskCopy: 'reflink' | 'copy';
  /** The chain a sandbox created from it mounts, topmost first (this snapshot, then its parents). */
  layers: string[];
}


export interface HostStartResult extends HostSandboxRuntime {
  memoryRestored: boolean;
  resumeReason?: string;
}

// Guest values are declared in guest.ts; these two are re-exported for existing importers.
export type { ExecInput, ExecResult } from './guest.js';

/** A request for the sandbox's guest agent, relayed unchanged by the host agent. */
export interface AgentRequest {
  method: string;
  /** Guest-agent path including the query string, e.g. `/processes/p1/output?offset=0`. */
  path: string;
  headers?: Record<string, string>;
  body?: Readable | Buffer;
  signal?: AbortSignal;
}

/** Where to open a WebSocket to the sandbox's guest agent (through its host agent). */
export interface AgentWebSocketTarget {
  url: string;
  headers: Record<string, string>;
}

export interface HostClient {
  readonly hostId: string;
  createSandbox(spec: HostSandboxSpec): Promise<HostSandboxRuntime>;
  /** Hands the warm-pool member `spec.id` its create's spec (environment, egress); idempotent. */
  claimWarm(spec: HostSandboxSpec): Promise<HostSandboxRuntime>;
  stopSandbox(id: string): Promise<{ memorySaved: boolean }>;
  startSandbox(spec: HostSandboxSpec): Promise<HostStartResult>;
  destroySandbox(id: string): Promise<void>;
  getSandbox(id: string): Promise<HostSandboxRuntime | undefined>;
  /**
   * The sandbox's guest agent, typed (host/agent-protocol/guest-client.ts). `stopped-disk`: the
   * host's read-only view of a stopped sandbox's kept disk, which serves the file reads only.
   */
  guest(id: string, view?: GuestView): GuestClient;
  /** Freeze a running sandbox (idempotent). */
  pauseSandbox(id: string): Promise<HostSandboxRuntime>;
  /** Thaw a paused sandbox (idempotent). */
  unpauseSandbox(id: string): Promise<HostSandboxRuntime>;
  /** New running sandboxes with copies of the source's disk; all or nothing. */
  forkSandbox(sourceId: string, children: HostSandboxSpec[]): Promise<HostForkResult>;
  /** Save the sandbox's disk as a named snapshot on its host (idempotent for the same sandbox). */
  snapshotSandbox(id: string, snapshotId: string): Promise<HostSnapshotResult>;
  /** Idempotent; `conflict` while a sandbox or another snapshot on the host uses it. */
  deleteSnapshot(snapshotId: string): Promise<void>;
  /**
   * Host-to-host transfers, asked of the RECEIVING host: pull the snapshot (and the parents of
   * its chain this host lacks) or a stopped sandbox's disk from the source host agent at
   * `sourceUrl`, showing `token` (core/transfer-token.ts). Streamed; all or nothing; idempotent
   * (what is already complete here is answered as it is).
   */
  importSnapshot(snapshotId: string, source: { url: string; token: string }): Promise<{ snapshotIds: string[] }>;
  importSandbox(spec: HostSandboxSpec, source: { url: string; token: string }): Promise<HostSandboxRuntime>;
  /** Resize: CPU and memory live when it runs, the disk grown while it is stopped (drivers without it: not_supported). */
  resizeSandbox(id: string, change: { cpu?: number; memoryMiB?: number; diskGiB?: number }): Promise<{ cpu: number; memoryMiB: number; diskGiB: number | null; live: boolean }>;
  /** Change the sandbox's egress policy; live when it runs, kept for its next start otherwise. */
  setEgress(id: string, egress: EgressPolicy): Promise<HostEgressResult>;
  /**
   * Pulls an OCI image into the host's store (linux/amd64 of a manifest list); an image already
   * there is answered at once. Errors: `validation_failed` (bad reference), `not_found` (no such
   * image or tag), `unauthorized` (registry refused the credentials), `upstream_unavailable`.
   */
  pullImage(reference: string, options?: HostPullOptions): Promise<HostImage>;
  /** The images in the host's OCI store. */
  listImages(): Promise<HostImage[]>;
  /** Removes an image from the host's store (idempotent); `conflict` while a sandbox there uses it. */
  deleteImage(id: string): Promise<void>;
  /** Hosted-port traffic goes through the host agent that owns the sandbox. */
  portProxyTarget(id: string, port: number): PortProxyTarget;
  /** Volumes (issue 19): create the volume's file system on this host (idempotent), measure it, remove it (idempotent). */
  ensureVolume(id: string, sizeBytes: number): Promise<HostVolumeInfo>;
  volumeInfo(id: string): Promise<HostVolumeInfo>;
  deleteVolume(id: string): Promise<void>;
  /**
   * A file operation on a volume's contents, served by the host agent itself (host/agent/volume-files.ts):
   * `op` is `list`, `stat`, `content`, `mkdir` or '' (remove). The answer is returned as it came
   * (2xx); an error answer is thrown as its NestboxError.
   */
  volumeFiles(id: string, o: { method: string; op: string; query: Record<string, string>; body?: import('node:stream').Readable; json?: unknown }): Promise<import('node:http').IncomingMessage>;
}

export interface HostVolumeInfo {
  id: string;
  sizeBytes: number;
  usedBytes: number;
}

/** Registry credentials for one pull; never stored, never logged. */
export interface HostRegistryCredentials {
  username: string;
  password: string;
}

/** What an OCI image's config says processes start with (host/images/oci/store.ts reads it). */
export interface HostImageConfig {
  env: string[];
  cmd: string[] | null;
  entrypoint: string[] | null;
  workingDir: string;
  user: string;
  exposedPorts: string[];
  labels: Record<string, string>;
}

/** An OCI image in a host's store, addressed by its linux/amd64 manifest digest. */
export interface HostImage {
  /** `sha256:<hex>`: what `HostSandboxSpec.image` names to start from it. */
  id: string;
  /** The normalised reference it was first pulled as, e.g. `docker.io/library/busybox:1.36`. */
  reference: string;
  sizeBytes: number;
  compressedBytes: number;
  layers: { digest: string; size: number; mediaType: string }[];
  created?: string;
  pulledAt: string;
  config: HostImageConfig;
}

export interface HostPullOptions {
  credentials?: HostRegistryCredentials;
  /** Each progress line of the pull, as it happens. */
  onProgress?: (line: string) => void;
  /** Aborting cancels the pull; nothing half-pulled stays in the store. */
  signal?: AbortSignal;
}

/** Builds a client for a registered host (its URL and credentials come from the host record). */
export type HostClientFactory = (host: HostRecord) => HostClient;
