// What core knows of a sandbox's guest agent: the values its operations take and give, and the
// typed client that performs them (GuestClient). The wire contract itself (paths, query names,
// status codes, zod schemas) lives with the implementation in host/agent-protocol/; core only
// sees these types, so no layer above host builds a guest path or parses a guest body. The
// implementation checks at compile time that its zod schemas produce exactly these shapes
// (host/agent-protocol/guest-client.ts), so the two cannot drift apart silently.
import type { Readable } from 'node:stream';
import type { CodeEvent, CodeLanguage, RunScriptResult } from './code-interpreter/types.js';

export type FileType = 'file' | 'dir' | 'symlink' | 'other';

export interface FileInfo {
  name: string;
  /** Absolute, inside the sandbox. */
  path: string;
  type: FileType;
  size: number;
  /** Permission bits, e.g. 0o644 = 420. */
  mode: number;
  /** ISO 8601. */
  mtime: string;
  /** A symlink's own text (readlink). */
  symlinkTarget?: string;
  /** A symlink that resolves: the absolute path at the end of every link, and what is there. */
  symlinkResolved?: { path: string; type: FileType; mode: number };
  owner: string;
  group: string;
  uid: number;
  gid: number;
}

export interface FileList {
  entries: FileInfo[];
}

/** Octal permission text such as "755" or "0644". */
export type OctalMode = string;

export interface MkdirInput {
  path: string;
  mode?: OctalMode;
  /** `<uid>:<gid>` that gets the directories made (default: root's). */
  owner?: string;
}
export interface MkdirResult {
  /** false: it already was a directory (the native API answers 200 instead of 201). */
  created: boolean;
  info: FileInfo;
}
export interface MoveInput {
  from: string;
  to: string;
  overwrite?: boolean;
}
export interface ChmodInput {
  path: string;
  mode: OctalMode;
}
/** A user or group by name or numeric id. */
export interface ChownInput {
  path: string;
  owner?: string | number;
  group?: string | number;
}

export interface FindInput {
  path?: string;
  pattern: string;
  maxResults?: number;
}
export interface FindResult {
  paths: string[];
  truncated: boolean;
  unreadableDirs: number;
}

export interface SearchInput {
  path?: string;
  query: string;
  regex?: boolean;
  caseSensitive?: boolean;
  glob?: string;
  maxResults?: number;
}
export interface SearchMatch {
  path: string;
  /** 1-based. */
  line: number;
  /** 1-based, in UTF-16 code units of the decoded line. */
  column: number;
  text: string;
}
export interface SearchResult {
  matches: SearchMatch[];
  truncated: boolean;
  unreadableDirs: number;
  unreadableFiles: number;
  binaryFilesSkipped: number;
}

export interface FileError {
  code: string;
  message: string;
}
export interface ReplaceInput {
  paths: string[];
  find: string;
  replace: string;
  regex?: boolean;
}
export interface ReplaceResult {
  results: { path: string; replacements: number; error?: FileError }[];
}

/** A file's metadata: its `user.*` extended attributes, names without `user.`. */
export type FileMetadata = Record<string, string>;
export interface FileMetadataEntry {
  path: string;
  metadata: FileMetadata;
}
export interface FileMetadataReadInput {
  paths: string[];
}
export interface FileMetadataWriteInput {
  path: string;
  set: FileMetadata;
  /** The file's other attributes under `user.<replacePrefix>` are removed: that group is replaced. */
  replacePrefix?: string;
}

export type UploadFileResult = { path: string; size: number; ok: true } | { path: string; ok: false; error: FileError };
export interface UploadResult {
  /** 207: some files failed (each result says which and why). */
  status: 200 | 207;
  results: UploadFileResult[];
}
export interface UploadInput {
  /** `multipart/form-data; boundary=…` as the client sent it. */
  contentType: string;
  /** The destination of every file part (E2B's single-file form). */
  path?: string;
  /** Absolute directory relative destinations resolve against (default: the agent user's home). */
  base?: string;
  /** `<uid>:<gid>` that gets the files and the directories made for them (default: root's). */
  owner?: string;
  body: Readable;
}

/**
 * A tar stream (plain or gzip) unpacked at `path` inside the sandbox, as the sandbox's root
 * would: Docker COPY semantics for what the archive holds (directories merge, files replace),
 * no entry escapes `path` (no `..`, no absolute names, never through a symlink the sandbox has).
 */
export interface ExtractArchiveInput {
  /** Absolute directory the entries are relative to (made when missing). */
  path: string;
  /** `user[:group]` (names from the sandbox's /etc/passwd and /etc/group, or ids) for every entry; default the archive's own ids. */
  owner?: string;
  /** Octal mode for every entry instead of the archive's, e.g. `0755`. */
  mode?: OctalMode;
  body: Readable;
}
export interface ExtractArchiveResult {
  /** Entries written (files, directories, links). */
  entries: number;
  /** Bytes of file content written. */
  bytes: number;
}
/**
 * A tar stream of `path` (a file or a directory, recursively, symlinks as links), entry names
 * relative to the sandbox's root without a leading `/` (`usr/bin/x` for `/usr/bin/x`), so the
 * archives of several paths merge like one tree.
 */
export interface CreateArchiveInput {
  path: string;
}

export interface DownloadInput {
  paths: string[];
  /** Absolute directory relative paths resolve against (default: the agent user's home). */
  base?: string;
}

export type WatchChangeType = 'create' | 'write' | 'remove' | 'rename' | 'chmod';
export interface WatchChangeEvent {
  type: WatchChangeType;
  path: string;
  isDir: boolean;
  at: string;
}
export type WatchEvent = WatchChangeEvent | { type: 'ready' } | { type: 'keepalive' };
export interface WatchInput {
  path: string;
  recursive?: boolean;
}
export interface WatcherCreated {
  watcherId: string;
}
export interface WatcherEvents {
  events: WatchChangeEvent[];
  dropped: number;
  closed: boolean;
}

export interface TerminalSize {
  cols: number;
  rows: number;
}

export interface ExecInput {
  cmd?: string;
  argv?: string[];
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  /** A name from the sandbox's /etc/passwd or a numeric uid; absent = the agent's user (root). */
  user?: string;
}

export interface ExecResult {
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  durationMs: number;
  timedOut: boolean;
  truncated: boolean;
}

export interface StartProcessInput {
  argv?: string[];
  cmd?: string;
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  timeoutMs?: number;
  stdin?: boolean;
  tag?: string;
  pty?: TerminalSize;
}

/**
 * A code kernel: the guest agent's kernel bridge driving a Jupyter kernel for `language`, as a
 * process with stdin open (host/agent-protocol/processes.ts, KERNELS).
 */
export interface StartKernelInput {
  language: CodeLanguage;
  tag?: string;
  cwd?: string;
  env?: Record<string, string>;
  user?: string;
  /** The bridge shuts its kernel down and exits after this long without a cell (default 3600; 0 = never). */
  idleTimeoutSeconds?: number;
}

/** One cell of code for a kernel, with environment variables for that cell only. */
export interface CellInput {
  code: string;
  env?: Record<string, string>;
}

/** The languages this sandbox's image has kernels for, and why each other one is missing. */
export interface KernelLanguages {
  languages: CodeLanguage[];
  missing: Record<string, string>;
}

/** A one-shot program (POST /scripts): RunScriptInput with the guest's `env`. */
export interface ScriptInput {
  language: 'python' | 'javascript' | 'typescript';
  code: string;
  argv?: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
}

export type ProcessStatus = 'running' | 'exited' | 'killed';
export interface StreamPosition {
  bytes: number;
  retainedFrom: number;
}
export interface ProcessInfo {
  processId: string;
  pid: number;
  cmd: string;
  args: string[];
  cwd: string;
  tag: string | null;
  user: string;
  pty: boolean;
  status: ProcessStatus;
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  startedAt: string;
  endedAt: string | null;
  stdout: StreamPosition;
  stderr: StreamPosition;
}
export interface ProcessList {
  processes: ProcessInfo[];
}

/** Absolute byte offsets since the process started; `offset` sets both. */
export interface OutputOffsets {
  offset?: number;
  stdoutOffset?: number;
  stderrOffset?: number;
}
export interface OutputInput extends OutputOffsets {
  encoding?: 'utf8' | 'base64';
  /** Per stream; the guest's default is 1 MiB. */
  maxBytes?: number;
}
export interface ProcessOutput {
  stdout: string;
  stderr: string;
  stdoutOffset: number;
  stderrOffset: number;
  stdoutRetainedFrom: number;
  stderrRetainedFrom: number;
  encoding: 'utf8' | 'base64';
  status: ProcessStatus;
  exitCode: number | null;
  signal: string | null;
}
export type ProcessEvent =
  | { type: 'stdout' | 'stderr'; offset: number; data: string }
  | { type: 'exit'; status: ProcessStatus; exitCode: number | null; signal: string | null; timedOut: boolean }
  | { type: 'keepalive' };

export type ProcessSignal = 'SIGTERM' | 'SIGINT' | 'SIGKILL' | 'SIGHUP' | 'SIGQUIT' | 'SIGUSR1' | 'SIGUSR2' | 'SIGSTOP' | 'SIGCONT';

export interface CreateSessionInput {
  sessionId?: string;
  cwd?: string;
  env?: Record<string, string>;
  /** The session's shell runs as this account (as ExecInput.user). */
  user?: string;
}
export interface SessionCreated {
  sessionId: string;
  createdAt: string;
}
export interface SessionCommand {
  commandId: string;
  cmd: string;
  status: 'running' | 'exited';
  exitCode: number | null;
  startedAt: string;
  endedAt: string | null;
  /** Only in the answer of a synchronous run. */
  stdout?: string;
  stderr?: string;
}
export interface SessionInfo {
  sessionId: string;
  createdAt: string;
  commands: SessionCommand[];
}
export interface SessionList {
  sessions: SessionInfo[];
}
export interface SessionCommandInput {
  cmd: string;
  /** Answer at once (202) with the command running. */
  async?: boolean;
  timeoutMs?: number;
  stdin?: boolean;
}
export interface SessionCommandRun {
  /** 202 when `async`: the command is still running. */
  status: 200 | 202;
  command: SessionCommand;
}

/**
 * A language server in the sandbox, named by its language and project (one server per pair).
 * `languageId` is checked by the guest (python, typescript, javascript); paths and `file://`
 * URIs may be relative to the sandbox user's home.
 */
export interface LspServerInput {
  languageId: string;
  pathToProject: string;
}
export interface LspStartInput extends LspServerInput {
  /** The account the server runs as (default: the agent's own). */
  user?: string;
}
export interface LspDocumentInput extends LspServerInput {
  uri: string;
}
/** Zero-based, as LSP counts. */
export interface LspPosition {
  line: number;
  character: number;
}
export interface LspCompletionInput extends LspDocumentInput {
  position: LspPosition;
  context?: { triggerKind: number; triggerCharacter?: string };
}
export interface LspWorkspaceSymbolsInput extends LspServerInput {
  query: string;
}
export interface LspCompletionItem {
  label: string;
  kind?: number;
  detail?: string;
  documentation?: unknown;
  sortText?: string;
  filterText?: string;
  insertText?: string;
}
export interface LspCompletionList {
  isIncomplete: boolean;
  items: LspCompletionItem[];
}
export interface LspSymbol {
  name: string;
  kind: number;
  location: { uri: string; range: { start: LspPosition; end: LspPosition } };
  containerName?: string;
}

/** Headers of a streamed guest answer that a front door may pass on as they are. */
export interface StreamHeaders {
  contentType?: string;
  contentLength?: string;
  contentRange?: string;
  acceptRanges?: string;
  contentDisposition?: string;
  cacheControl?: string;
}

/**
 * A streamed answer (file bytes, a multipart download): read `body` with backpressure (pipe it)
 * or destroy it; aborting the call's signal cancels it upstream.
 */
export interface ByteStream {
  /** 200, or 206 for a byte range. */
  status: number;
  headers: StreamHeaders;
  body: Readable;
}

/**
 * A Server-Sent Events stream: pipe `body` on as it is (a native client reads the same
 * bytes), or iterate `events()` for the decoded and validated events (not both).
 */
export interface EventStream<T> extends ByteStream {
  events(): AsyncGenerator<T>;
}

export interface CallOptions {
  /** Cancels the guest call (and the guest's work, e.g. a foreground command) when aborted. */
  signal?: AbortSignal;
}

/** Options of a stdin write. */
export interface StdinOptions extends CallOptions {
  /**
   * Also append what was written to the process's stdout, as a terminal would echo it: the
   * input then shows in the command's output between what it printed before and after.
   */
  echo?: boolean;
}

/** `Range` header value (`bytes=start-end`), honoured by the guest as one range. */
export type RangeHeader = string;

/** Where a WebSocket to the guest agent is opened (through the sandbox's host agent). */
export interface GuestWebSocketTarget {
  url: string;
  headers: Record<string, string>;
}

/**
 * One sandbox's guest agent, typed. Every method maps to one guest route; errors arrive as
 * NestboxError (decoded once, by decodeErrorBody in core/errors.ts). A client of a stopped
 * sandbox's kept disk (HostClient.guest(id, 'stopped-disk')) serves only the reads.
 */
export interface GuestClient {
  exec(input: ExecInput, o?: CallOptions): Promise<ExecResult>;
  /** The default environment of every later exec, process, session and PTY: `unset` removed, then `env` set. */
  setEnv(input: { env: Record<string, string>; unset?: string[] }, o?: CallOptions): Promise<void>;

  startProcess(input: StartProcessInput, o?: CallOptions): Promise<ProcessInfo>;
  /** Answers once the kernel is ready; a language the image has no kernel for is validation_failed (`language`). */
  startKernel(input: StartKernelInput, o?: CallOptions): Promise<ProcessInfo>;
  kernelLanguages(o?: CallOptions): Promise<KernelLanguages>;
  /**
   * Runs one cell in a kernel: its events as they come (keepalives included), ending after
   * `end`. A kernel that exits mid-cell ends it with status `lost`. Aborting `o.signal` (or
   * leaving the generator early) interrupts the cell: the stream goes on to its `end`
   * (`interrupted`, or `lost` when the kernel would not stop), and the kernel keeps its state.
   */
  runCell(kernelProcessId: string, input: CellInput, o?: CallOptions): Promise<AsyncGenerator<CodeEvent>>;
  /** A program run once to its end: exit code, merged output without chart lines, charts. */
  runScript(input: ScriptInput, o?: CallOptions): Promise<RunScriptResult>;
  listProcesses(input: { all?: boolean }, o?: CallOptions): Promise<ProcessList>;
  getProcess(processId: string, o?: CallOptions): Promise<ProcessInfo>;
  processOutput(processId: string, input: OutputInput, o?: CallOptions): Promise<ProcessOutput>;
  processEvents(processId: string, from: OutputOffsets, o?: CallOptions): Promise<EventStream<ProcessEvent>>;
  writeStdin(processId: string, body: Readable | Buffer, o?: StdinOptions): Promise<void>;
  closeStdin(processId: string, o?: CallOptions): Promise<void>;
  signalProcess(processId: string, signal: ProcessSignal, o?: CallOptions): Promise<void>;
  resizeTerminal(processId: string, size: TerminalSize, o?: CallOptions): Promise<void>;
  killProcess(processId: string, o?: CallOptions): Promise<void>;

  createSession(input: CreateSessionInput, o?: CallOptions): Promise<SessionCreated>;
  listSessions(o?: CallOptions): Promise<SessionList>;
  getSession(sessionId: string, o?: CallOptions): Promise<SessionInfo>;
  deleteSession(sessionId: string, o?: CallOptions): Promise<void>;
  runSessionCommand(sessionId: string, input: SessionCommandInput, o?: CallOptions): Promise<SessionCommandRun>;
  getSessionCommand(sessionId: string, commandId: string, o?: CallOptions): Promise<SessionCommand>;

  readFile(path: string, input: { range?: RangeHeader }, o?: CallOptions): Promise<ByteStream>;
  writeFile(path: string, body: Readable, input: { mode?: OctalMode; owner?: string }, o?: CallOptions): Promise<FileInfo>;
  listFiles(input: { path?: string; depth?: number }, o?: CallOptions): Promise<FileList>;
  statFile(path: string, o?: CallOptions): Promise<FileInfo>;
  makeDirectory(input: MkdirInput, o?: CallOptions): Promise<MkdirResult>;
  moveFile(input: MoveInput, o?: CallOptions): Promise<FileInfo>;
  deleteFile(input: { path: string; recursive?: boolean }, o?: CallOptions): Promise<void>;
  changeMode(input: ChmodInput, o?: CallOptions): Promise<FileInfo>;
  changeOwner(input: ChownInput, o?: CallOptions): Promise<FileInfo>;
  findFiles(input: FindInput, o?: CallOptions): Promise<FindResult>;
  searchFiles(input: SearchInput, o?: CallOptions): Promise<SearchResult>;
  replaceInFiles(input: ReplaceInput, o?: CallOptions): Promise<ReplaceResult>;
  /** Metadata of each path, in order (`{}` for a missing path or one without any). */
  readFileMetadata(input: FileMetadataReadInput, o?: CallOptions): Promise<FileMetadataEntry[]>;
  /** Sets metadata on a file; answers what it then has. */
  writeFileMetadata(input: FileMetadataWriteInput, o?: CallOptions): Promise<FileMetadataEntry>;
  uploadFiles(input: UploadInput, o?: CallOptions): Promise<UploadResult>;
  downloadFiles(input: DownloadInput, o?: CallOptions): Promise<ByteStream>;
  /** Unpacks a tar stream into the sandbox (image builds' COPY). */
  extractArchive(input: ExtractArchiveInput, o?: CallOptions): Promise<ExtractArchiveResult>;
  /** A tar stream of a path in the sandbox (image builds' COPY --from). */
  createArchive(input: CreateArchiveInput, o?: CallOptions): Promise<ByteStream>;
  watchFiles(input: WatchInput, o?: CallOptions): Promise<EventStream<WatchEvent>>;
  createWatcher(input: WatchInput, o?: CallOptions): Promise<WatcherCreated>;
  watcherEvents(watcherId: string, o?: CallOptions): Promise<WatcherEvents>;
  deleteWatcher(watcherId: string, o?: CallOptions): Promise<void>;

  /** Starts the language server (initialize done when it answers); a running one is left as is. */
  lspStart(input: LspStartInput, o?: CallOptions): Promise<void>;
  lspStop(input: LspServerInput, o?: CallOptions): Promise<void>;
  /** The file is read from the sandbox's disk and handed to the server. */
  lspDidOpen(input: LspDocumentInput, o?: CallOptions): Promise<void>;
  lspDidClose(input: LspDocumentInput, o?: CallOptions): Promise<void>;
  lspCompletion(input: LspCompletionInput, o?: CallOptions): Promise<LspCompletionList>;
  lspDocumentSymbols(input: LspDocumentInput, o?: CallOptions): Promise<LspSymbol[]>;
  lspWorkspaceSymbols(input: LspWorkspaceSymbolsInput, o?: CallOptions): Promise<LspSymbol[]>;

  /** WebSocket of a process's events (same messages as processEvents). */
  processEventsSocket(processId: string, from: OutputOffsets): GuestWebSocketTarget;
  /** WebSocket attached to a pty process's terminal. */
  terminalSocket(processId: string): GuestWebSocketTarget;
  /** WebSocket of watch events (same messages as watchFiles); a missing path is the guest's 400. */
  watchSocket(input: Partial<WatchInput>): GuestWebSocketTarget;
  /** WebSocket carrying one TCP connection the guest opens from inside the sandbox (binary frames = bytes). */
  tcpSocket(input: TcpConnectInput): GuestWebSocketTarget;
}

/** Where a TCP connection from inside the sandbox goes (SSH port forwarding). */
export interface TcpConnectInput {
  host: string;
  port: number;
}

/** Which guest agent answers: the running sandbox's, or the host's read-only view of a stopped sandbox's disk. */
export type GuestView = 'live' | 'stopped-disk';
