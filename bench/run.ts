// `npm run bench`: latency and throughput of the native API on this machine, each figure
// beside a baseline measured in the same run. Prints medians (and p95 where asked).
// Options: --creates N (default 10), --execs N (default 50), --mib N (default 50), --postgres URL.
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { pipeline } from 'node:stream/promises';
import { parseArgs } from 'node:util';
import { loadConfig } from '../src/config.js';
import { startServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';

const { values } = parseArgs({
  options: {
    creates: { type: 'string', default: '10' },
    execs: { type: 'string', default: '50' },
    mib: { type: 'string', default: '50' },
    postgres: { type: 'string' },
    'images-dir': { type: 'string', default: '/var/tmp/nestbox-test-images' },
  },
});
const CREATES = Number(values.creates);
const EXECS = Number(values.execs);
const MIB = Number(values.mib);

const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};
const ms = (n: number) => `${n.toFixed(1)} ms`;
const mibps = (bytes: number, millis: number) => `${(bytes / 1024 / 1024 / (millis / 1000)).toFixed(0)} MiB/s`;

interface Call {
  status: number;
  body: string;
}

function call(base: string, key: string, method: string, path: string, body?: unknown): Promise<Call> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(new URL(base + path), {
      method,
      headers: { authorization: `Bearer ${key}`, ...(payload ? { 'content-type': 'application/json' } : {}) },
    }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

async function timed<T>(fn: () => Promise<T>): Promise<[number, T]> {
  const start = performance.now();
  const value = await fn();
  return [performance.now() - start, value];
}

async function upload(url: string, headers: Record<string, string>, file: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const req = http.request(new URL(url), { method: 'PUT', headers: { ...headers, 'content-type': 'application/octet-stream' } }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`upload answered ${res.statusCode}`))));
    });
    req.on('error', reject);
    createReadStream(file).pipe(req);
  });
}

async function download(url: string, headers: Record<string, string>): Promise<string> {
  return new Promise((resolve, reject) => {
    http.get(new URL(url), { headers }, (res) => {
      if (res.statusCode !== 200) return reject(new Error(`download answered ${res.statusCode}`));
      const hash = createHash('sha256');
      res.on('data', (c) => hash.update(c));
      res.on('end', () => resolve(hash.digest('hex')));
    }).on('error', reject);
  });
}

/** Baseline: the same bytes over a plain Node HTTP server on loopback, written to / read from disk. */
async function loopbackBaseline(file: string, scratch: string): Promise<{ up: number; down: number }> {
  const server = http.createServer((req, res) => {
    if (req.method === 'PUT') {
      void pipeline(req, createWriteStream(`${scratch}/loopback.bin`)).then(() => res.end('ok'));
    } else {
      void pipeline(createReadStream(`${scratch}/loopback.bin`), res);
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const base = `http://127.0.0.1:${(server.address() as { port: number }).port}/x`;
  const [up] = await timed(() => upload(base, {}, file));
  const [down] = await timed(() => download(base, {}));
  server.close();
  return { up, down };
}

async function main(): Promise<void> {
  const dataDir = mkdtempSync('/tmp/nbx-bench-');
  const key = generateApiKey();
  const config = loadConfig({
    NESTBOX_PORT: '0',
    NESTBOX_DATA_DIR: dataDir,
    NESTBOX_IMAGES_DIR: values['images-dir'],
    NESTBOX_BOOTSTRAP_API_KEY: key,
    ...(values.postgres ? { NESTBOX_DATABASE_URL: values.postgres } : {}),
  });
  const logs: string[] = [];
  const server = await startServer(config, (m) => logs.push(m));
  const base = `${server.url}/api/v1`;
  const created: string[] = [];
  try {
    const deadline = Date.now() + 180_000;
    while (JSON.parse((await call(base, key, 'GET', '/health')).body).hostsAvailable < 1) {
      if (Date.now() > deadline) throw new Error(`no host agent registered:\n${logs.join('\n')}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    console.log(`Nestbox benchmark — ${new Date().toISOString()} — database: ${config.database.kind}, driver: local`);

    // 1. create → running
    const createTimes: number[] = [];
    for (let i = 0; i < CREATES; i++) {
      const [t, res] = await timed(() => call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0 }));
      if (res.status !== 201) throw new Error(`create failed: ${res.body}`);
      created.push(JSON.parse(res.body).id);
      createTimes.push(t);
    }
    console.log(`create → running (n=${CREATES}): p50 ${ms(quantile(createTimes, 0.5))}, p95 ${ms(quantile(createTimes, 0.95))}`);

    // 2. exec round trip of `true` vs spawning it on the host
    const id = created[0];
    const execTimes: number[] = [];
    for (let i = 0; i < EXECS; i++) {
      const [t, res] = await timed(() => call(base, key, 'POST', `/sandboxes/${id}/commands`, { cmd: 'true' }));
      if (res.status !== 200) throw new Error(`exec failed: ${res.body}`);
      execTimes.push(t);
    }
    // Baselines: the host's own bash login profile is not the sandbox's, so compare with
    // spawning the program itself and with a non-login bash (both without the network hop).
    const spawnTimes = async (argv: string[]) => {
      const times: number[] = [];
      for (let i = 0; i < EXECS; i++) times.push((await timed(() => new Promise((r) => spawn(argv[0], argv.slice(1)).on('exit', r))))[0]);
      return quantile(times, 0.5);
    };
    const trueP50 = await spawnTimes(['/bin/true']);
    const bashP50 = await spawnTimes(['bash', '--noprofile', '--norc', '-c', 'true']);
    const execP50 = quantile(execTimes, 0.5);
    console.log(`exec \`true\` via API (n=${EXECS}): p50 ${ms(execP50)}, p95 ${ms(quantile(execTimes, 0.95))}`);
    console.log(`  baseline direct spawn on the host: /bin/true p50 ${ms(trueP50)}, bash -c true p50 ${ms(bashP50)} → API round trip ×${(execP50 / bashP50).toFixed(2)} of bash -c (+${ms(execP50 - bashP50)})`);

    // 3. 50 MiB upload and download vs a plain loopback HTTP copy
    const bytes = MIB * 1024 * 1024;
    const file = `${dataDir}/payload.bin`;
    writeFileSync(file, randomBytes(bytes));
    const auth = { authorization: `Bearer ${key}` };
    const url = `${base}/sandboxes/${id}/files?path=/root/payload.bin`;
    const ups: number[] = [];
    const downs: number[] = [];
    for (let i = 0; i < 3; i++) {
      ups.push((await timed(() => upload(url, auth, file)))[0]);
      downs.push((await timed(() => download(url, auth)))[0]);
    }
    const baseUps: number[] = [];
    const baseDowns: number[] = [];
    for (let i = 0; i < 3; i++) {
      const b = await loopbackBaseline(file, dataDir);
      baseUps.push(b.up);
      baseDowns.push(b.down);
    }
    const [up, down, bup, bdown] = [ups, downs, baseUps, baseDowns].map((xs) => quantile(xs, 0.5));
    console.log(`upload ${MIB} MiB (median of 3): ${mibps(bytes, up)} (${ms(up)}); baseline loopback copy ${mibps(bytes, bup)} → API takes ×${(up / bup).toFixed(2)} the time`);
    console.log(`download ${MIB} MiB (median of 3): ${mibps(bytes, down)} (${ms(down)}); baseline loopback copy ${mibps(bytes, bdown)} → API takes ×${(down / bdown).toFixed(2)} the time`);
  } finally {
    for (const id of created) await call(base, key, 'DELETE', `/sandboxes/${id}`).catch(() => undefined);
    await server.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
