// `/mcp`: the MCP server over streamable HTTP, for agents that reach Nestbox over the network.
// Stateless: each POST gets a fresh MCP server and transport (no session id), so any replica can
// answer any request. It holds no authority of its own: the caller's API key is handed to a
// NativeClient pointed at this server's own native API over loopback, so every tool call is a
// native API request that checks the key, its scopes and its sandboxes as for any client.
import express, { Router, type NextFunction, type Request, type Response } from 'express';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { NestboxError } from '../../core/errors.js';
import { isWellFormedApiKey } from '../../core/services/auth.js';
import type { Logger } from '../../core/logger.js';
import type { Config } from '../config.js';
import { NativeClient } from '../client/native-client.js';
import { createMcpServer } from '../mcp/server.js';
import { renderNativeError } from './native/router.js';

export const MCP_PATH = '/mcp';

/**
 * One JSON-RPC message (or batch). write_file's content travels inside it (base64 for binary),
 * so it allows more than the native API's 2 MiB JSON bodies; larger files belong on the native
 * upload route, which streams.
 */
const MCP_MAX_BODY = '8mb';

/**
 * Where this server's own native API answers: the address it listens on, loopback when it
 * listens on every interface. The port is the one the request came in on, which is the bound
 * port even when the configuration said 0 (tests).
 */
function ownApiUrl(config: Config, req: Request): string {
  const host = ['0.0.0.0', '::', 'localhost'].includes(config.host) ? '127.0.0.1' : config.host;
  return `http://${host.includes(':') ? `[${host}]` : host}:${req.socket.localPort}`;
}

/** A JSON-RPC error answer, for what the transport itself would answer this way. */
function jsonRpcError(res: Response, status: number, code: number, message: string): void {
  res.status(status).json({ jsonrpc: '2.0', error: { code, message }, id: null });
}

export function createMcpRouter(config: Config, logger: Logger): Router {
  const router = Router();
  const log = logger.child({ component: 'mcp' });

  router.post(
    '/',
    // Before the body is read: a request without a key is answered without buffering 8 MB.
    (req: Request, res: Response, next: NextFunction) => {
      const header = req.headers.authorization ?? '';
      const key = header.startsWith('Bearer ') ? header.slice(7).trim() : '';
      if (!isWellFormedApiKey(key)) {
        res.setHeader('WWW-Authenticate', 'Bearer');
        return renderNativeError(res, new NestboxError('unauthorized', key ? 'Authorization: the bearer token is not a Nestbox API key' : 'Authorization: send "Bearer <API key>"'));
      }
      res.locals.apiKey = key;
      next();
    },
    express.json({ limit: MCP_MAX_BODY }),
    async (req: Request, res: Response) => {
      const client = new NativeClient({ url: ownApiUrl(config, req), apiKey: res.locals.apiKey as string });
      const server = createMcpServer(client);
      // JSON answers rather than an SSE stream: tools send no progress, and a plain response
      // passes through every proxy.
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      res.on('close', () => {
        void transport.close();
        void server.close();
      });
      try {
        await server.connect(transport);
        await transport.handleRequest(req, res, req.body);
      } catch (err) {
        log.error({ err }, `MCP request failed: ${err instanceof Error ? err.message : String(err)}`);
        if (!res.headersSent) jsonRpcError(res, 500, -32603, 'internal error');
      }
    },
  );
  // Stateless: there is no server-to-client stream to open (GET) and no session to end (DELETE).
  router.all('/', (req: Request, res: Response) => {
    res.setHeader('Allow', 'POST');
    jsonRpcError(res, 405, -32000, `method not allowed: ${req.method} ${MCP_PATH} (this endpoint is stateless; POST only)`);
  });
  // A body that is too large or not JSON: the native error shape, like the native API's.
  router.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    renderNativeError(res, err, log);
  });
  return router;
}
