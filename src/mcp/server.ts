// The MCP server: Nestbox as tools an AI agent can call. It is a client of the native API and
// nothing else: every tool call is one or a few requests through NativeClient with the caller's
// key, so the key's scopes, its sandbox limits and its organisation apply exactly as they do to
// curl. Used over stdio by `nestbox mcp` (src/mcp/stdio.ts) and over streamable HTTP at `/mcp`
// (src/http/mcp.ts), one server per request there.
import { stripVTControlCharacters } from 'node:util';
import { McpServer, type ToolCallback } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { NativeApiError, type CodeRunResult, type CommandResult, type NativeClient, type Sandbox, type SandboxState } from '../client/native-client.js';

export const MCP_SERVER_NAME = 'nestbox';
export const MCP_SERVER_VERSION = '0.1.0';

/** read_file answers at most this much unless asked for less: an agent's context is small. */
const READ_FILE_DEFAULT_BYTES = 256 * 1024;
const READ_FILE_MAX_BYTES = 4 * 1024 * 1024;

const SANDBOX_STATES = ['creating', 'running', 'stopping', 'stopped', 'starting', 'pausing', 'paused', 'resuming', 'deleting', 'error'] as const satisfies readonly SandboxState[];

const sandboxId = z.string().min(1).describe('The sandbox id, as create_sandbox or list_sandboxes answered it.');
const stringMap = (what: string) => z.record(z.string(), z.string()).describe(what);
const absolutePath = (what: string) => z.string().min(1).describe(`${what} Absolute, or relative to the sandbox user's home directory.`);

const text = (value: string) => ({ type: 'text' as const, text: value });
const json = (value: unknown) => JSON.stringify(value, null, 2);

/** A tool's answer as text an agent reads, with the same data structured for programs. */
function answer(summary: string, structured?: Record<string, unknown>): CallToolResult {
  return structured ? { content: [text(summary)], structuredContent: structured } : { content: [text(summary)] };
}

/**
 * An API refusal (forbidden, not_found, invalid_state…) is something the agent should read and
 * act on, so it is a tool result with isError, not a protocol error; so is an API that cannot
 * be reached. The message is the API's own (it names the field or the missing scope).
 */
function failure(err: unknown, baseUrl: string): CallToolResult {
  if (err instanceof NativeApiError) {
    return {
      isError: true,
      content: [text(`${err.code}: ${err.message}`)],
      structuredContent: { error: { code: err.code, message: err.message, status: err.status, ...(err.details !== undefined ? { details: err.details } : {}) } },
    };
  }
  if (err instanceof Error && err.name === 'AbortError') return { isError: true, content: [text('cancelled: the call was cancelled before the API answered')] };
  // fetch's own failure (connection refused, DNS): say where, not a stack trace.
  const reason = err instanceof Error ? ((err.cause as Error | undefined)?.message ?? err.message) : String(err);
  return { isError: true, content: [text(`unreachable: the Nestbox API at ${baseUrl} did not answer (${reason})`)], structuredContent: { error: { code: 'unreachable', message: reason } } };
}

/** The fields of a sandbox an agent needs to decide what to do next. */
function sandboxSummary(s: Sandbox): Record<string, unknown> {
  return {
    id: s.id,
    state: s.state,
    image: s.image,
    cpu: s.cpu,
    memoryMiB: s.memoryMiB,
    labels: s.labels,
    timeoutSeconds: s.timeoutSeconds,
    expiresAt: s.expiresAt,
    createdAt: s.createdAt,
    ...(s.egress ? { egress: s.egress } : {}),
    ...(s.errorMessage ? { errorMessage: s.errorMessage } : {}),
  };
}

function commandText(r: CommandResult): string {
  const how = r.timedOut ? `timed out after ${r.durationMs} ms (killed${r.signal ? ` by ${r.signal}` : ''})` : r.signal ? `killed by ${r.signal}` : `exit code ${r.exitCode}`;
  const lines = [`${how}, ${r.durationMs} ms${r.truncated ? ' (output truncated)' : ''}`];
  lines.push('--- stdout ---', r.stdout.replace(/\n$/, ''));
  if (r.stderr) lines.push('--- stderr ---', r.stderr.replace(/\n$/, ''));
  return lines.join('\n');
}

/** Image MIME types MCP clients show as images; everything else of a result goes in as text. */
const IMAGE_TYPES = ['image/png', 'image/jpeg'] as const;

function codeResult(r: CodeRunResult): CallToolResult {
  const content: CallToolResult['content'] = [];
  const parts: string[] = [`status: ${r.status}${r.executionCount !== null ? ` (execution ${r.executionCount})` : ''}`];
  if (r.stdout) parts.push('--- stdout ---', r.stdout.replace(/\n$/, ''));
  if (r.stderr) parts.push('--- stderr ---', r.stderr.replace(/\n$/, ''));
  const images: CallToolResult['content'] = [];
  r.results.forEach((result, i) => {
    const kinds = Object.keys(result.data);
    const plain = typeof result.data['text/plain'] === 'string' ? result.data['text/plain'] : undefined;
    const label = result.main ? 'result' : `display ${i + 1}`;
    parts.push(`--- ${label} (${kinds.join(', ')}) ---`);
    if (plain !== undefined) parts.push(plain);
    for (const mimeType of IMAGE_TYPES) {
      const data = result.data[mimeType];
      if (typeof data === 'string') images.push({ type: 'image', data, mimeType });
    }
  });
  if (r.error) {
    // Jupyter colours tracebacks with terminal escapes; an agent reads them as noise.
    parts.push(`--- error ---`, `${r.error.name}: ${r.error.value}`, stripVTControlCharacters(r.error.traceback));
  }
  content.push(text(parts.join('\n')), ...images);
  return {
    content,
    // Binary payloads are in the image content already; structured results list their types.
    structuredContent: {
      status: r.status,
      executionCount: r.executionCount,
      stdout: r.stdout,
      stderr: r.stderr,
      text: r.text,
      results: r.results.map((res) => ({ main: res.main, types: Object.keys(res.data), text: typeof res.data['text/plain'] === 'string' ? res.data['text/plain'] : null })),
      error: r.error ? { ...r.error, traceback: stripVTControlCharacters(r.error.traceback) } : null,
    },
    // The cell failed (an exception, an interrupt, a kernel that died): the agent should see that.
    ...(r.status !== 'ok' ? { isError: true } : {}),
  };
}

/** The MCP server for one caller: every tool acts through `client` (and so with its key). */
export function createMcpServer(client: NativeClient): McpServer {
  const server = new McpServer(
    { name: MCP_SERVER_NAME, version: MCP_SERVER_VERSION, title: 'Nestbox sandboxes' },
    {
      instructions:
        'Nestbox runs isolated Linux sandboxes. Create one with create_sandbox, then run shell commands (run_command), ' +
        'Python in a persistent Jupyter kernel (run_code), and read, write or list its files. Sandboxes stop by themselves ' +
        'after timeoutSeconds; delete_sandbox when done. Errors come back as results whose text starts with the API error code.',
    },
  );

  /** Register a tool whose handler's API failures become isError results. */
  const tool = <Shape extends z.ZodRawShape>(
    name: string,
    config: { title: string; description: string; inputSchema: Shape; readOnly?: boolean; destructive?: boolean; idempotent?: boolean },
    run: (args: z.infer<z.ZodObject<Shape>>, signal: AbortSignal) => Promise<CallToolResult>,
  ) => {
    server.registerTool(
      name,
      {
        title: config.title,
        description: config.description,
        inputSchema: config.inputSchema,
        annotations: { readOnlyHint: config.readOnly ?? false, destructiveHint: config.destructive ?? false, idempotentHint: config.idempotent ?? false, openWorldHint: false },
      },
      // The SDK has validated the arguments against the schema by now. (Cast: the SDK's callback
      // type over a generic shape does not reduce to the shape's own inferred type.)
      (async (args: z.infer<z.ZodObject<Shape>>, extra: { signal: AbortSignal }) => {
        try {
          return await run(args, extra.signal);
        } catch (err) {
          return failure(err, client.baseUrl);
        }
      }) as unknown as ToolCallback<Shape>,
    );
  };

  tool('create_sandbox', {
    title: 'Create a sandbox',
    description:
      'Create a new sandbox (an isolated Linux machine) and wait until it is running. Answers its id, which every other tool takes. ' +
      'Image "default" (Debian with Python) unless told otherwise; "code-interpreter" adds numpy, pandas, matplotlib and more kernels.',
    inputSchema: {
      image: z.string().min(1).optional().describe('Image name or name:tag, e.g. "default" or "code-interpreter". Default: the server\'s default image.'),
      cpu: z.number().positive().optional().describe('CPU cores (fractions allowed, e.g. 0.5).'),
      memoryMiB: z.number().int().positive().optional().describe('Memory limit in MiB.'),
      env: stringMap('Environment variables every process in the sandbox gets.').optional(),
      labels: stringMap('Labels (key → value) to find the sandbox again with list_sandboxes.').optional(),
      timeoutSeconds: z.number().int().min(0).optional().describe('Seconds until the sandbox is stopped by itself; 0 = never.'),
      egress: z.object({
        mode: z.enum(['allow-all', 'deny-all', 'allow-list']).describe('"deny-all" = no network beyond the sandbox; "allow-list" = only the hosts in allow.'),
        allow: z.array(z.string()).optional().describe('Host names or CIDRs reachable with mode "allow-list".'),
        deny: z.array(z.string()).optional().describe('Host names or CIDRs never reachable.'),
      }).optional().describe('Outbound network policy. Default: the server\'s (usually allow-all).'),
    },
  }, async (args) => {
    const sandbox = await client.createSandbox(args);
    return answer(`created sandbox ${sandbox.id} (${sandbox.state})\n${json(sandboxSummary(sandbox))}`, sandboxSummary(sandbox));
  });

  tool('list_sandboxes', {
    title: 'List sandboxes',
    description: 'List the sandboxes this key can see, newest first, optionally filtered by labels and states.',
    readOnly: true,
    inputSchema: {
      labels: stringMap('Only sandboxes with all of these labels.').optional(),
      states: z.array(z.enum(SANDBOX_STATES)).optional().describe('Only sandboxes in one of these states, e.g. ["running"].'),
      limit: z.number().int().min(1).max(1000).optional().describe('At most this many (default 50).'),
      cursor: z.string().optional().describe('nextCursor of a previous answer, for the next page.'),
    },
  }, async ({ labels, states, limit, cursor }) => {
    const page = await client.listSandboxes({ label: labels ? Object.entries(labels).map(([k, v]) => `${k}=${v}`) : undefined, state: states, limit: limit ?? 50, cursor });
    const items = page.items.map(sandboxSummary);
    const lines = page.items.map((s) => `${s.id}  ${s.state}  ${s.image}  cpu=${s.cpu} mem=${s.memoryMiB}MiB${Object.keys(s.labels).length ? `  ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(',')}` : ''}`);
    const summary = `${items.length} sandbox${items.length === 1 ? '' : 'es'}${page.nextCursor ? ` (more: cursor ${page.nextCursor})` : ''}${lines.length ? `\n${lines.join('\n')}` : ''}`;
    return answer(summary, { items, nextCursor: page.nextCursor });
  });

  tool('get_sandbox', {
    title: 'Get a sandbox',
    description: 'The state, image, size, labels and expiry of one sandbox.',
    readOnly: true,
    inputSchema: { sandboxId },
  }, async ({ sandboxId: id }) => {
    const sandbox = await client.getSandbox(id);
    return answer(json(sandboxSummary(sandbox)), sandboxSummary(sandbox));
  });

  tool('delete_sandbox', {
    title: 'Delete a sandbox',
    description: 'Delete a sandbox and everything in it. This cannot be undone.',
    destructive: true,
    idempotent: true,
    inputSchema: { sandboxId },
  }, async ({ sandboxId: id }) => {
    await client.deleteSandbox(id);
    return answer(`deleted sandbox ${id}`, { id, deleted: true });
  });

  tool('stop_sandbox', {
    title: 'Stop a sandbox',
    description: 'Stop a running sandbox: its processes end, its files are kept. resume_sandbox starts it again.',
    idempotent: true,
    inputSchema: { sandboxId },
  }, async ({ sandboxId: id }) => {
    const sandbox = await client.stopSandbox(id);
    return answer(`sandbox ${id} is ${sandbox.state}`, sandboxSummary(sandbox));
  });

  tool('resume_sandbox', {
    title: 'Resume a sandbox',
    description: 'Start a stopped sandbox again, with the files it had.',
    idempotent: true,
    inputSchema: { sandboxId },
  }, async ({ sandboxId: id }) => {
    const sandbox = await client.resumeSandbox(id);
    return answer(`sandbox ${id} is ${sandbox.state}`, sandboxSummary(sandbox));
  });

  tool('run_command', {
    title: 'Run a shell command',
    description:
      'Run a shell command (bash -lc) in a sandbox and wait for it to end. Answers the exit code, stdout and stderr. ' +
      'Give timeoutMs for anything that might not end by itself.',
    inputSchema: {
      sandboxId,
      cmd: z.string().min(1).describe('The command line, run by a shell, e.g. "ls -la /tmp && python3 --version".'),
      cwd: z.string().min(1).optional().describe('Working directory (default: the user\'s home).'),
      env: stringMap('Extra environment variables for this command.').optional(),
      timeoutMs: z.number().int().min(1).max(86_400_000).optional().describe('Kill the command after this many milliseconds.'),
    },
  }, async ({ sandboxId: id, cmd, cwd, env, timeoutMs }, signal) => {
    const result = await client.runCommand(id, { cmd, cwd, env, timeoutMs }, signal);
    // A command that exits non-zero is still a call that worked: the exit code says how it went.
    return answer(commandText(result), { ...result });
  });

  tool('run_code', {
    title: 'Run code',
    description:
      'Run code in a Jupyter kernel in a sandbox (Python by default). Variables, imports and functions persist between calls in the same context. ' +
      'Answers stdout, stderr, the value of the last expression, and errors with their traceback; charts (matplotlib plt.show()) and other images come back as images. ' +
      'Other languages (javascript, typescript, bash, r) need the "code-interpreter" image.',
    inputSchema: {
      sandboxId,
      code: z.string().describe('The code of one cell, e.g. "import math\\nmath.sqrt(2)".'),
      language: z.string().min(1).optional().describe('Kernel language: python (default), javascript, typescript, bash, r. Ignored when contextId is given.'),
      contextId: z.string().min(1).optional().describe('A context (kernel) id; default: the language\'s default context.'),
      envs: stringMap('Environment variables for this cell.').optional(),
      timeoutMs: z.number().int().min(1).optional().describe('Interrupt the cell after this many milliseconds (the context keeps its state).'),
    },
  }, async ({ sandboxId: id, ...body }, signal) => codeResult(await client.runCode(id, body, signal)));

  tool('read_file', {
    title: 'Read a file',
    description: `Read a file from a sandbox as text (UTF-8), or as base64 when it is binary. Answers at most maxBytes (default ${READ_FILE_DEFAULT_BYTES}), saying when it was cut.`,
    readOnly: true,
    inputSchema: {
      sandboxId,
      path: absolutePath('The file to read.'),
      maxBytes: z.number().int().min(1).max(READ_FILE_MAX_BYTES).optional().describe(`Read at most this many bytes (default ${READ_FILE_DEFAULT_BYTES}, at most ${READ_FILE_MAX_BYTES}).`),
    },
  }, async ({ sandboxId: id, path, maxBytes }, signal) => {
    const { bytes, truncated, size } = await client.downloadFileHead(id, path, maxBytes ?? READ_FILE_DEFAULT_BYTES, signal);
    let content: string;
    let encoding: 'utf8' | 'base64';
    try {
      // fatal: a binary file is not silently mangled into replacement characters. A cut may
      // split a character at the end, which is not binary: stream mode keeps the tail back.
      content = new TextDecoder('utf-8', { fatal: true }).decode(bytes, { stream: truncated });
      encoding = 'utf8';
    } catch {
      content = Buffer.from(bytes).toString('base64');
      encoding = 'base64';
    }
    const note = truncated ? `\n[truncated: the first ${bytes.byteLength} of ${size ?? 'more'} bytes; pass a larger maxBytes for more]` : '';
    const header = encoding === 'base64' ? `[binary file, ${bytes.byteLength} bytes as base64]\n` : '';
    return answer(`${header}${content}${note}`, { path, encoding, content, bytes: bytes.byteLength, size, truncated });
  });

  tool('write_file', {
    title: 'Write a file',
    description: 'Write a file in a sandbox (created or replaced, parent directories created). Content is text unless encoding is "base64".',
    idempotent: true,
    inputSchema: {
      sandboxId,
      path: absolutePath('The file to write.'),
      content: z.string().describe('The file\'s content.'),
      encoding: z.enum(['utf8', 'base64']).optional().describe('"utf8" (default) or "base64" for binary content.'),
      mode: z.string().regex(/^[0-7]{3,4}$/, 'must be octal permission bits like 644 or 0755').optional().describe('Octal permission bits, e.g. "644" or "0755".'),
    },
  }, async ({ sandboxId: id, path, content, encoding, mode }) => {
    const bytes = encoding === 'base64' ? Buffer.from(content, 'base64') : Buffer.from(content, 'utf8');
    const info = await client.uploadFile(id, path, new Uint8Array(bytes), mode);
    return answer(`wrote ${info.size} bytes to ${info.path}`, { ...info });
  });

  tool('list_files', {
    title: 'List files',
    description: 'List a directory in a sandbox: names, types (file, dir, symlink), sizes and modification times.',
    readOnly: true,
    inputSchema: {
      sandboxId,
      path: absolutePath('The directory to list.'),
      depth: z.number().int().min(1).max(32).optional().describe('How many levels down (1 = direct children, the default).'),
    },
  }, async ({ sandboxId: id, path, depth }) => {
    const entries = await client.listFiles(id, path, depth);
    const lines = entries.map((e) => `${e.type === 'dir' ? 'd' : e.type === 'symlink' ? 'l' : e.type === 'file' ? '-' : '?'} ${String(e.size).padStart(10)}  ${e.mtime}  ${e.path}${e.symlinkTarget ? ` -> ${e.symlinkTarget}` : ''}`);
    return answer(`${entries.length} entr${entries.length === 1 ? 'y' : 'ies'} in ${path}${lines.length ? `\n${lines.join('\n')}` : ''}`, {
      path,
      entries: entries.map((e) => ({ name: e.name, path: e.path, type: e.type, size: e.size, mtime: e.mtime, ...(e.symlinkTarget ? { symlinkTarget: e.symlinkTarget } : {}) })),
    });
  });

  tool('publish_port', {
    title: 'Publish a port',
    description:
      'Make a TCP port a server listens on inside the sandbox reachable over HTTP(S). Answers its URL; a private port (the default) also needs its token, ' +
      'sent as the X-Nestbox-Port-Token header or once as ?_token= on the URL.',
    idempotent: true,
    inputSchema: {
      sandboxId,
      port: z.number().int().min(1).max(65535).describe('The port inside the sandbox, e.g. 8000.'),
      public: z.boolean().optional().describe('true = anyone with the URL can reach it, no token (default false).'),
    },
  }, async ({ sandboxId: id, port, public: isPublic }) => {
    const published = await client.publishPort(id, port, isPublic ?? false);
    const lines = [`port ${port} of ${id} is published${published.public ? ' (public)' : ''}`, `url: ${published.url}`];
    if (published.pathUrl && published.pathUrl !== published.url) lines.push(`path url: ${published.pathUrl}`);
    if (published.token) lines.push(`token: ${published.token}`);
    return answer(lines.join('\n'), { port: published.port, url: published.url, pathUrl: published.pathUrl, public: published.public, ...(published.token ? { token: published.token } : {}) });
  });

  return server;
}
