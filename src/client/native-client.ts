// A client of the native API (openapi/native.yaml), shared by the CLI, the MCP server and the
// dashboard: they are clients of the public API, with no back door into core. It uses only
// fetch, URL, ReadableStream and TextDecoder, so the same module runs in Node and, bundled by
// Vite, in the browser. Types are the wire shapes of the spec's schemas that these clients read;
// fields they do not use are left out rather than guessed.
// They are declared here rather than imported from core on purpose: core's types are the
// engine's (they change with it and pull Node-only modules into the dashboard's type-check),
// while these follow the published contract, which changes only compatibly.

export type SandboxState =
  | 'creating' | 'running' | 'stopping' | 'stopped' | 'starting'
  | 'pausing' | 'paused' | 'resuming' | 'deleting' | 'error';

export interface EgressPolicy {
  mode: 'allow-all' | 'deny-all' | 'allow-list';
  allow?: string[];
  deny?: string[];
}

export interface Sandbox {
  id: string;
  state: SandboxState;
  image: string;
  imageId?: string | null;
  cpu: number;
  memoryMiB: number;
  diskGiB?: number | null;
  labels: Record<string, string>;
  timeoutSeconds: number;
  expiresAt: string | null;
  createdAt: string;
  updatedAt: string;
  startedAt?: string | null;
  stoppedAt?: string | null;
  pausedAt?: string | null;
  errorMessage: string | null;
  idleTimeoutSeconds?: number;
  idleAction?: 'pause' | 'stop';
  autoDeleteSeconds?: number | null;
  snapshotId?: string | null;
  forkedFrom?: string | null;
  egress?: EgressPolicy;
  /** Only for keys with platform:hosts (operators). */
  hostId?: string | null;
}

/** Where a sandbox may run (createSandbox's `placement`). */
export interface Placement {
  region?: string;
  labels?: Record<string, string>;
  /** Operators only (platform:hosts). */
  hostId?: string;
}

export interface HostResources {
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
}

/** A host agent as operators see it (GET /hosts). */
export interface Host {
  id: string;
  url: string;
  state: 'ready' | 'cordoned' | 'draining' | 'lost';
  region: string;
  labels: Record<string, string>;
  driver: string;
  version: string | null;
  capacity: HostResources | null;
  allocatable: HostResources | null;
  allocated: HostResources & { sandboxes: number };
  reported: (HostResources & { sandboxes: number }) | null;
  registeredAt: string;
  lastHeartbeatAt: string;
  lostAt: string | null;
}

export interface CreateSandboxRequest {
  image?: string;
  cpu?: number;
  memoryMiB?: number;
  diskGiB?: number;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  timeoutSeconds?: number;
  snapshot?: string;
  idleTimeoutSeconds?: number;
  idleAction?: 'pause' | 'stop';
  autoDeleteSeconds?: number | null;
  egress?: EgressPolicy;
  placement?: Placement;
}

export interface UpdateSandboxRequest {
  labels?: Record<string, string>;
  timeoutSeconds?: number;
  idleTimeoutSeconds?: number;
  idleAction?: 'pause' | 'stop';
  autoDeleteSeconds?: number | null;
  egress?: EgressPolicy;
  /** Resize (issue 19): live on a running sandbox, at the next start of a stopped one. */
  cpu?: number;
  memoryMiB?: number;
  /** Grows only, only while the sandbox is stopped. */
  diskGiB?: number;
}

export interface SandboxList { items: Sandbox[]; nextCursor: string | null }

export interface ForkResult { sandboxes: Sandbox[]; memoryCopied: boolean; diskCopy: 'reflink' | 'copy' }

export interface Port {
  port: number;
  url: string;
  pathUrl: string;
  public: boolean;
  token?: string;
  createdAt: string;
  updatedAt: string;
}

export interface TerminalSize { cols: number; rows: number }

export interface RunCommandRequest {
  cmd?: string;
  argv?: string[];
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  detach?: boolean;
  user?: string;
  tag?: string;
  stdin?: boolean;
  pty?: TerminalSize;
}

export interface CommandResult {
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  durationMs: number;
  timedOut: boolean;
  truncated: boolean;
}

export interface ProcessInfo {
  processId: string;
  pid: number;
  cmd: string;
  args: string[];
  cwd: string;
  tag?: string | null;
  user?: string;
  pty?: boolean;
  status: 'running' | 'exited' | 'killed';
  exitCode: number | null;
  signal: string | null;
  timedOut?: boolean;
  startedAt: string;
  endedAt: string | null;
}

export interface ProcessOutput {
  stdout: string;
  stderr: string;
  stdoutOffset: number;
  stderrOffset: number;
  encoding?: 'utf8' | 'base64';
  status: 'running' | 'exited' | 'killed';
  exitCode: number | null;
  signal: string | null;
}

/** One message of a process's output stream (`streamCommand`). `data` is base64. */
export type StreamMessage =
  | { type: 'stdout' | 'stderr'; offset: number; data: string }
  | { type: 'exit'; status: string; exitCode: number | null; signal: string | null; timedOut?: boolean }
  | { type: 'keepalive' };

export interface CreateTerminalRequest {
  cols?: number;
  rows?: number;
  cwd?: string;
  env?: Record<string, string>;
  shell?: string;
  user?: string;
}

export interface FileInfo {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime: string;
  symlinkTarget?: string;
  owner?: string;
  group?: string;
  uid?: number;
  gid?: number;
}

export interface Snapshot {
  id: string;
  name: string;
  state: 'creating' | 'ready' | 'deleting' | 'error';
  sourceSandboxId: string | null;
  parentSnapshotId?: string | null;
  sizeBytes: number | null;
  createdAt: string;
}

export interface Image {
  id: string;
  name: string;
  tags?: string[];
  [field: string]: unknown;
}

export interface ApiKey {
  id: string;
  name: string;
  preset: string;
  scopes: string[];
  keyPrefix: string;
  sandboxIds: string[] | null;
  createdAt: string;
  lastUsedAt: string | null;
}

export type ApiKeyPreset = 'read-only' | 'sandbox' | 'ci' | 'admin' | 'operator';

export interface CreatedApiKey extends ApiKey { key: string }

export interface OrganizationLimits {
  maxSandboxes: number;
  maxCpu: number;
  maxMemoryMiB: number;
  maxDiskGiB: number;
  maxSnapshots: number;
  maxImages: number;
  /** Requests per second (0: not limited) and bursts: the organisation's, and each key's. */
  requestsPerSecond: number;
  requestBurst: number;
  keyRequestsPerSecond: number;
  keyRequestBurst: number;
  /** Live volumes, the GiB of their sizes in all, and the GiB of the largest. */
  maxVolumes: number;
  maxVolumeTotalGiB: number;
  maxVolumeSizeGiB: number;
}

/** An organisation's own limits: null = the server's default. */
export type OrganizationLimitOverrides = { [K in keyof OrganizationLimits]: number | null };

export interface Organization {
  id: string;
  name: string;
  createdAt: string;
  suspended: boolean;
  suspendedAt: string | null;
  /** In force: its own, else the server's default. */
  limits: OrganizationLimits;
  customLimits: OrganizationLimitOverrides;
}

export interface OwnOrganization extends Organization {
  usage: { sandboxes: number; cpu: number; memoryMiB: number; diskGiB: number; snapshots: number; images: number };
}

export interface UsageRecord {
  organizationId: string;
  hourStart: string;
  sandboxSeconds: number;
  bySize: { cpu: number; memoryMiB: number; sandboxSeconds: number; cpuSeconds: number }[];
  cpuSeconds: number;
  storageGiBHours: number;
  closed: boolean;
  updatedAt: string;
}

export type CodeLanguage = string;

export interface CodeContext {
  id: string;
  language: CodeLanguage;
  cwd: string;
  user: string;
  isDefault: boolean;
  createdAt: string;
}

export interface RunCodeRequest {
  code: string;
  contextId?: string;
  language?: CodeLanguage;
  envs?: Record<string, string>;
  timeoutMs?: number;
  cwd?: string;
  user?: string;
}

/** A result as the kernel sent it, by MIME type (binary types base64). */
export type MimeBundle = Record<string, unknown> & {
  'text/plain'?: string;
  'text/html'?: string;
  'image/png'?: string;
  'image/jpeg'?: string;
  'image/svg+xml'?: string;
};

export interface CodeResult { main: boolean; data: MimeBundle }

export interface CodeError { name: string; value: string; traceback: string }

export type CodeEndStatus = 'ok' | 'error' | 'interrupted' | 'lost';

export interface CodeRunResult {
  status: CodeEndStatus;
  executionCount: number | null;
  stdout: string;
  stderr: string;
  text: string | null;
  results: CodeResult[];
  error: CodeError | null;
}

export interface Health { status: 'ok'; hostsAvailable: number }

/** The native API's error shape (`{ error: { code, message, details? } }`) with its HTTP status. */
export class NativeApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: unknown,
    /** Seconds from a 429's Retry-After header. */
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
    this.name = 'NativeApiError';
  }
}

export interface NativeClientOptions {
  /** The server's base URL, e.g. `http://127.0.0.1:3000` (the API is under `/api/v1`). */
  url: string;
  apiKey: string;
  /** Defaults to the global fetch. */
  fetch?: typeof fetch;
}

type Query = Record<string, string | number | boolean | string[] | undefined>;

interface RequestOptions {
  query?: Query;
  /** A JSON body (serialised here) … */
  json?: unknown;
  /** … or a raw one, sent as application/octet-stream. */
  body?: BodyInit;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

const enc = encodeURIComponent;

export class NativeClient {
  readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly fetchImpl: typeof fetch;

  constructor(options: NativeClientOptions) {
    this.baseUrl = options.url.replace(/\/+$/, '');
    this.apiKey = options.apiKey;
    // Bound: a browser's fetch called as a method of another object throws "Illegal invocation".
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The URL of an API path with its query, e.g. `url('/sandboxes', { limit: 5 })`. */
  url(path: string, query?: Query): string {
    const u = new URL(`${this.baseUrl}/api/v1${path}`);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v === undefined) continue;
      if (Array.isArray(v)) for (const item of v) u.searchParams.append(k, item);
      else u.searchParams.set(k, String(v));
    }
    return u.toString();
  }

  /**
   * The WebSocket URL of a streaming route (`ws:`/`wss:`), carrying the key as `access_token`:
   * browsers cannot set headers on a WebSocket, and the server accepts the key there for these
   * routes only.
   */
  webSocketUrl(path: string, query?: Query): string {
    const u = new URL(this.url(path, query));
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    u.searchParams.set('access_token', this.apiKey);
    return u.toString();
  }

  /** One request; answers the Response when it is 2xx, else throws NativeApiError. */
  async raw(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.apiKey}`, ...options.headers };
    let body: BodyInit | undefined = options.body;
    if (options.json !== undefined) {
      headers['content-type'] = 'application/json';
      body = JSON.stringify(options.json);
    } else if (body !== undefined) {
      headers['content-type'] ??= 'application/octet-stream';
    }
    const init: RequestInit & { duplex?: 'half' } = { method, headers, body, signal: options.signal };
    // Node's fetch needs duplex for a streamed request body; browsers ignore it.
    if (body instanceof ReadableStream) init.duplex = 'half';
    const response = await this.fetchImpl(this.url(path, options.query), init);
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  async request<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const response = await this.raw(method, path, options);
    if (response.status === 204) return undefined as T;
    const type = response.headers.get('content-type') ?? '';
    return (type.includes('json') ? await response.json() : await response.text()) as T;
  }

  // ── health ──
  health(): Promise<Health> { return this.request('GET', '/health'); }

  // ── sandboxes ──
  createSandbox(body: CreateSandboxRequest = {}, idempotencyKey?: string): Promise<Sandbox> {
    return this.request('POST', '/sandboxes', { json: body, headers: idempotencyKey ? { 'idempotency-key': idempotencyKey } : undefined });
  }
  listSandboxes(query: { label?: string[]; state?: SandboxState[]; limit?: number; cursor?: string } = {}): Promise<SandboxList> {
    return this.request('GET', '/sandboxes', { query });
  }
  /** Every page of listSandboxes. */
  async listAllSandboxes(query: { label?: string[]; state?: SandboxState[] } = {}): Promise<Sandbox[]> {
    const all: Sandbox[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.listSandboxes({ ...query, limit: 1000, cursor });
      all.push(...page.items);
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
    return all;
  }
  getSandbox(id: string): Promise<Sandbox> { return this.request('GET', `/sandboxes/${enc(id)}`); }
  updateSandbox(id: string, body: UpdateSandboxRequest): Promise<Sandbox> { return this.request('PATCH', `/sandboxes/${enc(id)}`, { json: body }); }
  deleteSandbox(id: string): Promise<void> { return this.request('DELETE', `/sandboxes/${enc(id)}`); }
  stopSandbox(id: string): Promise<Sandbox> { return this.request('POST', `/sandboxes/${enc(id)}/stop`); }
  resumeSandbox(id: string): Promise<Sandbox> { return this.request('POST', `/sandboxes/${enc(id)}/resume`); }
  pauseSandbox(id: string): Promise<Sandbox> { return this.request('POST', `/sandboxes/${enc(id)}/pause`); }
  unpauseSandbox(id: string): Promise<Sandbox> { return this.request('POST', `/sandboxes/${enc(id)}/unpause`); }
  keepAlive(id: string): Promise<Sandbox> { return this.request('POST', `/sandboxes/${enc(id)}/keepalive`); }
  forkSandbox(id: string, body: { count?: number; labels?: Record<string, string>; timeoutSeconds?: number } = {}): Promise<ForkResult> {
    return this.request('POST', `/sandboxes/${enc(id)}/fork`, { json: body });
  }

  // ── ports ──
  publishPort(id: string, port: number, isPublic = false): Promise<Port> {
    return this.request('POST', `/sandboxes/${enc(id)}/ports`, { json: { port, public: isPublic } });
  }
  async listPorts(id: string): Promise<Port[]> {
    return (await this.request<{ items: Port[] }>('GET', `/sandboxes/${enc(id)}/ports`)).items;
  }
  unpublishPort(id: string, port: number): Promise<void> { return this.request('DELETE', `/sandboxes/${enc(id)}/ports/${port}`); }

  // ── commands and terminals ──
  runCommand(id: string, body: RunCommandRequest & { detach?: false }, signal?: AbortSignal): Promise<CommandResult>;
  runCommand(id: string, body: RunCommandRequest & { detach: true }, signal?: AbortSignal): Promise<ProcessInfo>;
  runCommand(id: string, body: RunCommandRequest, signal?: AbortSignal): Promise<CommandResult | ProcessInfo> {
    return this.request('POST', `/sandboxes/${enc(id)}/commands`, { json: body, signal });
  }
  async listCommands(id: string, all = false): Promise<ProcessInfo[]> {
    return (await this.request<{ processes: ProcessInfo[] }>('GET', `/sandboxes/${enc(id)}/commands`, { query: { all: all || undefined } })).processes;
  }
  getCommand(id: string, processId: string): Promise<ProcessInfo> { return this.request('GET', `/sandboxes/${enc(id)}/commands/${enc(processId)}`); }
  killCommand(id: string, processId: string): Promise<void> { return this.request('DELETE', `/sandboxes/${enc(id)}/commands/${enc(processId)}`); }
  getCommandLogs(id: string, processId: string, query: { stdoutOffset?: number; stderrOffset?: number } = {}): Promise<ProcessOutput> {
    return this.request('GET', `/sandboxes/${enc(id)}/commands/${enc(processId)}/logs`, { query });
  }
  /** A process's output and exit as they happen (Server-Sent Events), from the given offsets. */
  async *streamCommand(id: string, processId: string, query: { stdoutOffset?: number; stderrOffset?: number } = {}, signal?: AbortSignal): AsyncGenerator<StreamMessage> {
    const response = await this.raw('GET', `/sandboxes/${enc(id)}/commands/${enc(processId)}/stream`, { query, headers: { accept: 'text/event-stream' }, signal });
    for await (const data of serverSentData(response)) yield JSON.parse(data) as StreamMessage;
  }
  writeStdin(id: string, processId: string, data: BodyInit): Promise<void> {
    return this.request('POST', `/sandboxes/${enc(id)}/commands/${enc(processId)}/stdin`, { body: data });
  }
  closeStdin(id: string, processId: string): Promise<void> {
    return this.request('POST', `/sandboxes/${enc(id)}/commands/${enc(processId)}/stdin/close`);
  }
  signalCommand(id: string, processId: string, signal: string): Promise<void> {
    return this.request('POST', `/sandboxes/${enc(id)}/commands/${enc(processId)}/signal`, { json: { signal } });
  }
  createTerminal(id: string, body: CreateTerminalRequest = {}): Promise<ProcessInfo> {
    return this.request('POST', `/sandboxes/${enc(id)}/terminals`, { json: body });
  }
  /** Where a terminal's WebSocket attaches (binary frames = terminal bytes; text = JSON control). */
  terminalWebSocketUrl(id: string, processId: string): string {
    return this.webSocketUrl(`/sandboxes/${enc(id)}/commands/${enc(processId)}/pty`);
  }

  /**
   * The same terminal WebSocket for clients that can set headers (Node, the CLI): the key goes
   * in the Authorization header rather than the URL, so it stays out of proxies' access logs.
   */
  terminalWebSocket(id: string, processId: string): { url: string; headers: Record<string, string> } {
    const u = new URL(this.url(`/sandboxes/${enc(id)}/commands/${enc(processId)}/pty`));
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    return { url: u.toString(), headers: { authorization: `Bearer ${this.apiKey}` } };
  }

  // ── files ──
  async listFiles(id: string, path: string, depth?: number): Promise<FileInfo[]> {
    return (await this.request<{ entries: FileInfo[] }>('GET', `/sandboxes/${enc(id)}/files/list`, { query: { path, depth } })).entries;
  }
  statFile(id: string, path: string): Promise<FileInfo> { return this.request('GET', `/sandboxes/${enc(id)}/files/stat`, { query: { path } }); }
  /** The file's bytes as a streamed Response (read `.body`, `.arrayBuffer()` or `.text()`). */
  downloadFile(id: string, path: string, signal?: AbortSignal): Promise<Response> {
    return this.raw('GET', `/sandboxes/${enc(id)}/files`, { query: { path }, signal });
  }
  /**
   * At most the first `maxBytes` of a file (one `Range` request), with whether it was cut.
   * An empty file answers 416 to any range, so it is read whole instead.
   */
  async downloadFileHead(id: string, path: string, maxBytes: number, signal?: AbortSignal): Promise<{ bytes: Uint8Array; truncated: boolean; size: number | null }> {
    let response: Response;
    try {
      response = await this.raw('GET', `/sandboxes/${enc(id)}/files`, { query: { path }, headers: { range: `bytes=0-${maxBytes - 1}` }, signal });
    } catch (err) {
      if (!(err instanceof NativeApiError && err.code === 'range_not_satisfiable')) throw err;
      response = await this.downloadFile(id, path, signal);
    }
    // A 206 says the whole size after the slash of Content-Range; a 200 is the whole file (no
    // range support for files of unknown size), read only as far as needed: it may never end.
    const total = /\/(\d+)$/.exec(response.headers.get('content-range') ?? '')?.[1];
    const chunks: Uint8Array[] = [];
    let read = 0;
    let more = false;
    if (response.body) {
      const reader = response.body.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        chunks.push(value);
        read += value.byteLength;
        if (read > maxBytes) {
          more = true;
          await reader.cancel();
          break;
        }
      }
    }
    const bytes = new Uint8Array(Math.min(read, maxBytes));
    let at = 0;
    for (const chunk of chunks) {
      const part = chunk.subarray(0, bytes.byteLength - at);
      bytes.set(part, at);
      at += part.byteLength;
    }
    const size = total !== undefined ? Number(total) : more ? null : read;
    return { bytes, truncated: more || (size !== null && size > bytes.byteLength), size };
  }
  uploadFile(id: string, path: string, data: BodyInit, mode?: string): Promise<FileInfo> {
    return this.request('PUT', `/sandboxes/${enc(id)}/files`, { query: { path, mode }, body: data });
  }
  deleteFile(id: string, path: string, recursive = false): Promise<void> {
    return this.request('DELETE', `/sandboxes/${enc(id)}/files`, { query: { path, recursive: recursive || undefined } });
  }
  makeDirectory(id: string, path: string): Promise<FileInfo> {
    return this.request('POST', `/sandboxes/${enc(id)}/files/mkdir`, { json: { path } });
  }

  // ── snapshots ──
  createSnapshot(sandboxId: string, name: string): Promise<Snapshot> {
    return this.request('POST', '/snapshots', { json: { sandboxId, name } });
  }
  async listSnapshots(): Promise<Snapshot[]> {
    return (await this.request<{ items: Snapshot[] }>('GET', '/snapshots')).items;
  }
  getSnapshot(idOrName: string): Promise<Snapshot> { return this.request('GET', `/snapshots/${enc(idOrName)}`); }
  deleteSnapshot(idOrName: string): Promise<void> { return this.request('DELETE', `/snapshots/${enc(idOrName)}`); }

  // ── images ──
  async listImages(query: { name?: string; all?: boolean } = {}): Promise<Image[]> {
    return (await this.request<{ items: Image[] }>('GET', '/images', { query: { ...query, limit: 1000 } })).items;
  }
  getImage(ref: string): Promise<Image> { return this.request('GET', `/images/${enc(ref)}`); }
  deleteImage(ref: string): Promise<void> { return this.request('DELETE', `/images/${enc(ref)}`); }

  // ── API keys ──
  createApiKey(body: { name: string; preset: ApiKeyPreset; sandboxIds?: string[] }): Promise<CreatedApiKey> {
    return this.request('POST', '/api-keys', { json: body });
  }
  async listApiKeys(): Promise<ApiKey[]> {
    return (await this.request<{ items: ApiKey[] }>('GET', '/api-keys')).items;
  }
  deleteApiKey(keyId: string): Promise<void> { return this.request('DELETE', `/api-keys/${enc(keyId)}`); }

  // ── hosts (operators: platform:hosts) ──
  async listHosts(): Promise<Host[]> {
    return (await this.request<{ items: Host[] }>('GET', '/hosts')).items;
  }
  getHost(hostId: string): Promise<Host> { return this.request('GET', `/hosts/${enc(hostId)}`); }
  /** cordon: no new sandboxes; drain: cordoned and marked draining; uncordon: ready again. */
  setHostState(hostId: string, action: 'cordon' | 'uncordon' | 'drain'): Promise<Host> { return this.request('POST', `/hosts/${enc(hostId)}/${action}`); }
  /** A stopped sandbox to another host (operators); `hostId` names the target. */
  moveSandbox(id: string, hostId?: string): Promise<{ sandbox: Sandbox; fromHostId: string; toHostId: string; layersCopied: string[]; ms: number }> {
    return this.request('POST', `/sandboxes/${enc(id)}/move`, { json: hostId ? { hostId } : {} });
  }
  /** Every stopped sandbox of a cordoned or draining host to other hosts (operators). */
  evacuateHost(hostId: string, toHostId?: string): Promise<{ moved: { sandboxId: string; fromHostId: string; toHostId: string; ms: number }[]; failed: { sandboxId: string; error: { code: string; message: string } }[]; skipped: { sandboxId: string; state: string }[] }> {
    return this.request('POST', `/hosts/${enc(hostId)}/evacuate`, { json: toHostId ? { hostId: toHostId } : {} });
  }
  // ── organisations (operator keys; `ownOrganization` and `ownUsage` with any key) ──
  createOrganization(body: { name: string; limits?: Partial<OrganizationLimitOverrides> }): Promise<Organization> {
    return this.request('POST', '/organizations', { json: body });
  }
  async listOrganizations(): Promise<Organization[]> {
    const all: Organization[] = [];
    let cursor: string | undefined;
    // Bounded: 100 pages of 1000.
    for (let page = 0; page < 100; page++) {
      const res = await this.request<{ items: Organization[]; nextCursor: string | null }>('GET', '/organizations', { query: { limit: 1000, ...(cursor ? { cursor } : {}) } });
      all.push(...res.items);
      if (!res.nextCursor) break;
      cursor = res.nextCursor;
    }
    return all;
  }
  getOrganization(id: string): Promise<Organization> { return this.request('GET', `/organizations/${enc(id)}`); }
  updateOrganization(id: string, body: { name?: string; suspended?: boolean; limits?: Partial<OrganizationLimitOverrides> }): Promise<Organization> {
    return this.request('PATCH', `/organizations/${enc(id)}`, { json: body });
  }
  createOrganizationApiKey(id: string, body: { name?: string; preset?: ApiKeyPreset } = {}): Promise<CreatedApiKey> {
    return this.request('POST', `/organizations/${enc(id)}/api-keys`, { json: body });
  }
  async organizationUsage(id: string, range: { from: string; to: string }): Promise<UsageRecord[]> {
    return (await this.request<{ items: UsageRecord[] }>('GET', `/organizations/${enc(id)}/usage`, { query: range })).items;
  }
  ownOrganization(): Promise<OwnOrganization> { return this.request('GET', '/organization'); }
  async ownUsage(range: { from: string; to: string }): Promise<UsageRecord[]> {
    return (await this.request<{ items: UsageRecord[] }>('GET', '/organization/usage', { query: range })).items;
  }

  // ── code interpreter ──
  /** One cell, its events collected into one answer. */
  runCode(id: string, body: RunCodeRequest, signal?: AbortSignal): Promise<CodeRunResult> {
    return this.request('POST', `/sandboxes/${enc(id)}/code/run`, { json: body, headers: { accept: 'application/json' }, signal });
  }
  createCodeContext(id: string, body: { language?: CodeLanguage; cwd?: string; user?: string; envs?: Record<string, string> } = {}): Promise<CodeContext> {
    return this.request('POST', `/sandboxes/${enc(id)}/code/contexts`, { json: body });
  }
  async listCodeContexts(id: string): Promise<CodeContext[]> {
    return (await this.request<{ contexts: CodeContext[] }>('GET', `/sandboxes/${enc(id)}/code/contexts`)).contexts;
  }
}

async function errorOf(response: Response): Promise<NativeApiError> {
  const text = await response.text().catch(() => '');
  const retryAfter = Number(response.headers.get('retry-after') ?? NaN);
  const retryAfterSeconds = Number.isFinite(retryAfter) ? retryAfter : undefined;
  try {
    const { error } = JSON.parse(text) as { error?: { code?: string; message?: string; details?: unknown } };
    if (error?.code) return new NativeApiError(response.status, error.code, error.message ?? error.code, error.details, retryAfterSeconds);
  } catch {
    // not the API's error shape (a proxy's page, say): fall through
  }
  return new NativeApiError(response.status, `http_${response.status}`, text.slice(0, 500) || response.statusText, undefined, retryAfterSeconds);
}

/** The `data:` payloads of a Server-Sent Events response, one per event. */
export async function* serverSentData(response: Response): AsyncGenerator<string> {
  if (!response.body) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline).replace(/\r$/, '');
        buffer = buffer.slice(newline + 1);
        if (line === '') {
          if (data.length) yield data.join('\n');
          data = [];
        } else if (line.startsWith('data:')) {
          data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
        }
      }
    }
    if (data.length) yield data.join('\n');
  } finally {
    reader.releaseLock();
  }
}
