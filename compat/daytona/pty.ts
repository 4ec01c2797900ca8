// Daytona PTY sessions (daytona.md (c) "PTY") on core's terminals: a PTY session is a guest
// process on a terminal whose tag carries the user's PTY id (Daytona's ids are chosen by the
// user, the guest's process ids are not). Shared by the HTTP routes (toolbox.ts) and the PTY
// WebSockets (websockets.ts).
import { daytonaAccount } from './sandbox-dto.js';
import { NestboxError, errors } from '../../core/errors.js';
import type { ToolboxPort } from '../../core/compat-port.js';
import type { ProcessInfo } from '../../core/guest.js';
import type { Principal } from '../../core/types.js';

/** Tag that marks a guest process as the Daytona PTY session `id`. */
const PTY_TAG_PREFIX = 'daytona-pty:';

export interface CreatePtyInput {
  id: string;
  cols?: number;
  rows?: number;
  cwd?: string;
  envs?: Record<string, string>;
  /** The account the shell runs as; default Daytona's `daytona` (root in an image without it). */
  user?: string;
}

/** Daytona's PtySessionInfo of the guest process behind a PTY session. */
export function ptyInfo(p: ProcessInfo, size?: { cols: number; rows: number }): Record<string, unknown> {
  return {
    id: p.tag!.slice(PTY_TAG_PREFIX.length),
    active: p.status === 'running',
    cols: size?.cols ?? 0,
    rows: size?.rows ?? 0,
    cwd: p.cwd,
    envs: {},
    createdAt: p.startedAt,
    lazyStart: false,
  };
}

/** The guest processes that are Daytona PTY sessions. */
export function ptyProcesses(processes: ProcessInfo[]): ProcessInfo[] {
  return processes.filter((p) => p.pty && p.tag?.startsWith(PTY_TAG_PREFIX));
}

/** Find the guest process behind a Daytona PTY id (running ones only, unless `includeEnded`). */
export async function findPty(toolbox: ToolboxPort, principal: Principal, sandboxId: string, id: string, includeEnded = false): Promise<ProcessInfo | undefined> {
  const { processes } = await toolbox.listProcesses(principal, sandboxId, { all: includeEnded || undefined });
  return processes.find((p) => p.tag === PTY_TAG_PREFIX + id && p.pty && (includeEnded || p.status === 'running'));
}

/** Start a login shell on a terminal for the Daytona PTY session `id`. */
export async function createPty(toolbox: ToolboxPort, principal: Principal, sandboxId: string, o: CreatePtyInput): Promise<ProcessInfo> {
  if (!/^[A-Za-z0-9_.-]{1,64}$/.test(o.id)) throw errors.validation('id', 'must be 1-64 characters of A-Z a-z 0-9 _ . -');
  if (await findPty(toolbox, principal, sandboxId, o.id)) throw new NestboxError('conflict', `PTY session ${o.id} already exists`);
  // openTerminal's process, with the tag that names the PTY session (openTerminal tags every
  // terminal alike): the same login shell, TERM and open stdin.
  return toolbox.startProcess(principal, sandboxId, {
    argv: ['/bin/bash', '-l'],
    cwd: o.cwd || undefined,
    env: { TERM: 'xterm-256color', ...o.envs },
    user: o.user ?? (await daytonaAccount(toolbox, principal, sandboxId)).name,
    stdin: true,
    tag: PTY_TAG_PREFIX + o.id,
    pty: { cols: o.cols ?? 80, rows: o.rows ?? 24 },
  });
}
