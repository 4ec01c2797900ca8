// The simulated Cloud Hypervisor VMM (test-only; host-runtime.md §9 tier 2): CH's REST routes on
// the API socket with CH's real conventions — 204 for most PUTs, 200 + JSON for GETs, 200 with an
// empty body for vmm.shutdown, 200 `{id,bdf}` vs 204 for hot-plug, 404 for "VM not created",
// 400 for undeserializable/invalid bodies and wrong methods, 409 for duplicate devices, 500 for
// every wrong-state call, and JSON arrays of strings as error bodies — plus the VM state
// machine, real snapshot directories, restore by reading config.json, and fault injection.
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdir, open, readdir, readFile, readlink, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { createConnection, type Socket } from 'node:net';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { dirname, basename, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { HybridVsockMuxer } from './muxer.js';
import { newBootId, readBootIdFromState, SimulatedGuest } from './guest.js';
import type { ChSchemaValidator } from './schema.js';

export const SIM_VERSION = 'v53.0-nestbox-sim';

type VmState = 'Created' | 'Running' | 'Paused' | 'Shutdown';

interface VmConfigLike {
  payload?: { kernel?: string; initramfs?: string };
  memory?: { size?: number; shared?: boolean; hugepages?: boolean; hotplug_size?: number; hotplugged_size?: number; hotplug_method?: string };
  cpus?: { boot_vcpus?: number; max_vcpus?: number };
  fs?: Array<{ tag?: string; socket?: string; id?: string }>;
  disks?: Array<{ id?: string; path?: string; readonly?: boolean }>;
  net?: Array<{ id?: string; tap?: string; mac?: string }>;
  vsock?: { id?: string; cid?: number; socket?: string };
  serial?: { mode?: string; file?: string };
  rng?: { id?: string };
  [key: string]: unknown;
}

/** Fault injection: env vars for the whole process, a JSON file (re-read per request) per sandbox. */
export interface Faults {
  latencyMs?: number;
  /** Routes answered with an injected 500 (e.g. `vm.pause`). */
  failOn?: string[];
  /** The process SIGKILLs itself when this route is called. */
  crashOn?: string;
  /** The API socket file is unlinked when this route is called (the call itself is answered). */
  vanishOn?: string;
  agentNeverReady?: boolean;
}

export interface VmmOptions {
  apiSocket: string;
  eventMonitor?: string;
  logFile?: string;
  validator: ChSchemaValidator;
  agentBundle: string;
  nodeBinary: string;
  /** Key under which this VMM's entry in the faults file is found (the sandbox id). */
  faultKey: string;
  envFaults: Faults;
  faultsFile?: string;
  lockDir: string;
  onExit: (code: number) => void;
}

class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly chain: string[],
  ) {
    super(chain.join(': '));
  }
}

const notCreated = (action: string) => new ApiError(404, ['Error from API', `The VM could not be ${action}`, 'VM is not created']);
const wrongState = (action: string, detail: string) => new ApiError(500, ['Error from API', `The VM could not be ${action}`, detail]);

interface Route {
  method: 'GET' | 'PUT';
  /** Schema of the body, when the route takes one. */
  body?: string;
  handler: (body: unknown) => Promise<{ status: 200 | 204; json?: unknown }>;
}

export class SimulatedVmm {
  private server?: Server;
  private state?: VmState;
  private config?: VmConfigLike;
  private guest?: SimulatedGuest;
  private muxer?: HybridVsockMuxer;
  private bootId = '';
  private heldLocks: string[] = [];
  private hotplugCounter = 0;
  private fsConnections: VirtiofsConnection[] = [];
  private readonly routes: Record<string, Route>;

  constructor(private readonly options: VmmOptions) {
    this.routes = {
      'vmm.ping': { method: 'GET', handler: async () => ({ status: 200, json: { version: SIM_VERSION, build_version: SIM_VERSION, pid: process.pid, features: ['kvm'] } }) },
      'vmm.shutdown': { method: 'PUT', handler: async () => this.vmmShutdown() },
      'vm.create': { method: 'PUT', body: 'VmConfig', handler: async (body) => this.create(body as VmConfigLike) },
      'vm.boot': { method: 'PUT', handler: async () => this.boot() },
      'vm.info': { method: 'GET', handler: async () => this.info() },
      'vm.counters': { method: 'GET', handler: async () => this.counters() },
      'vm.pause': { method: 'PUT', handler: async () => this.pause() },
      'vm.resume': { method: 'PUT', handler: async () => this.resume() },
      'vm.snapshot': { method: 'PUT', body: 'VmSnapshotConfig', handler: async (body) => this.snapshot(body as { destination_url?: string }) },
      'vm.restore': { method: 'PUT', body: 'RestoreConfig', handler: async (body) => this.restore(body as { source_url: string; resume?: boolean; memory_restore_mode?: string; prefault?: boolean }) },
      'vm.shutdown': { method: 'PUT', handler: async () => this.shutdownVm('shut down') },
      'vm.reboot': { method: 'PUT', handler: async () => this.reboot() },
      'vm.power-button': { method: 'PUT', handler: async () => this.powerButton() },
      'vm.delete': { method: 'PUT', handler: async () => this.deleteVm() },
      'vm.resize': { method: 'PUT', body: 'VmResize', handler: async (body) => this.resize(body as { desired_vcpus?: number; desired_ram?: number; desired_balloon?: number }) },
      'vm.resize-disk': { method: 'PUT', body: 'VmResizeDisk', handler: async () => this.requireVm('resized') },
      'vm.add-disk': { method: 'PUT', body: 'DiskConfig', handler: async (body) => this.addDevice('disks', 'disk', body as { id?: string }) },
      'vm.add-net': { method: 'PUT', body: 'NetConfig', handler: async (body) => this.addDevice('net', 'net', body as { id?: string }) },
      'vm.remove-device': { method: 'PUT', body: 'VmRemoveDevice', handler: async (body) => this.removeDevice(body as { id?: string }) },
      'vm.nmi': { method: 'PUT', handler: async () => this.requireVm('interrupted') },
    };
  }

  async listen(): Promise<void> {
    const server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.options.apiSocket, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.server = server;
    this.event('vmm', 'starting');
  }

  /** Guest gone, locks released, sockets removed (SIGTERM and vmm.shutdown). */
  async teardown(): Promise<void> {
    await this.stopGuest({ flush: true });
    this.server?.close();
    this.server?.closeAllConnections();
    await rm(this.options.apiSocket, { force: true });
  }

  // ---- plumbing ---------------------------------------------------------------------------------

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const url = new URL(req.url ?? '/', 'http://localhost');
    const name = url.pathname.startsWith('/api/v1/') ? url.pathname.slice('/api/v1/'.length) : undefined;
    const route = name ? this.routes[name] : undefined;
    const faults = this.faults();
    if (faults.latencyMs) await sleep(faults.latencyMs);
    const reply = (status: number, json?: unknown): void => {
      const body = json === undefined ? '' : JSON.stringify(json);
      res.writeHead(status, { 'content-type': 'application/json', server: 'Cloud Hypervisor API', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    };
    if (!route || !name) {
      this.log(`${req.method} ${url.pathname}: 404 unknown path`);
      return reply(404);
    }
    // micro_http: a known path with the wrong method is a 400, here with an empty body.
    if (req.method !== route.method) return reply(400);
    if (faults.crashOn === name) {
      this.log(`fault injection: crashing on ${name}`);
      process.kill(process.pid, 'SIGKILL');
      return;
    }
    if (faults.vanishOn === name) {
      this.log(`fault injection: removing the API socket on ${name}`);
      await unlink(this.options.apiSocket).catch(() => {});
    }
    if (faults.failOn?.includes(name)) {
      this.log(`fault injection: 500 on ${name}`);
      return reply(500, ['Error from API', `The VM could not be handled (${name})`, 'Injected failure: simulated internal error']);
    }
    let body: unknown;
    if (route.body) {
      const text = Buffer.concat(chunks).toString('utf8');
      if (!text.trim()) return reply(400, ['Error from API', 'Error parsing request body', 'Empty request body']);
      try {
        body = JSON.parse(text);
      } catch (error) {
        return reply(400, ['Error from API', 'Error parsing request body', (error as Error).message]);
      }
      const problems = this.options.validator.validate(route.body, body);
      if (problems.length) {
        this.log(`${name}: body rejected by the pinned schema: ${problems.join('; ')}`);
        return reply(400, ['Error from API', 'Error parsing request body', `Schema validation against the pinned API description failed: ${problems.join('; ')}`]);
      }
    }
    try {
      const result = await route.handler(body);
      this.log(`${name}: ${result.status}`);
      reply(result.status, result.json);
      if (name === 'vmm.shutdown') res.once('finish', () => void this.exitAfterShutdown());
    } catch (error) {
      if (error instanceof ApiError) {
        this.log(`${name}: ${error.status} ${error.chain.join(' / ')}`);
        return reply(error.status, error.chain);
      }
      this.log(`${name}: internal error ${(error as Error).stack}`);
      reply(500, ['Error from API', `Internal error handling ${name}`, (error as Error).message]);
    }
  }

  private faults(): Faults {
    const fromFile = (): Faults => {
      if (!this.options.faultsFile) return {};
      try {
        const all = JSON.parse(readFileSync(this.options.faultsFile, 'utf8')) as Record<string, Faults>;
        return all[this.options.faultKey] ?? {};
      } catch {
        return {};
      }
    };
    return { ...this.options.envFaults, ...fromFile() };
  }

  private log(line: string): void {
    if (!this.options.logFile) return;
    try {
      writeFileSync(this.options.logFile, `${new Date().toISOString()} cloud-hypervisor(sim): ${line}\n`, { flag: 'a' });
    } catch {
      // Log directory gone (sandbox being destroyed).
    }
  }

  /** One pretty-printed JSON object per event, like CH's event monitor. */
  private event(source: 'vm' | 'vmm' | 'guest', event: string, properties?: Record<string, unknown>): void {
    if (!this.options.eventMonitor) return;
    const now = Date.now();
    const entry = { timestamp: { secs: Math.floor(now / 1000), nanos: (now % 1000) * 1e6 }, source, event, properties: properties ?? null };
    try {
      writeFileSync(this.options.eventMonitor, `${JSON.stringify(entry, null, 2)}\n`, { flag: 'a' });
    } catch {
      // As above.
    }
  }

  // ---- routes -----------------------------------------------------------------------------------

  private async requireVm(action: string): Promise<{ status: 204 }> {
    if (!this.state) throw notCreated(action);
    return { status: 204 };
  }

  private async create(config: VmConfigLike): Promise<{ status: 204 }> {
    if (this.state) throw wrongState('created', 'VM is already created');
    this.checkDuplicates(config);
    validateVmConfig(config);
    this.config = config;
    this.state = 'Created';
    return { status: 204 };
  }

  private checkDuplicates(config: VmConfigLike): void {
    const ids = new Set<string>();
    const paths = new Set<string>();
    for (const device of [...(config.disks ?? []), ...(config.net ?? []), ...(config.fs ?? []), ...(config.vsock ? [config.vsock] : []), ...(config.rng ? [config.rng] : [])]) {
      const id = (device as { id?: string }).id;
      if (id && ids.has(id)) throw new ApiError(409, ['Error from API', 'The VM could not be created', `Identifier ${id} is not unique`]);
      if (id) ids.add(id);
    }
    for (const disk of config.disks ?? []) {
      if (disk.path && paths.has(disk.path)) throw new ApiError(409, ['Error from API', 'The VM could not be created', `Duplicate disk path ${disk.path}`]);
      if (disk.path) paths.add(disk.path);
    }
  }

  private async boot(): Promise<{ status: 204 }> {
    if (!this.state || !this.config) throw notCreated('booted');
    if (this.state !== 'Created' && this.state !== 'Shutdown') throw wrongState('booted', `VM is ${this.state}, not Created`);
    const config = this.config;
    for (const [label, path] of [['kernel', config.payload?.kernel], ['initramfs', config.payload?.initramfs]] as const) {
      if (path && !existsSync(path)) throw wrongState('booted', `Cannot open ${label} file ${path}: No such file or directory`);
    }
    if (!config.payload?.kernel) throw wrongState('booted', 'No kernel or firmware to boot');
    this.event('vm', 'booting');
    await this.startGuest(config, newBootId(), 'booted');
    this.state = 'Running';
    this.event('vm', 'booted');
    return { status: 204 };
  }

  private async info(): Promise<{ status: 200; json: unknown }> {
    if (!this.state || !this.config) throw notCreated('queried');
    return { status: 200, json: { config: this.config, state: this.state, memory_actual_size: this.config.memory?.size ?? 512 * 1024 * 1024 } };
  }

  private async counters(): Promise<{ status: 200; json: unknown }> {
    if (!this.state) throw notCreated('queried');
    return { status: 200, json: { _disk0: { read_bytes: 0, write_bytes: 0 }, _net0: { rx_bytes: 0, tx_bytes: 0 } } };
  }

  private async pause(): Promise<{ status: 204 }> {
    if (!this.state) throw notCreated('paused');
    if (this.state !== 'Running') throw wrongState('paused', `Invalid VM state transition: ${this.state} to Paused`);
    this.event('vm', 'pausing');
    this.guest?.pause();
    this.state = 'Paused';
    this.event('vm', 'paused');
    return { status: 204 };
  }

  private async resume(): Promise<{ status: 204 }> {
    if (!this.state) throw notCreated('resumed');
    if (this.state !== 'Paused') throw wrongState('resumed', `Invalid VM state transition: ${this.state} to Running`);
    this.event('vm', 'resuming');
    this.guest?.resume();
    this.state = 'Running';
    this.muxer?.wake();
    this.event('vm', 'resumed');
    return { status: 204 };
  }

  /**
   * vm.resize as CH does it: vCPUs hot(un)plugged within max_vcpus, memory plugged above the
   * boot size within hotplug_size (virtio-mem: back down to the boot size too, in 2 MiB blocks;
   * ACPI: grow only), the new sizes written into the config (config.json of a later snapshot
   * shows them) and shown to the guest (guest.ts setLimits).
   */
  private async resize(body: { desired_vcpus?: number; desired_ram?: number; desired_balloon?: number }): Promise<{ status: 204 }> {
    if (!this.state || !this.config) throw notCreated('resized');
    const failed = (detail: string) => new ApiError(500, ['Error from API', 'The VM could not be resized', detail]);
    const cpus = this.config.cpus ?? {};
    const memory = this.config.memory ?? {};
    if (body.desired_balloon !== undefined) throw failed('Error resizing VM: No balloon device');
    if (body.desired_vcpus !== undefined && body.desired_vcpus > (cpus.max_vcpus ?? 1)) throw failed(`Error resizing VM: Desired vCPUs count (${body.desired_vcpus}) exceeds max vCPUs count (${cpus.max_vcpus ?? 1})`);
    if (body.desired_ram !== undefined) {
      const boot = memory.size ?? 0;
      const room = memory.hotplug_size ?? 0;
      if (!room) throw failed('Error resizing VM: Memory hotplug is not enabled (no hotplug_size)');
      if (body.desired_ram > boot + room) throw failed(`Error resizing VM: Desired memory (${body.desired_ram}) exceeds boot size plus hotplug_size (${boot + room})`);
      if (body.desired_ram < boot) throw failed(`Error resizing VM: Desired memory (${body.desired_ram}) is below the boot memory (${boot})`);
      const plugged = body.desired_ram - boot;
      if ((memory.hotplug_method ?? 'Acpi') === 'Acpi' && plugged < (memory.hotplugged_size ?? 0)) throw failed('Error resizing VM: ACPI memory hot-unplug is not supported');
      if (plugged % (2 * 1024 * 1024) !== 0) throw failed(`Error resizing VM: Invalid size ${plugged} for virtio-mem: not a multiple of the 2 MiB block size`);
      this.config.memory = { ...memory, hotplugged_size: plugged };
    }
    if (body.desired_vcpus !== undefined) this.config.cpus = { ...cpus, boot_vcpus: body.desired_vcpus };
    await this.guest?.setLimits(this.limitsOf(this.config));
    this.event('vm', 'resized', { desired_vcpus: body.desired_vcpus ?? null, desired_ram: body.desired_ram ?? null });
    return { status: 204 };
  }

  private limitsOf(config: VmConfigLike): { vcpus: number; memoryBytes: number } {
    return { vcpus: config.cpus?.boot_vcpus ?? 1, memoryBytes: (config.memory?.size ?? 512 * 1024 * 1024) + (config.memory?.hotplugged_size ?? 0) };
  }

  private async snapshot(body: { destination_url?: string }): Promise<{ status: 204 }> {
    if (!this.state || !this.config) throw notCreated('snapshotted');
    if (this.state !== 'Paused') throw wrongState('snapshotted', 'Trying to snapshot while VM is running');
    const dir = fileUrlPath(body.destination_url, 'snapshotted');
    if (!existsSync(dir)) throw wrongState('snapshotted', `Error creating snapshot file: directory ${dir} does not exist`);
    this.event('vm', 'snapshotting');
    const disk = this.rootDisk(this.config);
    if (disk && this.guest) await this.guest.flushToDisk(disk);
    await writeFile(join(dir, 'config.json'), JSON.stringify(this.config));
    await writeFile(join(dir, 'state.json'), JSON.stringify({ simulator: SIM_VERSION, bootId: this.bootId, vcpus: this.config.cpus?.boot_vcpus ?? 1, devices: { net: (this.config.net ?? []).map((net) => ({ id: net.id, guestMac: net.mac })) }, takenAt: new Date().toISOString() }));
    // Guest RAM, sparse: holes for untouched pages (v52+), so only the size is "real".
    const memory = await open(join(dir, 'memory-ranges'), 'w');
    try {
      await memory.truncate(this.config.memory?.size ?? 512 * 1024 * 1024);
      await memory.write(Buffer.from(`nestbox-sim-memory ${this.bootId}\n`), 0, undefined, 0);
    } finally {
      await memory.close();
    }
    this.event('vm', 'snapshotted');
    return { status: 204 };
  }

  private async restore(body: { source_url: string; resume?: boolean; memory_restore_mode?: string; prefault?: boolean }): Promise<{ status: 204 }> {
    if (this.state) throw wrongState('restored', 'VM is already created');
    const dir = fileUrlPath(body.source_url, 'restored');
    if (body.memory_restore_mode === 'OnDemand' && body.prefault) throw new ApiError(400, ['Error from API', 'The VM could not be restored', 'prefault is not compatible with OnDemand memory restore']);
    // Like CH: the VM's devices, paths and sockets come from config.json, not from the caller.
    let config: VmConfigLike;
    try {
      config = JSON.parse(await readFile(join(dir, 'config.json'), 'utf8')) as VmConfigLike;
    } catch (error) {
      throw wrongState('restored', `Cannot read snapshot config ${join(dir, 'config.json')}: ${(error as Error).message}`);
    }
    const problems = this.options.validator.validate('VmConfig', config);
    if (problems.length) throw wrongState('restored', `Invalid config.json: ${problems.join('; ')}`);
    for (const file of ['state.json', 'memory-ranges']) {
      if (!existsSync(join(dir, file))) throw wrongState('restored', `Snapshot file ${join(dir, file)} is missing`);
    }
    const memorySize = (await stat(join(dir, 'memory-ranges'))).size;
    if (memorySize !== config.memory?.size) throw wrongState('restored', `memory-ranges is ${memorySize} bytes, config.json says ${config.memory?.size}`);
    const bootId = await readBootIdFromState(join(dir, 'state.json')).catch((error: Error) => {
      throw wrongState('restored', `Invalid state.json: ${error.message}`);
    });
    this.event('vm', 'restoring');
    this.checkDuplicates(config);
    await this.startGuest(config, bootId, 'restored');
    this.config = config;
    this.state = 'Paused';
    this.guest?.pause();
    // v52+: host-side vsock connections are reset on restore; listeners in the guest survive.
    this.muxer?.resetConnections();
    this.event('vm', 'restored', { memory_restore_mode: body.memory_restore_mode ?? 'Copy' });
    if (body.resume) await this.resume();
    return { status: 204 };
  }

  private async shutdownVm(action: string): Promise<{ status: 204 }> {
    if (!this.state) throw notCreated(action);
    if (this.state !== 'Running' && this.state !== 'Paused') throw wrongState(action, `Invalid VM state transition: ${this.state} to Shutdown`);
    await this.stopGuest({ flush: true });
    this.state = 'Shutdown';
    this.event('vm', 'shutdown');
    return { status: 204 };
  }

  private async reboot(): Promise<{ status: 204 }> {
    if (!this.state || !this.config) throw notCreated('rebooted');
    if (this.state !== 'Running') throw wrongState('rebooted', `VM is ${this.state}`);
    await this.stopGuest({ flush: true });
    await this.startGuest(this.config, newBootId(), 'rebooted');
    return { status: 204 };
  }

  /** ACPI power button: the guest powers off and (without --no-shutdown) the VMM exits. */
  private async powerButton(): Promise<{ status: 204 }> {
    if (!this.state) throw notCreated('powered off');
    if (this.state !== 'Running') throw wrongState('powered off', `VM is ${this.state}`);
    setTimeout(() => {
      void this.shutdownVm('shut down').then(() => this.exitAfterShutdown());
    }, 50);
    return { status: 204 };
  }

  private async deleteVm(): Promise<{ status: 204 }> {
    if (this.state === 'Running' || this.state === 'Paused') await this.stopGuest({ flush: true });
    this.state = undefined;
    this.config = undefined;
    this.event('vm', 'deleted');
    return { status: 204 };
  }

  private async vmmShutdown(): Promise<{ status: 200 }> {
    if (this.state === 'Running' || this.state === 'Paused') {
      await this.stopGuest({ flush: true });
      this.state = 'Shutdown';
      this.event('vm', 'shutdown');
    }
    // CH answers 200 with an empty body here (the spec says 204).
    return { status: 200 };
  }

  private async exitAfterShutdown(): Promise<void> {
    this.event('vmm', 'shutdown');
    await this.teardown();
    this.options.onExit(0);
  }

  private async addDevice(kind: 'disks' | 'net', prefix: string, device: { id?: string }): Promise<{ status: 200 | 204; json?: unknown }> {
    if (!this.state || !this.config) throw notCreated('modified');
    const list = ((this.config[kind] as Array<{ id?: string }> | undefined) ??= []);
    const id = device.id ?? `_${prefix}${this.hotplugCounter++}`;
    if (list.some((existing) => existing.id === id)) throw new ApiError(409, ['Error from API', 'The device could not be added', `Identifier ${id} is not unique`]);
    list.push({ ...device, id });
    // Cold-plugged into a created VM: 204; hot-plugged into a booted one: 200 with the PCI address.
    if (this.state === 'Created') return { status: 204 };
    return { status: 200, json: { id, bdf: `0000:00:${(0x10 + this.hotplugCounter).toString(16).padStart(2, '0')}.0` } };
  }

  private async removeDevice(body: { id?: string }): Promise<{ status: 204 }> {
    if (!this.state || !this.config) throw notCreated('modified');
    for (const kind of ['disks', 'net'] as const) {
      const list = this.config[kind] as Array<{ id?: string }> | undefined;
      const index = list?.findIndex((device) => device.id === body.id) ?? -1;
      if (list && index >= 0) {
        list.splice(index, 1);
        return { status: 204 };
      }
    }
    throw new ApiError(404, ['Error from API', 'The device could not be removed', `No device with id ${body.id}`]);
  }

  // ---- the guest ----------------------------------------------------------------------------------

  private rootDisk(config: VmConfigLike): string | undefined {
    return config.disks?.find((disk) => !disk.readonly)?.path;
  }

  /** What CH opens when a VM comes to life (boot or restore): disks (locked), TAP, vsock socket. */
  private async startGuest(config: VmConfigLike, bootId: string, verb: string): Promise<void> {
    for (const disk of config.disks ?? []) {
      if (!disk.path || !existsSync(disk.path)) throw wrongState(verb, `Cannot open disk path ${disk.path}: No such file or directory`);
    }
    for (const net of config.net ?? []) {
      // Real CH would create a missing TAP (with CAP_NET_ADMIN) in whatever namespace it runs in;
      // the simulator insists on the pre-created one, which proves we run inside the slot.
      if (net.tap && !existsSync(`/sys/class/net/${net.tap}`)) throw wrongState(verb, `Error creating net device: TAP ${net.tap} does not exist in the VMM's network namespace (simulator strictness)`);
    }
    const vsockPath = config.vsock?.socket;
    if (vsockPath && existsSync(vsockPath)) throw wrongState(verb, `Error creating vsock device: cannot bind ${vsockPath}: Address in use`);
    // virtio-fs: like CH, connect to each device's vhost-user backend and keep the connection for
    // the VM's life; a socket nobody serves fails the boot.
    const shares: VirtiofsConnection[] = [];
    try {
      for (const fs of config.fs ?? []) shares.push(await connectVirtiofsd(fs.tag!, fs.socket!));
    } catch (error) {
      for (const share of shares) share.connection.destroy();
      throw wrongState(verb, `Error creating virtio-fs device: ${(error as Error).message}`);
    }
    this.fsConnections = shares;
    await this.lockDisks(config, verb);
    const workDir = join(dirname(this.options.apiSocket), 'sim');
    await mkdir(workDir, { recursive: true });
    this.guest = new SimulatedGuest({ workDir, agentBundle: this.options.agentBundle, nodeBinary: this.options.nodeBinary, serialLog: config.serial?.mode === 'File' ? config.serial.file : undefined, log: (line) => this.log(line) });
    const disk = this.rootDisk(config);
    try {
      if (disk) await this.guest.start(disk, bootId, { agentNeverReady: this.faults().agentNeverReady, shares: shares.map(({ tag, source }) => ({ tag, source })), limits: this.limitsOf(config) });
      if (vsockPath) {
        const guest = this.guest;
        this.muxer = new HybridVsockMuxer(vsockPath, { listenerFor: (port) => guest.listenerFor(port), paused: () => this.state !== 'Running' }, (line) => this.log(line));
        await this.muxer.start();
      }
    } catch (error) {
      await this.stopGuest({ flush: false });
      throw wrongState(verb, `Guest start failed: ${(error as Error).message}`);
    }
    this.bootId = bootId;
  }

  private async stopGuest(options: { flush: boolean }): Promise<void> {
    const disk = this.config ? this.rootDisk(this.config) : undefined;
    if (this.guest && options.flush && disk && existsSync(disk)) await this.guest.flushToDisk(disk).catch((error: Error) => this.log(`flush failed: ${error.message}`));
    await this.guest?.stop();
    this.guest = undefined;
    // The VMM lets go of its vhost-user backends: a virtiofsd exits when its VMM disconnects.
    for (const share of this.fsConnections) share.connection.destroy();
    this.fsConnections = [];
    await this.muxer?.close();
    this.muxer = undefined;
    await this.unlockDisks();
  }

  /** OFD-lock stand-in: one writable disk per VMM across processes (lock files with our pid). */
  private async lockDisks(config: VmConfigLike, verb: string): Promise<void> {
    await mkdir(this.options.lockDir, { recursive: true });
    for (const disk of config.disks ?? []) {
      if (!disk.path || disk.readonly) continue;
      const lock = join(this.options.lockDir, createHash('sha256').update(disk.path).digest('hex'));
      try {
        const holder = Number((await readFile(lock, 'utf8')).trim());
        if (holder && holder !== process.pid && processExists(holder)) {
          throw wrongState(verb, `Error locking disk image ${disk.path}: held by another VMM (pid ${holder}): Resource temporarily unavailable`);
        }
      } catch (error) {
        if (error instanceof ApiError) throw error;
      }
      await writeFile(lock, `${process.pid}\n`);
      this.heldLocks.push(lock);
    }
  }

  private async unlockDisks(): Promise<void> {
    for (const lock of this.heldLocks) await rm(lock, { force: true });
    this.heldLocks = [];
  }
}

/** What CH's VmConfig::validate refuses that the schema cannot say (the subset we use). */
function validateVmConfig(config: VmConfigLike): void {
  const invalid = (detail: string) => new ApiError(400, ['Error from API', 'The VM could not be created', `Invalid VM config: ${detail}`]);
  if ((config.cpus?.max_vcpus ?? 1) < (config.cpus?.boot_vcpus ?? 1)) throw invalid('Max vCPUs lower than boot vCPUs');
  if (config.fs?.length && !config.memory?.shared && !config.memory?.hugepages) throw invalid('Using vhost-user requires using shared memory or huge pages');
  const tags = new Set<string>();
  for (const fs of config.fs ?? []) {
    if (!fs.tag || Buffer.byteLength(fs.tag) > 36) throw invalid(`virtio-fs tag "${fs.tag}" must be 1 to 36 bytes`);
    if (tags.has(fs.tag)) throw invalid(`Duplicate virtio-fs tag ${fs.tag}`);
    tags.add(fs.tag);
  }
  if (config.memory?.hotplug_method === 'VirtioMem' && (config.memory.hotplug_size ?? 0) % (2 * 1024 * 1024) !== 0) throw invalid('hotplug_size must be a multiple of the virtio-mem block size (2 MiB)');
}

interface VirtiofsConnection {
  tag: string;
  /** The directory the listening virtiofsd shares (from its command line). */
  source: string;
  connection: Socket;
}

const VHOST_USER_GET_FEATURES = 1;
const VHOST_USER_VERSION = 0x1;
const VHOST_USER_REPLY = 0x4;

/**
 * Proves a real vhost-user backend serves `socket`: finds the process listening on it (its
 * shared directory is on its command line), connects, and asks VHOST_USER_GET_FEATURES, which a
 * virtiofsd answers with its feature bits. The connection stays open, as CH's does.
 */
async function connectVirtiofsd(tag: string, socket: string): Promise<VirtiofsConnection> {
  if (!existsSync(socket)) throw new Error(`vhost-user socket ${socket} (tag ${tag}) does not exist`);
  const source = await listenerSharedDir(socket);
  const connection = createConnection(socket);
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no VHOST_USER_GET_FEATURES answer on ${socket}`)), 5_000);
      connection.once('error', (error) => {
        clearTimeout(timer);
        reject(new Error(`cannot connect to ${socket}: ${error.message}`));
      });
      connection.once('connect', () => {
        const header = Buffer.alloc(12);
        header.writeUInt32LE(VHOST_USER_GET_FEATURES, 0);
        header.writeUInt32LE(VHOST_USER_VERSION, 4);
        header.writeUInt32LE(0, 8);
        connection.write(header);
      });
      let received = Buffer.alloc(0);
      const onData = (chunk: Buffer) => {
        received = Buffer.concat([received, chunk]);
        if (received.length < 20) return;
        clearTimeout(timer);
        connection.off('data', onData);
        const request = received.readUInt32LE(0);
        const flags = received.readUInt32LE(4);
        const size = received.readUInt32LE(8);
        if (request !== VHOST_USER_GET_FEATURES || !(flags & VHOST_USER_REPLY) || size !== 8) reject(new Error(`${socket} answered GET_FEATURES with request ${request}, flags ${flags}, size ${size}: not a vhost-user backend`));
        else resolve();
      };
      connection.on('data', onData);
    });
  } catch (error) {
    connection.destroy();
    throw error;
  }
  connection.on('error', () => {});
  return { tag, source, connection };
}

/** The shared directory of the process listening on a Unix socket path (via /proc/net/unix and fds). */
async function listenerSharedDir(socket: string): Promise<string> {
  // /proc/net is per network namespace, and the VMM runs in the slot's while virtiofsd runs in
  // the host's: init's table is the host's.
  const table = (await readFile('/proc/net/unix', 'utf8')) + (await readFile('/proc/1/net/unix', 'utf8').catch(() => ''));
  const inodes = new Set(table.split('\n').map((line) => line.trim().split(/\s+/)).filter((fields) => fields[7] === socket).map((fields) => fields[6]));
  if (!inodes.size) throw new Error(`nobody listens on ${socket}`);
  for (const pid of await readdir('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const fds = await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]);
    for (const fd of fds) {
      const target = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
      const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
      if (!inode || !inodes.has(inode)) continue;
      const argv = (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).split('\0');
      for (const [index, arg] of argv.entries()) {
        const shared = /^--shared-dir=(.+)$/.exec(arg)?.[1] ?? (argv[index - 1] === '-o' ? /^source=(.+)$/.exec(arg)?.[1] : undefined);
        if (shared) return shared;
      }
      throw new Error(`the process listening on ${socket} (pid ${pid}: ${argv.join(' ').trim()}) is not a virtiofsd sharing a directory`);
    }
  }
  throw new Error(`no process holds the listening socket ${socket}`);
}

function fileUrlPath(url: string | undefined, action: string): string {
  if (!url?.startsWith('file://')) throw new ApiError(500, ['Error from API', `The VM could not be ${action}`, `Unsupported URL scheme in ${url}: only file:// is supported`]);
  return decodeURIComponent(url.slice('file://'.length));
}

function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The sandbox id in `<dataDir>/sandboxes/<id>/run/api.sock`, used to look up per-sandbox faults. */
export function faultKeyFor(apiSocket: string): string {
  return basename(dirname(dirname(apiSocket)));
}
