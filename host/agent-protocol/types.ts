// The guest-agent wire protocol: HTTP/1.1 over a stream transport (a Unix socket in the local
// driver today; Cloud Hypervisor hybrid vsock later). The host agent speaks it to the guest
// agent; nothing above the host agent does. Keep this file free of Node-only imports other
// than types so the guest-agent bundle stays small.
//
// Routes (all JSON unless noted; errors are `{ error: { code, message } }` with the codes of
// core's catalogue, so the host agent can pass them through unchanged):
//
//   GET  /health                      → HealthResponse
//   POST /exec          ExecRequest   → ExecResponse (foreground: answers when the process ends)
//   GET  /files/content?path=         → raw bytes, streamed (Content-Length set from stat). A
//                                       file whose size is not known in advance (st_size 0, or
//                                       on procfs/sysfs/…) is read until EOF and sent chunked,
//                                       without Content-Length; Range is ignored for it.
//   PUT  /files/content?path=&mode=   raw body, streamed to a temp file then renamed; parents
//                                       created → FileInfo of the written file
//   GET  /files/list?path=&depth=    → { entries: FileInfo[] }   (more file routes: files.ts)
//   GET  /files/stat?path=            → FileInfo
//   PUT  /env           EnvRequest    → 204: removes `unset`, then sets (adds or replaces) `env` in
//                                       the environment every later process starts from. Drivers whose guest
//                                       agent is started by the image (VMs) use it to hand over
//                                       the sandbox's env after boot and after a restore.
//
// Relative paths resolve against the sandbox user's home directory. All paths are resolved by
// the guest agent inside the sandbox's own root, so symlinks can never reach the host.
import { z } from 'zod';

/**
 * The longest timeout a command may ask for: Node's timers hold at most 2^31-1 ms (about 24.8
 * days) and fire at once for anything larger, which would kill the command immediately.
 */
export const MAX_TIMEOUT_MS = 2_147_483_647;

export const GUEST_AGENT_PROTOCOL_VERSION = 1;

export const HealthResponse = z.object({
  status: z.literal('ok'),
  protocolVersion: z.number().int(),
  pid: z.number().int(),
  uptimeMs: z.number(),
});
export type HealthResponse = z.infer<typeof HealthResponse>;

export const ExecRequest = z
  .object({
    // Exactly one of argv or cmd. `cmd` runs as `bash -lc <cmd>` (`/bin/sh -c <cmd>` in an image
    // without bash; a 400 validation_failed on `cmd` in one without any shell).
    argv: z.array(z.string()).min(1).optional(),
    cmd: z.string().optional(),
    cwd: z.string().optional(),
    env: z.record(z.string(), z.string()).optional(),
    // 0 or absent = no timeout. On timeout the whole process group gets SIGKILL.
    timeoutMs: z.number().int().min(0).max(MAX_TIMEOUT_MS).optional(),
    // Bytes for stdin, base64; absent = stdin closed at once.
    stdinBase64: z.string().optional(),
    // As POST /processes (processes.ts): a name from the sandbox's /etc/passwd or a numeric uid;
    // absent = the agent's own user (root). HOME/USER/LOGNAME follow it, cwd defaults to its home.
    user: z.string().min(1).optional(),
  })
  .strict();
export type ExecRequest = z.infer<typeof ExecRequest>;

export const ExecResponse = z.object({
  exitCode: z.number().int().nullable(), // null when killed by a signal
  signal: z.string().nullable(),
  stdout: z.string(), // UTF-8 (invalid sequences replaced)
  stderr: z.string(),
  durationMs: z.number(),
  timedOut: z.boolean(),
  // True when a stream exceeded the agent's per-stream output cap; the tail was dropped.
  truncated: z.boolean(),
});
export type ExecResponse = z.infer<typeof ExecResponse>;

const ENV_VAR_NAME = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid variable name');
// `unset` names are removed before `env` is applied (Daytona's updateEnv; issue 19).
export const EnvRequest = z.object({ env: z.record(ENV_VAR_NAME, z.string().refine((v) => !v.includes('\0'), 'must not contain NUL')), unset: z.array(ENV_VAR_NAME).max(10_000).optional() }).strict();
export type EnvRequest = z.infer<typeof EnvRequest>;

export const FileType = z.enum(['file', 'dir', 'symlink', 'other']);
export const FileInfo = z.object({
  name: z.string(),
  path: z.string(), // absolute, inside the sandbox
  type: FileType,
  size: z.number(),
  mode: z.number().int(), // permission bits, e.g. 0o644 = 420
  mtime: z.string(), // ISO 8601
  symlinkTarget: z.string().optional(), // a symlink's own text, as readlink(2) gives it
  // A symlink that resolves: the absolute path at the end of every link, and the type and mode
  // of what is there (E2B describes links by these). Absent for a dangling or looping link.
  symlinkResolved: z.object({ path: z.string(), type: FileType, mode: z.number().int() }).optional(),
  // Owner names come from the sandbox's own /etc/passwd and /etc/group; an id without an
  // entry there is reported as the number in decimal.
  owner: z.string(),
  group: z.string(),
  uid: z.number().int(),
  gid: z.number().int(),
});
export type FileInfo = z.infer<typeof FileInfo>;

export const ListResponse = z.object({ entries: z.array(FileInfo) });
export type ListResponse = z.infer<typeof ListResponse>;

export const AgentError = z.object({ error: z.object({ code: z.string(), message: z.string() }) });
export type AgentError = z.infer<typeof AgentError>;
