// The local driver: sandboxes isolated with Linux namespaces, an overlayfs root, cgroups and a
// network namespace each (host-runtime.md §10), for hosts without KVM. Every sandbox keeps a
// record on disk so a restarted host agent adopts what still runs (`init()`), and every piece
// of runtime state (slot, cgroup, processes) can be found again from the sandbox id and owner
// alone, so destroy() also cleans half-created sandboxes.
import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { constants as fsConstants, existsSync } from 'node:fs';
import { lstat, mkdir, open, readdir, readFile, rm, stat } from 'node:fs/promises';
import { cpus } from 'node:os';
import { join, resolve } from 'node:path';
import { AgentClient } from '../../agent-protocol/client.js';
import { ensureBaseImage, mountPointsUnder, processStartTime, removeTree } from '../../images/base-image.js';
import type { Driver, DriverCapabilities, SandboxRuntime, SandboxSpec, StartResult } from '../types.js';
import { Cgroups, type CgroupGroup } from './cgroups.js';
import { SlotAllocator, buildSlot, enableIpForwarding, hostDnsServers, slotFor, teardownSlot, VETH_PREFIX, type Slot } from './network.js';
import { applyNftRuleset, nftAvailable, renderNftRuleset } from './nft.js';
import { newRecord, readRecord, removeRecordTempFiles, writeRecord, type SandboxRecord } from './records.js';
import { lastCapability, launchSandbox, assertSafeHostPath, assertValidEnv, SANDBOX_PATH, syscallNumbers } from './spawn.js';

export interface LocalDriverOptions {
  /** Sandboxes live in `<dataDir>/sandboxes/<id>/`. Keep it short: the agent socket path must fit in 108 bytes. */
  dataDir: string;
  imagesDir: string;
  /** The bundled guest agent (dist/guest-agent.mjs). */
  guestAgentBundle: string;
  /** Identifies this host agent, so agents sharing a machine never reclaim each other's slots or cgroups. */
  ownerId: string;
  nodeBinary?: string;
  tiniBinary?: string;
  /** Sandbox subnet; every host agent on the machine must use the same one. */
  subnet?: string;
  pidsMax?: number;
  readyTimeoutMs?: number;
  /** Resolvers handed to sandboxes (default: the host's non-loopback IPv4 nameservers). */
  dnsServers?: string[];
  /** How often running sandboxes are checked for having died on their own. */
  watchIntervalMs?: number;
  slotsDir?: string;
  cgroupRoot?: string;
  log?: (message: string) => void;
}

const SANDBOX_ID = /^[a-z0-9]{1,32}$/;
const SUN_PATH_MAX = 107; // 108 bytes including the terminating NUL
const FALLBACK_DNS = ['1.1.1.1', '8.8.8.8'];
const HEALTH_TIMEOUT_MS = 2_000;
const LOG_TAIL_BYTES = 4_000;

export class LocalDriver implements Driver {
  readonly name = 'local' as const;
  private readonly dataDir: string;
  private readonly sandboxesDir: string;
  private readonly nodeBinary: string;
  private readonly tiniBinary: string;
  private readonly subnet: string;
  private readonly ownerKey: string;
  private readonly slots: SlotAllocator;
  private readonly log: (message: string) => void;
  private cgroups?: Cgroups;
  private capabilityProbes: Record<string, string | number | boolean> = {};
  private lastCap = 40;
  private dnsServers: string[] = FALLBACK_DNS;
  private readonly records = new Map<string, SandboxRecord>();
  private readonly locks = new Map<string, Promise<unknown>>();
  /** Launchers started by this process: their exit tells us at once that a sandbox died. */
  private readonly children = new Map<string, ChildProcess>();
  private watchTimer?: NodeJS.Timeout;
  private initialized = false;

  constructor(private readonly options: LocalDriverOptions) {
    this.dataDir = resolve(options.dataDir);
    this.sandboxesDir = join(this.dataDir, 'sandboxes');
    this.nodeBinary = options.nodeBinary ?? process.execPath;
    this.tiniBinary = options.tiniBinary ?? '/usr/bin/tini-static';
    this.subnet = options.subnet ?? '10.200.0.0/16';
    this.ownerKey = ownerKeyFor(options.ownerId);
    this.slots = new SlotAllocator(this.subnet, options.slotsDir);
    this.log = options.log ?? (() => {});
  }

  // ---- Driver: setup --------------------------------------------------------------------------

  async init(): Promise<void> {
    await this.probe();
    await enableIpForwarding();
    const found = this.options.dnsServers ?? (await hostDnsServers());
    this.dnsServers = found.length ? found : FALLBACK_DNS;
    await applyNftRuleset(renderNftRuleset({ subnet: this.subnet, vethPrefix: VETH_PREFIX, dnsServers: this.dnsServers }));
    await mkdir(this.sandboxesDir, { recursive: true, mode: 0o700 });
    await this.adoptAll();
    await this.reclaimOrphans();
    this.initialized = true;
    this.startWatching();
  }

  capabilities(): DriverCapabilities {
    return {
      memorySnapshot: false,
      fork: false,
      // The freezer works (cgroups.freeze/thaw), but the Driver interface has no pause call yet.
      pause: false,
      nestedVirt: false,
      hotResize: false,
      maxVcpus: cpus().length,
      probes: { ...this.capabilityProbes },
    };
  }

  async close(): Promise<void> {
    if (this.watchTimer) clearInterval(this.watchTimer);
    this.watchTimer = undefined;
    for (const child of this.children.values()) child.removeAllListeners('exit');
    this.children.clear();
  }

  private async probe(): Promise<void> {
    const missing: string[] = [];
    this.cgroups = await Cgroups.detect(this.options.cgroupRoot);
    const filesystems = await readFile('/proc/filesystems', 'utf8');
    const nft = await nftAvailable();
    for (const [label, path] of [
      ['node', this.nodeBinary],
      ['tini', this.tiniBinary],
      ['guest agent bundle', this.options.guestAgentBundle],
      ['perl', '/usr/bin/perl'],
      ['nsenter', '/usr/bin/nsenter'],
      ['unshare', '/usr/bin/unshare'],
    ] as const) {
      if (!existsSync(path)) missing.push(`${label} (${path})`);
    }
    if (!filesystems.includes('\toverlay\n')) missing.push('overlayfs');
    if (!nft) missing.push('nft');
    syscallNumbers(); // throws on an unsupported architecture
    this.lastCap = await lastCapability();
    this.capabilityProbes = {
      cgroupVersion: this.cgroups.version,
      cgroupSwapLimit: this.cgroups.swapLimit,
      overlayfs: filesystems.includes('\toverlay\n'),
      nft: nft ?? false,
      tini: this.tiniBinary,
      node: this.nodeBinary,
      lastCapability: this.lastCap,
      memorySnapshot: 'unavailable: CRIU cannot dump processes on this kernel (host-runtime.md §10); stop keeps the disk only',
      freezer: true,
      subnet: this.subnet,
    };
    if (missing.length) throw new Error(`local driver cannot run on this host; missing: ${missing.join(', ')}`);
  }

  // ---- Driver: lifecycle ----------------------------------------------------------------------

  async create(spec: SandboxSpec, onProgress?: (line: string) => void): Promise<SandboxRuntime> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const dir = this.sandboxDir(spec.id);
      const existing = this.records.get(spec.id) ?? (await readRecord(dir));
      if (existing && existing.status !== 'creating') throw new Error(`sandbox ${spec.id} already exists`);
      // A directory without a usable record is the remains of a create that crashed.
      if (existsSync(dir)) await this.destroyUnlocked(spec.id);

      const started = Date.now();
      const image = await ensureBaseImage({ imagesDir: this.options.imagesDir, onProgress });
      const record = newRecord(spec, this.options.ownerId, join(dir, 'run', 'agent.sock'), 'creating');
      try {
        await this.makeSandboxDirs(dir);
        await writeRecord(dir, record);
        this.records.set(spec.id, record);
        await this.launch(record, image.rootfs, onProgress);
      } catch (error) {
        await this.destroyUnlocked(spec.id).catch((cleanupError) => this.log(`create ${spec.id}: cleanup after failure failed: ${String(cleanupError)}`));
        throw error;
      }
      this.log(`create ${spec.id}: running in ${Date.now() - started} ms (slot ${record.slot?.index})`);
      return this.runtimeOf(record);
    });
  }

  async stop(id: string): Promise<{ memorySaved: boolean }> {
    this.assertInitialized();
    assertSandboxId(id);
    return this.withLock(id, async () => {
      const record = this.records.get(id);
      if (!record) throw new Error(`sandbox ${id} not found`);
      await this.teardownRuntime(id, record);
      record.status = 'stopped';
      await writeRecord(this.sandboxDir(id), record);
      return { memorySaved: false };
    });
  }

  async start(spec: SandboxSpec): Promise<StartResult> {
    this.assertInitialized();
    this.validateSpec(spec);
    return this.withLock(spec.id, async () => {
      const record = this.records.get(spec.id);
      if (!record) throw new Error(`sandbox ${spec.id} not found`);
      // Nothing was lost if it never stopped.
      if (record.status === 'running') return { ...this.runtimeOf(record), memoryRestored: true };
      const image = await ensureBaseImage({ imagesDir: this.options.imagesDir });
      record.spec = spec;
      record.status = 'starting';
      await writeRecord(this.sandboxDir(spec.id), record);
      try {
        await this.launch(record, image.rootfs);
      } catch (error) {
        await this.teardownRuntime(spec.id, record).catch(() => {});
        record.status = 'stopped';
        await writeRecord(this.sandboxDir(spec.id), record);
        throw error;
      }
      return { ...this.runtimeOf(record), memoryRestored: false, resumeReason: 'driver_has_no_memory_snapshot' };
    });
  }

  async destroy(id: string): Promise<void> {
    assertSandboxId(id);
    await this.withLock(id, () => this.destroyUnlocked(id));
  }

  async get(id: string): Promise<SandboxRuntime | undefined> {
    const record = this.records.get(id);
    return record ? this.runtimeOf(record) : undefined;
  }

  async list(): Promise<SandboxRuntime[]> {
    return [...this.records.values()].map((record) => this.runtimeOf(record));
  }

  // ---- launch ---------------------------------------------------------------------------------

  /** Slot, cgroups, process, agent: everything a running sandbox has beyond its disk. */
  private async launch(record: SandboxRecord, lowerDir: string, onProgress?: (line: string) => void): Promise<void> {
    const { id } = record.spec;
    const dir = this.sandboxDir(id);
    const cgroups = this.requireCgroups();
    await writeSandboxEtc(join(dir, 'upper'), id, this.dnsServers, this.log);

    const slot = await this.slots.claim(this.options.ownerId, id);
    record.slot = { ...slot };
    await writeRecord(dir, record);
    await buildSlot(slot);
    onProgress?.(`network slot ${slot.index}: ${slot.sandboxAddress} via ${slot.hostAddress}`);

    const group = await cgroups.create(this.cgroupPath(id), {
      memoryBytes: record.spec.memoryMiB * 1024 * 1024,
      cpus: record.spec.cpu,
      pidsMax: this.options.pidsMax ?? 4096,
    });
    record.cgroup = { version: group.version, paths: group.paths };
    await writeRecord(dir, record);

    await rm(record.agentSocket, { force: true });
    await appendLog(join(dir, 'sandbox.log'), `--- nestbox: starting ${id} at ${new Date().toISOString()} ---\n`);
    const child = launchSandbox({
      netnsPath: `/run/netns/${slot.netns}`,
      cgroupProcsFiles: cgroups.procsFiles(group),
      lowerDir,
      upperDir: join(dir, 'upper'),
      workDir: join(dir, 'work'),
      rootDir: join(dir, 'rootfs'),
      runDir: join(dir, 'run'),
      nodeBinary: this.nodeBinary,
      tiniBinary: this.tiniBinary,
      guestAgentBundle: resolve(this.options.guestAgentBundle),
      hostname: id,
      env: { HOME: '/root', PATH: SANDBOX_PATH, ...record.spec.env, HOSTNAME: id },
      logFile: join(dir, 'sandbox.log'),
      lastCapability: this.lastCap,
    });
    const exited = new Promise<never>((_, reject) => {
      child.once('exit', (code, signal) => reject(new Error(`sandbox ${id} exited during start (${signal ?? `exit ${code}`})`)));
      child.once('error', reject);
    });
    exited.catch(() => {});
    if (!child.pid) throw new Error(`could not spawn the launcher for sandbox ${id}`);
    record.pid = child.pid;
    record.pidStartTime = processStartTime(child.pid);
    await writeRecord(dir, record);

    try {
      const client = new AgentClient(record.agentSocket);
      try {
        await Promise.race([this.waitReadySafely(client, record.agentSocket), exited]);
      } finally {
        client.close();
      }
    } catch (error) {
      const tail = await readLogTail(join(dir, 'sandbox.log'));
      throw new Error(`sandbox ${id} did not become ready: ${(error as Error).message}\n--- sandbox log (tail) ---\n${tail}`);
    }
    record.status = 'running';
    await writeRecord(dir, record);
    this.watchChild(id, child);
  }

  private async waitReadySafely(client: AgentClient, socketPath: string): Promise<void> {
    await client.waitReady({ timeoutMs: this.options.readyTimeoutMs ?? 20_000, intervalMs: 25 });
    await assertAgentSocket(socketPath);
  }

  private async makeSandboxDirs(dir: string): Promise<void> {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    for (const sub of ['upper', 'work', 'rootfs']) await mkdir(join(dir, sub), { recursive: true, mode: 0o755 });
    // The launcher binds the agent socket here; only root on the host may connect, and the
    // sandbox never sees this directory.
    await mkdir(join(dir, 'run'), { recursive: true, mode: 0o700 });
  }

  // ---- teardown -------------------------------------------------------------------------------

  /** Kills the processes and releases the slot and cgroups; the disk (upper/) stays. */
  private async teardownRuntime(id: string, record: SandboxRecord | undefined): Promise<void> {
    const cgroups = this.requireCgroups();
    const group = this.cgroupGroup(id);
    this.children.get(id)?.removeAllListeners('exit');
    this.children.delete(id);
    await cgroups.killAll(group);
    // Belt and braces: a launcher killed before it joined the cgroups is found by pid.
    if (record?.pid && record.pidStartTime && processStartTime(record.pid) === record.pidStartTime) {
      try {
        process.kill(record.pid, 'SIGKILL');
      } catch {
        // Gone meanwhile.
      }
      await waitForExit(record.pid, record.pidStartTime, 5_000);
    }
    for (const slot of await this.slotsOf(id, record)) {
      await teardownSlot(slot);
      await this.slots.release(slot.index);
    }
    await cgroups.remove(group);
    if (record) {
      record.slot = undefined;
      record.cgroup = undefined;
      record.pid = undefined;
      record.pidStartTime = undefined;
      await rm(record.agentSocket, { force: true });
    }
  }

  /** The slots this sandbox holds: from its record and from our claim files (a crash can leave either). */
  private async slotsOf(id: string, record: SandboxRecord | undefined): Promise<Slot[]> {
    const indices = new Set<number>();
    for (const claim of await this.slots.claims()) {
      if (claim.owner === this.options.ownerId && claim.sandboxId === id) indices.add(claim.index);
    }
    if (record?.slot) {
      const claimOwner = (await this.slots.claims()).find((claim) => claim.index === record.slot?.index);
      // Never tear down an index someone else claimed after our claim was released.
      if (!claimOwner || (claimOwner.owner === this.options.ownerId && claimOwner.sandboxId === id)) indices.add(record.slot.index);
    }
    return [...indices].map((index) => slotFor(this.subnet, index));
  }

  private async destroyUnlocked(id: string): Promise<void> {
    const dir = this.sandboxDir(id);
    const record = this.records.get(id) ?? (await readRecord(dir));
    await this.teardownRuntime(id, record);
    // Mounts live in the sandbox's own namespace; anything on the host here is a leftover.
    const leftovers = mountPointsUnder(dir);
    await removeTree(dir);
    if (existsSync(dir)) throw new Error(`could not remove ${dir} (mounts: ${leftovers.join(', ') || 'none'})`);
    this.records.delete(id);
  }

  // ---- adoption and reclaim -------------------------------------------------------------------

  private async adoptAll(): Promise<void> {
    const entries = await readdir(this.sandboxesDir, { withFileTypes: true });
    for (const entry of entries) {
      if (!entry.isDirectory() || !SANDBOX_ID.test(entry.name)) continue;
      const id = entry.name;
      const dir = this.sandboxDir(id);
      await removeRecordTempFiles(dir);
      const record = await readRecord(dir);
      if (record && record.owner !== this.options.ownerId) continue;
      await this.withLock(id, () => this.adoptOne(id, record));
    }
  }

  private async adoptOne(id: string, record: SandboxRecord | undefined): Promise<void> {
    if (!record || record.status === 'creating') {
      this.log(`init: removing half-created sandbox ${id}`);
      await this.destroyUnlocked(id);
      return;
    }
    this.records.set(id, record);
    if (record.status === 'running' && (await this.isAlive(record))) {
      this.log(`init: adopted running sandbox ${id} (pid ${record.pid})`);
      return;
    }
    if (record.status === 'running' || record.status === 'starting') this.log(`init: sandbox ${id} is no longer running; marking it stopped`);
    await this.teardownRuntime(id, record);
    record.status = 'stopped';
    await writeRecord(this.sandboxDir(id), record);
  }

  private async isAlive(record: SandboxRecord): Promise<boolean> {
    if (!record.pid || !record.pidStartTime || processStartTime(record.pid) !== record.pidStartTime) return false;
    const client = new AgentClient(record.agentSocket);
    try {
      await assertAgentSocket(record.agentSocket);
      await client.health({ timeoutMs: HEALTH_TIMEOUT_MS });
      return true;
    } catch {
      return false;
    } finally {
      client.close();
    }
  }

  /** Slots and cgroups of this owner that no running sandbox accounts for. */
  private async reclaimOrphans(): Promise<void> {
    const running = new Set([...this.records.values()].filter((record) => record.status === 'running').map((record) => record.id));
    for (const claim of await this.slots.claims()) {
      if (claim.owner !== this.options.ownerId || running.has(claim.sandboxId)) continue;
      this.log(`init: releasing orphaned network slot ${claim.index} (sandbox ${claim.sandboxId})`);
      await teardownSlot(slotFor(this.subnet, claim.index));
      await this.slots.release(claim.index);
    }
    const cgroups = this.requireCgroups();
    for (const name of await cgroups.children(join('nestbox', this.ownerKey))) {
      if (running.has(name)) continue;
      this.log(`init: removing orphaned cgroup ${name}`);
      const group = this.cgroupGroup(name);
      await cgroups.killAll(group);
      await cgroups.remove(group);
    }
  }

  // ---- watching -------------------------------------------------------------------------------

  private watchChild(id: string, child: ChildProcess): void {
    this.children.set(id, child);
    child.once('exit', () => {
      if (this.children.get(id) === child) void this.checkStillRunning(id);
    });
  }

  private startWatching(): void {
    const interval = this.options.watchIntervalMs ?? 5_000;
    this.watchTimer = setInterval(() => {
      for (const record of this.records.values()) if (record.status === 'running') void this.checkStillRunning(record.id);
    }, interval);
    this.watchTimer.unref();
  }

  /** A sandbox whose launcher died on its own (OOM of PID 1, external kill) becomes stopped. */
  private async checkStillRunning(id: string): Promise<void> {
    await this.withLock(id, async () => {
      const record = this.records.get(id);
      if (!record || record.status !== 'running') return;
      if (record.pid && record.pidStartTime && processStartTime(record.pid) === record.pidStartTime) return;
      this.log(`sandbox ${id} exited on its own; releasing its runtime`);
      await this.teardownRuntime(id, record);
      record.status = 'stopped';
      await writeRecord(this.sandboxDir(id), record);
    }).catch((error) => this.log(`watch ${id}: ${String(error)}`));
  }

  // ---- helpers --------------------------------------------------------------------------------

  private withLock<T>(id: string, task: () => Promise<T>): Promise<T> {
    const previous = this.locks.get(id) ?? Promise.resolve();
    const next = previous.catch(() => {}).then(task);
    const settled = next.catch(() => {});
    this.locks.set(id, settled);
    void settled.then(() => {
      if (this.locks.get(id) === settled) this.locks.delete(id);
    });
    return next;
  }

  private runtimeOf(record: SandboxRecord): SandboxRuntime {
    if (record.status !== 'running') return { id: record.id, status: 'stopped' };
    return {
      id: record.id,
      status: 'running',
      pid: record.pid,
      agentSocket: record.agentSocket,
      network: record.slot ? { hostAddress: record.slot.hostAddress, sandboxAddress: record.slot.sandboxAddress, netns: record.slot.netns } : undefined,
    };
  }

  private validateSpec(spec: SandboxSpec): void {
    assertSandboxId(spec.id);
    if (spec.image !== 'default') throw new Error(`unknown image "${spec.image}" (the local driver has only "default")`);
    if (!(spec.cpu > 0) || spec.cpu > 1024) throw new Error(`cpu must be a positive number of vCPUs, got ${spec.cpu}`);
    if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < 64) throw new Error(`memoryMiB must be an integer of at least 64, got ${spec.memoryMiB}`);
    assertValidEnv(spec.env ?? {});
    assertSafeHostPath('data dir', this.sandboxDir(spec.id));
    const socket = join(this.sandboxDir(spec.id), 'run', 'agent.sock');
    if (Buffer.byteLength(socket) > SUN_PATH_MAX) {
      throw new Error(
        `agent socket path ${socket} is ${Buffer.byteLength(socket)} bytes, over the ${SUN_PATH_MAX}-byte Unix socket limit; use a shorter data dir than ${this.dataDir}`,
      );
    }
  }

  private assertInitialized(): void {
    if (!this.initialized) throw new Error('LocalDriver.init() must run first');
  }

  private requireCgroups(): Cgroups {
    if (!this.cgroups) throw new Error('LocalDriver.init() must run first');
    return this.cgroups;
  }

  private sandboxDir(id: string): string {
    return join(this.sandboxesDir, id);
  }

  private cgroupPath(id: string): string {
    return join('nestbox', this.ownerKey, id);
  }

  private cgroupGroup(id: string): CgroupGroup {
    return this.requireCgroups().groupFor(this.cgroupPath(id));
  }
}

// ---- free functions -----------------------------------------------------------------------------

/**
 * Defence in depth: the launcher binds the agent socket in run/, a host directory the sandbox
 * never sees (the agent inherits only the descriptor), so nothing inside can replace it. Should
 * that ever change, a symlink planted there would point the host agent, as root, at some other
 * host socket; refuse anything that is not a socket.
 */
export async function assertAgentSocket(path: string): Promise<void> {
  const info = await lstat(path);
  if (!info.isSocket()) throw new Error(`${path} is not a Unix socket (${info.isSymbolicLink() ? 'a symlink' : 'another file type'}); refusing to connect`);
}

function assertSandboxId(id: string): void {
  if (typeof id !== 'string' || !SANDBOX_ID.test(id)) throw new Error(`invalid sandbox id "${id}": lowercase letters and digits only, at most 32`);
}

/** Owner ids become a cgroup directory name; anything unusual is hashed. */
function ownerKeyFor(ownerId: string): string {
  if (/^[A-Za-z0-9_.-]{1,64}$/.test(ownerId) && ownerId !== '.' && ownerId !== '..') return ownerId;
  return createHash('sha256').update(ownerId).digest('hex').slice(0, 32);
}

/**
 * /etc/hostname, /etc/hosts and /etc/resolv.conf go straight into the upper layer before launch.
 * The sandbox owns that directory, so nothing here may follow a symlink it planted.
 */
async function writeSandboxEtc(upperDir: string, id: string, dnsServers: string[], log: (message: string) => void): Promise<void> {
  const etc = join(upperDir, 'etc');
  const etcStat = await lstat(etc).catch(() => undefined);
  if (!etcStat) await mkdir(etc, { mode: 0o755 });
  else if (!etcStat.isDirectory()) {
    log(`sandbox ${id}: /etc in the upper layer is not a directory; leaving it alone`);
    return;
  }
  await writeNoFollow(join(etc, 'hostname'), `${id}\n`);
  await writeNoFollow(join(etc, 'hosts'), `127.0.0.1\tlocalhost\n127.0.1.1\t${id}\n::1\tlocalhost ip6-localhost ip6-loopback\n`);
  await writeNoFollow(join(etc, 'resolv.conf'), dnsServers.map((server) => `nameserver ${server}\n`).join(''));
}

async function writeNoFollow(path: string, content: string): Promise<void> {
  const existing = await lstat(path).catch(() => undefined);
  if (existing && !existing.isFile()) await rm(path, { recursive: true, force: true });
  const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_TRUNC | fsConstants.O_NOFOLLOW, 0o644);
  try {
    await handle.writeFile(content);
  } finally {
    await handle.close();
  }
}

async function appendLog(path: string, line: string): Promise<void> {
  const handle = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_APPEND | fsConstants.O_NOFOLLOW, 0o600);
  try {
    await handle.writeFile(line);
  } finally {
    await handle.close();
  }
}

async function readLogTail(path: string): Promise<string> {
  try {
    const size = (await stat(path)).size;
    const handle = await open(path, 'r');
    try {
      const length = Math.min(size, LOG_TAIL_BYTES);
      const buffer = Buffer.alloc(length);
      await handle.read(buffer, 0, length, size - length);
      return buffer.toString('utf8');
    } finally {
      await handle.close();
    }
  } catch {
    return '(no log)';
  }
}

async function waitForExit(pid: number, startTime: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (processStartTime(pid) === startTime) {
    if (Date.now() > deadline) throw new Error(`process ${pid} did not exit within ${timeoutMs} ms`);
    await new Promise((resolveSleep) => setTimeout(resolveSleep, 20));
  }
}
