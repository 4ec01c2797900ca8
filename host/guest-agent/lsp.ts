// Language servers inside the sandbox (routes and contract: host/agent-protocol/lsp.ts). One
// server process per (languageId, pathToProject), started through the workload launcher like
// every other process (work cgroup, workloads' user namespace, the requested user), spoken to
// over its stdio with vscode-languageserver-protocol's JSON-RPC connection. The agent is the
// only client of each server: it answers the server's own requests (configuration, progress,
// registrations) with empty results and drops its notifications (diagnostics, logs).
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readdir, readFile, stat } from 'node:fs/promises';
import { extname, join, posix } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { MessageConnection } from 'vscode-languageserver-protocol/node';
import {
  LANGUAGE_SERVERS_PREFIX,
  LSP_LANGUAGES,
  MAX_LANGUAGE_SERVERS,
  MAX_WORKSPACE_SYMBOL_FILES,
  LspCompletionRequest,
  LspDocumentRequest,
  LspServerRequest,
  LspStartRequest,
  LspWorkspaceSymbolsRequest,
  type LspCompletionList,
  type LspLanguage,
  type LspSymbol,
  type LspSymbolsResponse,
} from '../agent-protocol/lsp.js';
import type { z } from 'zod';
import { readJsonBody } from './body.js';
import { AgentHttpError, notFound, sendJson, validationFailed } from './errors.js';
import { mergedEnv } from './exec.js';
import { killGroup } from './processes/kill.js';
import { resolveRunAs } from './processes/users.js';
import type { WorkloadLauncher } from './workload.js';

/** The host's node, bind-mounted (local driver) or copied (VM image) into every sandbox. */
export const IN_SANDBOX_NODE = '/.nestbox/bin/node';

type JsonRpc = typeof import('vscode-languageserver-protocol/node');
let jsonRpc: Promise<JsonRpc> | undefined;
/**
 * The JSON-RPC library, loaded by the first language server's start: evaluating it cost every
 * sandbox start about 30 ms of agent start-up (measured), and most sandboxes never start one.
 * It is CommonJS: in the bundle's chunk (scripts/bundle-guest-agent.mjs splits) its
 * `module.exports` is the namespace's `default` only, as it also is (beside named exports) when
 * Node imports it from the sources; so the library is read from `default` in both.
 */
const loadJsonRpc = (): Promise<JsonRpc> =>
  (jsonRpc ??= import('vscode-languageserver-protocol/node').then((namespace) => (namespace as { default?: JsonRpc }).default ?? namespace));

export interface LanguageServerProgram {
  file: string;
  args: string[];
}

/** What the default image runs for each language (host/images/language-servers.ts installs it). */
export const DEFAULT_LANGUAGE_SERVER_PROGRAMS: Record<LspLanguage, LanguageServerProgram> = {
  python: { file: '/usr/bin/pylsp', args: [] },
  typescript: { file: IN_SANDBOX_NODE, args: [`${LANGUAGE_SERVERS_PREFIX}/node_modules/typescript-language-server/lib/cli.mjs`, '--stdio'] },
  javascript: { file: IN_SANDBOX_NODE, args: [`${LANGUAGE_SERVERS_PREFIX}/node_modules/typescript-language-server/lib/cli.mjs`, '--stdio'] },
};

export interface LspSettings {
  /** The agent user's home: relative paths of the agent's own user resolve against it. */
  home: string;
  baseEnv: NodeJS.ProcessEnv;
  launcher: WorkloadLauncher;
  passwdPath?: string;
  /** Programs by language (tests point them elsewhere); default DEFAULT_LANGUAGE_SERVER_PROGRAMS. */
  programs?: Partial<Record<LspLanguage, LanguageServerProgram>>;
  maxServers?: number;
  /** Per request to a server. Default 30 s. */
  requestTimeoutMs?: number;
  /** For initialize (tsserver loads its library first). Default 60 s. */
  startTimeoutMs?: number;
}

/** Largest file didOpen hands to a server. */
const MAX_DOCUMENT_BYTES = 16 * 1024 * 1024;
/** How long a stopped server gets between `exit` and SIGKILL. */
const EXIT_GRACE_MS = 2_000;
/** How long a failed start waits for the server's end before answering. */
const START_FAILURE_REPORT_WAIT_MS = 1_000;
/** Bytes of a server's stderr kept to explain its death. */
const STDERR_TAIL_BYTES = 4096;
/** Directories a workspace-symbol walk never enters. */
const SKIPPED_DIRECTORIES = new Set(['node_modules', '__pycache__', 'site-packages', 'dist-packages']);
const SOURCE_EXTENSIONS: Record<LspLanguage, string[]> = {
  python: ['.py', '.pyi'],
  typescript: ['.ts', '.tsx', '.mts', '.cts', '.js', '.jsx', '.mjs', '.cjs'],
  javascript: ['.js', '.jsx', '.mjs', '.cjs', '.ts', '.tsx'],
};

/** The languageId of a document, as typescript-language-server tells script kinds apart. */
function documentLanguage(language: LspLanguage, path: string): string {
  if (language === 'python') return 'python';
  const ext = extname(path);
  if (ext === '.tsx') return 'typescriptreact';
  if (ext === '.jsx') return 'javascriptreact';
  if (['.js', '.mjs', '.cjs'].includes(ext)) return 'javascript';
  if (['.ts', '.mts', '.cts'].includes(ext)) return 'typescript';
  return language;
}

function languageOf(languageId: string): LspLanguage {
  if ((LSP_LANGUAGES as readonly string[]).includes(languageId)) return languageId as LspLanguage;
  throw validationFailed('languageId', `unsupported language ${JSON.stringify(languageId)} (supported: ${LSP_LANGUAGES.join(', ')})`);
}

interface Exit {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
}

/** One running language server and the documents opened on it. */
class LanguageServer {
  readonly documents = new Map<string, number>();
  exited: Exit | undefined;
  capabilities: Record<string, unknown> = {};
  private stderrTail = Buffer.alloc(0);

  constructor(
    readonly language: LspLanguage,
    readonly pathToProject: string,
    /** The project as an absolute path, and the home relative document paths resolve against. */
    readonly root: string,
    readonly home: string,
    readonly child: ChildProcess,
    readonly connection: MessageConnection,
  ) {
    child.stderr?.on('data', (chunk: Buffer) => this.noteOutput(chunk));
  }

  /** Keeps the end of what the server said about itself (stderr, error log messages). */
  noteOutput(chunk: Buffer | string): void {
    this.stderrTail = Buffer.concat([this.stderrTail, Buffer.from(chunk)]).subarray(-STDERR_TAIL_BYTES);
  }

  get label(): string {
    return `the ${this.language} language server for ${this.pathToProject}`;
  }

  /** Why it is gone, with the end of its stderr. */
  exitReport(): string {
    const how = this.exited?.signal ? `killed by ${this.exited.signal}` : `exit code ${this.exited?.exitCode}`;
    const stderr = this.stderrTail.toString('utf8').trim().split('\n').slice(-5).join(' | ');
    return `${this.label} has exited (${how})${stderr ? `; its last output: ${stderr}` : ''}; start it again`;
  }
}

export class LspService {
  private readonly servers = new Map<string, LanguageServer>();
  /** Starts in progress, so two concurrent starts of one key share one server. */
  private readonly starting = new Map<string, Promise<LanguageServer>>();
  private readonly programs: Record<LspLanguage, LanguageServerProgram>;
  private readonly maxServers: number;
  private readonly requestTimeoutMs: number;
  private readonly startTimeoutMs: number;

  constructor(private readonly settings: LspSettings) {
    this.programs = { ...DEFAULT_LANGUAGE_SERVER_PROGRAMS, ...settings.programs };
    this.maxServers = settings.maxServers ?? MAX_LANGUAGE_SERVERS;
    this.requestTimeoutMs = settings.requestTimeoutMs ?? 30_000;
    this.startTimeoutMs = settings.startTimeoutMs ?? 60_000;
  }

  private static key(languageId: string, pathToProject: string): string {
    return `${languageId}\0${pathToProject}`;
  }

  async start(request: LspStartRequest): Promise<void> {
    const language = languageOf(request.languageId);
    const key = LspService.key(language, request.pathToProject);
    const running = this.servers.get(key);
    if (running && !running.exited) return;
    const pending = this.starting.get(key);
    if (pending) {
      await pending;
      return;
    }
    const live = [...this.servers.values()].filter((server) => !server.exited).length + this.starting.size;
    if (live >= this.maxServers) {
      throw new AgentHttpError(429, 'limit_reached', `at most ${this.maxServers} language servers may run in one sandbox; stop one first`);
    }
    const starting = this.launch(language, request);
    this.starting.set(key, starting);
    try {
      this.servers.set(key, await starting);
    } finally {
      this.starting.delete(key);
    }
  }

  private async launch(language: LspLanguage, request: LspStartRequest): Promise<LanguageServer> {
    const program = this.programs[language];
    if (!existsSync(program.file) || !program.args.slice(0, 1).every((arg) => !arg.startsWith('/') || existsSync(arg))) {
      throw new AgentHttpError(501, 'not_supported', `the ${language} language server is not installed in this sandbox's image (${[program.file, ...program.args.slice(0, 1)].join(' ')} is missing)`);
    }
    const runAs = await resolveRunAs(request.user, this.settings.passwdPath);
    const home = runAs.uid !== undefined ? (runAs.home ?? '/') : this.settings.home;
    const root = posix.resolve(home, request.pathToProject);
    const info = await stat(root).catch(() => undefined);
    if (!info?.isDirectory()) throw validationFailed('pathToProject', `not a directory in the sandbox: ${root}`);
    const env = mergedEnv({ baseEnv: this.settings.baseEnv, home }, undefined);
    if (runAs.uid !== undefined) env.USER = env.LOGNAME = runAs.name;
    const launch = this.settings.launcher.wrap(program.file, program.args, runAs);
    const { createMessageConnection, StreamMessageReader, StreamMessageWriter } = await loadJsonRpc();
    const child = spawn(launch.file, launch.args, {
      cwd: root,
      env,
      uid: launch.uid,
      gid: launch.gid,
      // Its own process group, so a stop reaches tsserver and anything else it started.
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe', ...launch.extraStdio],
    });
    const spawnError = await new Promise<Error | undefined>((resolve) => {
      child.once('spawn', () => resolve(undefined));
      child.once('error', resolve);
    });
    if (spawnError) throw cannotStart(language, spawnError.message);
    // A server that exits leaves broken pipes behind; the exit handler reports it instead.
    child.stdin?.on('error', () => undefined);
    const connection = createMessageConnection(new StreamMessageReader(child.stdout!), new StreamMessageWriter(child.stdin!));
    const server = new LanguageServer(language, request.pathToProject, root, home, child, connection);
    child.once('exit', (exitCode, signal) => {
      server.exited = { exitCode, signal };
      connection.dispose();
    });
    // The server's own requests: no configuration, no UI, registrations accepted.
    connection.onRequest((method: string, params: unknown) => {
      if (method === 'workspace/configuration') return Array.isArray((params as { items?: unknown[] })?.items) ? (params as { items: unknown[] }).items.map(() => null) : [];
      return null;
    });
    // Its error log lines explain a death as well as stderr does (typescript-language-server
    // writes nothing else): the last few are kept with the stderr tail.
    connection.onNotification((method: string, params: unknown) => {
      const message = params as { type?: unknown; message?: unknown } | undefined;
      if (method === 'window/logMessage' && message?.type === 1 && typeof message.message === 'string') server.noteOutput(`${message.message}\n`);
    });
    connection.onError(() => undefined);
    connection.listen();

    const rootUri = pathToFileURL(root).href;
    try {
      const result = await this.request<{ capabilities?: Record<string, unknown> }>(server, 'initialize', {
        // Not the agent's pid: servers poll it with kill(pid, 0), which a workload gets EPERM
        // for (the agent is outside the workloads' user namespace), and typescript-language-server
        // takes that for a dead parent and exits. Without the agent, stdin ends and so do they.
        processId: null,
        clientInfo: { name: 'nestbox-guest-agent' },
        rootUri,
        rootPath: root,
        workspaceFolders: [{ uri: rootUri, name: posix.basename(root) || '/' }],
        // typescript comes from the project's node_modules, else the one installed beside the
        // server. Typings acquisition would run npm (absent) against the registry: off.
        initializationOptions: language === 'python' ? {} : { disableAutomaticTypingAcquisition: true },
        capabilities: {
          textDocument: {
            synchronization: { didSave: false, dynamicRegistration: false },
            completion: { contextSupport: true, completionItem: { snippetSupport: false, documentationFormat: ['markdown', 'plaintext'], deprecatedSupport: true } },
            // Flat SymbolInformation with a location, the shape Daytona answers.
            documentSymbol: { hierarchicalDocumentSymbolSupport: false },
          },
          workspace: { symbol: {}, workspaceFolders: true, configuration: true },
        },
      }, this.startTimeoutMs);
      server.capabilities = result?.capabilities ?? {};
      await connection.sendNotification('initialized', {});
    } catch (error) {
      if (error instanceof AgentHttpError && error.code === 'timeout') {
        this.kill(server);
        throw error;
      }
      // A write to a server that is dying can fail before its exit is seen: give it a moment to
      // end and its stderr to drain, so the answer says how it ended rather than "EPIPE".
      await Promise.race([once(child, 'close'), delay(START_FAILURE_REPORT_WAIT_MS)]);
      this.kill(server);
      throw cannotStart(language, server.exited ? server.exitReport() : (error as Error).message);
    }
    return server;
  }

  async stop(request: LspServerRequest): Promise<void> {
    const key = LspService.key(request.languageId, request.pathToProject);
    const server = this.servers.get(key);
    if (!server) throw this.notStarted(request);
    this.servers.delete(key);
    if (server.exited) return;
    // A polite end first (shutdown, then exit); whatever is left of its group goes after a grace.
    await this.request(server, 'shutdown', undefined, 5_000).catch(() => undefined);
    await server.connection.sendNotification('exit').catch(() => undefined);
    const exited = new Promise<void>((resolve) => (server.exited ? resolve() : server.child.once('exit', () => resolve())));
    const grace = new Promise<void>((resolve) => setTimeout(resolve, EXIT_GRACE_MS).unref());
    await Promise.race([exited, grace]);
    this.kill(server);
  }

  async didOpen(request: LspDocumentRequest): Promise<void> {
    const server = this.serverFor(request);
    const { uri, path } = this.document(server, request.uri);
    const info = await stat(path).catch(() => undefined);
    if (!info?.isFile()) throw notFound(`uri: no such file in the sandbox: ${path}`);
    if (info.size > MAX_DOCUMENT_BYTES) throw new AgentHttpError(413, 'payload_too_large', `uri: ${path} is larger than ${MAX_DOCUMENT_BYTES} bytes`);
    const text = await readFile(path, 'utf8');
    const version = server.documents.get(uri);
    if (version === undefined) {
      await this.notify(server, 'textDocument/didOpen', { textDocument: { uri, languageId: documentLanguage(server.language, path), version: 1, text } });
      server.documents.set(uri, 1);
    } else {
      // Opened again: the server gets the file's current text as a new version.
      await this.notify(server, 'textDocument/didChange', { textDocument: { uri, version: version + 1 }, contentChanges: [{ text }] });
      server.documents.set(uri, version + 1);
    }
  }

  async didClose(request: LspDocumentRequest): Promise<void> {
    const server = this.serverFor(request);
    const { uri } = this.document(server, request.uri);
    if (!server.documents.has(uri)) return;
    server.documents.delete(uri);
    await this.notify(server, 'textDocument/didClose', { textDocument: { uri } });
  }

  async completion(request: LspCompletionRequest): Promise<LspCompletionList> {
    const server = this.serverFor(request);
    const { uri } = this.document(server, request.uri);
    const result = await this.request<unknown>(server, 'textDocument/completion', { textDocument: { uri }, position: request.position, ...(request.context ? { context: request.context } : {}) });
    const list = Array.isArray(result) ? { isIncomplete: false, items: result } : ((result as { isIncomplete?: boolean; items?: unknown[] } | null) ?? { items: [] });
    return { isIncomplete: list.isIncomplete === true, items: (list.items ?? []).map(completionItem) };
  }

  async documentSymbols(request: LspDocumentRequest): Promise<LspSymbol[]> {
    const server = this.serverFor(request);
    return this.symbolsOf(server, this.document(server, request.uri).uri);
  }

  async workspaceSymbols(request: LspWorkspaceSymbolsRequest): Promise<LspSymbol[]> {
    const server = this.serverFor(request);
    if (server.capabilities.workspaceSymbolProvider) {
      const result = await this.request<unknown[] | null>(server, 'workspace/symbol', { query: request.query });
      return (result ?? []).map((symbol) => symbolInformation(symbol)).filter((symbol): symbol is LspSymbol => symbol !== undefined);
    }
    // No workspace/symbol in this server (pylsp): its own document symbols of every source file
    // under the project, matched by name, within one request's time.
    const deadline = Date.now() + this.requestTimeoutMs;
    const query = request.query.toLowerCase();
    const found: LspSymbol[] = [];
    for (const path of await sourceFiles(server.root, SOURCE_EXTENSIONS[server.language], MAX_WORKSPACE_SYMBOL_FILES)) {
      const left = deadline - Date.now();
      if (left <= 0) break;
      const symbols = await this.symbolsOf(server, pathToFileURL(path).href, left).catch((error: unknown) => {
        if (error instanceof AgentHttpError && error.code === 'invalid_state') throw error;
        return [];
      });
      found.push(...symbols.filter((symbol) => symbol.name.toLowerCase().includes(query)));
    }
    return found;
  }

  /** Ends every server (the agent is shutting down). */
  close(): void {
    for (const server of this.servers.values()) this.kill(server);
    this.servers.clear();
  }

  private async symbolsOf(server: LanguageServer, uri: string, timeoutMs?: number): Promise<LspSymbol[]> {
    const result = await this.request<unknown[] | null>(server, 'textDocument/documentSymbol', { textDocument: { uri } }, timeoutMs);
    const symbols: LspSymbol[] = [];
    const visit = (entry: unknown, container?: string): void => {
      const flat = symbolInformation(entry, uri, container);
      if (flat) symbols.push(flat);
      // A server answering hierarchically (DocumentSymbol) despite our capabilities: flattened.
      for (const child of ((entry as { children?: unknown[] }).children ?? [])) visit(child, flat?.name);
    };
    for (const entry of result ?? []) visit(entry);
    return symbols;
  }

  private kill(server: LanguageServer): void {
    if (!server.exited && server.child.pid !== undefined) killGroup(server.child.pid);
    server.connection.dispose();
  }

  private notStarted(request: LspServerRequest): AgentHttpError {
    return new AgentHttpError(409, 'invalid_state', `no ${request.languageId} language server is running for ${request.pathToProject}: start it first`);
  }

  private serverFor(request: LspServerRequest): LanguageServer {
    languageOf(request.languageId);
    const server = this.servers.get(LspService.key(request.languageId, request.pathToProject));
    if (!server) throw this.notStarted(request);
    if (server.exited) throw new AgentHttpError(409, 'invalid_state', server.exitReport());
    return server;
  }

  /** The document's absolute `file://` URI and path (a relative path resolves against the server's home). */
  private document(server: LanguageServer, raw: string): { uri: string; path: string } {
    if (!raw.startsWith('file://')) throw validationFailed('uri', `must be a file:// URI, got ${JSON.stringify(raw)}`);
    let path: string;
    if (raw.startsWith('file:///')) {
      try {
        path = fileURLToPath(raw);
      } catch (error) {
        throw validationFailed('uri', (error as Error).message);
      }
    } else {
      // `file://` + a relative path, as the SDK builds it from `workspace/a.py`.
      path = posix.resolve(server.home, decodeURIComponentSafe(raw.slice('file://'.length)));
    }
    return { uri: pathToFileURL(path).href, path };
  }

  private async notify(server: LanguageServer, method: string, params: unknown): Promise<void> {
    try {
      await server.connection.sendNotification(method, params);
    } catch (error) {
      throw server.exited ? new AgentHttpError(409, 'invalid_state', server.exitReport()) : new AgentHttpError(500, 'internal', `${server.label} could not be sent ${method}: ${(error as Error).message}`);
    }
  }

  /** One request, bounded in time; a server that exits meanwhile is reported as such. */
  private async request<T>(server: LanguageServer, method: string, params: unknown, timeoutMs = this.requestTimeoutMs): Promise<T> {
    // Loaded already: a server exists only after a start.
    const { CancellationTokenSource, ResponseError } = await loadJsonRpc();
    const cancel = new CancellationTokenSource();
    let timer: NodeJS.Timeout | undefined;
    let onExit: (() => void) | undefined;
    const limits = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        cancel.cancel();
        reject(new AgentHttpError(504, 'timeout', `${server.label} did not answer ${method} within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      onExit = () => reject(new AgentHttpError(409, 'invalid_state', server.exitReport()));
      server.child.once('exit', onExit);
    });
    try {
      if (server.exited) throw new AgentHttpError(409, 'invalid_state', server.exitReport());
      const answer = params === undefined ? server.connection.sendRequest<T>(method, cancel.token) : server.connection.sendRequest<T>(method, params, cancel.token);
      return await Promise.race([answer, limits]);
    } catch (error) {
      if (error instanceof AgentHttpError) throw error;
      // The exit listener may lose the race with the connection's own "disposed" rejection.
      if (server.exited) throw new AgentHttpError(409, 'invalid_state', server.exitReport());
      if (error instanceof ResponseError) throw new AgentHttpError(400, 'validation_failed', `${method}: ${server.label} answered with error ${error.code}: ${error.message}`);
      throw new AgentHttpError(500, 'internal', `${server.label} failed on ${method}: ${(error as Error)?.message ?? String(error)}`);
    } finally {
      clearTimeout(timer);
      if (onExit) server.child.off('exit', onExit);
      cancel.dispose();
    }
  }
}

/**
 * A server that fails to start is the sandbox's state (its image, its project), not a fault of
 * the agent: an invalid_state whose message says why, so the caller sees the reason.
 */
function cannotStart(language: LspLanguage, why: string): AgentHttpError {
  return new AgentHttpError(409, 'invalid_state', `the ${language} language server could not be started: ${why}`);
}

function decodeURIComponentSafe(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** The fields Daytona's CompletionItem has (a server's `data`, edits and commands stay behind). */
function completionItem(raw: unknown): LspCompletionList['items'][number] {
  const item = (raw ?? {}) as Record<string, unknown>;
  const out: LspCompletionList['items'][number] = { label: typeof item.label === 'string' ? item.label : String(item.label ?? '') };
  if (typeof item.kind === 'number') out.kind = item.kind;
  for (const field of ['detail', 'sortText', 'filterText', 'insertText'] as const) if (typeof item[field] === 'string') out[field] = item[field] as string;
  if (item.documentation !== undefined && item.documentation !== null) out.documentation = item.documentation;
  return out;
}

const ZERO_RANGE = { start: { line: 0, character: 0 }, end: { line: 0, character: 0 } };

/**
 * A SymbolInformation, WorkspaceSymbol or DocumentSymbol as an LspSymbol (name, kind, location).
 * `uri` is the document's, for DocumentSymbol, which has none of its own.
 */
function symbolInformation(raw: unknown, uri?: string, container?: string): LspSymbol | undefined {
  const entry = (raw ?? {}) as { name?: unknown; kind?: unknown; location?: { uri?: unknown; range?: LspSymbol['location']['range'] }; range?: LspSymbol['location']['range']; containerName?: unknown };
  if (typeof entry.name !== 'string' || typeof entry.kind !== 'number') return undefined;
  const location = entry.location && typeof entry.location.uri === 'string'
    ? { uri: entry.location.uri, range: entry.location.range ?? ZERO_RANGE }
    : uri && entry.range
      ? { uri, range: entry.range }
      : undefined;
  if (!location) return undefined;
  const containerName = typeof entry.containerName === 'string' ? entry.containerName : container;
  return { name: entry.name, kind: entry.kind, location, ...(containerName ? { containerName } : {}) };
}

/** Source files under `root`, breadth first, skipping hidden, dependency and virtualenv directories. */
async function sourceFiles(root: string, extensions: string[], limit: number): Promise<string[]> {
  const files: string[] = [];
  const queue = [root];
  // Bounded in directories too, so a huge tree without sources ends the walk.
  for (let visited = 0; queue.length > 0 && files.length < limit && visited < limit * 20; visited += 1) {
    const dir = queue.shift()!;
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    if (entries.some((entry) => entry.name === 'pyvenv.cfg')) continue;
    for (const entry of entries.sort((a, b) => a.name.localeCompare(b.name))) {
      if (entry.name.startsWith('.')) continue;
      const path = join(dir, entry.name);
      if (entry.isDirectory() && !SKIPPED_DIRECTORIES.has(entry.name)) queue.push(path);
      else if (entry.isFile() && extensions.includes(extname(entry.name)) && files.length < limit) files.push(path);
    }
  }
  return files;
}

interface LspRouteContext {
  req: IncomingMessage;
  res: ServerResponse;
}
type LspRouteHandler = (context: LspRouteContext) => Promise<void>;

/** The /lsp/* routes (agent-protocol/lsp.ts) over one LspService; server.ts merges them in. */
export function createLspRoutes(service: LspService, maxJsonBodyBytes: number): Record<string, Partial<Record<string, LspRouteHandler>>> {
  /** A call answered 204 once it is done. */
  const noContent = <T>(schema: z.ZodType<T>, call: (request: T) => Promise<void>): Partial<Record<string, LspRouteHandler>> => ({
    POST: async ({ req, res }) => {
      await call(await readJsonBody(req, schema, maxJsonBodyBytes));
      res.writeHead(204).end();
    },
  });
  const symbols = (res: ServerResponse, list: LspSymbol[]) => sendJson(res, 200, { symbols: list } satisfies LspSymbolsResponse);
  return {
    '/lsp/start': noContent(LspStartRequest, (request) => service.start(request)),
    '/lsp/stop': noContent(LspServerRequest, (request) => service.stop(request)),
    '/lsp/did-open': noContent(LspDocumentRequest, (request) => service.didOpen(request)),
    '/lsp/did-close': noContent(LspDocumentRequest, (request) => service.didClose(request)),
    '/lsp/completion': { POST: async ({ req, res }) => sendJson(res, 200, await service.completion(await readJsonBody(req, LspCompletionRequest, maxJsonBodyBytes))) },
    '/lsp/document-symbols': { POST: async ({ req, res }) => symbols(res, await service.documentSymbols(await readJsonBody(req, LspDocumentRequest, maxJsonBodyBytes))) },
    '/lsp/workspace-symbols': { POST: async ({ req, res }) => symbols(res, await service.workspaceSymbols(await readJsonBody(req, LspWorkspaceSymbolsRequest, maxJsonBodyBytes))) },
  };
}
