import { WebSocket } from 'ws';

/** Message-by-message relay, so text/binary framing and close codes survive the hop. */
export function relayWebSockets(a: WebSocket, b: WebSocket): void {
  const forward = (from: WebSocket, to: WebSocket) => {
    from.on('message', (data, isBinary) => {
      if (to.readyState === WebSocket.OPEN) to.send(data, { binary: isBinary });
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
