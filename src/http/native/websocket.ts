// Native WebSocket routes. openapi-backend only sees plain HTTP, so upgrades are routed here:
// the same auth, scopes and sandbox checks as the HTTP operations (through core), then a
// message-by-message relay to the guest agent through the sandbox's host agent.
import http, { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocket, WebSocketServer } from 'ws';
import { NestboxError, toNestboxError } from '../../../core/errors.js';
import type { Scope } from '../../../core/types.js';
import { relayWebSockets } from '../../../host/protocol/ws-relay.js';
import type { Services } from '../../services.js';

interface WebSocketRoute {
  pattern: RegExp;
  scope: Scope;
  operation: string;
  /** Guest-agent path (without query) from the match. */
  guestPath: (m: RegExpMatchArray) => string;
  query: readonly string[];
}

const ID = '([a-z0-9]{1,32})';
const NAME = '([A-Za-z0-9_.-]{1,64})';

export const NATIVE_WEBSOCKET_ROUTES: readonly WebSocketRoute[] = [
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/commands/${NAME}/stream$`),
    scope: 'sandboxes:read',
    operation: 'stream process output of',
    guestPath: (m) => `/processes/${m[2]}/events`,
    query: ['stdoutOffset', 'stderrOffset'],
  },
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/commands/${NAME}/pty$`),
    scope: 'sandboxes:exec',
    operation: 'attach to terminals of',
    guestPath: (m) => `/processes/${m[2]}/pty`,
    query: [],
  },
  {
    pattern: new RegExp(`^/api/v1/sandboxes/${ID}/files/watch$`),
    scope: 'files:read',
    operation: 'watch files of',
    guestPath: () => '/files/watch',
    query: ['path', 'recursive'],
  },
];

function refuse(socket: Duplex, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`);
}

export function attachNativeWebSockets(server: http.Server, services: Services): void {
  const wss = new WebSocketServer({ noServer: true });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    void handleUpgrade(req, socket, head).catch((err) => {
      const e = toNestboxError(err);
      refuse(socket, e.status, { error: e.toJSON() });
    });
  });

  async function handleUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const url = new URL((req.url ?? '/').replace(/\/{2,}/g, '/'), 'http://nestbox');
    const route = NATIVE_WEBSOCKET_ROUTES.find((r) => r.pattern.test(url.pathname));
    if (!route) throw new NestboxError('not_found', `no WebSocket route ${url.pathname}`);
    const match = url.pathname.match(route.pattern)!;
    // Browsers cannot set headers on a WebSocket, so the key may also come as ?access_token=.
    const header = req.headers.authorization;
    const token = header?.startsWith('Bearer ') ? header.slice(7).trim() : (url.searchParams.get('access_token') ?? undefined);
    const principal = await services.auth.authenticate(token);
    const query = new URLSearchParams();
    for (const name of route.query) for (const v of url.searchParams.getAll(name)) query.append(name, v);
    const guestPath = route.guestPath(match) + (query.size ? `?${query}` : '');
    const target = await services.sandboxes.agentWebSocket(principal, match[1], route.scope, route.operation, guestPath);

    const upstream = new WebSocket(target.url, { headers: target.headers });
    const opened = await new Promise<boolean>((resolve, reject) => {
      upstream.once('open', () => resolve(true));
      // The guest agent's own refusal (unknown process, not a terminal…) reaches the client as is.
      upstream.once('unexpected-response', (_r, res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let body: unknown;
          try {
            body = JSON.parse(text);
          } catch {
            body = { error: { code: 'internal', message: text } };
          }
          refuse(socket, res.statusCode ?? 502, body);
          resolve(false);
        });
      });
      upstream.once('error', (err) => reject(new NestboxError('host_unavailable', `cannot reach the sandbox: ${err.message}`)));
    });
    if (!opened) return;
    wss.handleUpgrade(req, socket, head, (client) => relayWebSockets(client, upstream));
  }
}
