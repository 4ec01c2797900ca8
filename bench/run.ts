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
import { unmountReflinkStore } from '../host/drivers/local/disk-store.js';

const { values } = parseArgs({
  options: {
    creates: { type: 'string', default: '10' },
    execs: { type: 'string', default: '50' },
    mib: { type: 'string', default: '50' },
    postgres: { type: 'string' },
    'images-dir': { type: 'string', default: '/var/tmp/nestbox-test-images' },
    reflink: { type: 'boolean', default: true },
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
    // Forks are measured with copy-on-write disks, the way a production host runs.
    NESTBOX_REFLINK_STORE: values.reflink ? 'auto' : 'off',
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

    // 4. first byte of a streamed command: detached start → first stdout event over SSE
    const firstBytes: number[] = [];
    for (let i = 0; i < 10; i++) {
      const [t] = await timed(async () => {
        const started = await call(base, key, 'POST', `/sandboxes/${id}/commands`, { cmd: 'echo first', detach: true });
        const { processId } = JSON.parse(started.body) as { processId: string };
        const res = await fetch(`${base}/sandboxes/${id}/commands/${processId}/stream`, { headers: { ...auth, accept: 'text/event-stream' } });
        const reader = (res.body as ReadableStream<Uint8Array>).getReader();
        let text = '';
        while (!text.includes('"stdout"')) {
          const { value, done } = await reader.read();
          if (done) break;
          text += new TextDecoder().decode(value);
        }
        await reader.cancel();
      });
      firstBytes.push(t);
    }
    console.log(`streamed command, start → first stdout byte (n=10): p50 ${ms(quantile(firstBytes, 0.5))}; baseline foreground exec p50 ${ms(execP50)}`);

    // 5. 1,000 small files: one multipart request vs 1,000 PUTs
    const files = Array.from({ length: 1000 }, (_, i) => ({ path: `/root/small/f${i}.txt`, data: Buffer.from(`file ${i}\n`) }));
    const boundary = `nbx${randomBytes(8).toString('hex')}`;
    const form = Buffer.concat(files.flatMap((f, i) => [
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[${i}].path"\r\n\r\n${f.path}\r\n--${boundary}\r\nContent-Disposition: form-data; name="files[${i}].file"; filename="f"\r\n\r\n`),
      f.data,
      Buffer.from('\r\n'),
    ]).concat([Buffer.from(`--${boundary}--\r\n`)]));
    const [oneRequest, multiRes] = await timed(() => fetch(`${base}/sandboxes/${id}/files/upload`, { method: 'POST', headers: { ...auth, 'content-type': `multipart/form-data; boundary=${boundary}` }, body: form }));
    if (multiRes.status !== 200) throw new Error(`bulk upload answered ${multiRes.status}: ${await multiRes.text()}`);
    const [oneByOne] = await timed(async () => {
      for (const f of files) {
        const r = await fetch(`${base}/sandboxes/${id}/files?path=${encodeURIComponent(f.path + '.single')}`, { method: 'PUT', headers: { ...auth, 'content-type': 'application/octet-stream' }, body: f.data });
        if (r.status !== 200) throw new Error(`upload answered ${r.status}`);
      }
    });
    console.log(`1,000 small files: one multipart request ${ms(oneRequest)} vs one PUT each ${ms(oneByOne)} → ×${(oneByOne / oneRequest).toFixed(1)} faster in one request`);

    // 6. watch event latency: write a file, time until its create event arrives over SSE
    await call(base, key, 'POST', `/sandboxes/${id}/files/mkdir`, { path: '/root/watched' });
    const watchLatencies: number[] = [];
    const abort = new AbortController();
    const watch = await fetch(`${base}/sandboxes/${id}/files/watch?path=/root/watched`, { headers: { ...auth, accept: 'text/event-stream' }, signal: abort.signal });
    const watchReader = (watch.body as ReadableStream<Uint8Array>).getReader();
    let pending = '';
    const nextEvent = async (): Promise<Record<string, unknown>> => {
      for (;;) {
        const at = pending.indexOf('\n\n');
        if (at !== -1) {
          const block = pending.slice(0, at);
          pending = pending.slice(at + 2);
          const data = block.split('\n').find((l) => l.startsWith('data:'));
          if (data) return JSON.parse(data.slice(5)) as Record<string, unknown>;
          continue;
        }
        const { value, done } = await watchReader.read();
        if (done) throw new Error('watch stream ended');
        pending += new TextDecoder().decode(value);
      }
    };
    while ((await nextEvent()).type !== 'ready');
    for (let i = 0; i < 10; i++) {
      const path = `/root/watched/w${i}.txt`;
      const start = performance.now();
      await fetch(`${base}/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, { method: 'PUT', headers: { ...auth, 'content-type': 'application/octet-stream' }, body: 'x' });
      for (;;) {
        const e = await nextEvent();
        if (e.path === path && (e.type === 'create' || e.type === 'rename' || e.type === 'write')) break;
      }
      watchLatencies.push(performance.now() - start);
    }
    abort.abort();
    console.log(`watch: upload → event delivered (n=10): p50 ${ms(quantile(watchLatencies, 0.5))} (includes the upload round trip itself)`);

    // 7. pause/unpause, fork (empty vs 1 GiB) and create-from-snapshot vs a plain create
    const pauses: number[] = [];
    const unpauses: number[] = [];
    for (let i = 0; i < 10; i++) {
      pauses.push((await timed(() => call(base, key, 'POST', `/sandboxes/${id}/pause`)))[0]);
      unpauses.push((await timed(() => call(base, key, 'POST', `/sandboxes/${id}/unpause`)))[0]);
    }
    console.log(`pause p50 ${ms(quantile(pauses, 0.5))}, unpause p50 ${ms(quantile(unpauses, 0.5))} (n=10)`);
    const forkOnce = async (sourceId: string) => {
      const [t, res] = await timed(() => call(base, key, 'POST', `/sandboxes/${sourceId}/fork`, { count: 1, timeoutSeconds: 0 }));
      if (res.status !== 201) throw new Error(`fork failed: ${res.body}`);
      const body = JSON.parse(res.body) as { sandboxes: { id: string }[]; diskCopy: string };
      created.push(...body.sandboxes.map((s) => s.id));
      return { t, diskCopy: body.diskCopy };
    };
    const emptySource = JSON.parse((await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0 })).body).id as string;
    const bigSource = JSON.parse((await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0, memoryMiB: 1024 })).body).id as string;
    created.push(emptySource, bigSource);
    const filled = await call(base, key, 'POST', `/sandboxes/${bigSource}/commands`, { cmd: 'head -c 1073741824 /dev/urandom > /root/big.bin && sync && stat -c %s /root/big.bin' });
    if (!filled.body.includes('1073741824')) throw new Error(`could not write 1 GiB: ${filled.body}`);
    const forkEmpty: number[] = [];
    const forkBig: number[] = [];
    let diskCopy = '';
    for (let i = 0; i < 3; i++) {
      forkEmpty.push((await forkOnce(emptySource)).t);
      const big = await forkOnce(bigSource);
      forkBig.push(big.t);
      diskCopy = big.diskCopy;
    }
    console.log(`fork (disk copy: ${diskCopy}, median of 3): empty sandbox ${ms(quantile(forkEmpty, 0.5))} vs 1 GiB sandbox ${ms(quantile(forkBig, 0.5))} → ×${(quantile(forkBig, 0.5) / quantile(forkEmpty, 0.5)).toFixed(2)}`);
    const snap = await call(base, key, 'POST', '/snapshots', { sandboxId: emptySource, name: `bench-${Date.now()}` });
    if (snap.status !== 201) throw new Error(`snapshot failed: ${snap.body}`);
    const snapName = JSON.parse(snap.body).name as string;
    const fromSnap: number[] = [];
    for (let i = 0; i < 5; i++) {
      const [t, res] = await timed(() => call(base, key, 'POST', '/sandboxes', { snapshot: snapName, timeoutSeconds: 0 }));
      if (res.status !== 201) throw new Error(`create from snapshot failed: ${res.body}`);
      created.push(JSON.parse(res.body).id);
      fromSnap.push(t);
    }
    console.log(`create from a snapshot (n=5): p50 ${ms(quantile(fromSnap, 0.5))}; baseline plain create p50 ${ms(quantile(createTimes, 0.5))}`);
    for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
    await call(base, key, 'DELETE', `/snapshots/${snapName}`);
  } finally {
    for (const id of created) await call(base, key, 'DELETE', `/sandboxes/${id}`).catch(() => undefined);
    await server.close();
    // The reflink store is a loop-mounted filesystem inside the data dir: release it first.
    await unmountReflinkStore(`${dataDir}/host`).catch(() => undefined);
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
