// SandboxSpec → VmConfig for `vm.create`, and the patcher for a snapshot's `config.json`
// (host-runtime.md §1, §2). Every sandbox presents the same guest identity (MAC, IP, TAP name
// `tap0` inside its own network namespace), so only per-sandbox *paths* differ between VMs:
// the rootfs disk, the vsock socket and the serial log. Those are exactly the fields a restored
// or forked VM must get patched, because CH opens whatever config.json names.
import type { FsConfig, VmConfig } from './api.js';

/** Locally administered, fixed: the MAC lives in guest memory and state.json anyway. */
export const GUEST_MAC = '02:6e:62:00:00:02';
export const TAP_NAME = 'tap0';
export const ROOTFS_DISK_ID = 'rootfs';
/** CIDs are per VMM, so every VM can use the lowest guest CID. */
export const GUEST_CID = 3;
/** The guest agent's vsock port (HTTP/1.1, same protocol as the local driver's Unix socket). */
export const AGENT_VSOCK_PORT = 1024;
export const DEFAULT_CMDLINE = 'console=ttyS0 root=/dev/vda rw net.ifnames=0 quiet panic=-1';

export interface VmPaths {
  kernel: string;
  initramfs: string;
  rootfsDisk: string;
  vsockSocket: string;
  serialLog: string;
}

export interface VmShape {
  cpu: number;
  memoryMiB: number;
  /** Pass the host's VMX/SVM through so the sandbox can run its own VMs. */
  nested: boolean;
  cmdline?: string;
  /**
   * Ceilings of a live resize (vm.resize): vCPUs up to `maxVcpus` (CPU hotplug), memory up to
   * `maxMemoryMiB` (virtio-mem hotplug above the boot size). Default: the boot size (no room).
   */
  maxVcpus?: number;
  maxMemoryMiB?: number;
  /** virtio-fs shares (volumes), one virtiofsd each; their presence makes guest memory shared. */
  fs?: Array<{ tag: string; socket: string }>;
}

const MIB = 1024 * 1024;

export function buildVmConfig(shape: VmShape, paths: VmPaths): VmConfig {
  if (!(shape.cpu > 0)) throw new Error(`cpu must be positive, got ${shape.cpu}`);
  if (!Number.isInteger(shape.memoryMiB) || shape.memoryMiB < 64) throw new Error(`memoryMiB must be an integer ≥ 64, got ${shape.memoryMiB}`);
  // A VM gets whole vCPUs; a fractional request (0.5) still needs one.
  const vcpus = Math.max(1, Math.ceil(shape.cpu));
  const maxVcpus = Math.max(vcpus, shape.maxVcpus ?? vcpus);
  // virtio-mem plugs (and unplugs) memory in blocks of 128 MiB in CH: the room is a multiple of that.
  const hotplugMiB = Math.floor(Math.max(0, (shape.maxMemoryMiB ?? shape.memoryMiB) - shape.memoryMiB) / HOTPLUG_BLOCK_MIB) * HOTPLUG_BLOCK_MIB;
  const fs: FsConfig[] = (shape.fs ?? []).map((share) => ({ tag: share.tag, socket: share.socket, num_queues: 1, queue_size: 1024, id: share.tag }));
  return {
    cpus: { boot_vcpus: vcpus, max_vcpus: maxVcpus, nested: shape.nested },
    // Private memory: snapshots copy it out, OnDemand restores fault it back in (no shared
    // mapping needed, and clones must not share writable memory anyway). virtio-fs is the
    // exception: virtiofsd maps guest memory to serve its queues, so it must be shared
    // (such VMs stop cold, see driver.ts, so no clone ever shares it).
    memory: {
      size: shape.memoryMiB * MIB,
      ...(hotplugMiB > 0 ? { hotplug_size: hotplugMiB * MIB, hotplug_method: 'VirtioMem' as const } : {}),
      shared: fs.length > 0,
      thp: true,
    },
    payload: { kernel: paths.kernel, initramfs: paths.initramfs, cmdline: shape.cmdline ?? DEFAULT_CMDLINE },
    // image_type explicitly: autodetection is deprecated since v52 and a raw image must never be
    // probed as qcow2 (a guest could write a qcow2 header into its own disk).
    disks: [{ id: ROOTFS_DISK_ID, path: paths.rootfsDisk, image_type: 'Raw', readonly: false }],
    net: [{ id: 'net0', tap: TAP_NAME, mac: GUEST_MAC, num_queues: 2, queue_size: 256 }],
    vsock: { id: 'vsock0', cid: GUEST_CID, socket: paths.vsockSocket },
    // A daemon must not leave the console on the VMM's TTY: serial to a file, console off.
    serial: { mode: 'File', file: paths.serialLog },
    console: { mode: 'Off' },
    rng: { src: '/dev/urandom' },
    ...(fs.length ? { fs } : {}),
  };
}

/** The hotplug room is a whole number of these (ACPI hotplug's alignment; virtio-mem's is finer). */
export const HOTPLUG_BLOCK_MIB = 128;
/** CH's default virtio-mem block: a live memory resize plugs or unplugs whole blocks above the boot size. */
export const VIRTIO_MEM_BLOCK_MIB = 2;

/** The virtio-fs tag of a sandbox's n-th volume mount (at most 36 bytes in virtio-fs). */
export function volumeTag(index: number): string {
  return `nbvol${index}`;
}

export interface SnapshotPatch {
  rootfsDisk: string;
  vsockSocket: string;
  serialLog: string;
}

/**
 * The config.json a restore of this VM (or a fork child) must use: the snapshot names the
 * paths of the VM it was taken of, which are still locked (disk) or bound (vsock) by that VM,
 * or belong to a sandbox that no longer exists. Unknown fields are kept as they are.
 */
export function patchSnapshotConfig(original: VmConfig, patch: SnapshotPatch): VmConfig {
  const config = structuredClone(original);
  const disks = config.disks ?? [];
  const rootfs = disks.find((disk) => disk.id === ROOTFS_DISK_ID) ?? (disks.length === 1 ? disks[0] : undefined);
  if (!rootfs) throw new Error(`snapshot config.json has no "${ROOTFS_DISK_ID}" disk to patch (disks: ${disks.map((disk) => disk.id ?? disk.path).join(', ') || 'none'})`);
  rootfs.path = patch.rootfsDisk;
  if (!config.vsock) throw new Error('snapshot config.json has no vsock device; the guest agent would be unreachable');
  config.vsock.socket = patch.vsockSocket;
  if (config.serial?.mode === 'File') config.serial.file = patch.serialLog;
  if (config.console?.mode === 'File') config.console.file = `${patch.serialLog}.console`;
  // Clones must never share guest RAM with their parent (Kata does the same for templates).
  if (config.memory) config.memory.shared = false;
  // Every sandbox has its own `tap0` in its own network namespace: the name stays.
  for (const net of config.net ?? []) if (net.tap && net.tap !== TAP_NAME) throw new Error(`snapshot config.json names TAP ${net.tap}, expected ${TAP_NAME}`);
  return config;
}
