// The simulated guest behind the simulator's VM (test-only): "booting" starts the real guest
// agent (dist/guest-agent.mjs) with its own HOME as the guest's filesystem, serving on a Unix
// socket that the hybrid-vsock muxer forwards port 1024 to. Pausing stops the agent (SIGSTOP),
// so a paused VM really does not answer. The guest's files are "flushed to its disk" as a tar
// archive at the start of the raw disk image whenever the VM is snapshotted or shut down, and
// read back at boot/restore from whatever disk path the VM's config names — so a reflinked copy
// carries them, and a restore from an unpatched config.json reads the wrong disk.
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

  constructor(private readonly options: GuestOptions) {
    this.home = join(options.workDir, 'home');
    this.agentSocket = join(options.workDir, 'agent.sock');
  }

  /** Fills HOME from the disk, sets the boot id, starts the agent (unless told never to answer). */
  async start(diskPath: string, bootId: string, options: { agentNeverReady?: boolean }): Promise<void> {
    await rm(this.home, { recursive: true, force: true });
    await mkdir(join(this.home, '.nestbox-sim'), { recursive: true });
    await loadFilesFromDisk(diskPath, this.home);
    await writeFile(join(this.home, '.nestbox-sim', 'boot_id'), `${bootId}\n`);
    const bin = join(this.options.workDir, 'bin');
    await mkdir(bin, { recursive: true });
    await writeFile(join(bin, 'nestbox-resync'), FAKE_RESYNC);
    await chmod(join(bin, 'nestbox-resync'), 0o755);
    if (options.agentNeverReady) {
      this.options.log('guest: agent start suppressed (fault injection: agent never ready)');
      return;
    }
    await rm(this.agentSocket, { force: true });
    const serial = this.options.serialLog ? await open(this.options.serialLog, 'a') : undefined;
    // --pdeathsig: if the VMM dies (kill -9 included), its guest dies with it, as with real CH.
    this.agent = spawn('setpriv', ['--pdeathsig', 'KILL', '--', this.options.nodeBinary, this.options.agentBundle, '--socket', this.agentSocket], {
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

  listenerFor(port: number): string | undefined {
    if (port !== AGENT_PORT || !this.agent || this.agent.exitCode !== null) return undefined;
    return existsSync(this.agentSocket) ? this.agentSocket : undefined;
  }

  pause(): void {
    this.signalGroup('SIGSTOP');
  }

  resume(): void {
    this.signalGroup('SIGCONT');
  }

  /** Writes the guest's files to its disk (what a guest `sync` would have done). */
  async flushToDisk(diskPath: string): Promise<void> {
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
