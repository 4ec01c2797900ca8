// `nestbox mcp`: the MCP server over stdio, for MCP clients that start it as a child process
// (Claude Desktop, editors, agent frameworks). stdout carries the protocol and nothing else;
// anything said to a person goes to stderr.
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { NativeClient } from '../client/native-client.js';
import { createMcpServer } from './server.js';

/** Serves until the client closes our stdin (it has gone), then resolves. */
export async function runMcpStdio(options: { url: string; apiKey: string }): Promise<void> {
  const server = createMcpServer(new NativeClient({ url: options.url, apiKey: options.apiKey }));
  const transport = new StdioServerTransport();
  transport.onerror = (err) => process.stderr.write(`nestbox mcp: ${err.message}\n`);
  const ended = new Promise<void>((resolve) => {
    process.stdin.once('end', resolve);
    process.stdin.once('close', resolve);
    transport.onclose = resolve;
  });
  await server.connect(transport);
  process.stderr.write(`nestbox mcp: serving over stdio, API ${options.url}\n`);
  await ended;
  await server.close();
}
