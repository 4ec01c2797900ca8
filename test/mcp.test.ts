// The MCP server with the SDK's own Client over both transports, against a real server and a
// real sandbox: `nestbox mcp` (the built binary) over stdio, and streamable HTTP at `/mcp` with
// the caller's key. One sandbox of the `code-interpreter` image (deny-all egress) serves every
// case; the authentication cases show the MCP endpoint can do no more than the key can through
// the native API (no key, a read-only key, a key of another organisation).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { CLI_ENTRY } from '../src/paths.js';
import { startTestServer, type TestServer } from './harness.js';

const TOOLS = [
  'create_sandbox', 'list_sandboxes', 'get_sandbox', 'delete_sandbox', 'stop_sandbox', 'resume_sandbox',
  'run_command', 'run_code', 'read_file', 'write_file', 'list_files', 'publish_port',
];
/** Creating a sandbox and a first kernel can take longer than the SDK's 60 s default. */
const CALL = { timeout: 120_000 };

let t: TestServer;
let stdio: Client;
let stdioTransport: StdioClientTransport;
let stdioStderr = '';
const stdioErrors: Error[] = [];
let http: Client;
let sandboxId: string;

async function connectHttp(apiKey: string): Promise<Client> {
  const client = new Client({ name: 'nestbox-mcp-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${t.url}/mcp`), { requestInit: { headers: { Authorization: `Bearer ${apiKey}` } } }));
  return client;
}

async function call(client: Client, name: string, args: Record<string, unknown>): Promise<CallToolResult> {
  return (await client.callTool({ name, arguments: args }, undefined, CALL)) as CallToolResult;
}

const textOf = (result: CallToolResult) => result.content.filter((c) => c.type === 'text').map((c) => (c as { text: string }).text).join('\n');
const structured = <T = Record<string, unknown>>(result: CallToolResult) => result.structuredContent as T;

beforeAll(async () => {
  t = await startTestServer();
  stdio = new Client({ name: 'nestbox-mcp-test', version: '1.0.0' });
  stdioTransport = new StdioClientTransport({
    command: process.execPath,
    args: [CLI_ENTRY(), 'mcp'],
    env: { NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey },
    stderr: 'pipe',
  });
  stdioTransport.stderr?.on('data', (chunk: Buffer) => (stdioStderr += chunk.toString()));
  await stdio.connect(stdioTransport);
  // Set after connect (which installs its own): anything on stdout that is not protocol lands here.
  const onerror = stdioTransport.onerror;
  stdioTransport.onerror = (err) => {
    stdioErrors.push(err);
    onerror?.(err);
  };
  http = await connectHttp(t.apiKey);
}, 180_000);

afterAll(async () => {
  await stdio?.close();
  await http?.close();
  await t?.close();
});

describe('MCP server', () => {
  it('lists every tool with a description and an input schema, over both transports', async () => {
    for (const client of [stdio, http]) {
      const { tools } = await client.listTools();
      expect(tools.map((tool) => tool.name).sort()).toEqual([...TOOLS].sort());
      for (const tool of tools) {
        expect(tool.description?.length, tool.name).toBeGreaterThan(30);
        expect(tool.inputSchema.type, tool.name).toBe('object');
      }
      const runCommand = tools.find((tool) => tool.name === 'run_command')!;
      expect(runCommand.inputSchema.required).toEqual(expect.arrayContaining(['sandboxId', 'cmd']));
      expect(Object.keys(runCommand.inputSchema.properties ?? {})).toEqual(expect.arrayContaining(['cwd', 'env', 'timeoutMs']));
    }
    expect(stdioStderr).toContain('serving over stdio');
  });

  it('creates a sandbox and runs a command in it (stdio)', async () => {
    const created = await call(stdio, 'create_sandbox', { image: 'code-interpreter', memoryMiB: 2048, timeoutSeconds: 900, labels: { suite: 'mcp' }, egress: { mode: 'deny-all' } });
    expect(created.isError, textOf(created)).toBeFalsy();
    const sandbox = structured<{ id: string; state: string; egress: { mode: string } }>(created);
    expect(sandbox).toMatchObject({ state: 'running', egress: { mode: 'deny-all' } });
    sandboxId = sandbox.id;
    expect(textOf(created)).toContain(sandboxId);

    const ran = await call(stdio, 'run_command', { sandboxId, cmd: 'echo $((6*7)); echo to-stderr >&2', cwd: '/tmp', env: { GREETING: 'hi' } });
    expect(ran.isError, textOf(ran)).toBeFalsy();
    expect(structured(ran)).toMatchObject({ exitCode: 0, stdout: '42\n', stderr: 'to-stderr\n', timedOut: false });
    expect(textOf(ran)).toMatch(/^exit code 0\b/);
    expect(textOf(ran)).toContain('42');

    const env = await call(stdio, 'run_command', { sandboxId, cmd: 'echo "$GREETING from $(pwd)"; exit 3', cwd: '/tmp', env: { GREETING: 'hi' } });
    expect(structured(env)).toMatchObject({ exitCode: 3, stdout: 'hi from /tmp\n' });

    const timedOut = await call(stdio, 'run_command', { sandboxId, cmd: 'sleep 30', timeoutMs: 500 });
    expect(structured(timedOut)).toMatchObject({ timedOut: true });
    expect(textOf(timedOut)).toMatch(/^timed out/);
  });

  it('answers bad arguments and API errors as tool errors naming the field or the API code', async () => {
    const missing = await call(stdio, 'run_command', { sandboxId });
    expect(missing.isError).toBe(true);
    expect(textOf(missing)).toContain('cmd');
    const unknown = await call(stdio, 'get_sandbox', { sandboxId: 'doesnotexist0000' });
    expect(unknown.isError).toBe(true);
    expect(textOf(unknown)).toMatch(/^not_found: /);
    expect(structured(unknown)).toMatchObject({ error: { code: 'not_found', status: 404 } });
  });

  it('writes, reads and lists files (HTTP)', async () => {
    const wrote = await call(http, 'write_file', { sandboxId, path: '/tmp/mcp/notes.txt', content: 'hello from MCP\nline two\n' });
    expect(wrote.isError, textOf(wrote)).toBeFalsy();
    const read = await call(http, 'read_file', { sandboxId, path: '/tmp/mcp/notes.txt' });
    expect(structured(read)).toMatchObject({ encoding: 'utf8', content: 'hello from MCP\nline two\n', truncated: false });
    expect(textOf(read)).toBe('hello from MCP\nline two\n');
    const head = await call(http, 'read_file', { sandboxId, path: '/tmp/mcp/notes.txt', maxBytes: 5 });
    expect(structured(head)).toMatchObject({ content: 'hello', truncated: true, size: 24 });

    const binary = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0xff, 0xfe]);
    await call(http, 'write_file', { sandboxId, path: '/tmp/mcp/blob.bin', content: binary.toString('base64'), encoding: 'base64' });
    const readBinary = await call(http, 'read_file', { sandboxId, path: '/tmp/mcp/blob.bin' });
    expect(structured(readBinary)).toMatchObject({ encoding: 'base64', content: binary.toString('base64') });

    const listed = await call(http, 'list_files', { sandboxId, path: '/tmp/mcp' });
    const entries = structured<{ entries: { name: string; type: string; size: number }[] }>(listed).entries;
    expect(entries).toEqual(expect.arrayContaining([expect.objectContaining({ name: 'notes.txt', type: 'file', size: 24 }), expect.objectContaining({ name: 'blob.bin', size: binary.length })]));
    expect(textOf(listed)).toContain('/tmp/mcp/notes.txt');
  });

  it('publishes a port and answers its URL and token, as the native API lists them', async () => {
    const published = await call(http, 'publish_port', { sandboxId, port: 8000 });
    expect(published.isError, textOf(published)).toBeFalsy();
    const port = structured<{ url: string; token: string; public: boolean }>(published);
    const listed = await t.http.get(`/api/v1/sandboxes/${sandboxId}/ports`).set(t.auth);
    expect(listed.body.items).toEqual([expect.objectContaining({ port: 8000, url: port.url, public: false })]);
    expect(port.url).toMatch(/^http:\/\//);
    expect(port.token).toMatch(/\S{16}/);
    expect(textOf(published)).toContain(`url: ${port.url}`);
    expect(textOf(published)).toContain(`token: ${port.token}`);
  });

  it('runs code: a value, an error with its traceback, and a matplotlib chart as an image', async () => {
    const value = await call(stdio, 'run_code', { sandboxId, code: '1+1' });
    expect(value.isError, textOf(value)).toBeFalsy();
    expect(structured(value)).toMatchObject({ status: 'ok', text: '2' });
    expect(textOf(value)).toMatch(/--- result \(text\/plain\) ---\n2/);

    const failed = await call(stdio, 'run_code', { sandboxId, code: 'def f():\n    return 1/0\nf()' });
    expect(failed.isError).toBe(true);
    expect(structured(failed)).toMatchObject({ status: 'error', error: { name: 'ZeroDivisionError' } });
    expect(textOf(failed)).toContain('ZeroDivisionError: division by zero');
    // The traceback names the function it went through, without terminal colour codes.
    expect(textOf(failed)).toMatch(/return 1\/0/);
    expect(textOf(failed)).not.toContain('\u001b[');

    const chart = await call(http, 'run_code', { sandboxId, code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("Squares")\nplt.show()' });
    expect(chart.isError, textOf(chart)).toBeFalsy();
    const images = chart.content.filter((c) => c.type === 'image') as { data: string; mimeType: string }[];
    expect(images).toHaveLength(1);
    expect(images[0]!.mimeType).toBe('image/png');
    expect(Buffer.from(images[0]!.data, 'base64').subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
    expect(textOf(chart)).toContain('image/png');
  });

  it('at /mcp: no key is a 401 in the native error shape, a body over 8 MiB is a 413, GET and DELETE are 405', async () => {
    const initialize = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'curl', version: '0' } } };
    const noKey = await fetch(`${t.url}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON.stringify(initialize) });
    expect(noKey.status).toBe(401);
    expect(((await noKey.json()) as { error: { code: string } }).error.code).toBe('unauthorized');
    const notAKey = await fetch(`${t.url}/mcp`, { method: 'POST', headers: { authorization: 'Bearer hunter2', 'content-type': 'application/json' }, body: JSON.stringify(initialize) });
    expect(notAKey.status).toBe(401);
    const tooLarge = await fetch(`${t.url}/mcp`, { method: 'POST', headers: { authorization: `Bearer ${t.apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify({ ...initialize, padding: 'x'.repeat(9 * 1024 * 1024) }) });
    expect(tooLarge.status).toBe(413);
    expect(((await tooLarge.json()) as { error: { code: string } }).error.code).toBe('payload_too_large');
    for (const method of ['GET', 'DELETE']) {
      const res = await fetch(`${t.url}/mcp`, { method, headers: { authorization: `Bearer ${t.apiKey}` } });
      expect(res.status, method).toBe(405);
    }
  });

  it('a read-only key can list but not create or run; an unknown well-formed key is refused by the API on each call', async () => {
    const created = await t.http.post('/api/v1/api-keys').set(t.auth).send({ name: 'mcp-read-only', preset: 'read-only' });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const readOnly = await connectHttp(created.body.key as string);
    try {
      const refused = await call(readOnly, 'create_sandbox', { egress: { mode: 'deny-all' } });
      expect(refused.isError).toBe(true);
      expect(textOf(refused)).toMatch(/^forbidden: /);
      const listed = await call(readOnly, 'list_sandboxes', { labels: { suite: 'mcp' } });
      expect(listed.isError, textOf(listed)).toBeFalsy();
      expect(structured<{ items: { id: string }[] }>(listed).items.map((s) => s.id)).toEqual([sandboxId]);
      const ran = await call(readOnly, 'run_command', { sandboxId, cmd: 'touch /tmp/should-not-exist' });
      expect(ran.isError).toBe(true);
      expect(textOf(ran)).toMatch(/^forbidden: /);
    } finally {
      await readOnly.close();
    }
    // Well-formed but unknown: the door lets it through, the native API refuses every call.
    const stranger = await connectHttp(`nbx_${'A'.repeat(40)}`);
    try {
      const listed = await call(stranger, 'list_sandboxes', {});
      expect(listed.isError).toBe(true);
      expect(textOf(listed)).toMatch(/^unauthorized: /);
    } finally {
      await stranger.close();
    }
  });

  it('a key of another organisation does not see the sandbox', async () => {
    const org = await t.server.services.auth.createOrganization('mcp-other');
    const key = await t.server.services.auth.createApiKey(org.id, { name: 'other-admin', preset: 'admin' });
    const other = await connectHttp(key.key);
    try {
      const got = await call(other, 'get_sandbox', { sandboxId });
      expect(got.isError).toBe(true);
      expect(textOf(got)).toMatch(/^not_found: /);
      const listed = await call(other, 'list_sandboxes', {});
      expect(structured<{ items: unknown[] }>(listed).items).toEqual([]);
      const ran = await call(other, 'run_command', { sandboxId, cmd: 'true' });
      expect(ran.isError).toBe(true);
      expect(textOf(ran)).toMatch(/^not_found: /);
    } finally {
      await other.close();
    }
  });

  it('stops and resumes the sandbox (files kept), then deletes it', async () => {
    const stopped = await call(stdio, 'stop_sandbox', { sandboxId });
    expect(stopped.isError, textOf(stopped)).toBeFalsy();
    expect(structured(stopped)).toMatchObject({ state: 'stopped' });
    const whileStopped = await call(stdio, 'run_command', { sandboxId, cmd: 'true' });
    expect(whileStopped.isError).toBe(true);
    expect(textOf(whileStopped)).toMatch(/^invalid_state: /);

    const resumed = await call(stdio, 'resume_sandbox', { sandboxId });
    expect(structured(resumed)).toMatchObject({ state: 'running' });
    const kept = await call(stdio, 'read_file', { sandboxId, path: '/tmp/mcp/notes.txt' });
    expect(structured(kept)).toMatchObject({ content: 'hello from MCP\nline two\n' });

    const deleted = await call(stdio, 'delete_sandbox', { sandboxId });
    expect(deleted.isError, textOf(deleted)).toBeFalsy();
    const gone = await call(stdio, 'get_sandbox', { sandboxId });
    expect(gone.isError).toBe(true);
    expect(textOf(gone)).toMatch(/^not_found: /);
    // Nothing but protocol came out of `nestbox mcp` on stdout the whole time.
    expect(stdioErrors).toEqual([]);
  });
});
