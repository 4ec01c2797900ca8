// The benchmark's HTTP client for bulk transfers and request rates, run as a process of its own
// (`node dist/bench/http-client.js '<json>'`): a real client is never inside the server's
// process, and one that is makes the server's event loop do the client's work as well, which
// charges every hop the server adds twice. Prints one JSON line: the milliseconds measured here
// (process start excluded) and the bytes seen.
import { createReadStream } from 'node:fs';
import http from 'node:http';

export type ClientJob =
  | { kind: 'upload'; url: string; headers: Record<string, string>; file: string }
  | { kind: 'download'; url: string; headers: Record<string, string> }
  /** `total` GETs of `url`, `concurrency` in flight on keep-alive connections. */
  | { kind: 'gets'; url: string; headers: Record<string, string>; total: number; concurrency: number };

export interface ClientResult {
  ms: number;
  bytes: number;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

function get(url: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    http
      .get(url, { agent, headers }, (res) => {
        let size = 0;
        res.on('data', (c: Buffer) => (size += c.length));
        res.on('end', () => (res.statusCode === 200 ? resolve(size) : reject(new Error(`${url} answered ${res.statusCode}`))));
      })
      .on('error', reject);
  });
}

function upload(url: string, headers: Record<string, string>, file: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let sent = 0;
    const req = http.request(url, { method: 'PUT', agent, headers: { ...headers, 'content-type': 'application/octet-stream' } }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve(sent) : reject(new Error(`upload answered ${res.statusCode}`))));
    });
    req.on('error', reject);
    const source = createReadStream(file);
    source.on('data', (c) => (sent += c.length));
    source.pipe(req);
  });
}

async function run(job: ClientJob): Promise<ClientResult> {
  const start = performance.now();
  let bytes = 0;
  if (job.kind === 'upload') bytes = await upload(job.url, job.headers, job.file);
  else if (job.kind === 'download') bytes = await get(job.url, job.headers);
  else {
    let next = 0;
    await Promise.all(
      Array.from({ length: job.concurrency }, async () => {
        while (next++ < job.total) bytes += await get(job.url, job.headers);
      }),
    );
  }
  return { ms: performance.now() - start, bytes };
}

if (process.argv[1]?.endsWith('http-client.js')) {
  run(JSON.parse(process.argv[2]!) as ClientJob).then(
    (result) => {
      process.stdout.write(`${JSON.stringify(result)}\n`);
      process.exit(0);
    },
    (error: unknown) => {
      process.stderr.write(`${String(error)}\n`);
      process.exit(1);
    },
  );
}
