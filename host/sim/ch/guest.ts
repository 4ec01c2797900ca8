// The simulated guest behind the simulator's VM (test-only): "booting" starts the real guest
// agent (dist/guest-agent.mjs) with its own HOME as the guest's filesystem, serving on a Unix
// socket that the hybrid-vsock muxer forwards port 1024 to. Pausing stops the agent (SIGSTOP),
// so a paused VM really does not answer. The guest's files are "flushed to its disk" as a tar
// archive at the start of the raw disk image whenever the VM is snapshotted or shut down, and
// read back at boot/restore from whatever disk path the VM's config names — so a reflinked copy
// carries them, and a restore from an unpatched config.json reads the wrong disk.
//
// A disk of an OCI image (host/images/vm-image-oci.ts: ext4 with /.nestbox/agent-start) is
// different: its files are read out of the ext4 with debugfs, and the guest runs the disk's own
// agent-start (its busybox, its node on its own loader and libraries, the image's environment)
// chrooted into them, in private mount and pid namespaces with /proc and /dev. What that proves:
// the disk's runtime works inside the image's root without the image's libc or shell, and what
// the guest sees is the image. What it cannot: the kernel, the initramfs and PID 1's init
// (mounts, modules, network, socat on vsock) — only a real boot exercises those
// (scripts/vm-smoke.mjs). Flushing rebuilds the ext4 from the guest's files (mkfs.ext4 -d).
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, open, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { execFileSync } from 'node:child_process';

export const AGENT_PORT = 1024;

/** Stands in for the image's nestbox-resync: records its arguments instead of touching the host clock. */
const FAKE_RESYNC = `#!/bin/sh
mkdir -p "$HOME/.nestbox-sim"
echo "$(date +%s%3N) $*" >> "$HOME/.nestbox-sim/resync.log"
`;

// The layout of an OCI image's disk (host/images/vm-image-oci.ts), repeated here because the
// simulator imports nothing of the program.
const IMAGE_AGENT_START = '/.nestbox/agent-start';
const IMAGE_RESYNC = '/.nestbox/bin/nestbox-resync';
const IMAGE_BUSYBOX = '/.nestbox/bin/busybox';
const IMAGE_AGENT_SOCKET = '/run/nestbox/agent.sock';

/** The image disk's resync, replaced: records its arguments in the guest's /.nestbox-sim. */
const FAKE_IMAGE_RESYNC = `#!${IMAGE_BUSYBOX} sh
echo "$(${IMAGE_BUSYBOX} date +%s) $*" >> /.nestbox-sim/resync.log
`;

/**
 * The simulated guest kernel's virtio-fs: `mount -t virtiofs [-o MODE] TAG DIR` (what the
 * driver's guest mount script runs) binds the directory the tag's virtiofsd shares, read-only
 * for `ro`; every other mount is the real one, in the guest's private mount namespace.
 */
function fakeMount(tagsFile: string): string {
  return `#!/bin/sh
if [ "$1" = -t ] && [ "$2" = virtiofs ]; then
  shift 2
  opts=rw
  if [ "$1" = -o ]; then opts=$2; shift 2; fi
  source=$(sed -n "s|^$1=||p" '${tagsFile}')
  [ -n "$source" ] || { echo "mount: $1: no virtio-fs device with this tag" >&2; exit 32; }
  /bin/mount --bind "$source" "$2" || exit 32
  case ",$opts," in *,ro,*) /bin/mount -o remount,bind,ro "$2" || exit 32 ;; esac
  exit 0
fi
exec /bin/mount "$@"
`;
}

export interface GuestShare {
  tag: string;
  source: string;
}

export interface GuestLimits {
  vcpus: number;
  memoryBytes: number;
}

export interface GuestOptions {
  workDir: string;
  agentBundle: string;
  nodeBinary: string;
  serialLog?: string;
  log: (line: string) => void;
}

export class SimulatedGuest {
  private agent?: ChildProcess;
  readonly home: string;
  readonly agentSocket: string;
  private stopped = false;
  private ext4Disk = false;

  constructor(private readonly options: GuestOptions) {
    this.home = join(options.workDir, 'home');
    this.agentSocket = join(options.workDir, 'agent.sock');
  }

  /** Fills HOME from the disk, sets the boot id, starts the agent (unless told never to answer). */
  async start(diskPath: string, bootId: string, options: { agentNeverReady?: boolean; shares?: GuestShare[]; limits?: GuestLimits }): Promise<void> {
    if (await isImageDisk(diskPath)) return this.startImageGuest(diskPath, bootId, options);
    await rm(this.home, { recursive: true, force: true });
    await mkdir(join(this.home, '.nestbox-sim'), { recursive: true });
    // An ext4 disk (a VM image built the real way, or a grown one) keeps the guest's files as
    // ext4; the small fake images of the tests keep them as a tar archive.
    this.ext4Disk = await isExt4(diskPath);
    if (this.ext4Disk) execFileSync('debugfs', ['-R', `rdump / ${this.home}`, diskPath], { stdio: 'ignore', timeout: 300_000 });
    else await loadFilesFromDisk(diskPath, this.home);
    await mkdir(join(this.home, '.nestbox-sim'), { recursive: true });
    await writeFile(join(this.home, '.nestbox-sim', 'boot_id'), `${bootId}\n`);
    if (options.limits) await this.setLimits(options.limits);
    // What `df /` in the guest would show as the root file system's size.
    await writeFile(join(this.home, '.nestbox-sim', 'rootfs-bytes'), `${this.ext4Disk ? ext4Bytes(diskPath) : (await stat(diskPath)).size}\n`);
    const bin = join(this.options.workDir, 'bin');
    await mkdir(bin, { recursive: true });
    await writeFile(join(bin, 'nestbox-resync'), FAKE_RESYNC);
    await chmod(join(bin, 'nestbox-resync'), 0o755);
    const shares = options.shares ?? [];
    await rm(join(bin, 'mount'), { force: true });
    if (shares.length) {
      const tagsFile = join(this.options.workDir, 'virtiofs-tags');
      await writeFile(tagsFile, shares.map((share) => `${share.tag}=${share.source}\n`).join(''));
      await writeFile(join(bin, 'mount'), fakeMount(tagsFile));
      await chmod(join(bin, 'mount'), 0o755);
    }
    if (options.agentNeverReady) {
      this.options.log('guest: agent start suppressed (fault injection: agent never ready)');
      return;
    }
    await rm(this.agentSocket, { force: true });
    const serial = this.options.serialLog ? await open(this.options.serialLog, 'a') : undefined;
    // --pdeathsig: if the VMM dies (kill -9 included), its guest dies with it, as with real CH.
    // With virtio-fs shares the guest gets a private mount namespace, so what it mounts (its
    // volumes) is its own and goes with it. The mount points themselves are directories on
    // the machine's file system (this guest has no root of its own): the tests pick fresh ones.
    const agentArgv = [this.options.nodeBinary, this.options.agentBundle, '--socket', this.agentSocket];
    const argv = shares.length ? ['unshare', '--mount', '--propagation', 'private', '--', ...agentArgv] : agentArgv;
    this.agent = spawn('setpriv', ['--pdeathsig', 'KILL', '--', ...argv], {
      cwd: this.home,
      env: { PATH: `${bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`, HOME: this.home, LANG: 'C.UTF-8' },
      stdio: ['ignore', serial?.fd ?? 'ignore', serial?.fd ?? 'ignore'],
      detached: true,
    });
    await serial?.close();
    this.agent.once('exit', (code, signal) => {
      if (!this.stopped) this.options.log(`guest: agent exited (${signal ?? code})`);
    });
  }

  /**
   * What the guest kernel would report after a boot or a vm.resize (its online CPUs, MemTotal),
   * in `.nestbox-sim/vcpus` and `.nestbox-sim/memory-bytes`: the agent runs on the machine's
   * own kernel, whose nproc and free say nothing of the simulated VM.
   */
  async setLimits(limits: GuestLimits): Promise<void> {
    const dir = this.imageRoot ? join(this.imageRoot, '.nestbox-sim') : join(this.home, '.nestbox-sim');
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'vcpus'), `${limits.vcpus}\n`);
    await writeFile(join(dir, 'memory-bytes'), `${limits.memoryBytes}\n`);
  }

  listenerFor(port: number): string | undefined {
    if (port !== AGENT_PORT || !this.agent || this.agent.exitCode !== null) return undefined;
    const socket = this.imageRoot ? join(this.imageRoot, IMAGE_AGENT_SOCKET) : this.agentSocket;
    return existsSync(socket) ? socket : undefined;
  }

  /** The guest's root when it runs an OCI image's disk. */
  private imageRoot?: string;

  private async startImageGuest(diskPath: string, bootId: string, options: { agentNeverReady?: boolean; shares?: GuestShare[]; limits?: GuestLimits }): Promise<void> {
    if (options.shares?.length) throw new Error('virtio-fs shares are simulated for the VM image guest only, not for OCI image disks');
    const root = join(this.options.workDir, 'root');
    await rm(root, { recursive: true, force: true });
    await mkdir(root, { recursive: true });
    execFileSync('debugfs', ['-R', `rdump / ${root}`, diskPath], { stdio: 'ignore', timeout: 300_000 });
    if (!existsSync(join(root, IMAGE_AGENT_START))) throw new Error(`image disk ${diskPath}: ${IMAGE_AGENT_START} did not come out of debugfs`);
    this.imageRoot = root;
    await mkdir(join(root, '.nestbox-sim'), { recursive: true });
    await writeFile(join(root, '.nestbox-sim', 'boot_id'), `${bootId}\n`);
    if (options.limits) await this.setLimits(options.limits);
    // The disk's resync would set the clock and hostname of the machine running the simulator.
    await writeFile(join(root, IMAGE_RESYNC), FAKE_IMAGE_RESYNC);
    await chmod(join(root, IMAGE_RESYNC), 0o755);
    await rm(join(root, IMAGE_AGENT_SOCKET), { force: true });
    if (options.agentNeverReady) {
      this.options.log('guest: agent start suppressed (fault injection: agent never ready)');
      return;
    }
    const serial = this.options.serialLog ? await open(this.options.serialLog, 'a') : undefined;
    // Private mount + pid namespaces: /proc and /dev exist only for the guest, and when the
    // namespace's first process dies (--kill-child follows the VMM's death), all of it dies.
    const inside = `mount --rbind /dev "$1/dev" && exec chroot "$1" ${IMAGE_BUSYBOX} sh ${IMAGE_AGENT_START}`;
    this.agent = spawn('setpriv', ['--pdeathsig', 'KILL', '--', 'unshare', '--mount', '--propagation', 'private', '--pid', '--fork', '--kill-child', `--mount-proc=${join(root, 'proc')}`, '--', '/bin/sh', '-c', inside, 'sim-guest', root], {
      cwd: '/',
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      stdio: ['ignore', serial?.fd ?? 'ignore', serial?.fd ?? 'ignore'],
      detached: true,
    });
    await serial?.close();
    this.agent.once('exit', (code, signal) => {
      if (!this.stopped) this.options.log(`guest: image agent exited (${signal ?? code})`);
    });
  }

  pause(): void {
    this.signalGroup('SIGSTOP');
  }

  resume(): void {
    this.signalGroup('SIGCONT');
  }

  /** Writes the guest's files to its disk (what a guest `sync` would have done). */
  async flushToDisk(diskPath: string): Promise<void> {
    if (this.imageRoot) {
      // The same file system, rebuilt from the guest's files at the disk's size.
      execFileSync('mkfs.ext4', ['-q', '-F', '-L', 'rootfs', '-b', '4096', '-E', 'root_owner=0:0', '-d', this.imageRoot, diskPath], { stdio: 'ignore', timeout: 300_000 });
      return;
    }
    if (this.ext4Disk) {
      execFileSync('mkfs.ext4', ['-q', '-F', '-L', 'rootfs', '-b', '4096', '-E', 'root_owner=0:0', '-d', this.home, diskPath], { stdio: 'ignore', timeout: 300_000 });
      return;
    }
    await saveFilesToDisk(this.home, diskPath);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    const agent = this.agent;
    this.agent = undefined;
    if (!agent || agent.exitCode !== null || agent.signalCode !== null) return;
    this.signalGroup('SIGKILL', agent);
    for (let i = 0; i < 200 && agent.exitCode === null && agent.signalCode === null; i++) await sleep(5);
  }

  private signalGroup(signal: NodeJS.Signals, agent = this.agent): void {
    if (!agent?.pid) return;
    try {
      process.kill(-agent.pid, signal);
    } catch {
      // Gone.
    }
  }
}

async function isExt4(diskPath: string): Promise<boolean> {
  const handle = await open(diskPath, 'r');
  const magic = Buffer.alloc(2);
  try {
    await handle.read(magic, 0, 2, 1080);
  } finally {
    await handle.close();
  }
  return magic.readUInt16LE(0) === 0xef53;
}

/** The size of an ext4's file system (block count × block size, what df reports as its size). */
function ext4Bytes(diskPath: string): number {
  const out = execFileSync('dumpe2fs', ['-h', diskPath], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 30_000 });
  const blocks = Number(/^Block count:\s+(\d+)/m.exec(out)?.[1]);
  const size = Number(/^Block size:\s+(\d+)/m.exec(out)?.[1]);
  return blocks * size;
}

/** An ext4 (magic 0xEF53 at byte 1080) holding /.nestbox/agent-start: a disk of an OCI image. */
async function isImageDisk(diskPath: string): Promise<boolean> {
  if (!(await isExt4(diskPath))) return false;
  try {
    const out = execFileSync('debugfs', ['-R', `stat ${IMAGE_AGENT_START}`, diskPath], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000 });
    return /Inode:/.test(out);
  } catch {
    return false;
  }
}

export function newBootId(): string {
  return randomBytes(16).toString('hex');
}

async function loadFilesFromDisk(diskPath: string, home: string): Promise<void> {
  const handle = await open(diskPath, 'r');
  const header = Buffer.alloc(512);
  try {
    await handle.read(header, 0, 512, 0);
  } finally {
    await handle.close();
  }
  if (header.subarray(257, 262).toString('latin1') !== 'ustar') return; // a fresh, empty disk
  execFileSync('tar', ['-xf', diskPath, '-C', home], { stdio: 'ignore' });
}

async function saveFilesToDisk(home: string, diskPath: string): Promise<void> {
  const archive = execFileSync('tar', ['-cf', '-', '-C', home, '.'], { maxBuffer: 512 * 1024 * 1024 });
  const size = (await stat(diskPath)).size;
  if (archive.length > size) throw new Error(`guest files (${archive.length} bytes) do not fit the ${size}-byte disk`);
  const handle = await open(diskPath, 'r+');
  try {
    await handle.write(archive, 0, archive.length, 0);
  } finally {
    await handle.close();
  }
}

export async function readBootIdFromState(stateJson: string): Promise<string> {
  const state = JSON.parse(await readFile(stateJson, 'utf8')) as { bootId?: string };
  if (!state.bootId) throw new Error('state.json has no bootId');
  return state.bootId;
}
