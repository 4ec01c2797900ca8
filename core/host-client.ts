// What core needs from a host agent. The control plane never touches a sandbox directly: it
// asks the host agent that owns it. The HTTP implementation lives with the host-agent protocol
// (host/protocol/client.ts); core sees only this interface.
import type { Readable } from 'node:stream';
import type { HostRecord } from './types.js';

export interface HostSandboxSpec {
  id: string;
  image: string;
  cpu: number;
  memoryMiB: number;
  env: Record<string, string>;
}

export interface HostSandboxRuntime {
  id: string;
  status: 'running' | 'stopped';
}

export interface HostStartResult extends HostSandboxRuntime {
  memoryRestored: boolean;
  resumeReason?: string;
}

export interface ExecInput {
  cmd?: string;
  argv?: string[];
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
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

export interface FileEntry {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime: string;
  symlinkTarget?: string;
}

export interface FileDownload {
  /** The bytes, streamed from the guest agent through the host agent. */
  body: Readable;
  status: number;
  /** Headers to pass on (content-length, content-range, content-type). */
  headers: Record<string, string>;
}

/** A request for the sandbox's guest agent, relayed unchanged by the host agent. */
export interface AgentRequest {
  method: string;
  /** Guest-agent path including the query string, e.g. `/processes/p1/output?offset=0`. */
  path: string;
  headers?: Record<string, string>;
  body?: Readable | Buffer;
  signal?: AbortSignal;
}

/** Where to open a WebSocket to the sandbox's guest agent (through its host agent). */
export interface AgentWebSocketTarget {
  url: string;
  headers: Record<string, string>;
}

export interface HostClient {
  readonly hostId: string;
  createSandbox(spec: HostSandboxSpec): Promise<HostSandboxRuntime>;
  stopSandbox(id: string): Promise<{ memorySaved: boolean }>;
  startSandbox(spec: HostSandboxSpec): Promise<HostStartResult>;
  destroySandbox(id: string): Promise<void>;
  getSandbox(id: string): Promise<HostSandboxRuntime | undefined>;
  exec(id: string, input: ExecInput, signal?: AbortSignal): Promise<ExecResult>;
  readFile(id: string, path: string, range?: string): Promise<FileDownload>;
  writeFile(id: string, path: string, body: Readable, mode?: string): Promise<FileEntry>;
  /** Any guest-agent route, streamed both ways; the caller reads status and body. */
  agentRequest(id: string, request: AgentRequest): Promise<import('node:http').IncomingMessage>;
  agentWebSocket(id: string, path: string): AgentWebSocketTarget;
}

/** Builds a client for a registered host (its URL and credentials come from the host record). */
export type HostClientFactory = (host: HostRecord) => HostClient;
