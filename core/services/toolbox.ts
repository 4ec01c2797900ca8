// The toolbox: every operation inside a sandbox (commands, processes, terminals, sessions,
// files, watches), one typed method each. Front doors (native handlers, compat translators)
// call these and translate the typed values into their own wire format; none of them builds a
// guest-agent path or reads a guest body (that is the GuestClient's job, behind HostClient).
//
// Each method checks its own scope, taken from TOOLBOX_OPERATIONS below and nowhere else, then
// resolves the sandbox through SandboxService.guestFor (visibility, wake-on-use, running state,
// activity) and calls the guest. Streams come back as Readables that carry backpressure and
// are cancelled through the call's AbortSignal (a front door passes its "client gone" signal).
import type { Readable } from 'node:stream';
import type * as Guest from '../guest.js';
import type { CodeEvent, RunScriptResult } from '../code-interpreter/types.js';
import type { Principal, Scope } from '../types.js';
import { requireScope } from './auth.js';
import type { SandboxService } from './sandboxes.js';
import { parseSystemMetrics, SYSTEM_METRICS_COMMAND, type SystemMetrics } from './system-metrics.js';

interface OperationRule {
  scope: Scope;
  /** Completes "cannot … sandbox X: it is stopped". */
  verb: string;
  /** A read a stopped sandbox answers from its kept disk (without being resumed). */
  stoppedDisk?: boolean;
}

/**
 * THE scope table of guest operations (the native spec's `x-nestbox-scope` agrees, checked by
 * toolbox.test.ts). Reads of state are `:read`, anything that runs or changes is `exec`/`write`.
 */
export const TOOLBOX_OPERATIONS = {
  exec: { scope: 'sandboxes:exec', verb: 'run a command in' },
  startProcess: { scope: 'sandboxes:exec', verb: 'run a command in' },
  openTerminal: { scope: 'sandboxes:exec', verb: 'open a terminal in' },
  startKernel: { scope: 'sandboxes:exec', verb: 'run code in' },
  runCell: { scope: 'sandboxes:exec', verb: 'run code in' },
  kernelLanguages: { scope: 'sandboxes:read', verb: 'list the code languages of' },
  runScript: { scope: 'sandboxes:exec', verb: 'run code in' },
  listProcesses: { scope: 'sandboxes:read', verb: 'list processes of' },
  getProcess: { scope: 'sandboxes:read', verb: 'inspect processes of' },
  processOutput: { scope: 'sandboxes:read', verb: 'read process output of' },
  processEvents: { scope: 'sandboxes:read', verb: 'stream process output of' },
  writeStdin: { scope: 'sandboxes:exec', verb: 'write to processes of' },
  closeStdin: { scope: 'sandboxes:exec', verb: 'close stdin of processes of' },
  signalProcess: { scope: 'sandboxes:exec', verb: 'signal processes of' },
  resizeTerminal: { scope: 'sandboxes:exec', verb: 'resize terminals of' },
  killProcess: { scope: 'sandboxes:exec', verb: 'kill processes of' },
  attachTerminal: { scope: 'sandboxes:exec', verb: 'attach to terminals of' },
  connectTcp: { scope: 'sandboxes:exec', verb: 'open connections in' },

  createSession: { scope: 'sandboxes:exec', verb: 'start sessions in' },
  listSessions: { scope: 'sandboxes:read', verb: 'list sessions of' },
  getSession: { scope: 'sandboxes:read', verb: 'inspect sessions of' },
  deleteSession: { scope: 'sandboxes:exec', verb: 'end sessions of' },
  runSessionCommand: { scope: 'sandboxes:exec', verb: 'run commands in' },
  getSessionCommand: { scope: 'sandboxes:read', verb: 'inspect session commands of' },

  readFile: { scope: 'files:read', verb: 'read files of', stoppedDisk: true },
  listFiles: { scope: 'files:read', verb: 'list files of', stoppedDisk: true },
  statFile: { scope: 'files:read', verb: 'read files of', stoppedDisk: true },
  downloadFiles: { scope: 'files:read', verb: 'read files of', stoppedDisk: true },
  findFiles: { scope: 'files:read', verb: 'find files of' },
  searchFiles: { scope: 'files:read', verb: 'search files of' },
  writeFile: { scope: 'files:write', verb: 'write files of' },
  uploadFiles: { scope: 'files:write', verb: 'write files of' },
  makeDirectory: { scope: 'files:write', verb: 'create directories in' },
  moveFile: { scope: 'files:write', verb: 'move files of' },
  deleteFile: { scope: 'files:write', verb: 'delete files of' },
  changeMode: { scope: 'files:write', verb: 'change files of' },
  changeOwner: { scope: 'files:write', verb: 'change files of' },
  replaceInFiles: { scope: 'files:write', verb: 'change files of' },
  readFileMetadata: { scope: 'files:read', verb: 'read files of' },
  writeFileMetadata: { scope: 'files:write', verb: 'change files of' },
  extractArchive: { scope: 'files:write', verb: 'write files of' },
  createArchive: { scope: 'files:read', verb: 'read files of' },
  watchFiles: { scope: 'files:read', verb: 'watch files of' },
  createWatcher: { scope: 'files:read', verb: 'watch files of' },
  watcherEvents: { scope: 'files:read', verb: 'watch files of' },
  deleteWatcher: { scope: 'files:read', verb: 'watch files of' },

  // Language servers run programs in the sandbox; their answers read its files.
  lspStart: { scope: 'sandboxes:exec', verb: 'start a language server in' },
  lspStop: { scope: 'sandboxes:exec', verb: 'stop a language server in' },
  lspDidOpen: { scope: 'sandboxes:exec', verb: 'use a language server in' },
  lspDidClose: { scope: 'sandboxes:exec', verb: 'use a language server in' },
  lspCompletion: { scope: 'sandboxes:exec', verb: 'use a language server in' },
  lspDocumentSymbols: { scope: 'sandboxes:exec', verb: 'use a language server in' },
  lspWorkspaceSymbols: { scope: 'sandboxes:exec', verb: 'use a language server in' },

  // Measured by a command run inside the sandbox (system-metrics.ts).
  systemMetrics: { scope: 'sandboxes:exec', verb: 'read metrics of' },
} as const satisfies Record<string, OperationRule>;

export type ToolboxOperation = keyof typeof TOOLBOX_OPERATIONS;

/** What the toolbox needs of the lifecycle side: resolving a usable sandbox, and activity. */
export type ToolboxSandboxes = Pick<SandboxService, 'guestFor' | 'noteActivity'>;

/** A terminal: a detached process on a PTY running an interactive login shell. */
export interface OpenTerminalInput {
  cols?: number;
  rows?: number;
  cwd?: string;
  env?: Record<string, string>;
  /** Default /bin/bash. */
  shell?: string;
  user?: string;
}

/** An open stream counts as activity for the idle policy this often, for as long as it is open. */
const STREAM_ACTIVITY_TICK_MS = 10_000;

type O = Guest.CallOptions;

export class Toolbox {
  constructor(private readonly sandboxes: ToolboxSandboxes) {}

  /** Scope, then the sandbox's guest agent as `operation` needs it. */
  private async guest(principal: Principal, sandboxId: string, operation: ToolboxOperation): Promise<Guest.GuestClient> {
    const rule: OperationRule = TOOLBOX_OPERATIONS[operation];
    requireScope(principal, rule.scope);
    return this.sandboxes.guestFor(principal, sandboxId, rule.verb, rule.stoppedDisk ?? false);
  }

  /**
   * An open stream or terminal counts as activity for the idle policy for as long as it is
   * open: call the returned function when it closes. The HTTP streams of this class do it
   * themselves; a front door relaying one of the WebSockets calls it.
   */
  keepActive(sandboxId: string): () => void {
    const timer = setInterval(() => void this.sandboxes.noteActivity(sandboxId).catch(() => undefined), STREAM_ACTIVITY_TICK_MS);
    timer.unref();
    return () => clearInterval(timer);
  }

  private keptActive<S extends Guest.ByteStream>(sandboxId: string, stream: S): S {
    stream.body.once('close', this.keepActive(sandboxId));
    return stream;
  }

  // ---- commands and processes -------------------------------------------------------------

  /** A foreground command: answers when it ends. Aborting `o.signal` kills it. */
  async exec(p: Principal, sandboxId: string, input: Guest.ExecInput, o?: O): Promise<Guest.ExecResult> {
    return (await this.guest(p, sandboxId, 'exec')).exec(input, o);
  }

  /** A detached process, answered as soon as it runs. */
  async startProcess(p: Principal, sandboxId: string, input: Guest.StartProcessInput, o?: O): Promise<Guest.ProcessInfo> {
    return (await this.guest(p, sandboxId, 'startProcess')).startProcess(input, o);
  }

  async openTerminal(p: Principal, sandboxId: string, input: OpenTerminalInput, o?: O): Promise<Guest.ProcessInfo> {
    return (await this.guest(p, sandboxId, 'openTerminal')).startProcess(
      {
        argv: [input.shell ?? '/bin/bash', '-l'],
        cwd: input.cwd,
        env: { TERM: 'xterm-256color', ...input.env },
        user: input.user,
        stdin: true,
        tag: 'terminal',
        pty: { cols: input.cols ?? 80, rows: input.rows ?? 24 },
      },
      o,
    );
  }

  /**
   * A code kernel (the guest agent's kernel bridge driving a Jupyter kernel, state kept from
   * cell to cell), as a process: the process methods list, follow, interrupt (SIGINT) and kill
   * it. Answers once the kernel is ready; a language the image has no kernel for is a
   * validation_failed naming `language`. Core's CodeInterpreterService is its user.
   */
  async startKernel(p: Principal, sandboxId: string, input: Guest.StartKernelInput, o?: O): Promise<Guest.ProcessInfo> {
    return (await this.guest(p, sandboxId, 'startKernel')).startKernel(input, o);
  }

  /**
   * One cell of code in a kernel (startKernel): its CodeEvents as they come, ending after
   * `end` (`lost` when the kernel exited mid-cell). Aborting `o.signal` interrupts the cell
   * and the stream goes on to its `end`; the kernel keeps its state.
   */
  async runCell(p: Principal, sandboxId: string, kernelProcessId: string, input: Guest.CellInput, o?: O): Promise<AsyncGenerator<CodeEvent>> {
    return (await this.guest(p, sandboxId, 'runCell')).runCell(kernelProcessId, input, o);
  }

  /** The languages the sandbox's image has Jupyter kernels for (and why the others are missing). */
  async kernelLanguages(p: Principal, sandboxId: string, o?: O): Promise<Guest.KernelLanguages> {
    return (await this.guest(p, sandboxId, 'kernelLanguages')).kernelLanguages(o);
  }

  /** A program run once in a new process (python, javascript, typescript): exit code, merged output, charts. */
  async runScript(p: Principal, sandboxId: string, input: Guest.ScriptInput, o?: O): Promise<RunScriptResult> {
    return (await this.guest(p, sandboxId, 'runScript')).runScript(input, o);
  }

  async listProcesses(p: Principal, sandboxId: string, input: { all?: boolean } = {}, o?: O): Promise<Guest.ProcessList> {
    return (await this.guest(p, sandboxId, 'listProcesses')).listProcesses(input, o);
  }

  async getProcess(p: Principal, sandboxId: string, processId: string, o?: O): Promise<Guest.ProcessInfo> {
    return (await this.guest(p, sandboxId, 'getProcess')).getProcess(processId, o);
  }

  async processOutput(p: Principal, sandboxId: string, processId: string, input: Guest.OutputInput = {}, o?: O): Promise<Guest.ProcessOutput> {
    return (await this.guest(p, sandboxId, 'processOutput')).processOutput(processId, input, o);
  }

  /** Retained output from the offsets, then live output, then exit (Server-Sent Events). */
  async processEvents(p: Principal, sandboxId: string, processId: string, from: Guest.OutputOffsets = {}, o?: O): Promise<Guest.EventStream<Guest.ProcessEvent>> {
    return this.keptActive(sandboxId, await (await this.guest(p, sandboxId, 'processEvents')).processEvents(processId, from, o));
  }

  /** The same events as a WebSocket to relay (the caller keeps the sandbox active while it is open). */
  async processEventsSocket(p: Principal, sandboxId: string, processId: string, from: Guest.OutputOffsets = {}): Promise<Guest.GuestWebSocketTarget> {
    return (await this.guest(p, sandboxId, 'processEvents')).processEventsSocket(processId, from);
  }

  async writeStdin(p: Principal, sandboxId: string, processId: string, body: Readable | Buffer, o?: Guest.StdinOptions): Promise<void> {
    return (await this.guest(p, sandboxId, 'writeStdin')).writeStdin(processId, body, o);
  }

  async closeStdin(p: Principal, sandboxId: string, processId: string, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'closeStdin')).closeStdin(processId, o);
  }

  async signalProcess(p: Principal, sandboxId: string, processId: string, signal: Guest.ProcessSignal, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'signalProcess')).signalProcess(processId, signal, o);
  }

  async resizeTerminal(p: Principal, sandboxId: string, processId: string, size: Guest.TerminalSize, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'resizeTerminal')).resizeTerminal(processId, size, o);
  }

  /** SIGKILL to the whole process group; a no-op for a process that ended. */
  async killProcess(p: Principal, sandboxId: string, processId: string, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'killProcess')).killProcess(processId, o);
  }

  /** A WebSocket attached to a pty process's terminal (raw bytes both ways). */
  async attachTerminal(p: Principal, sandboxId: string, processId: string): Promise<Guest.GuestWebSocketTarget> {
    return (await this.guest(p, sandboxId, 'attachTerminal')).terminalSocket(processId);
  }

  /** A WebSocket carrying one TCP connection opened from inside the sandbox (SSH's `-L`). */
  async connectTcp(p: Principal, sandboxId: string, input: Guest.TcpConnectInput): Promise<Guest.GuestWebSocketTarget> {
    return (await this.guest(p, sandboxId, 'connectTcp')).tcpSocket(input);
  }

  // ---- sessions -----------------------------------------------------------------------------

  async createSession(p: Principal, sandboxId: string, input: Guest.CreateSessionInput = {}, o?: O): Promise<Guest.SessionCreated> {
    return (await this.guest(p, sandboxId, 'createSession')).createSession(input, o);
  }

  async listSessions(p: Principal, sandboxId: string, o?: O): Promise<Guest.SessionList> {
    return (await this.guest(p, sandboxId, 'listSessions')).listSessions(o);
  }

  async getSession(p: Principal, sandboxId: string, sessionId: string, o?: O): Promise<Guest.SessionInfo> {
    return (await this.guest(p, sandboxId, 'getSession')).getSession(sessionId, o);
  }

  async deleteSession(p: Principal, sandboxId: string, sessionId: string, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'deleteSession')).deleteSession(sessionId, o);
  }

  async runSessionCommand(p: Principal, sandboxId: string, sessionId: string, input: Guest.SessionCommandInput, o?: O): Promise<Guest.SessionCommandRun> {
    return (await this.guest(p, sandboxId, 'runSessionCommand')).runSessionCommand(sessionId, input, o);
  }

  async getSessionCommand(p: Principal, sandboxId: string, sessionId: string, commandId: string, o?: O): Promise<Guest.SessionCommand> {
    return (await this.guest(p, sandboxId, 'getSessionCommand')).getSessionCommand(sessionId, commandId, o);
  }

  // ---- files ----------------------------------------------------------------------------------

  /** The file's bytes, streamed; `range` is one `bytes=` range (206). Works on a stopped sandbox. */
  async readFile(p: Principal, sandboxId: string, path: string, input: { range?: Guest.RangeHeader } = {}, o?: O): Promise<Guest.ByteStream> {
    return (await this.guest(p, sandboxId, 'readFile')).readFile(path, input, o);
  }

  /** Streams `body` into the file (parents created, replaced atomically). */
  async writeFile(p: Principal, sandboxId: string, path: string, body: Readable, input: { mode?: Guest.OctalMode; owner?: string } = {}, o?: O): Promise<Guest.FileInfo> {
    return (await this.guest(p, sandboxId, 'writeFile')).writeFile(path, body, input, o);
  }

  async listFiles(p: Principal, sandboxId: string, input: { path?: string; depth?: number } = {}, o?: O): Promise<Guest.FileList> {
    return (await this.guest(p, sandboxId, 'listFiles')).listFiles(input, o);
  }

  async statFile(p: Principal, sandboxId: string, path: string, o?: O): Promise<Guest.FileInfo> {
    return (await this.guest(p, sandboxId, 'statFile')).statFile(path, o);
  }

  async makeDirectory(p: Principal, sandboxId: string, input: Guest.MkdirInput, o?: O): Promise<Guest.MkdirResult> {
    return (await this.guest(p, sandboxId, 'makeDirectory')).makeDirectory(input, o);
  }

  async moveFile(p: Principal, sandboxId: string, input: Guest.MoveInput, o?: O): Promise<Guest.FileInfo> {
    return (await this.guest(p, sandboxId, 'moveFile')).moveFile(input, o);
  }

  async deleteFile(p: Principal, sandboxId: string, input: { path: string; recursive?: boolean }, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'deleteFile')).deleteFile(input, o);
  }

  async changeMode(p: Principal, sandboxId: string, input: Guest.ChmodInput, o?: O): Promise<Guest.FileInfo> {
    return (await this.guest(p, sandboxId, 'changeMode')).changeMode(input, o);
  }

  async changeOwner(p: Principal, sandboxId: string, input: Guest.ChownInput, o?: O): Promise<Guest.FileInfo> {
    return (await this.guest(p, sandboxId, 'changeOwner')).changeOwner(input, o);
  }

  async findFiles(p: Principal, sandboxId: string, input: Guest.FindInput, o?: O): Promise<Guest.FindResult> {
    return (await this.guest(p, sandboxId, 'findFiles')).findFiles(input, o);
  }

  async searchFiles(p: Principal, sandboxId: string, input: Guest.SearchInput, o?: O): Promise<Guest.SearchResult> {
    return (await this.guest(p, sandboxId, 'searchFiles')).searchFiles(input, o);
  }

  async replaceInFiles(p: Principal, sandboxId: string, input: Guest.ReplaceInput, o?: O): Promise<Guest.ReplaceResult> {
    return (await this.guest(p, sandboxId, 'replaceInFiles')).replaceInFiles(input, o);
  }

  /** File metadata (user extended attributes) of each path, in order; see host/agent-protocol/files.ts METADATA. */
  async readFileMetadata(p: Principal, sandboxId: string, input: Guest.FileMetadataReadInput, o?: O): Promise<Guest.FileMetadataEntry[]> {
    return (await this.guest(p, sandboxId, 'readFileMetadata')).readFileMetadata(input, o);
  }

  async writeFileMetadata(p: Principal, sandboxId: string, input: Guest.FileMetadataWriteInput, o?: O): Promise<Guest.FileMetadataEntry> {
    return (await this.guest(p, sandboxId, 'writeFileMetadata')).writeFileMetadata(input, o);
  }

  /**
   * A multipart/form-data body of files, streamed to the guest (see host/agent-protocol/files.ts
   * UPLOAD for the forms it reads). 207 when some files failed.
   */
  async uploadFiles(p: Principal, sandboxId: string, input: Guest.UploadInput, o?: O): Promise<Guest.UploadResult> {
    return (await this.guest(p, sandboxId, 'uploadFiles')).uploadFiles(input, o);
  }

  /** A tar stream unpacked into the sandbox (image builds' COPY; see Guest.ExtractArchiveInput). */
  async extractArchive(p: Principal, sandboxId: string, input: Guest.ExtractArchiveInput, o?: O): Promise<Guest.ExtractArchiveResult> {
    return (await this.guest(p, sandboxId, 'extractArchive')).extractArchive(input, o);
  }

  /** A tar stream of a path in the sandbox (image builds' COPY --from). */
  async createArchive(p: Principal, sandboxId: string, input: Guest.CreateArchiveInput, o?: O): Promise<Guest.ByteStream> {
    return (await this.guest(p, sandboxId, 'createArchive')).createArchive(input, o);
  }

  /** A multipart/form-data stream with one part per path, in order (failures as `error` parts). */
  async downloadFiles(p: Principal, sandboxId: string, input: Guest.DownloadInput, o?: O): Promise<Guest.ByteStream> {
    return (await this.guest(p, sandboxId, 'downloadFiles')).downloadFiles(input, o);
  }

  /** `ready`, then change events and keepalives (Server-Sent Events), for as long as it is read. */
  async watchFiles(p: Principal, sandboxId: string, input: Guest.WatchInput, o?: O): Promise<Guest.EventStream<Guest.WatchEvent>> {
    return this.keptActive(sandboxId, await (await this.guest(p, sandboxId, 'watchFiles')).watchFiles(input, o));
  }

  /** The same events as a WebSocket to relay. */
  async watchFilesSocket(p: Principal, sandboxId: string, input: Partial<Guest.WatchInput>): Promise<Guest.GuestWebSocketTarget> {
    return (await this.guest(p, sandboxId, 'watchFiles')).watchSocket(input);
  }

  /** A polling watcher: events are buffered until drained by watcherEvents. */
  async createWatcher(p: Principal, sandboxId: string, input: Guest.WatchInput, o?: O): Promise<Guest.WatcherCreated> {
    return (await this.guest(p, sandboxId, 'createWatcher')).createWatcher(input, o);
  }

  async watcherEvents(p: Principal, sandboxId: string, watcherId: string, o?: O): Promise<Guest.WatcherEvents> {
    return (await this.guest(p, sandboxId, 'watcherEvents')).watcherEvents(watcherId, o);
  }

  async deleteWatcher(p: Principal, sandboxId: string, watcherId: string, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'deleteWatcher')).deleteWatcher(watcherId, o);
  }

  // ---- language servers -----------------------------------------------------------------------

  /**
   * A language server for (languageId, pathToProject), run as a workload in the sandbox
   * (host/agent-protocol/lsp.ts); the document calls below need it started.
   */
  async lspStart(p: Principal, sandboxId: string, input: Guest.LspStartInput, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'lspStart')).lspStart(input, o);
  }

  async lspStop(p: Principal, sandboxId: string, input: Guest.LspServerInput, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'lspStop')).lspStop(input, o);
  }

  async lspDidOpen(p: Principal, sandboxId: string, input: Guest.LspDocumentInput, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'lspDidOpen')).lspDidOpen(input, o);
  }

  async lspDidClose(p: Principal, sandboxId: string, input: Guest.LspDocumentInput, o?: O): Promise<void> {
    return (await this.guest(p, sandboxId, 'lspDidClose')).lspDidClose(input, o);
  }

  async lspCompletion(p: Principal, sandboxId: string, input: Guest.LspCompletionInput, o?: O): Promise<Guest.LspCompletionList> {
    return (await this.guest(p, sandboxId, 'lspCompletion')).lspCompletion(input, o);
  }

  async lspDocumentSymbols(p: Principal, sandboxId: string, input: Guest.LspDocumentInput, o?: O): Promise<Guest.LspSymbol[]> {
    return (await this.guest(p, sandboxId, 'lspDocumentSymbols')).lspDocumentSymbols(input, o);
  }

  async lspWorkspaceSymbols(p: Principal, sandboxId: string, input: Guest.LspWorkspaceSymbolsInput, o?: O): Promise<Guest.LspSymbol[]> {
    return (await this.guest(p, sandboxId, 'lspWorkspaceSymbols')).lspWorkspaceSymbols(input, o);
  }

  // ---- the sandbox as a machine --------------------------------------------------------------

  /** CPU, memory and disk use as the sandbox's workload sees them (takes about 0.2 s). */
  async systemMetrics(p: Principal, sandboxId: string, o?: O): Promise<SystemMetrics> {
    return parseSystemMetrics(await (await this.guest(p, sandboxId, 'systemMetrics')).exec(SYSTEM_METRICS_COMMAND, o));
  }
}
