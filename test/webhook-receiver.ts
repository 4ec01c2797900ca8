// A webhook receiver on loopback for the webhook tests: records every request with its arrival time.
import http from 'node:http';

export interface Received {
  at: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** A webhook receiver on loopback; `answer` decides each response's status (undefined: never answer). */
export async function startReceiver(answer: (n: number, r: Received) => number | undefined = () => 200) {
  const received: Received[] = [];
  const held: http.ServerResponse[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const r = { at: Date.now(), headers: req.headers, body: Buffer.concat(chunks).toString() };
      received.push(r);
      const status = answer(received.length, r);
      if (status === undefined) held.push(res);
      else res.writeHead(status).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/hook`,
    port,
    received,
    close: () => {
      for (const res of held) res.destroy();
      server.closeAllConnections();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

