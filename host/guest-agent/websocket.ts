// WebSocket routes of the guest agent. server.ts hands every HTTP upgrade to one dispatcher,
// which finds the route by path in a small table (shared by the process streams, the PTY and
// the file watcher). A route validates first and may throw an AgentHttpError, which is answered
// as a plain HTTP error before any upgrade; only then does it accept() the WebSocket.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { WebSocket, WebSocketServer } from 'ws';
import { AGENT_PROOF_HEADER } from '../agent-protocol/auth.js';
import { AgentHttpError } from './errors.js';

export interface UpgradeContext {
  req: IncomingMessage;
  pathname: string;
  query: URLSearchParams;
  /** Completes the handshake. Call at most once, after all validation. */
  accept(): Promise<WebSocket>;
}

export type UpgradeHandler = (context: UpgradeContext) => Promise<void>;

/** Returns the handler for a path, or undefined when the route is someone else's. */
export type UpgradeRoute = (pathname: string) => UpgradeHandler | undefined;

/** An exact-path route, for routes without path parameters. */
export function exactUpgradeRoute(path: string, handler: UpgradeHandler): UpgradeRoute {
  return (pathname) => (pathname === path ? handler : undefined);
}

/** The proof header value for an answer of `status` to this upgrade request, if any (auth.ts). */
export type UpgradeProver = (req: IncomingMessage, status: number) => string | undefined;

function rejectUpgradeWithProof(socket: Duplex, error: AgentHttpError, proof: string | undefined): void {
  const body = JSON.stringify({ error: { code: error.code, message: error.message } });
  const reason = error.status === 404 ? 'Not Found' : error.status === 400 ? 'Bad Request' : error.status === 409 ? 'Conflict' : 'Error';
  const proofLine = proof ? `${AGENT_PROOF_HEADER}: ${proof}\r\n` : '';
  socket.end(
    `HTTP/1.1 ${error.status} ${reason}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${proofLine}Connection: close\r\n\r\n${body}`,
  );
}

export interface UpgradeDispatcher {
  /** The server's 'upgrade' listener. */
  handle(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Terminates every accepted WebSocket (server shutdown). */
  closeAll(): void;
}

/**
 * `routes` is read on every upgrade, so routes pushed into the array after creation count too.
 */
export function createUpgradeDispatcher(routes: readonly UpgradeRoute[], log: (message: string) => void, prove: UpgradeProver = () => undefined): UpgradeDispatcher {
  // ws is imported at the first upgrade (issue 20: fewer modules to parse before the agent can
  // answer; most requests never upgrade).
  let wss: WebSocketServer | undefined;
  let loading: Promise<WebSocketServer> | undefined;
  const webSocketServer = (): Promise<WebSocketServer> =>
    (loading ??= import('ws').then(({ WebSocketServer }) => {
      // Large frames are not expected from clients (terminal input, control JSON); 16 MiB is a
      // generous ceiling that still stops a client from making us buffer without bound.
      const server = new WebSocketServer({ noServer: true, maxPayload: 16 * 1024 * 1024 });
      // The 101 carries the proof too, so the host agent knows who it is about to relay frames from.
      server.on('headers', (headers: string[], req: IncomingMessage) => {
        const proof = prove(req, 101);
        if (proof) headers.push(`${AGENT_PROOF_HEADER}: ${proof}`);
      });
      return (wss = server);
    }));
  const handle = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    const rejectUpgrade = (socket: Duplex, error: AgentHttpError): void => rejectUpgradeWithProof(socket, error, prove(req, error.status));
    socket.on('error', () => socket.destroy());
    const target = req.url ?? '/';
    const queryStart = target.indexOf('?');
    const pathname = queryStart === -1 ? target : target.slice(0, queryStart);
    const query = new URLSearchParams(queryStart === -1 ? '' : target.slice(queryStart + 1));
    let handler: UpgradeHandler | undefined;
    for (const route of routes) {
      handler = route(pathname);
      if (handler) break;
    }
    if (!handler) {
      rejectUpgrade(socket, new AgentHttpError(404, 'not_found', `no such WebSocket route: ${pathname}`));
      return;
    }
    let accepted = false;
    const accept = (): Promise<WebSocket> =>
      webSocketServer().then(
        (server) =>
          new Promise((resolve) => {
            accepted = true;
            server.handleUpgrade(req, socket, head, (ws) => resolve(ws));
          }),
      );
    handler({ req, pathname, query, accept }).catch((error: unknown) => {
      if (!accepted) {
        if (error instanceof AgentHttpError) {
          rejectUpgrade(socket, error);
          return;
        }
        rejectUpgrade(socket, new AgentHttpError(500, 'internal', `internal error: ${(error as Error)?.message ?? String(error)}`));
      }
      log(`guest agent: unexpected error in WebSocket ${pathname}: ${(error as Error)?.stack ?? String(error)}`);
    });
  };
  return {
    handle,
    closeAll: () => {
      for (const client of wss?.clients ?? []) client.terminate();
    },
  };
}
