// Guest-agent process routes: detached processes, their output, streams, stdin, signals, PTYs
// and sessions. Like types.ts, this file is shared by the host side and the guest-agent bundle,
// so it imports nothing but zod and types.ts. (The foreground `POST /exec` stays in types.ts.)
//
// Conventions: JSON in and out unless noted. Errors are `{ error: { code, message } }` with
// core's codes: validation_failed 400 (the message starts with the field name), not_found 404,
// conflict 409 (a session id that exists), invalid_state 409 (stdin closed, process finished,
// session ended), payload_too_large 413, internal 500. Timestamps are ISO 8601.
//
// PROCESSES
//
//   POST   /processes  StartProcessRequest → 201 ProcessInfo, as soon as the process is spawned.
//          Exactly one of argv/cmd (`cmd` runs `bash -lc cmd`, or `/bin/sh -c cmd` in an image
//          without bash; 400 on `cmd` in one without a shell). A bad cwd or unknown user is a
//          400 naming the field; a missing program gives a process that exits 127 at once (126
//          when it cannot be executed), with the reason on its stderr, like /exec.
//          Every process gets its own process group (a pty process: its own session, whose id is
//          its pid) and oom_score_adj 800, so the OOM killer takes workloads before the agent.
//          `user` is a name from the sandbox's /etc/passwd or a numeric uid (default: the
//          agent's user, root); HOME/USER/LOGNAME follow it and cwd defaults to its home.
//          `stdin: false` (default) connects stdin to /dev/null; `true` keeps a pipe open for
//          /stdin until /stdin/close. A pty process's input is its terminal and always open.
//          `pty` runs it on a terminal of that size: stdout carries the terminal's output,
//          stderr stays empty (except diagnostics of the pty helper), TERM defaults to
//          xterm-256color.
//   GET    /processes?all=true|false            → { processes: ProcessInfo[] } newest first;
//          running only unless all=true, which adds the retained history.
//   GET    /processes/{processId}               → ProcessInfo (404 if unknown or dropped)
//   GET    /processes/{processId}/output?stdoutOffset=&stderrOffset=&offset=&encoding=&maxBytes=
//          → OutputResponse. Offsets are absolute byte positions since the process started
//          (`offset` sets both); the answer's offsets are the NEXT ones to ask for. An offset
//          below retainedFrom reads from retainedFrom (the caller sees the gap). maxBytes
//          (default 1 MiB) bounds each stream. With utf8 (default) a multi-byte character is
//          never cut: the read stops before it and the offset says so (a character that is
//          still incomplete when the process has ended is decoded with U+FFFD).
//   GET    /processes/{processId}/events?stdoutOffset=&stderrOffset=   (offset= sets both)
//          WebSocket upgrade, or Server-Sent Events for a plain GET with
//          `Accept: text/event-stream`. Each message (a WS text frame, or one SSE `data:` line
//          followed by a blank line) is one ProcessEvent JSON:
//            {type:"stdout"|"stderr", offset, data}   offset = absolute offset of the chunk's
//                                                     first byte, data = base64
//            {type:"exit", status, exitCode, signal, timedOut}
//            {type:"keepalive"}                       every 15 s
//          First the retained output from the requested offsets (stdout and stderr interleaved
//          in the order they were produced), then live output, then exit, then the stream ends
//          (WS close 1000). Reconnecting with `offset + decoded length` of the last chunk seen
//          per stream loses nothing and repeats nothing. A chunk whose offset is above the one
//          asked for reveals bytes that were dropped by the retention bound.
//          Backpressure: nothing is queued per client. A client's stream is pulled from the
//          process's retained buffer at the client's own offsets, at most ~1 MiB in flight; a
//          slow client just falls behind (and, if it falls out of the retention window, sees a
//          gap as above). The process itself is never paused by a slow client.
//          A WS client that sends anything is ignored; an unknown process is an HTTP 404
//          before the upgrade.
//   POST   /processes/{processId}/stdin   raw body bytes → 204, written in order, each request
//          completing before its 204. 409 invalid_state if stdin is closed (or was never open)
//          or the process has ended. For a pty process the bytes go to the terminal.
//          `?echo=true` also appends each written chunk to the process's stdout (Daytona's
//          session input shows in the command's log, as a terminal would echo it).
//   POST   /processes/{processId}/stdin/close → 204 (idempotent while the process runs; a pty's
//          terminal input stops being read, the process keeps running)
//   POST   /processes/{processId}/signal  SignalRequest → 204, sent to the process group (a
//          session command: to the processes the command started, see SESSIONS).
//          409 invalid_state if the process has ended.
//   POST   /processes/{processId}/resize  ResizeRequest → 204 (400 naming `pty` if not a pty)
//   DELETE /processes/{processId} → 204 at once: SIGKILL to the whole process group (a pty: its
//          whole session). The process then ends with status "killed" (even when its main
//          process had already exited and only its group lived on). A no-op 204 if it ended.
//   GET    /processes/{processId}/pty   WebSocket upgrade, pty processes only (400 otherwise).
//          Binary frames both ways are raw terminal bytes. Client text frames are JSON control
//          messages: {type:"resize",cols,rows} or {type:"kill"}; anything else gets a text frame
//          {type:"error",message} and the socket stays open. On connect the server sends the
//          retained terminal output (binary), then live output; on exit a text frame
//          {type:"exit",exitCode,signal} and close 1000. Several clients may attach at once and
//          reconnecting to a running terminal works. Same backpressure rule as events. Idle
//          terminals get WebSocket pings every keepaliveIntervalMs (no message to filter out).
//          Input after the terminal ended, or after /stdin/close, is dropped silently.
//
// KERNELS (the code interpreter's Jupyter kernels; core/code-interpreter/types.ts has the values)
//
//   POST   /kernels  StartKernelRequest → 201 ProcessInfo once the kernel is ready. The process
//          is the kernel bridge (code-interpreter/bridge.py, shipped inside the agent): `python3
//          -u -c <bridge> --language L --idle-timeout S`, stdin open, otherwise as POST /processes
//          (tag, cwd, env, user). It starts a real Jupyter kernel for the language with
//          jupyter_client (kernelspec python3 for python, deno for javascript and typescript,
//          bash, ir for r) in its cwd with its env. Before anything starts, a language this
//          image has no kernel for (or no python3/jupyter_client at all) is a 400 naming
//          `language`; a kernel that then fails to start is a 500 with its reason. With no cell
//          for idleTimeoutSeconds (default 3600; 0 = never) the bridge shuts the kernel down
//          and exits 0. The kernel dies with the bridge (DELETE kills both); SIGTERM makes the
//          bridge shut its kernel's whole process group down and then die of the SIGTERM
//          (status killed); SIGHUP the same, exiting 129 (exited). A bridge's output
//          is retained up to 16 MiB per stream (a result is one stdout line, PNGs included).
//   GET    /kernels/languages → KernelLanguagesResponse: the languages this image has kernels
//          for, and why each other one is missing.
//   A cell: write `{"id":"<cell id>","code":"…","env_vars":{…}}` and a newline to the bridge's
//   stdin; cells run one after another. Its events are the stdout lines
//   `{"cell":"<cell id>","type":…}` (KernelEventLine), each a CodeEvent of
//   core/code-interpreter/types.ts: start{executionCount}, stdout|stderr{text} (one per Jupyter
//   stream message), result{main, data: the MIME bundle}, error{name,value,traceback}, then
//   end{status ok|error|interrupted|lost, executionCount?}. env_vars are set before the cell and
//   restored after it, by silent executions in the kernel's language. `{"interrupt":"<cell id>"}`
//   on stdin interrupts that cell (a queued one ends `interrupted` without running); SIGINT to
//   the bridge (or its process group) interrupts the running cell once. A cell the kernel does
//   not stop within 10 s of its interrupt, or a kernel that dies, ends `lost` and the bridge
//   exits (1). Lines with "cell": null are about the bridge (ready, fatal). Read them from the
//   stdout offset the process had before the write. (The typed client's runCell does all this.)
//
// SCRIPTS (one-shot programs: Daytona's codeRun)
//
//   POST   /scripts  RunScriptRequest → 200 RunScriptResponse when the program has ended. The
//          code goes in on the program's stdin: python through the agent's runner
//          (code-interpreter/script_runner.py: __main__, argv as sys.argv[1:], matplotlib Agg,
//          plt.show() reports each new figure on a `<chartMarker> {json}` line), javascript and
//          typescript with the image's `node -` (Node's own type stripping; argv as
//          process.argv.slice(2)). stdout and stderr are one pipe, so `output` is in write order.
//          timeoutMs kills the process group (timedOut true, exitCode null). A program that is not
//          installed exits 127 with the shell's message in `output`.
//
// SESSIONS: a named, persistent non-interactive `bash -l` (stdin from the agent, not a
// terminal; `/bin/sh -l` in an image without bash, a 400 on create without a shell) that runs commands one after another, so `cd`, `export`, shell variables and
// functions carry over. Each command gets an id that is ALSO a process id: /processes/{cid},
// /output, /events, /stdin, /signal and DELETE work for it. Its ProcessInfo has pid = the
// session shell's pid, cmd "bash", args ["-c", cmd], tag "session:<sessionId>", pty false.
//   POST   /sessions  CreateSessionRequest → 201 SessionCreated (409 conflict if the id exists;
//          409 invalid_state when maxSessions shells are alive)
//   GET    /sessions                       → { sessions: SessionInfo[] }
//   GET    /sessions/{sid}                 → SessionInfo
//   DELETE /sessions/{sid}                 → 204, kills the shell and everything it started
//   POST   /sessions/{sid}/commands  SessionCommandRequest → sync 200 SessionCommand with
//          stdout/stderr (the whole retained output as UTF-8), or async 202 SessionCommand
//          (status running). A command waits for the previous one to finish. 409 invalid_state
//          "session ended" after the shell exited (`exit 3` ends the session cleanly; that
//          command's exitCode is 3).
//   GET    /sessions/{sid}/commands/{cid}  → SessionCommand
// Session command caveats: stdin is /dev/null unless `stdin: true` (then a FIFO fed by
// /processes/{cid}/stdin; closing it or the command ending closes it). Signals and DELETE reach
// the processes the command started (the shell's children and their process groups); a
// builtin-only command (`while :; do :; done`) can only be stopped by DELETE /sessions/{sid}.
// Output that a background job of an earlier command writes later is counted to the command
// running at that time (or dropped when none is).
// A command's timeoutMs SIGKILLs its processes: status "killed", timedOut true, the session
// lives on.
//
// BOUNDS (constructor options of the guest agent, defaults in brackets):
//   maxRetainedBytesPerStream [4 MiB]  per stream per process; when exceeded the OLDEST bytes
//                                      are dropped and retainedFrom advances (offsets never
//                                      change meaning).
//   maxFinishedProcesses      [50]     finished processes kept for /processes/{id}; the
//                                      oldest-finished is forgotten (404 afterwards).
//   maxSessions               [64]     live session shells; creating one more is a 409.
//   keepaliveIntervalMs       [15000]  events keepalive period.
import { z } from 'zod';
import { MAX_TIMEOUT_MS } from './types.js';

export const PROCESS_SIGNALS = ['SIGTERM', 'SIGINT', 'SIGKILL', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT'] as const;
export const ProcessSignal = z.enum(PROCESS_SIGNALS);
export type ProcessSignal = z.infer<typeof ProcessSignal>;

const TerminalDimension = z.number().int().min(1).max(65535);
export const TerminalSize = z.object({ cols: TerminalDimension, rows: TerminalDimension }).strict();
export type TerminalSize = z.infer<typeof TerminalSize>;

export const StartProcessRequest = z
  .object({
    argv: z.array(z.string()).min(1).optional(),
    cmd: z.string().optional(),
    cwd: z.string().optional(),
    env: z.record(z.string(), z.string()).optional(),
    user: z.string().min(1).optional(),
    timeoutMs: z.number().int().min(0).max(MAX_TIMEOUT_MS).optional(),
    stdin: z.boolean().optional(),
    tag: z.string().optional(),
    pty: TerminalSize.optional(),
  })
  .strict();
export type StartProcessRequest = z.infer<typeof StartProcessRequest>;

/** The languages a kernel can speak (core's CODE_LANGUAGES, checked by guest-client.ts). */
export const KERNEL_LANGUAGES = ['python', 'javascript', 'typescript', 'bash', 'r'] as const;
export const KernelLanguage = z.enum(KERNEL_LANGUAGES);
/** Seven days: longer idle kernels are a leak, not a use. */
export const MAX_KERNEL_IDLE_SECONDS = 7 * 24 * 3600;
export const StartKernelRequest = z
  .object({
    language: KernelLanguage,
    tag: z.string().optional(),
    cwd: z.string().optional(),
    env: z.record(z.string(), z.string()).optional(),
    user: z.string().min(1).optional(),
    idleTimeoutSeconds: z.number().int().min(0).max(MAX_KERNEL_IDLE_SECONDS).optional(),
  })
  .strict();

export const KernelLanguagesResponse = z.object({
  languages: z.array(KernelLanguage),
  /** Why each other language has no kernel here, by language. */
  missing: z.record(z.string(), z.string()),
});

/** One line of a kernel bridge's stdout: an event of one cell (or, with cell null, of the bridge). */
export const KernelEventLine = z.looseObject({ type: z.string(), cell: z.string().nullable() });

export const SCRIPT_LANGUAGES = ['python', 'javascript', 'typescript'] as const;
export const RunScriptRequest = z
  .object({
    language: z.enum(SCRIPT_LANGUAGES),
    code: z.string(),
    argv: z.array(z.string()).optional(),
    env: z.record(z.string(), z.string()).optional(),
    cwd: z.string().optional(),
    user: z.string().min(1).optional(),
    timeoutMs: z.number().int().min(0).max(MAX_TIMEOUT_MS).optional(),
  })
  .strict();

export const RunScriptResponse = z.object({
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  timedOut: z.boolean(),
  /** stdout and stderr as one UTF-8 text, marker lines included. */
  output: z.string(),
  /** The prefix of the runner's chart lines in `output` (python only). */
  chartMarker: z.string(),
});

export const ProcessStatus = z.enum(['running', 'exited', 'killed']);
export type ProcessStatus = z.infer<typeof ProcessStatus>;

export const StreamPosition = z.object({ bytes: z.number().int(), retainedFrom: z.number().int() });

export const ProcessInfo = z.object({
  processId: z.string(),
  pid: z.number().int(),
  cmd: z.string(),
  args: z.array(z.string()),
  cwd: z.string(),
  tag: z.string().nullable(),
  user: z.string(),
  pty: z.boolean(),
  status: ProcessStatus,
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  timedOut: z.boolean(),
  startedAt: z.string(),
  endedAt: z.string().nullable(),
  stdout: StreamPosition,
  stderr: StreamPosition,
});
export type ProcessInfo = z.infer<typeof ProcessInfo>;

export const ProcessList = z.object({ processes: z.array(ProcessInfo) });
export type ProcessList = z.infer<typeof ProcessList>;

export const OutputEncoding = z.enum(['utf8', 'base64']);
export type OutputEncoding = z.infer<typeof OutputEncoding>;

export const OutputResponse = z.object({
  stdout: z.string(),
  stderr: z.string(),
  stdoutOffset: z.number().int(),
  stderrOffset: z.number().int(),
  stdoutRetainedFrom: z.number().int(),
  stderrRetainedFrom: z.number().int(),
  encoding: OutputEncoding,
  status: ProcessStatus,
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
});
export type OutputResponse = z.infer<typeof OutputResponse>;

export const ProcessEvent = z.discriminatedUnion('type', [
  z.object({ type: z.enum(['stdout', 'stderr']), offset: z.number().int(), data: z.string() }),
  z.object({
    type: z.literal('exit'),
    status: ProcessStatus,
    exitCode: z.number().int().nullable(),
    signal: z.string().nullable(),
    timedOut: z.boolean(),
  }),
  z.object({ type: z.literal('keepalive') }),
]);
export type ProcessEvent = z.infer<typeof ProcessEvent>;

export const SignalRequest = z.object({ signal: ProcessSignal }).strict();
export type SignalRequest = z.infer<typeof SignalRequest>;

export const ResizeRequest = TerminalSize;
export type ResizeRequest = TerminalSize;

/** Client → server text frames on the PTY WebSocket. */
export const PtyControlMessage = z.discriminatedUnion('type', [
  z.object({ type: z.literal('resize'), cols: TerminalDimension, rows: TerminalDimension }),
  z.object({ type: z.literal('kill') }),
]);
export type PtyControlMessage = z.infer<typeof PtyControlMessage>;

/** Server → client text frame on the PTY WebSocket, just before close 1000. */
export const PtyExitMessage = z.object({ type: z.literal('exit'), exitCode: z.number().int().nullable(), signal: z.string().nullable() });
export type PtyExitMessage = z.infer<typeof PtyExitMessage>;

export const SESSION_ID_PATTERN = /^[A-Za-z0-9_.-]{1,64}$/;

export const CreateSessionRequest = z
  .object({
    sessionId: z.string().regex(SESSION_ID_PATTERN, 'must be 1-64 characters of A-Z a-z 0-9 _ . -').optional(),
    cwd: z.string().optional(),
    env: z.record(z.string(), z.string()).optional(),
    // The shell's account, as POST /processes `user`.
    user: z.string().min(1).optional(),
  })
  .strict();
export type CreateSessionRequest = z.infer<typeof CreateSessionRequest>;

export const SessionCreated = z.object({ sessionId: z.string(), createdAt: z.string() });
export type SessionCreated = z.infer<typeof SessionCreated>;

export const SessionCommandRequest = z
  .object({
    cmd: z.string(),
    async: z.boolean().optional(),
    timeoutMs: z.number().int().min(0).max(MAX_TIMEOUT_MS).optional(),
    // Addition to the brief: feed the command's stdin through /processes/{cid}/stdin.
    stdin: z.boolean().optional(),
  })
  .strict();
export type SessionCommandRequest = z.infer<typeof SessionCommandRequest>;

export const SessionCommand = z.object({
  commandId: z.string(),
  cmd: z.string(),
  status: z.enum(['running', 'exited']),
  exitCode: z.number().int().nullable(),
  startedAt: z.string(),
  endedAt: z.string().nullable(),
  // Only in the answer of a synchronous POST /sessions/{sid}/commands.
  stdout: z.string().optional(),
  stderr: z.string().optional(),
});
export type SessionCommand = z.infer<typeof SessionCommand>;

export const SessionInfo = z.object({
  sessionId: z.string(),
  createdAt: z.string(),
  commands: z.array(SessionCommand),
});
export type SessionInfo = z.infer<typeof SessionInfo>;

export const SessionList = z.object({ sessions: z.array(SessionInfo) });
export type SessionList = z.infer<typeof SessionList>;
