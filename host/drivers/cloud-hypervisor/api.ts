// Typed client of Cloud Hypervisor's REST API (pinned v53.0) over its Unix socket, with plain
// node:http (host-runtime.md §1). Conventions taken from CH's code, not only its spec:
// - success is 204 for most PUTs, 200 + JSON for GETs, 200 with an EMPTY body for
//   vmm.shutdown (the spec says 204), and 200 `{id, bdf}` vs 204 for vm.add-* depending on
//   whether the VM is booted; so any 2xx is success and a body is parsed only when present;
// - errors are a JSON array of strings (the error chain, outermost first), sometimes an empty
//   body (wrong method); we keep the whole chain and surface its last element.
import { request as httpRequest } from 'node:http';

/** `BreakPoint` only exists in builds with guest debugging; listed so we never crash on it. */
export type VmState = 'Created' | 'Running' | 'Shutdown' | 'Paused' | 'BreakPoint';

export interface VmmPingResponse {
  version: string;
  build_version?: string;
  pid?: number;
  features?: string[];
}

// The VmConfig subset the driver writes. CH's config.json holds many more fields, so anything
// that reads one back treats it as an open record (see config.ts).
export interface PayloadConfig {
  kernel?: string;
  initramfs?: string;
  cmdline?: string;
  firmware?: string;
}
export interface CpusConfig {
  boot_vcpus: number;
  max_vcpus: number;
  nested?: boolean;
  kvm_hyperv?: boolean;
}
export interface MemoryConfig {
  size: number;
  /** Room for memory hotplug above `size` (address space only, nothing is allocated). */
  hotplug_size?: number;
  hotplugged_size?: number;
  hotplug_method?: 'Acpi' | 'VirtioMem';
  shared?: boolean;
  thp?: boolean;
  mergeable?: boolean;
  prefault?: boolean;
}
export type ImageType = 'FixedVhd' | 'Qcow2' | 'Raw' | 'Vhdx';
export interface DiskConfig {
  id?: string;
  path?: string;
  readonly?: boolean;
  direct?: boolean;
  image_type?: ImageType;
  backing_files?: boolean;
  sparse?: boolean;
  num_queues?: number;
  queue_size?: number;
}
export interface NetConfig {
  id?: string;
  tap?: string;
  mac?: string;
  host_mac?: string;
  mtu?: number;
  num_queues?: number;
  queue_size?: number;
}
export interface VsockConfig {
  id?: string;
  cid: number;
  socket: string;
}
export type ConsoleMode = 'Off' | 'Pty' | 'Tty' | 'File' | 'Socket' | 'Null';
export interface SerialConfig {
  mode: ConsoleMode;
  file?: string;
  socket?: string;
}
export interface RngConfig {
  src: string;
  id?: string;
}
/** A virtio-fs device backed by a vhost-user-fs daemon (virtiofsd) on `socket`. */
export interface FsConfig {
  tag: string;
  socket: string;
  num_queues: number;
  queue_size: number;
  id?: string;
}
export interface VmConfig {
  cpus?: CpusConfig;
  fs?: FsConfig[];
  memory?: MemoryConfig;
  payload: PayloadConfig;
  disks?: DiskConfig[];
  net?: NetConfig[];
  rng?: RngConfig;
  serial?: SerialConfig;
  console?: SerialConfig;
  vsock?: VsockConfig;
  [field: string]: unknown;
}
export interface VmInfo {
  config: VmConfig;
  state: VmState;
  memory_actual_size?: number;
  device_tree?: Record<string, unknown>;
}
export interface RestoreConfig {
  source_url: string;
  prefault?: boolean;
  memory_restore_mode?: 'Copy' | 'OnDemand';
  resume?: boolean;
}
export interface PciDeviceInfo {
  id: string;
  bdf: string;
}

/**
 * A failed API call. `status` 0 means the request never got an answer (socket missing,
 * connection reset, timeout); `chain` is CH's error chain, outermost first.
 */
export class ChApiError extends Error {
  constructor(
    readonly endpoint: string,
    readonly status: number,
    readonly chain: string[],
    readonly code?: string,
  ) {
    super(`cloud-hypervisor ${endpoint} failed (${status === 0 ? code ?? 'no answer' : `HTTP ${status}`}): ${chain[chain.length - 1] ?? 'no detail'}`);
    this.name = 'ChApiError';
  }

  /** The VMM process is not answering at all (as opposed to refusing this call). */
  get unreachable(): boolean {
    return this.status === 0;
  }
}

/** CH answers errors as a JSON array of strings; anything else is wrapped as a one-element chain. */
export function parseErrorChain(status: number, text: string): string[] {
  const trimmed = text.trim();
  if (!trimmed) return [`HTTP ${status} with an empty body`];
  try {
    const parsed: unknown = JSON.parse(trimmed);
    if (Array.isArray(parsed) && parsed.every((item) => typeof item === 'string')) return parsed as string[];
  } catch {
    // Not JSON: keep the text as it is.
  }
  return [trimmed.slice(0, 2_000)];
}

export interface ChApiOptions {
  /** Per-call budget (a snapshot of a large VM writes all touched memory, so be generous there). */
  timeoutMs?: number;
}

const API_PREFIX = '/api/v1';

export class ChApi {
  private readonly timeoutMs: number;

  constructor(
    readonly socketPath: string,
    options: ChApiOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? 30_000;
  }

  ping(timeoutMs?: number): Promise<VmmPingResponse> {
    return this.call<VmmPingResponse>('GET', 'vmm.ping', undefined, timeoutMs);
  }
  /** CH answers 200 with an empty body and then exits. */
  async shutdownVmm(): Promise<void> {
    await this.call('PUT', 'vmm.shutdown');
  }
  async createVm(config: VmConfig): Promise<void> {
    await this.call('PUT', 'vm.create', config);
  }
  async bootVm(): Promise<void> {
    await this.call('PUT', 'vm.boot');
  }
  info(): Promise<VmInfo> {
    return this.call<VmInfo>('GET', 'vm.info');
  }
  counters(): Promise<Record<string, Record<string, number>>> {
    return this.call('GET', 'vm.counters');
  }
  async pauseVm(): Promise<void> {
    await this.call('PUT', 'vm.pause');
  }
  async resumeVm(): Promise<void> {
    await this.call('PUT', 'vm.resume');
  }
  /** The VM must be paused and `directory` must exist. */
  async snapshotVm(directory: string, timeoutMs?: number): Promise<void> {
    await this.call('PUT', 'vm.snapshot', { destination_url: `file://${directory}` }, timeoutMs);
  }
  /** Only into a VMM without a VM; the VM comes back Paused unless `resume` is set. */
  async restoreVm(config: RestoreConfig, timeoutMs?: number): Promise<void> {
    await this.call('PUT', 'vm.restore', config, timeoutMs);
  }
  async shutdownVm(): Promise<void> {
    await this.call('PUT', 'vm.shutdown');
  }
  async rebootVm(): Promise<void> {
    await this.call('PUT', 'vm.reboot');
  }
  async powerButton(): Promise<void> {
    await this.call('PUT', 'vm.power-button');
  }
  async deleteVm(): Promise<void> {
    await this.call('PUT', 'vm.delete');
  }
  async resizeVm(body: { desired_vcpus?: number; desired_ram?: number; desired_balloon?: number }): Promise<void> {
    await this.call('PUT', 'vm.resize', body);
  }
  /** 200 + `{id, bdf}` when hot-plugged into a booted VM, 204 (undefined here) before boot. */
  addDisk(disk: DiskConfig): Promise<PciDeviceInfo | undefined> {
    return this.call('PUT', 'vm.add-disk', disk);
  }
  addNet(net: NetConfig): Promise<PciDeviceInfo | undefined> {
    return this.call('PUT', 'vm.add-net', net);
  }
  async removeDevice(id: string): Promise<void> {
    await this.call('PUT', 'vm.remove-device', { id });
  }

  /** One connection per call: CH's micro_http server is simple, and calls are rare. */
  private call<T>(method: 'GET' | 'PUT', endpoint: string, body?: unknown, timeoutMs = this.timeoutMs): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = httpRequest({
        socketPath: this.socketPath,
        method,
        path: `${API_PREFIX}/${endpoint}`,
        agent: false,
        headers: {
          accept: 'application/json',
          ...(payload ? { 'content-type': 'application/json', 'content-length': String(payload.length) } : {}),
        },
      });
      req.setTimeout(timeoutMs, () => req.destroy(Object.assign(new Error(`no answer within ${timeoutMs} ms`), { code: 'ETIMEDOUT' })));
      req.once('error', (error) => {
        const code = (error as NodeJS.ErrnoException).code;
        reject(new ChApiError(endpoint, 0, [`${this.socketPath}: ${error.message}`], code));
      });
      req.once('response', (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.once('error', (error) => reject(new ChApiError(endpoint, 0, [error.message], 'ECONNRESET')));
        response.once('end', () => {
          const status = response.statusCode ?? 0;
          const text = Buffer.concat(chunks).toString('utf8');
          if (status < 200 || status >= 300) {
            reject(new ChApiError(endpoint, status, parseErrorChain(status, text)));
            return;
          }
          if (!text.trim()) {
            resolve(undefined as T);
            return;
          }
          try {
            resolve(JSON.parse(text) as T);
          } catch {
            reject(new ChApiError(endpoint, status, [`unparseable success body: ${text.slice(0, 200)}`]));
          }
        });
      });
      req.end(payload);
    });
  }
}
