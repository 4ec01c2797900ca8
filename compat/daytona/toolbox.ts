// Daytona toolbox (daytona.md (c)): process, session, PTY, file and info endpoints translated
// onto core's toolbox (core/services/toolbox.ts): typed calls in, typed values out, each
// rendered in Daytona's shape here. Guest errors get Daytona's daemon codes (errors.ts).
import { constants as osConstants } from 'node:os';
import { posix } from 'node:path';
import { pipeline } from 'node:stream/promises';
import express, { type Request, type Response, type Router } from 'express';
import { NestboxError, errors } from '../../core/errors.js';
import type { Principal } from '../../core/types.js';
import type { ExecInput, ExecResult, FileInfo, SessionInfo, UploadResult } from '../../core/guest.js';
import type { CompatPort } from '../../core/compat-port.js';
import { clientGoneSignal, streamedBody } from '../../http-kit/request-body.js';
import { handle, markedText, principalOf, queryString, requireQuery, wantsMarkedText, type DaytonaOptions, type ToolboxCall } from './context.js';
import { daytonaDownloadParts } from './download-parts.js';
import { daemonCall, daemonError, FILE_CODES, notSupported, PROCESS_CODES } from './errors.js';
import { createGitRoutes } from './git.js';
import { createLspRoutes } from './lsp.js';
import { createPty, findPty, ptyInfo, ptyProcesses } from './pty.js';
import { daytonaAccount } from './sandbox-dto.js';
import { toolboxSandboxId } from './builds.js';
import { codeRunRequest, codeRunResponse } from './code-run.js';
import { createInterpreterRoutes } from './interpreter.js';
import { createWorkdirs } from './workdirs.js';
import { giveTo, inHome, ownerOf } from '../sandbox-accounts.js';

/** Exit code of a process that a signal ended, the way shells report it (128 + signal number). */
export function exitCodeOf(r: Pick<ExecResult, 'exitCode' | 'signal'>): number {
  if (r.exitCode !== null) return r.exitCode;
  const n = r.signal ? (osConstants.signals as Record<string, number>)[r.signal] : undefined;
  return n ? 128 + n : -1;
}

/** Daytona FileInfo (daytona.md (c) "FileInfo"): mode as `ls -l` text, permissions as octal. */
export function daytonaFileInfo(f: FileInfo): Record<string, unknown> {
  const bits = 'rwxrwxrwx';
  let mode = f.type === 'dir' ? 'd' : f.type === 'symlink' ? 'L' : f.type === 'other' ? '?' : '-';
  for (let i = 0; i < 9; i++) mode += f.mode & (1 << (8 - i)) ? bits[i] : '-';
  return {
    name: f.name,
    path: f.path,
    isDir: f.type === 'dir',
    size: f.size,
    mode,
    permissions: `0${(f.mode & 0o777).toString(8).padStart(3, '0')}`,
    owner: f.owner,
    group: f.group,
    modTime: f.mtime,
    modifiedAt: f.mtime,
  };
}

/**
 * A command that ran past its timeout: the daemon's 408 (`DaytonaTimeoutError`), with the code
 * that selects `DaytonaProcessExecutionTimeoutError` and a message that says "timeout".
 */
function executionTimeout(what: string, seconds: unknown): NestboxError {
  return daemonError('timeout', `${what} timed out after ${seconds} seconds; raise the timeout parameter of the request to allow longer`, 'PROCESS_EXECUTION_TIMEOUT');
}

/** Session command logs are read whole, up to this much per stream. */
const SESSION_LOG_MAX_BYTES = 64 * 1024 * 1024;

/** Longest timeout a toolbox command may ask for, as the native API's `timeoutMs` maximum. */
const MAX_COMMAND_TIMEOUT_SECONDS = 86_400;

export function createToolboxRouter(core: Pick<CompatPort, 'toolbox' | 'sandboxes' | 'images' | 'codeInterpreter' | 'sandboxEnv'>, options: Pick<DaytonaOptions, 'log' | 'maxUploadBytes'>): Router {
  const router = express.Router({ mergeParams: true });
  const { sandboxes, toolbox } = core;
  const tb = (fn: (c: ToolboxCall) => Promise<void>) =>
    handle(options.log, 'toolbox', async (req, res) => {
      const principal = principalOf(res);
      await fn({ req, res, principal, sandboxId: await toolboxSandboxId(sandboxes, principal, String(req.params.sandboxId)) });
    });
  /** A client that goes away cancels the guest call (a foreground command is killed). */
  const untilGone = (c: ToolboxCall) => ({ signal: clientGoneSignal(c.req, c.res) });
  /** Daytona's `daytona` user (root in an image without it): every toolbox call acts as it. */
  const accountOf = (c: ToolboxCall) => daytonaAccount(toolbox, c.principal, c.sandboxId);
  /** A path query parameter, relative ones in the user's home (the daemon's working directory). */
  const pathIn = async (c: ToolboxCall, name = 'path') => inHome(requireQuery(c.req, name), (await accountOf(c)).home);
  /** The WORKDIR of the sandbox's image (workdirs.ts): commands without a cwd start there. */
  const workdirs = createWorkdirs(core);
  const imageWorkdir = (c: ToolboxCall): Promise<string | undefined> => workdirs.of(c.principal, c.sandboxId);
  /** Code runs and interpreter contexts: as the account, in the image's WORKDIR or its home. */
  const interpreterDefaults = async (c: ToolboxCall) => {
    const account = await accountOf(c);
    return { user: account.name, cwd: (await imageWorkdir(c)) ?? account.home };
  };
  const execIn = async (c: ToolboxCall, input: ExecInput): Promise<ExecResult> => toolbox.exec(c.principal, c.sandboxId, { ...input, cwd: input.cwd ?? (await imageWorkdir(c)), user: (await accountOf(c)).name }, untilGone(c));
  const sessionOf = (c: ToolboxCall) => String(c.req.params.sessionId);
  const commandOf = (c: ToolboxCall) => String(c.req.params.commandId);
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' ? (req.body as Record<string, unknown>) : {});
  const str = (v: unknown, field: string, required = false): string | undefined => {
    if (v === undefined || v === null) {
      if (required) throw errors.validation(field, 'is required');
      return undefined;
    }
    if (typeof v !== 'string') throw errors.validation(field, 'must be a string');
    return v;
  };
  const envOf = (v: unknown, field: string): Record<string, string> | undefined => {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'object' || Array.isArray(v) || Object.values(v).some((x) => typeof x !== 'string')) throw errors.validation(field, 'must be an object of strings');
    return v as Record<string, string>;
  };
  const timeoutOf = (v: unknown): number | undefined => {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw errors.validation('timeout', 'must be a number of seconds');
    // The native API's limit for a command (24 h). Past 2^31 ms a timer fires at once, so a
    // huge timeout used to end the command immediately with a 504 (found by the fuzz suite).
    if (v > MAX_COMMAND_TIMEOUT_SECONDS) throw errors.validation('timeout', `must be at most ${MAX_COMMAND_TIMEOUT_SECONDS} seconds (0 = none)`);
    return Math.round(v * 1000);
  };

  // --- process (daytona.md (c) "Process") -------------------------------------------------

  // The real daemon merges stderr into stdout and answers 408 on timeout (appendix B).
  router.post('/process/execute', tb(async (c) => {
    const b = body(c.req);
    const command = str(b.command, 'command', true)!;
    const r = await execIn(c, { cmd: `exec 2>&1\n${command}`, cwd: str(b.cwd, 'cwd') || undefined, env: envOf(b.envs, 'envs'), timeoutMs: timeoutOf(b.timeout) });
    if (r.timedOut) throw executionTimeout('command execution', b.timeout);
    c.res.json({ exitCode: exitCodeOf(r), result: r.stdout });
  }));

  // daytona-wave2 §4.1: python, typescript and javascript through core's one-shot runner, stdout
  // and stderr merged, charts of python's plt.show() in artifacts.charts; 408 past the timeout.
  router.post('/process/code-run', tb(async (c) => {
    const b = body(c.req);
    const request = codeRunRequest(b);
    const timeoutMs = timeoutOf(b.timeout);
    const r = await core.codeInterpreter.runScript(c.principal, c.sandboxId, { ...request, ...(await interpreterDefaults(c)), timeoutMs: timeoutMs || undefined }, untilGone(c));
    if (r.timedOut) throw executionTimeout('code execution', b.timeout);
    c.res.json(codeRunResponse(r));
  }));

  // Sessions: a Daytona session is a guest-agent session; its command ids are process ids.
  const sessionJson = (s: SessionInfo) => ({
    sessionId: s.sessionId,
    commands: s.commands.map((cmd) => ({ id: cmd.commandId, command: cmd.cmd, ...(cmd.status === 'exited' ? { exitCode: cmd.exitCode ?? -1 } : {}) })),
  });
  router.post('/process/session', tb(async (c) => {
    const sessionId = str(body(c.req).sessionId, 'sessionId', true);
    await toolbox.createSession(c.principal, c.sandboxId, { sessionId, user: (await accountOf(c)).name });
    c.res.status(201).end();
  }));
  router.get('/process/session', tb(async (c) => {
    const list = await toolbox.listSessions(c.principal, c.sandboxId);
    c.res.json(list.sessions.map(sessionJson));
  }));
  // Nestbox sandboxes have no entrypoint command: the entrypoint session exists and is empty.
  router.get('/process/session/entrypoint', tb(async (c) => {
    await sandboxes.get(c.principal, c.sandboxId);
    c.res.json({ sessionId: 'entrypoint', commands: [] });
  }));
  router.get('/process/session/entrypoint/logs', tb(async (c) => {
    await sandboxes.get(c.principal, c.sandboxId);
    if (wantsMarkedText(c.req)) c.res.type('text/plain').send('');
    else c.res.json({ output: '', stdout: '', stderr: '' });
  }));
  router.get('/process/session/:sessionId', tb(async (c) => {
    const s = await daemonCall(PROCESS_CODES, toolbox.getSession(c.principal, c.sandboxId, sessionOf(c)));
    c.res.json(sessionJson(s));
  }));
  router.delete('/process/session/:sessionId', tb(async (c) => {
    await daemonCall(PROCESS_CODES, toolbox.deleteSession(c.principal, c.sandboxId, sessionOf(c)));
    c.res.status(204).end();
  }));
  router.post('/process/session/:sessionId/exec', tb(async (c) => {
    const b = body(c.req);
    const command = str(b.command, 'command', true)!;
    const runAsync = b.runAsync === true || b.async === true;
    const { status, command: cmd } = await daemonCall(
      { ...PROCESS_CODES, invalid_state: 'SESSION_ENDED' },
      // stdin is kept open for asynchronous commands only: input can be sent to those while they run.
      toolbox.runSessionCommand(c.principal, c.sandboxId, sessionOf(c), { cmd: command, async: runAsync, stdin: runAsync || undefined }, untilGone(c)),
    );
    // daytona.md (h) 17: asynchronous commands are answered with 202 {cmdId}.
    if (runAsync || status === 202) {
      c.res.status(202).json({ cmdId: cmd.commandId });
      return;
    }
    const stdout = cmd.stdout ?? '';
    const stderr = cmd.stderr ?? '';
    c.res.json({
      cmdId: cmd.commandId,
      exitCode: cmd.exitCode ?? -1,
      output: wantsMarkedText(c.req) ? markedText(stdout, stderr) : stdout + stderr,
      stdout,
      stderr,
    });
  }));
  router.get('/process/session/:sessionId/command/:commandId', tb(async (c) => {
    const cmd = await daemonCall(PROCESS_CODES, toolbox.getSessionCommand(c.principal, c.sandboxId, sessionOf(c), commandOf(c)));
    // daytona.md (h) 17: no exitCode means "still running".
    c.res.json({ id: cmd.commandId, command: cmd.cmd, ...(cmd.status === 'exited' ? { exitCode: cmd.exitCode ?? -1 } : {}) });
  }));
  router.get('/process/session/:sessionId/command/:commandId/logs', tb(async (c) => {
    // The session must exist and own the command (command ids are process ids in the guest).
    await daemonCall(PROCESS_CODES, toolbox.getSessionCommand(c.principal, c.sandboxId, sessionOf(c), commandOf(c)));
    const out = await daemonCall(PROCESS_CODES, toolbox.processOutput(c.principal, c.sandboxId, commandOf(c), { offset: 0, maxBytes: SESSION_LOG_MAX_BYTES }));
    // daytona.md (h) 9: JSON for SDK ≥ 0.167, marked text for older ones.
    if (wantsMarkedText(c.req)) c.res.type('text/plain').send(markedText(out.stdout, out.stderr));
    else c.res.json({ output: out.stdout + out.stderr, stdout: out.stdout, stderr: out.stderr });
  }));
  router.post('/process/session/:sessionId/command/:commandId/input', tb(async (c) => {
    const data = str(body(c.req).data, 'data', true)!;
    // As the daemon: a line is completed with a newline (so `read` returns), and the input is
    // echoed into the command's log as stdout.
    const line = data.endsWith('\n') ? data : `${data}\n`;
    // The command must be the session's (command ids are process ids in the guest).
    await daemonCall(PROCESS_CODES, toolbox.getSessionCommand(c.principal, c.sandboxId, sessionOf(c), commandOf(c)));
    await daemonCall({ ...PROCESS_CODES, invalid_state: 'COMMAND_ALREADY_COMPLETED' }, toolbox.writeStdin(c.principal, c.sandboxId, commandOf(c), Buffer.from(line), { echo: true }));
    c.res.status(204).end();
  }));

  // PTY HTTP calls (the WebSockets are in websockets.ts). SDK 0.150–0.190 create with a POST.
  router.post('/process/pty', tb(async (c) => {
    const b = body(c.req);
    const id = str(b.id, 'id', true)!;
    await createPty(toolbox, c.principal, c.sandboxId, { id, cols: typeof b.cols === 'number' ? b.cols : undefined, rows: typeof b.rows === 'number' ? b.rows : undefined, cwd: str(b.cwd, 'cwd') || (await imageWorkdir(c)), envs: envOf(b.envs, 'envs') });
    c.res.status(201).json({ sessionId: id });
  }));
  router.get('/process/pty', tb(async (c) => {
    const list = await toolbox.listProcesses(c.principal, c.sandboxId);
    c.res.json({ sessions: ptyProcesses(list.processes).map((p) => ptyInfo(p)) });
  }));
  const requirePty = async (c: ToolboxCall, includeEnded = false) => {
    const id = String(c.req.params.ptyId);
    const p = await findPty(toolbox, c.principal, c.sandboxId, id, includeEnded);
    if (!p) throw daemonError('not_found', `PTY session ${id} not found`, 'PROCESS_NOT_FOUND');
    return p;
  };
  router.get('/process/pty/:ptyId', tb(async (c) => {
    c.res.json(ptyInfo(await requirePty(c, true)));
  }));
  router.post('/process/pty/:ptyId/resize', tb(async (c) => {
    const b = body(c.req);
    const p = await requirePty(c);
    const size = { cols: Number(b.cols), rows: Number(b.rows) };
    await daemonCall(PROCESS_CODES, toolbox.resizeTerminal(c.principal, c.sandboxId, p.processId, size));
    c.res.json(ptyInfo(p, size));
  }));
  router.delete('/process/pty/:ptyId', tb(async (c) => {
    const p = await requirePty(c);
    await daemonCall(PROCESS_CODES, toolbox.killProcess(c.principal, c.sandboxId, p.processId));
    // The daemon answers with a message, and the generated clients parse a JSON body here (the
    // Python async client fails on an empty one).
    c.res.status(200).json({ message: 'PTY session deleted' });
  }));

  // Interpreter contexts (daytona-wave2 §4.2); the execute socket is in websockets.ts.
  router.use('/process/interpreter', createInterpreterRoutes(core, tb, interpreterDefaults));

  // --- files (daytona.md (c) "File system", (d)) --------------------------------------------

  /** A file call: a missing or forbidden path is Daytona's FILE_NOT_FOUND / FILE_ACCESS_DENIED. */
  const file = <T>(call: Promise<T>): Promise<T> => daemonCall(FILE_CODES, call);
  /** `?depth=` passed on as given; the guest names a bad value (400). */
  const depthOf = (c: ToolboxCall): number | undefined => {
    const v = queryString(c.req, 'depth');
    return v === undefined ? undefined : Number(v);
  };

  router.get('/files', tb(async (c) => {
    const list = await file(toolbox.listFiles(c.principal, c.sandboxId, { path: await pathIn(c), depth: depthOf(c) }));
    c.res.json(list.entries.map(daytonaFileInfo));
  }));
  router.get('/files/info', tb(async (c) => {
    c.res.json(daytonaFileInfo(await file(toolbox.statFile(c.principal, c.sandboxId, await pathIn(c)))));
  }));
  router.post('/files/folder', tb(async (c) => {
    const made = await file(toolbox.makeDirectory(c.principal, c.sandboxId, { path: await pathIn(c), mode: queryString(c.req, 'mode') || undefined, owner: ownerOf(await accountOf(c)) }));
    // The daemon runs as the sandbox's user, so what it creates is that user's.
    if (made.created) await file(giveTo(toolbox, c.principal, c.sandboxId, made.info.path, await accountOf(c)));
    c.res.status(201).end();
  }));
  router.delete('/files', tb(async (c) => {
    await file(toolbox.deleteFile(c.principal, c.sandboxId, { path: await pathIn(c), recursive: queryString(c.req, 'recursive') === 'true' || undefined }));
    c.res.status(204).end();
  }));
  // Daytona's move renames over an existing file, like rename(2).
  router.post('/files/move', tb(async (c) => {
    await file(toolbox.moveFile(c.principal, c.sandboxId, { from: await pathIn(c, 'source'), to: await pathIn(c, 'destination'), overwrite: true }));
    c.res.status(200).end();
  }));
  router.post('/files/permissions', tb(async (c) => {
    const path = await pathIn(c);
    const mode = queryString(c.req, 'mode') || undefined;
    const owner = queryString(c.req, 'owner') || undefined;
    const group = queryString(c.req, 'group') || undefined;
    if (owner || group) await file(toolbox.changeOwner(c.principal, c.sandboxId, { path, owner, group }));
    if (mode) await file(toolbox.changeMode(c.principal, c.sandboxId, { path, mode }));
    c.res.status(200).end();
  }));
  // Daytona's find is a content search (grep -rn), its search a name glob: the names are swapped
  // relative to core's operations.
  router.get('/files/find', tb(async (c) => {
    const found = await file(toolbox.searchFiles(c.principal, c.sandboxId, { path: await pathIn(c), query: requireQuery(c.req, 'pattern') }));
    c.res.json(found.matches.map((m) => ({ file: m.path, line: m.line, content: m.text })));
  }));
  router.get('/files/search', tb(async (c) => {
    const found = await file(toolbox.findFiles(c.principal, c.sandboxId, { path: await pathIn(c), pattern: requireQuery(c.req, 'pattern') }));
    c.res.json({ files: found.paths });
  }));
  router.post('/files/replace', tb(async (c) => {
    const b = body(c.req);
    if (!Array.isArray(b.files) || b.files.some((f) => typeof f !== 'string')) throw errors.validation('files', 'must be an array of paths');
    const paths = b.files as string[];
    const home = (await accountOf(c)).home;
    const replaced = await file(toolbox.replaceInFiles(c.principal, c.sandboxId, { paths: paths.map((p) => inHome(p, home)), find: str(b.pattern, 'pattern', true)!, replace: str(b.newValue, 'newValue', true)! }));
    c.res.json(replaced.results.map((r, i) => ({ file: paths[i] !== undefined ? paths[i] : r.path, success: !r.error, ...(r.error ? { error: r.error.message } : {}) })));
  }));

  /**
   * Multipart uploads stream through to core's uploadFiles as they are: Daytona's bulk form
   * (`files[i].path` + `files[i].file`) is the native one, and its single-file form is a `file`
   * part to `?path=` (daytona.md (d)).
   */
  const forwardUpload = async (c: ToolboxCall, path?: string): Promise<UploadResult['results']> => {
    const contentType = c.req.headers['content-type'];
    if (!contentType?.startsWith('multipart/form-data')) throw new NestboxError('unsupported_media_type', 'content-type: must be multipart/form-data');
    // The same upload limit as the native API, enforced while streaming (bulk uploads are chunked).
    const max = options.maxUploadBytes;
    if (Number(c.req.headers['content-length'] ?? 0) > max) throw new NestboxError('payload_too_large', `body: exceeds the upload limit of ${max} bytes`);
    const account = await accountOf(c);
    const result = await file(toolbox.uploadFiles(c.principal, c.sandboxId, { contentType, path: path && inHome(path, account.home), base: account.home, owner: ownerOf(account), body: streamedBody(c.req, max) }, untilGone(c)));
    for (const r of result.results) if (r.ok) await file(giveTo(toolbox, c.principal, c.sandboxId, r.path, account));
    const failed = result.results.filter((r) => !r.ok);
    if (failed.length) {
      const first = failed[0] as { path: string; error: { code: string; message: string } };
      throw new NestboxError('validation_failed', `upload failed for ${failed.length} file(s): ${first.path}: ${first.error.message}`);
    }
    return result.results;
  };
  const uploadedFiles = (results: UploadResult['results']) => ({ files: results.map((r) => ({ path: r.path, bytes: r.ok ? r.size : 0 })) });
  router.post('/files/bulk-upload', tb(async (c) => {
    c.res.json(uploadedFiles(await forwardUpload(c)));
  }));
  // upload-v2 (signed upload URLs): one `file` part to ?path=, answered with the daemon's
  // UploadedFile, which the generated clients parse.
  router.post('/files/upload-v2', tb(async (c) => {
    const path = requireQuery(c.req, 'path');
    await forwardUpload(c, path);
    c.res.json({ name: posix.basename(path), path, type: 'file' });
  }));
  router.post('/files/upload', tb(async (c) => {
    c.res.json(uploadedFiles(await forwardUpload(c, requireQuery(c.req, 'path'))));
  }));

  // Bulk download (daytona.md (d)): core's multipart, one part per path, with each `error`
  // part's body rewritten to Daytona's daemon shape on the way through (download-parts.ts).
  router.post('/files/bulk-download', tb(async (c) => {
    const b = body(c.req);
    if (!Array.isArray(b.paths) || b.paths.length === 0 || b.paths.some((p) => typeof p !== 'string')) throw errors.validation('paths', 'must be a non-empty array of paths');
    // Parts are named by the paths as asked (the SDK matches them); relative ones are in the user's home.
    const stream = await file(toolbox.downloadFiles(c.principal, c.sandboxId, { paths: b.paths as string[], base: (await accountOf(c)).home }, untilGone(c)));
    const rewrite = daytonaDownloadParts(stream.headers.contentType);
    c.res.status(200);
    if (stream.headers.contentType) c.res.setHeader('content-type', stream.headers.contentType);
    await pipeline(stream.body, rewrite, c.res);
  }));
  // Raw single-file download (signed download URLs).
  router.get('/files/download', tb(async (c) => {
    const stream = await file(toolbox.readFile(c.principal, c.sandboxId, await pathIn(c), {}, untilGone(c)));
    c.res.status(200);
    c.res.setHeader('content-type', 'application/octet-stream');
    if (stream.headers.contentLength) c.res.setHeader('content-length', stream.headers.contentLength);
    await pipeline(stream.body, c.res);
  }));

  // --- info, env, metrics (daytona.md (c) "Info, env, metrics") ----------------------------

  router.get('/user-home-dir', tb(async (c) => {
    const r = await execIn(c, { argv: ['/bin/sh', '-c', 'printf %s "$HOME"'] });
    c.res.json({ dir: r.stdout || (await accountOf(c)).home });
  }));
  // Commands start in the image's WORKDIR, else the user's home, unless given a cwd: that is the work dir.
  router.get('/work-dir', tb(async (c) => {
    const r = await execIn(c, { argv: ['/bin/pwd'] });
    c.res.json({ dir: r.stdout.trim() });
  }));
  router.get('/system/metrics', tb(async (c) => {
    c.res.json({ ...(await toolbox.systemMetrics(c.principal, c.sandboxId, untilGone(c))), timestamp: new Date().toISOString() });
  }));
  router.get('/version', tb(async (c) => {
    c.res.json({ version: 'nestbox' });
  }));
  // sb.updateEnv(): `unset` removed, then `set` applied, for every later process, session and
  // PTY; kept with the sandbox across stop/start (core/services/sandbox-env.ts).
  // The Python toolbox client sends this body without a Content-Type: JSON whatever it says.
  router.post('/env', express.json({ limit: '1mb', type: () => true }), tb(async (c) => {
    const body = (c.req.body ?? {}) as { set?: unknown; unset?: unknown; unsetValuePrefix?: unknown };
    if (body.unsetValuePrefix !== undefined) throw notSupported('unsetValuePrefix', 'name the variables in unset');
    const sandbox = await core.sandboxEnv.update(c.principal, c.sandboxId, { set: body.set, unset: body.unset });
    c.res.json(sandbox.env);
  }));

  router.use('/git', createGitRoutes(toolbox, tb));
  router.use('/lsp', createLspRoutes(toolbox, tb));

  const area = (path: string, feature: string, why?: string) => router.all(path, tb(async () => {
    throw notSupported(feature, why);
  }));
  area(/^\/computeruse(\/.*)?$/ as unknown as string, 'computer use', 'Nestbox sandboxes have no desktop');
  area(/^\/port(\/.*)?$/ as unknown as string, 'port discovery');
  return router;
}
