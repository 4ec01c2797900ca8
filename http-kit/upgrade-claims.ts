// Several front doors (native, Daytona, E2B) listen for WebSocket upgrades on the one server.
// A front door that recognises a request as its own claims it synchronously in its 'upgrade'
// listener; the native listener, which answers every unknown path with a 404, skips claimed ones.
import type http from 'node:http';

const claimed = new WeakSet<http.IncomingMessage>();

export function claimUpgrade(req: http.IncomingMessage): void {
  claimed.add(req);
}

export function isUpgradeClaimed(req: http.IncomingMessage): boolean {
  return claimed.has(req);
}
