// The typed client of one sandbox's guest agent (core's GuestClient): the only place above the
// host agent that knows the guest routes (paths, query names, success statuses) and parses
// guest bodies. It runs over any transport that relays a guest request unchanged — the host
// agent's `/agent` and `/files-view` pass-throughs (host/protocol/client.ts) — so the control
// plane and a host-side caller would share it. Answers are validated with the wire schemas
// (types.ts, files.ts, processes.ts); errors are decoded by core's one decoder.
import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import type { z } from 'zod';
import { errors, NestboxError } from '../../core/errors.js';
import type * as Guest from '../../core/guest.js';
import type { Chart, CodeEvent, CodeLanguage, RunScriptInput, RunScriptResult } from '../../core/code-interpreter/types.js';
import type { AgentRequest } from '../../core/host-client.js';
import { errorFromResponse } from '../protocol/error-response.js';
import { serverSentEvents } from '../protocol/sse.js';
import * as Archive from './archive.js';
import * as Files from './files.js';
import * as Lsp from './lsp.js';
import * as Processes from './processes.js';
import { ExecResponse, FileInfo, ListResponse } from './types.js';

/** Sends one guest-agent request (path with query) and resolves with the answer as it starts. */
export type GuestTransport = (request: AgentRequest) => Promise<IncomingMessage>;
/** Where a WebSocket to the guest path (with query) is opened. */
export type GuestSocketTarget = (path: string) => Guest.GuestWebSocketTarget;

// Compile-time proof that the wire schemas and core's types describe the same values.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type Check<T extends true> = T;
export type SchemasMatchCore = [
  Check<Same<z.infer<typeof FileInfo>, Guest.FileInfo>>,
  Check<Same<z.infer<typeof ListResponse>, Guest.FileList>>,
  Check<Same<z.infer<typeof ExecResponse>, Guest.ExecResult>>,
  Check<Same<z.infer<typeof Files.FindResponse>, Guest.FindResult>>,
  Check<Same<z.infer<typeof Files.SearchResponse>, Guest.SearchResult>>,
  Check<Same<z.infer<typeof Files.ReplaceResponse>, Guest.ReplaceResult>>,
  Check<Same<z.infer<typeof Files.UploadResponse>['results'], Guest.UploadResult['results']>>,
  Check<Same<z.infer<typeof Files.WatchEvent>, Guest.WatchEvent>>,
  Check<Same<z.infer<typeof Files.CreateWatcherResponse>, Guest.WatcherCreated>>,
  Check<Same<z.infer<typeof Files.WatcherEventsResponse>, Guest.WatcherEvents>>,
  Check<Same<z.infer<typeof Files.MkdirRequest>, Guest.MkdirInput>>,
  Check<Same<z.infer<typeof Files.MoveRequest>, Guest.MoveInput>>,
  Check<Same<z.infer<typeof Files.ChmodRequest>, Guest.ChmodInput>>,
  Check<Same<z.infer<typeof Files.ChownRequest>, Guest.ChownInput>>,
  Check<Same<z.infer<typeof Files.ReplaceRequest>, Guest.ReplaceInput>>,
  Check<Same<z.infer<typeof Files.DownloadRequest>, Guest.DownloadInput>>,
  Check<Same<z.infer<typeof Files.FileMetadataReadRequest>, Guest.FileMetadataReadInput>>,
  Check<Same<z.infer<typeof Files.FileMetadataWriteRequest>, Guest.FileMetadataWriteInput>>,
  Check<Same<z.infer<typeof Files.FileMetadataResponse>, Guest.FileMetadataEntry>>,
  Check<Same<z.infer<typeof Files.CreateWatcherRequest>, Guest.WatchInput>>,
  Check<Same<z.infer<typeof Processes.StartProcessRequest>, Guest.StartProcessInput>>,
  Check<Same<z.infer<typeof Processes.StartKernelRequest>, Guest.StartKernelInput>>,
  Check<Same<z.infer<typeof Processes.KernelLanguage>, CodeLanguage>>,
  Check<Same<z.infer<typeof Processes.RunScriptRequest>, Guest.ScriptInput>>,
  Check<Same<z.infer<typeof Processes.RunScriptRequest>['language'], RunScriptInput['language']>>,
  Check<Same<z.infer<typeof Processes.ProcessInfo>, Guest.ProcessInfo>>,
  Check<Same<z.infer<typeof Processes.KernelLanguagesResponse>['missing'], Guest.KernelLanguages['missing']>>,
  Check<Same<z.infer<typeof Processes.ProcessList>, Guest.ProcessList>>,
  Check<Same<z.infer<typeof Processes.OutputResponse>, Guest.ProcessOutput>>,
  Check<Same<z.infer<typeof Processes.ProcessEvent>, Guest.ProcessEvent>>,
  Check<Same<z.infer<typeof Processes.ProcessSignal>, Guest.ProcessSignal>>,
  Check<Same<z.infer<typeof Processes.TerminalSize>, Guest.TerminalSize>>,
  Check<Same<z.infer<typeof Processes.CreateSessionRequest>, Guest.CreateSessionInput>>,
  Check<Same<z.infer<typeof Processes.SessionCreated>, Guest.SessionCreated>>,
  Check<Same<z.infer<typeof Processes.SessionCommandRequest>, Guest.SessionCommandInput>>,
  Check<Same<z.infer<typeof Processes.SessionCommand>, Guest.SessionCommand>>,
  Check<Same<z.infer<typeof Processes.SessionInfo>, Guest.SessionInfo>>,
  Check<Same<z.infer<typeof Processes.SessionList>, Guest.SessionList>>,
  Check<Same<z.infer<typeof Lsp.LspServerRequest>, Guest.LspServerInput>>,
  Check<Same<z.infer<typeof Lsp.LspStartRequest>, Guest.LspStartInput>>,
  Check<Same<z.infer<typeof Lsp.LspDocumentRequest>, Guest.LspDocumentInput>>,
  Check<Same<z.infer<typeof Lsp.LspCompletionRequest>, Guest.LspCompletionInput>>,
  Check<Same<z.infer<typeof Lsp.LspWorkspaceSymbolsRequest>, Guest.LspWorkspaceSymbolsInput>>,
  Check<Same<z.infer<typeof Lsp.LspCompletionList>, Guest.LspCompletionList>>,
  Check<Same<z.infer<typeof Lsp.LspSymbol>, Guest.LspSymbol>>,
  Check<Same<z.infer<typeof Archive.ArchiveExtractResponse>, Guest.ExtractArchiveResult>>,
];

type Query = Record<string, string | number | boolean | undefined>;

/** After an interrupt, how long a bridge may stay silent before its cell is given up as lost. */
const STUCK_INTERRUPT_MS = 30_000;
const CELL_EVENT_TYPES = new Set(['start', 'stdout', 'stderr', 'result', 'error', 'end']);

/** One line of a kernel bridge's stdout as an event of `cell`, or undefined (another cell's, or not ours). */
function cellEvent(line: string, cell: string): CodeEvent | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return undefined;
  }
  const checked = Processes.KernelEventLine.safeParse(parsed);
  // Events of other cells (an interrupted one still finishing) are not this caller's.
  if (!checked.success || checked.data.cell !== cell || !CELL_EVENT_TYPES.has(checked.data.type)) return undefined;
  const { cell: _cell, ...event } = parsed as { cell: string };
  return event as unknown as CodeEvent;
}

/**
 * A script's output without the python runner's chart lines (`\n<marker> {json}\n`, each put
 * on a line of its own by the runner, which adds the newline before it), and their charts.
 */
function splitChartLines(raw: string, marker: string): { output: string; charts: RunScriptResult['charts'] } {
  const charts: RunScriptResult['charts'] = [];
  if (!marker) return { output: raw, charts };
  const opening = `\n${marker} `;
  let output = '';
  let from = 0;
  for (let at = raw.indexOf(opening, from); at !== -1; at = raw.indexOf(opening, from)) {
    output += raw.slice(from, at);
    const lineEnd = raw.indexOf('\n', at + opening.length);
    const json = raw.slice(at + opening.length, lineEnd === -1 ? raw.length : lineEnd);
    from = lineEnd === -1 ? raw.length : lineEnd + 1;
    try {
      const { chart, png } = JSON.parse(json) as { chart: Chart | null; png: string | null };
      const base: Chart = chart ?? { type: 'unknown', title: null, elements: [] };
      charts.push(png ? { ...base, png } : base);
    } catch {
      // A cut line (the output bound): its chart is lost, the text around it kept.
    }
  }
  return { output: output + raw.slice(from), charts };
}

function withQuery(route: string, params: Query = {}): string {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value !== undefined) query.set(name, String(value));
  const text = query.toString();
  return text ? `${route}?${text}` : route;
}

/**
 * One path segment of the guest's routes, for an id the caller chose. Encoding is not enough for
 * "." and "..": URL parsers treat them (and %2E) as dot segments, so `/sessions/.` would reach
 * the session *list*. No id is ever one of them, so such an id names nothing.
 */
function segment(kind: string, value: string): string {
  if (value === '' || value === '.' || value === '..') throw errors.notFound(kind, value);
  return encodeURIComponent(value);
}

interface Call {
  method: string;
  path: string;
  json?: unknown;
  body?: Readable | Buffer;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

function streamHeaders(res: IncomingMessage): Guest.StreamHeaders {
  const h = (name: string): string | undefined => {
    const v = res.headers[name];
    return Array.isArray(v) ? v.join(', ') : v;
  };
  const headers: Guest.StreamHeaders = {
    contentType: h('content-type'),
    contentLength: h('content-length'),
    contentRange: h('content-range'),
    acceptRanges: h('accept-ranges'),
    contentDisposition: h('content-disposition'),
    cacheControl: h('cache-control'),
  };
  for (const key of Object.keys(headers) as (keyof Guest.StreamHeaders)[]) if (headers[key] === undefined) delete headers[key];
  return headers;
}

export class HttpGuestClient implements Guest.GuestClient {
  constructor(
    private readonly send: GuestTransport,
    private readonly socketTarget: GuestSocketTarget,
    /** Names the sandbox in messages about unexpected answers. */
    private readonly label: string,
  ) {}

  /** Any 2xx answer, streaming; anything else is thrown as the decoded error. */
  private async open(call: Call): Promise<IncomingMessage> {
    const headers: Record<string, string> = { ...call.headers };
    let body = call.body;
    if (call.json !== undefined) {
      body = Buffer.from(JSON.stringify(call.json));
      headers['content-type'] = 'application/json';
    }
    const res = await this.send({ method: call.method, path: call.path, headers, body, signal: call.signal });
    const status = res.statusCode ?? 502;
    if (status < 200 || status >= 300) throw await errorFromResponse(res, `the guest agent of sandbox ${this.label}`);
    return res;
  }

  /**
   * A JSON answer checked against its schema. The value returned is the one received (checked,
   * not rebuilt), so what a front door passes on keeps the guest's field order and any field a
   * newer guest added.
   */
  private async json<T>(schema: z.ZodType<T>, call: Call): Promise<{ status: number; body: T }> {
    const res = await this.open({ ...call, headers: { accept: 'application/json', ...call.headers } });
    const chunks: Buffer[] = [];
    for await (const chunk of res) chunks.push(chunk as Buffer);
    let value: unknown;
    try {
      value = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch (err) {
      throw this.unexpected(call, (err as Error).message);
    }
    const checked = schema.safeParse(value);
    if (!checked.success) throw this.unexpected(call, checked.error.message);
    return { status: res.statusCode ?? 200, body: value as T };
  }

  /** A route that answers 204 (or any 2xx without a body worth reading). */
  private async noContent(call: Call): Promise<void> {
    const res = await this.open(call);
    res.resume();
  }

  private async stream(call: Call): Promise<Guest.ByteStream> {
    const res = await this.open(call);
    return { status: res.statusCode ?? 200, headers: streamHeaders(res), body: res };
  }

  private async events<T>(schema: z.ZodType<T>, call: Call): Promise<Guest.EventStream<T>> {
    const res = await this.open({ ...call, method: 'GET', headers: { accept: 'text/event-stream' } });
    const unexpected = (detail: string) => this.unexpected(call, detail);
    const label = this.label;
    return {
      status: res.statusCode ?? 200,
      headers: streamHeaders(res),
      body: res,
      async *events() {
        try {
          for await (const event of serverSentEvents<unknown>(res)) {
            const checked = schema.safeParse(event);
            if (!checked.success) throw unexpected(checked.error.message);
            yield event as T;
          }
        } catch (err) {
          if (err instanceof NestboxError || (err as Error).name === 'AbortError') throw err;
          // The connection broke mid-stream (the sandbox was deleted or stopped under it, or its
          // host went away): the catalogue's word for it, so every front door tells its client
          // "the sandbox went away" instead of an internal error.
          throw new NestboxError('host_unavailable', `the event stream of ${call.method} ${call.path} from sandbox ${label} was cut: ${(err as Error).message}`);
        }
      },
    };
  }

  private unexpected(call: Call, detail: string): NestboxError {
    return new NestboxError('internal', `the guest agent of sandbox ${this.label} sent an unexpected answer to ${call.method} ${call.path}: ${detail}`);
  }

  async exec(input: Guest.ExecInput, o: Guest.CallOptions = {}): Promise<Guest.ExecResult> {
    return (await this.json(ExecResponse, { method: 'POST', path: '/exec', json: input, signal: o.signal })).body;
  }

  async setEnv(input: { env: Record<string, string>; unset?: string[] }, o: Guest.CallOptions = {}): Promise<void> {
    await this.noContent({ method: 'PUT', path: '/env', json: input, signal: o.signal });
  }

  async startProcess(input: Guest.StartProcessInput, o: Guest.CallOptions = {}): Promise<Guest.ProcessInfo> {
    return (await this.json(Processes.ProcessInfo, { method: 'POST', path: '/processes', json: input, signal: o.signal })).body;
  }

  async startKernel(input: Guest.StartKernelInput, o: Guest.CallOptions = {}): Promise<Guest.ProcessInfo> {
    return (await this.json(Processes.ProcessInfo, { method: 'POST', path: '/kernels', json: input, signal: o.signal })).body;
  }

  async kernelLanguages(o: Guest.CallOptions = {}): Promise<Guest.KernelLanguages> {
    return (await this.json(Processes.KernelLanguagesResponse, { method: 'GET', path: '/kernels/languages', signal: o.signal })).body as Guest.KernelLanguages;
  }

  async runCell(processId: string, input: Guest.CellInput, o: Guest.CallOptions = {}): Promise<AsyncGenerator<CodeEvent>> {
    // Note where the bridge's output is now, hand it the cell, then follow the output from that
    // offset: the guest replays from any offset, so nothing is missed. (The stream is opened
    // after the cell is written because its headers only come with its first event.)
    const now = await this.getProcess(processId);
    const cell = randomBytes(8).toString('hex');
    await this.writeStdin(processId, Buffer.from(`${JSON.stringify({ id: cell, code: input.code, ...(input.env ? { env_vars: input.env } : {}) })}\n`));
    // The stream is ours to end: an abort interrupts the cell and reads on to its `end`.
    const reading = new AbortController();
    const stream = await this.processEvents(processId, { stdoutOffset: now.stdout.bytes, stderrOffset: now.stderr.bytes }, { signal: reading.signal });
    let ended = false;
    let interruptedAt: number | undefined;
    const interrupt = () => {
      if (ended || interruptedAt !== undefined) return;
      interruptedAt = Date.now();
      // Addressed to this cell, so it can never stop the next one.
      void this.writeStdin(processId, Buffer.from(`${JSON.stringify({ interrupt: cell })}\n`)).catch(() => undefined);
    };
    if (o.signal?.aborted) interrupt();
    else o.signal?.addEventListener('abort', interrupt, { once: true });
    const client = this;
    return (async function* (): AsyncGenerator<CodeEvent> {
      let decoder = new TextDecoder();
      let buffer = '';
      let expected = now.stdout.bytes;
      try {
        for await (const event of stream.events()) {
          if (event.type === 'keepalive') {
            // The bridge ends an interrupted cell within its grace (10 s) or exits; one that
            // says nothing long after is stuck: told to stop (SIGHUP: it exits as if on its
            // own, so the context's next cell starts a fresh kernel), and the cell is lost.
            if (interruptedAt !== undefined && Date.now() - interruptedAt > STUCK_INTERRUPT_MS) {
              await client.signalProcess(processId, 'SIGHUP').catch(() => undefined);
              ended = true;
              yield { type: 'end', status: 'lost' };
              return;
            }
            yield { type: 'keepalive' };
            continue;
          }
          if (event.type === 'exit') break;
          if (event.type !== 'stdout') continue;
          const bytes = Buffer.from(event.data, 'base64');
          if (event.offset > expected) {
            // Output the guest no longer kept (a reader far behind a huge result): the line
            // under way is cut, so it goes; the cell says what it lost.
            buffer = '';
            decoder = new TextDecoder();
            yield { type: 'stderr', text: `[nestbox: ${event.offset - expected} bytes of this kernel's output were dropped before they could be read]\n` };
          }
          expected = event.offset + bytes.length;
          buffer += decoder.decode(bytes, { stream: true });
          let at: number;
          while ((at = buffer.indexOf('\n')) !== -1) {
            const line = buffer.slice(0, at);
            buffer = buffer.slice(at + 1);
            const codeEvent = cellEvent(line, cell);
            if (!codeEvent) continue;
            if (codeEvent.type === 'end') ended = true;
            yield codeEvent;
            if (ended) return;
          }
        }
        // The bridge exited before the cell's end: the kernel, and the cell, are lost.
        ended = true;
        yield { type: 'end', status: 'lost' };
      } finally {
        o.signal?.removeEventListener('abort', interrupt);
        // A consumer that stopped reading early gave the cell up.
        if (!ended) interrupt();
        reading.abort();
        stream.body.destroy();
      }
    })();
  }

  async runScript(input: Guest.ScriptInput, o: Guest.CallOptions = {}): Promise<RunScriptResult> {
    const answer = (await this.json(Processes.RunScriptResponse, { method: 'POST', path: '/scripts', json: input, signal: o.signal })).body;
    const { output, charts } = splitChartLines(answer.output, answer.chartMarker);
    return { exitCode: answer.exitCode, output, charts, timedOut: answer.timedOut };
  }

  async listProcesses(input: { all?: boolean }, o: Guest.CallOptions = {}): Promise<Guest.ProcessList> {
    return (await this.json(Processes.ProcessList, { method: 'GET', path: withQuery('/processes', { all: input.all }), signal: o.signal })).body;
  }

  async getProcess(processId: string, o: Guest.CallOptions = {}): Promise<Guest.ProcessInfo> {
    return (await this.json(Processes.ProcessInfo, { method: 'GET', path: `/processes/${segment('process', processId)}`, signal: o.signal })).body;
  }

  async processOutput(processId: string, input: Guest.OutputInput, o: Guest.CallOptions = {}): Promise<Guest.ProcessOutput> {
    const { offset, stdoutOffset, stderrOffset, encoding, maxBytes } = input;
    const path = withQuery(`/processes/${segment('process', processId)}/output`, { offset, stdoutOffset, stderrOffset, encoding, maxBytes });
    return (await this.json(Processes.OutputResponse, { method: 'GET', path, signal: o.signal })).body;
  }

  processEvents(processId: string, from: Guest.OutputOffsets, o: Guest.CallOptions = {}): Promise<Guest.EventStream<Guest.ProcessEvent>> {
    return this.events(Processes.ProcessEvent, { method: 'GET', path: this.eventsPath(processId, from), signal: o.signal });
  }

  private eventsPath(processId: string, from: Guest.OutputOffsets): string {
    return withQuery(`/processes/${segment('process', processId)}/events`, { offset: from.offset, stdoutOffset: from.stdoutOffset, stderrOffset: from.stderrOffset });
  }

  writeStdin(processId: string, body: Readable | Buffer, o: Guest.StdinOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: withQuery(`/processes/${segment('process', processId)}/stdin`, { echo: o.echo || undefined }), body, headers: { 'content-type': 'application/octet-stream' }, signal: o.signal });
  }

  closeStdin(processId: string, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: `/processes/${segment('process', processId)}/stdin/close`, signal: o.signal });
  }

  signalProcess(processId: string, signal: Guest.ProcessSignal, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: `/processes/${segment('process', processId)}/signal`, json: { signal }, signal: o.signal });
  }

  resizeTerminal(processId: string, size: Guest.TerminalSize, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: `/processes/${segment('process', processId)}/resize`, json: size, signal: o.signal });
  }

  killProcess(processId: string, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'DELETE', path: `/processes/${segment('process', processId)}`, signal: o.signal });
  }

  async createSession(input: Guest.CreateSessionInput, o: Guest.CallOptions = {}): Promise<Guest.SessionCreated> {
    return (await this.json(Processes.SessionCreated, { method: 'POST', path: '/sessions', json: input, signal: o.signal })).body;
  }

  async listSessions(o: Guest.CallOptions = {}): Promise<Guest.SessionList> {
    return (await this.json(Processes.SessionList, { method: 'GET', path: '/sessions', signal: o.signal })).body;
  }

  async getSession(sessionId: string, o: Guest.CallOptions = {}): Promise<Guest.SessionInfo> {
    return (await this.json(Processes.SessionInfo, { method: 'GET', path: `/sessions/${segment('session', sessionId)}`, signal: o.signal })).body;
  }

  deleteSession(sessionId: string, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'DELETE', path: `/sessions/${segment('session', sessionId)}`, signal: o.signal });
  }

  async runSessionCommand(sessionId: string, input: Guest.SessionCommandInput, o: Guest.CallOptions = {}): Promise<Guest.SessionCommandRun> {
    const { status, body } = await this.json(Processes.SessionCommand, { method: 'POST', path: `/sessions/${segment('session', sessionId)}/commands`, json: input, signal: o.signal });
    return { status: status === 202 ? 202 : 200, command: body };
  }

  async getSessionCommand(sessionId: string, commandId: string, o: Guest.CallOptions = {}): Promise<Guest.SessionCommand> {
    return (await this.json(Processes.SessionCommand, { method: 'GET', path: `/sessions/${segment('session', sessionId)}/commands/${segment('command', commandId)}`, signal: o.signal })).body;
  }

  readFile(path: string, input: { range?: Guest.RangeHeader }, o: Guest.CallOptions = {}): Promise<Guest.ByteStream> {
    return this.stream({ method: 'GET', path: withQuery('/files/content', { path }), headers: input.range ? { range: input.range } : {}, signal: o.signal });
  }

  async writeFile(path: string, body: Readable, input: { mode?: Guest.OctalMode; owner?: string }, o: Guest.CallOptions = {}): Promise<Guest.FileInfo> {
    return (await this.json(FileInfo, { method: 'PUT', path: withQuery('/files/content', { path, mode: input.mode || undefined, owner: input.owner }), body, headers: { 'content-type': 'application/octet-stream' }, signal: o.signal })).body;
  }

  async listFiles(input: { path?: string; depth?: number }, o: Guest.CallOptions = {}): Promise<Guest.FileList> {
    return (await this.json(ListResponse, { method: 'GET', path: withQuery('/files/list', { path: input.path, depth: input.depth }), signal: o.signal })).body;
  }

  async statFile(path: string, o: Guest.CallOptions = {}): Promise<Guest.FileInfo> {
    return (await this.json(FileInfo, { method: 'GET', path: withQuery('/files/stat', { path }), signal: o.signal })).body;
  }

  async makeDirectory(input: Guest.MkdirInput, o: Guest.CallOptions = {}): Promise<Guest.MkdirResult> {
    const { status, body } = await this.json(FileInfo, { method: 'POST', path: '/files/mkdir', json: input, signal: o.signal });
    return { created: status === 201, info: body };
  }

  async moveFile(input: Guest.MoveInput, o: Guest.CallOptions = {}): Promise<Guest.FileInfo> {
    return (await this.json(FileInfo, { method: 'POST', path: '/files/move', json: input, signal: o.signal })).body;
  }

  deleteFile(input: { path: string; recursive?: boolean }, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'DELETE', path: withQuery('/files', { path: input.path, recursive: input.recursive }), signal: o.signal });
  }

  async changeMode(input: Guest.ChmodInput, o: Guest.CallOptions = {}): Promise<Guest.FileInfo> {
    return (await this.json(FileInfo, { method: 'POST', path: '/files/chmod', json: input, signal: o.signal })).body;
  }

  async changeOwner(input: Guest.ChownInput, o: Guest.CallOptions = {}): Promise<Guest.FileInfo> {
    return (await this.json(FileInfo, { method: 'POST', path: '/files/chown', json: input, signal: o.signal })).body;
  }

  async findFiles(input: Guest.FindInput, o: Guest.CallOptions = {}): Promise<Guest.FindResult> {
    const path = withQuery('/files/find', { path: input.path, pattern: input.pattern, maxResults: input.maxResults });
    return (await this.json(Files.FindResponse, { method: 'GET', path, signal: o.signal })).body;
  }

  async searchFiles(input: Guest.SearchInput, o: Guest.CallOptions = {}): Promise<Guest.SearchResult> {
    const { path: root, query, regex, caseSensitive, glob, maxResults } = input;
    const path = withQuery('/files/search', { path: root, query, regex, caseSensitive, glob, maxResults });
    return (await this.json(Files.SearchResponse, { method: 'GET', path, signal: o.signal })).body;
  }

  async replaceInFiles(input: Guest.ReplaceInput, o: Guest.CallOptions = {}): Promise<Guest.ReplaceResult> {
    return (await this.json(Files.ReplaceResponse, { method: 'POST', path: '/files/replace', json: input, signal: o.signal })).body;
  }

  async readFileMetadata(input: Guest.FileMetadataReadInput, o: Guest.CallOptions = {}): Promise<Guest.FileMetadataEntry[]> {
    return (await this.json(Files.FileMetadataReadResponse, { method: 'POST', path: '/files/metadata/read', json: input, signal: o.signal })).body.entries;
  }

  /** A tar stream unpacked in the sandbox (agent-protocol/archive.ts); the body is streamed through. */
  async extractArchive(input: Guest.ExtractArchiveInput, o: Guest.CallOptions = {}): Promise<Guest.ExtractArchiveResult> {
    return (
      await this.json(Archive.ArchiveExtractResponse, {
        method: 'POST',
        path: withQuery(Archive.ARCHIVE_EXTRACT_ROUTE, { path: input.path, owner: input.owner, mode: input.mode }),
        body: input.body,
        headers: { 'content-type': 'application/x-tar' },
        signal: o.signal,
      })
    ).body;
  }

  createArchive(input: Guest.CreateArchiveInput, o: Guest.CallOptions = {}): Promise<Guest.ByteStream> {
    return this.stream({ method: 'GET', path: withQuery(Archive.ARCHIVE_ROUTE, { path: input.path }), signal: o.signal });
  }

  async writeFileMetadata(input: Guest.FileMetadataWriteInput, o: Guest.CallOptions = {}): Promise<Guest.FileMetadataEntry> {
    return (await this.json(Files.FileMetadataResponse, { method: 'POST', path: '/files/metadata', json: input, signal: o.signal })).body;
  }

  async uploadFiles(input: Guest.UploadInput, o: Guest.CallOptions = {}): Promise<Guest.UploadResult> {
    const { status, body } = await this.json(Files.UploadResponse, {
      method: 'POST',
      path: withQuery('/files/upload', { path: input.path, base: input.base, owner: input.owner }),
      body: input.body,
      headers: input.contentType ? { 'content-type': input.contentType } : {},
      signal: o.signal,
    });
    return { status: status === 207 ? 207 : 200, results: body.results };
  }

  downloadFiles(input: Guest.DownloadInput, o: Guest.CallOptions = {}): Promise<Guest.ByteStream> {
    return this.stream({ method: 'POST', path: '/files/download', json: input, signal: o.signal });
  }

  watchFiles(input: Guest.WatchInput, o: Guest.CallOptions = {}): Promise<Guest.EventStream<Guest.WatchEvent>> {
    return this.events(Files.WatchEvent, { method: 'GET', path: this.watchPath(input), signal: o.signal });
  }

  private watchPath(input: Partial<Guest.WatchInput>): string {
    return withQuery('/files/watch', { path: input.path, recursive: input.recursive });
  }

  async createWatcher(input: Guest.WatchInput, o: Guest.CallOptions = {}): Promise<Guest.WatcherCreated> {
    return (await this.json(Files.CreateWatcherResponse, { method: 'POST', path: '/files/watchers', json: input, signal: o.signal })).body;
  }

  async watcherEvents(watcherId: string, o: Guest.CallOptions = {}): Promise<Guest.WatcherEvents> {
    return (await this.json(Files.WatcherEventsResponse, { method: 'GET', path: `/files/watchers/${segment('watcher', watcherId)}/events`, signal: o.signal })).body;
  }

  deleteWatcher(watcherId: string, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'DELETE', path: `/files/watchers/${segment('watcher', watcherId)}`, signal: o.signal });
  }

  lspStart(input: Guest.LspStartInput, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: '/lsp/start', json: input, signal: o.signal });
  }

  lspStop(input: Guest.LspServerInput, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: '/lsp/stop', json: input, signal: o.signal });
  }

  lspDidOpen(input: Guest.LspDocumentInput, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: '/lsp/did-open', json: input, signal: o.signal });
  }

  lspDidClose(input: Guest.LspDocumentInput, o: Guest.CallOptions = {}): Promise<void> {
    return this.noContent({ method: 'POST', path: '/lsp/did-close', json: input, signal: o.signal });
  }

  async lspCompletion(input: Guest.LspCompletionInput, o: Guest.CallOptions = {}): Promise<Guest.LspCompletionList> {
    return (await this.json(Lsp.LspCompletionList, { method: 'POST', path: '/lsp/completion', json: input, signal: o.signal })).body;
  }

  async lspDocumentSymbols(input: Guest.LspDocumentInput, o: Guest.CallOptions = {}): Promise<Guest.LspSymbol[]> {
    return (await this.json(Lsp.LspSymbolsResponse, { method: 'POST', path: '/lsp/document-symbols', json: input, signal: o.signal })).body.symbols;
  }

  async lspWorkspaceSymbols(input: Guest.LspWorkspaceSymbolsInput, o: Guest.CallOptions = {}): Promise<Guest.LspSymbol[]> {
    return (await this.json(Lsp.LspSymbolsResponse, { method: 'POST', path: '/lsp/workspace-symbols', json: input, signal: o.signal })).body.symbols;
  }

  processEventsSocket(processId: string, from: Guest.OutputOffsets): Guest.GuestWebSocketTarget {
    return this.socketTarget(this.eventsPath(processId, from));
  }

  terminalSocket(processId: string): Guest.GuestWebSocketTarget {
    return this.socketTarget(`/processes/${segment('process', processId)}/pty`);
  }

  watchSocket(input: Partial<Guest.WatchInput>): Guest.GuestWebSocketTarget {
    return this.socketTarget(this.watchPath(input));
  }

  tcpSocket(input: Guest.TcpConnectInput): Guest.GuestWebSocketTarget {
    return this.socketTarget(`/tcp?${new URLSearchParams({ host: input.host, port: String(input.port) }).toString()}`);
  }
}
