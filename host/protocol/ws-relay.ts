// WebSocket hops (control plane → host agent → guest agent) share this: connect upstream first,
// and only then accept the client, so a refusal upstream (unknown process, not a terminal…)
// reaches the client as the same HTTP error; then relay message by message.
import type http from 'node:http';
import { STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocket, WebSocketServer } from 'ws';
import { decodeErrorBody } from '../../core/errors.js';

/** A client that reads slower than the sandbox writes is cut off beyond this much buffered data. */
export const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** An upstream (host agent, guest agent) that has not completed the handshake by then never will. */
export const UPSTREAM_HANDSHAKE_TIMEOUT_MS = 30_000;

export type UpstreamResult = { ok: true; ws: WebSocket } | { ok: false; status: number; body: string };

export interface UpstreamChecks {
  /**
   * Looks at the upstream's answer (the 101 or a refusal) before anything of it is used; a
   * message refuses it as `agent_unavailable` (502). The host agent checks the guest agent's
   * proof here (agent-protocol/auth.ts).
   */
  verify?(response: http.IncomingMessage): string | undefined;
}

function unverified(message: string): UpstreamResult {
  return { ok: false, status: 502, body: JSON.stringify({ error: { code: 'agent_unavailable', message } }) };
}

/**
 * Open the upstream WebSocket, passing on the subprotocols the client asked for. It is paused
 * once open: the guest may speak first (replayed output, terminal contents) while the client is
 * still being accepted, and nothing it says may be lost; acceptAndRelay resumes it.
 */
export function connectUpstream(url: string, headers: Record<string, string>, req: http.IncomingMessage, checks: UpstreamChecks = {}): Promise<UpstreamResult> {
  const protocols = String(req.headers['sec-websocket-protocol'] ?? '')
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean);
  const ws = new WebSocket(url, protocols, { headers, handshakeTimeout: UPSTREAM_HANDSHAKE_TIMEOUT_MS });
  return new Promise((resolve) => {
    // ws emits 'upgrade' with the 101 before 'open'; terminating here means 'open' never comes.
    ws.once('upgrade', (res) => {
      const refusal = checks.verify?.(res);
      if (refusal === undefined) return;
      resolve(unverified(refusal));
      ws.terminate();
    });
    ws.once('open', () => {
      ws.pause();
      resolve({ ok: true, ws });
    });
    ws.once('unexpected-response', (_r, res) => {
      const refusal = checks.verify?.(res);
      if (refusal !== undefined) {
        res.destroy();
        _r.destroy();
        resolve(unverified(refusal));
        return;
      }
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ ok: false, status: res.statusCode ?? 502, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', () => resolve({ ok: false, status: 502, body: '' }));
    });
    ws.once('error', (err) => resolve({ ok: false, status: 502, body: JSON.stringify({ error: { code: 'host_unavailable', message: `the sandbox's agent is not reachable: ${err.message}` } }) }));
  });
}

/** Answer a not-yet-upgraded request with an HTTP error (JSON in the native error shape). */
export function refuseUpgrade(socket: Duplex, status: number, body: string | object, headers: Record<string, string> = {}): void {
  let text = typeof body === 'string' ? body : JSON.stringify(body);
  try {
    JSON.parse(text);
  } catch {
    // Not our shape: named by its status, as every hop's decoder does.
    text = JSON.stringify({ error: { code: decodeErrorBody(status, '').code, message: text || STATUS_CODES[status] || 'error' } });
  }
  const extra = Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('');
  socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\n${extra}connection: close\r\n\r\n${text}`);
}

/** Accept the client with the subprotocol the upstream chose, then relay both ways. */
export function acceptAndRelay(req: http.IncomingMessage, socket: Duplex, head: Buffer, upstream: WebSocket): void {
  const wss = new WebSocketServer({ noServer: true, handleProtocols: () => upstream.protocol || false });
  wss.handleUpgrade(req, socket, head, (client) => {
    relayWebSockets(client, upstream);
    upstream.resume();
    wss.close();
  });
}

/** Message-by-message relay, so text/binary framing and close codes survive the hop. */
export function relayWebSockets(a: WebSocket, b: WebSocket): void {
  const forward = (from: WebSocket, to: WebSocket) => {
    from.on('message', (data, isBinary) => {
      if (to.readyState !== WebSocket.OPEN) return;
      // Never buffer without bound for a peer that does not read: drop it, it can reconnect
      // (streams resume from offsets, terminals replay their retained output).
      if (to.bufferedAmount > MAX_BUFFERED_BYTES) {
        to.close(1013, 'peer too slow; reconnect');
        from.close(1013, 'peer too slow; reconnect');
        return;
      }
      to.send(data, { binary: isBinary });
    });
    from.on('close', (code, reason) => {
      if (to.readyState === WebSocket.OPEN || to.readyState === WebSocket.CONNECTING) {
        to.close(sendableCloseCode(code), reason);
      }
    });
    from.on('error', () => to.terminate());
  };
  forward(a, b);
  forward(b, a);
}

/**
 * Some close codes only describe what happened locally and may not be sent (RFC 6455 §7.4.1):
 * "no status" becomes a normal closure, an abnormal drop becomes "internal error".
 */
export function sendableCloseCode(code: number): number {
  if (code === 1005) return 1000;
  if (code === 1006 || code === 1015 || code === 1004) return 1011;
  return code;
}
