// TCP connections opened from inside the sandbox (the SSH gateway's port forwarding, `ssh -L`):
//   GET /tcp?host=<name or address>&port=<1-65535>   WebSocket upgrade
// The agent connects first (from the sandbox's own network namespace, so 127.0.0.1 is the
// sandbox's loopback and the sandbox's egress policy applies to anything else), and only then
// accepts the WebSocket: a refused or timed-out connect is an HTTP 409 `invalid_state` before
// any upgrade. Binary frames both ways are the connection's bytes; either side closing closes
// the other (the socket's EOF is a close 1000).
import net from 'node:net';
import { AgentHttpError } from './errors.js';
import { exactUpgradeRoute, type UpgradeRoute } from './websocket.js';

const CONNECT_TIMEOUT_MS = 10_000;
const HOST = /^[A-Za-z0-9.:-]{1,253}$/;

export const tcpForwardRoute: UpgradeRoute = exactUpgradeRoute('/tcp', async (context) => {
  const host = context.query.get('host') ?? '';
  const port = Number(context.query.get('port'));
  if (!HOST.test(host)) throw new AgentHttpError(400, 'validation_failed', 'host: must be a host name or an address');
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new AgentHttpError(400, 'validation_failed', 'port: must be an integer from 1 to 65535');
  const socket = await new Promise<net.Socket>((resolve, reject) => {
    const s = net.connect({ host, port });
    const timer = setTimeout(() => s.destroy(new Error('connect timed out')), CONNECT_TIMEOUT_MS);
    s.once('connect', () => {
      clearTimeout(timer);
      resolve(s);
    });
    s.once('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(new AgentHttpError(409, 'invalid_state', `nothing accepts connections on ${host}:${port} in the sandbox (${err.code ?? err.message})`));
    });
  });
  socket.pause();
  const ws = await context.accept();
  socket.on('data', (chunk: Buffer) => {
    ws.send(chunk, { binary: true });
    if (ws.bufferedAmount > 4 * 1024 * 1024) {
      socket.pause();
      const wait = setInterval(() => {
        if (ws.bufferedAmount < 1024 * 1024 || ws.readyState !== ws.OPEN) {
          clearInterval(wait);
          socket.resume();
        }
      }, 20);
    }
  });
  socket.resume();
  ws.on('message', (data: Buffer) => {
    if (!socket.write(data)) {
      ws.pause();
      socket.once('drain', () => ws.resume());
    }
  });
  socket.once('end', () => ws.close(1000));
  socket.once('error', () => ws.close(1011));
  socket.once('close', () => ws.readyState === ws.OPEN && ws.close(1000));
  ws.once('close', () => socket.destroy());
  ws.once('error', () => socket.destroy());
});
