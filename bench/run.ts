// `npm run bench`: latency and throughput of the native API (and image pulls) on this machine, each figure
// beside a baseline measured in the same run. Prints medians (and p95 where asked).
// Options: --creates N (default 10), --execs N (default 50), --mib N (default 50), --postgres URL,
// --code-runs N (default 30) and --code-image NAME (default `code-interpreter`) for the code interpreter,
// --usage-sandboxes N (default 50) and --usage-rounds N (default 20) for the host agent's usage sampling,
// --only code-interpreter, --only usage or --only observability to run just that part (the last: the exec
// round trip with metrics and tracing off vs on, two servers of its own; it also runs after the rest).
// Scale-out (bench/placement.ts, bench/replicas.ts; they run last, each on a database of its own on the
// PostgreSQL server of --postgres, else the test suite's): --only placement (create with 3 host agents
// vs 1; --placement-creates N per phase, default 10, --placements N calls of the placement step alone,
// default 200) and --only replicas (GET throughput through 1 vs 2 replicas, limits off and on;
// --replica-seconds N, default 5, --replica-connections N, default 16, --replica-rounds N, default 2);
// --only transfer (a host-to-host move of a stopped sandbox holding --transfer-mib MiB, default 1024, vs a
// plain cp of the same bytes, median of --transfer-runs moves, default 3, at most 10; also runs last);
// --only ssh (SSH exec round trips vs the API exec, --ssh-runs N each, default 20; bench/ssh.ts).
// --only volumes: dd of --volume-mib MiB (default 256) conv=fsync into a volume vs the sandbox's own disk,
// median of --volume-runs (default 3), inside one sandbox (bench/volumes.ts).
// --only warm-pool: the cold creates (1) and the warm-pool creates beside them and the raw floor (1b, bench/warm-pool.ts).
// --only data: create, exec, --mib up/down, hosted ports, --burst-creates N (default 50) at
// --burst-concurrency N (default 8), and PSS per idle sandbox with --pss-sandboxes N running (default 20),
// read --pss-settle-seconds after the last create (default 20: V8 shrinks an idle heap after some seconds).
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { pipeline } from 'node:stream/promises';
import { parseArgs } from 'node:util';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { startServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';
import { unmountReflinkStore } from '../host/storage/disk-store.js';
import { benchCodeInterpreter } from './code-interpreter.js';
import { benchObservability } from './observability.js';
import { benchUsageSampling } from './usage-sampling.js';
import { benchPlacement } from './placement.js';
import { benchReplicaThroughput } from './replicas.js';
import { DEFAULT_BENCH_POSTGRES } from './nestbox-processes.js';
import { benchHostTransfer } from './host-transfer.js';
import { benchSsh } from './ssh.js';
import { benchVolumes } from './volumes.js';
import { benchWarmPool } from './warm-pool.js';
import { call, clientJob, ms, quantile, timed } from './measure.js';
import { benchConcurrentCreates, benchIdlePss } from './density.js';

const { values } = parseArgs({
  options: {
    creates: { type: 'string', default: '10' },
    execs: { type: 'string', default: '50' },
    mib: { type: 'string', default: '50' },
    postgres: { type: 'string' },
    'images-dir': { type: 'string', default: '/var/tmp/nestbox-test-images' },
    reflink: { type: 'boolean', default: true },
    'code-runs': { type: 'string', default: '30' },
    'code-image': { type: 'string', default: 'code-interpreter' },
    'usage-sandboxes': { type: 'string', default: '50' },
    'usage-rounds': { type: 'string', default: '20' },
    'placement-creates': { type: 'string', default: '10' },
    placements: { type: 'string', default: '200' },
    'replica-seconds': { type: 'string', default: '5' },
    'replica-connections': { type: 'string', default: '16' },
    'replica-rounds': { type: 'string', default: '2' },
    'transfer-runs': { type: 'string', default: '3' },
    'transfer-mib': { type: 'string', default: '1024' },
    'ssh-runs': { type: 'string', default: '20' },
    only: { type: 'string' },
    'burst-creates': { type: 'string', default: '50' },
    'burst-concurrency': { type: 'string', default: '8' },
    'pss-sandboxes': { type: 'string', default: '20' },
    'pss-settle-seconds': { type: 'string', default: '20' },
    'volume-runs': { type: 'string', default: '3' },
    'volume-mib': { type: 'string', default: '256' },
  },
});
const ALONE = ['code-interpreter', 'usage', 'observability', 'placement', 'replicas', 'transfer', 'ssh', 'volumes', 'warm-pool'];
// `--only data`: the data paths of issue 20 on one server (create, exec, 50 MiB up/down, hosted
// ports, creates at concurrency, PSS per idle sandbox), each beside its floor.
if (values.only !== undefined && !ALONE.includes(values.only) && values.only !== 'data') throw new Error(`--only: the parts that run alone are ${ALONE.join(', ')} and data, not ${values.only}`);
const usageSampling = () => benchUsageSampling({ sandboxes: Number(values['usage-sandboxes']), rounds: Number(values['usage-rounds']), imagesDir: values['images-dir']! });
const scaleOutPostgres = values.postgres ?? DEFAULT_BENCH_POSTGRES;
const placement = () => benchPlacement({ creates: Number(values['placement-creates']), placements: Number(values.placements), imagesDir: values['images-dir']!, postgres: scaleOutPostgres });
const replicas = () =>
  benchReplicaThroughput({ seconds: Number(values['replica-seconds']), connections: Number(values['replica-connections']), rounds: Number(values['replica-rounds']), imagesDir: values['images-dir']!, postgres: scaleOutPostgres });
const CREATES = Number(values.creates);
const EXECS = Number(values.execs);
const MIB = Number(values.mib);

const mibps = (bytes: number, millis: number) => `${(bytes / 1024 / 1024 / (millis / 1000)).toFixed(0)} MiB/s`;

// Bulk transfers run in a client process of their own (bench/http-client.ts), for the API and
// for its loopback baseline alike: the server is in this process.
async function upload(url: string, headers: Record<string, string>, file: string): Promise<number> {
  return (await clientJob({ kind: 'upload', url, headers, file })).ms;
}

async function download(url: string, headers: Record<string, string>): Promise<number> {
  return (await clientJob({ kind: 'download', url, headers })).ms;
}

/**
 * Baseline: the same bytes over a plain Node HTTP server on loopback, written to / read from
 * disk. With `fsync`, the upload is flushed to disk before the answer, as the guest agent does
 * for every upload (a file is replaced atomically and durably): the floor for that promise.
 */
async function loopbackBaseline(file: string, scratch: string, fsync = false): Promise<{ up: number; down: number }> {
  const target = `${scratch}/loopback.bin`;
  const server = http.createServer((req, res) => {
    if (req.method === 'PUT') {
      const out = createWriteStream(target, { flush: fsync });
      void pipeline(req, out).then(() => res.end('ok'));
    } else {
      void pipeline(createReadStream(target), res);
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const base = `http://127.0.0.1:${(server.address() as { port: number }).port}/x`;
  const up = await upload(base, {}, file);
  const down = await download(base, {});
  server.close();
  return { up, down };
}

async function main(): Promise<void> {
  const observability = () => benchObservability({ execs: EXECS, imagesDir: values['images-dir']!, postgres: values.postgres });
  if (values.only === 'observability') return await observability();
  // A host-to-host move of a 1 GiB sandbox vs a plain cp (bench/host-transfer.ts): a server and a peer host agent of its own.
  const hostTransfer = () => benchHostTransfer({ runs: Number(values['transfer-runs']), bytes: Number(values['transfer-mib']) * 2 ** 20, imagesDir: values['images-dir']!, postgres: values.postgres });
  if (values.only === 'transfer') return await hostTransfer();
  // SSH exec round trips (new connection, ControlMaster, ssh2 on one connection) vs the API exec (bench/ssh.ts).
  if (values.only === 'ssh') return await benchSsh({ runs: Number(values['ssh-runs']), imagesDir: values['images-dir']!, postgres: values.postgres });
  // Needs no control plane: its sandboxes run on a driver of this process (usage-sampling.ts).
  if (values.only === 'usage') return usageSampling();
  // Volume writes vs the sandbox's own disk (bench/volumes.ts), on a driver of this process.
  if (values.only === 'volumes') return benchVolumes({ runs: Number(values['volume-runs']), mib: Number(values['volume-mib']), imagesDir: values['images-dir']! });
  if (values.only === 'placement') return placement();
  if (values.only === 'replicas') return replicas();
  const dataDir = mkdtempSync('/tmp/nbx-bench-');
  const key = generateApiKey();
  const config = loadConfig({
    NESTBOX_PORT: '0',
    NESTBOX_SSH_PORT: '0',
    NESTBOX_DATA_DIR: dataDir,
    NESTBOX_IMAGES_DIR: values['images-dir'],
    NESTBOX_BOOTSTRAP_API_KEY: key,
    ...(values.postgres ? { NESTBOX_DATABASE_URL: values.postgres } : {}),
    // Forks are measured with copy-on-write disks, the way a production host runs.
    NESTBOX_REFLINK_STORE: values.reflink ? 'auto' : 'off',
    // 50 sandboxes at once (creates at concurrency, PSS per idle sandbox) of 1 vCPU each pass a
    // 2-core machine's default 32 vCPUs (cores × 16); idle sandboxes use no CPU.
    NESTBOX_CPU_OVERCOMMIT: '64',
  });
  const logs: string[] = [];
  const server = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => logs.push(line.trimEnd()) }));
  const base = `${server.url}/api/v1`;
  const created: string[] = [];
  try {
    const deadline = Date.now() + 180_000;
    while (JSON.parse((await call(base, key, 'GET', '/health')).body).hostsAvailable < 1) {
      if (Date.now() > deadline) throw new Error(`no host agent registered:\n${logs.join('\n')}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    console.log(`Nestbox benchmark — ${new Date().toISOString()} — database: ${config.database.kind}, driver: local`);
    const codeInterpreter = () => benchCodeInterpreter({ base, key, runs: Number(values['code-runs']), image: values['code-image']!, track: (sid) => created.push(sid) });
    if (values.only === 'code-interpreter') return await codeInterpreter();
    // The warm pool waits until its own part (1b): the cold creates must be cold, and its
    // refills would compete with every figure for the CPUs.
    await server.services.warmPool.stop();
    await server.services.warmPool.drain();

    // 1. create → running
    const createTimes: number[] = [];
    for (let i = 0; i < CREATES; i++) {
      const [t, res] = await timed(() => call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0 }));
      if (res.status !== 201) throw new Error(`create failed: ${res.body}`);
      created.push(JSON.parse(res.body).id);
      createTimes.push(t);
    }
    console.log(`create → running (n=${CREATES}): p50 ${ms(quantile(createTimes, 0.5))}, p95 ${ms(quantile(createTimes, 0.95))}`);

    // 1b. warm-pool create vs the cold ones above and the raw floor (bench/warm-pool.ts)
    await benchWarmPool({ server, base, key, creates: CREATES, coldTimes: createTimes, baseRootfs: `${values['images-dir']}/default/rootfs`, track: (sid) => created.push(sid) });
    if (values.only === 'warm-pool') return;

    // 2. exec round trip of `true` vs spawning it on the host
    const id = created[0];
    const { execP50 } = await execSection();
    async function execSection(): Promise<{ execP50: number }> {
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
    console.log(`  baseline direct spawn on the host: /bin/true p50 ${ms(trueP50)}, bash -c true p50 ${ms(bashP50)} → API round trip ×${(execP50 / bashP50).toFixed(2)} of bash -c (+${ms(execP50 - bashP50)}; goal ≤ ×1.3)`);
    return { execP50 };
    }

    // 3. 50 MiB upload and download vs a plain loopback HTTP copy
    const bytes = MIB * 1024 * 1024;
    const file = `${dataDir}/payload.bin`;
    writeFileSync(file, randomBytes(bytes));
    const auth = { authorization: `Bearer ${key}` };
    const { up, down } = await filesSection();
    async function filesSection(): Promise<{ up: number; down: number }> {
    const url = `${base}/sandboxes/${id}/files?path=/root/payload.bin`;
    const ups: number[] = [];
    const downs: number[] = [];
    for (let i = 0; i < 3; i++) {
      ups.push(await upload(url, auth, file));
      downs.push(await download(url, auth));
    }
    const baseUps: number[] = [];
    const baseDowns: number[] = [];
    for (let i = 0; i < 3; i++) {
      const b = await loopbackBaseline(file, dataDir);
      baseUps.push(b.up);
      baseDowns.push(b.down);
    }
    const syncedUps: number[] = [];
    for (let i = 0; i < 3; i++) syncedUps.push((await loopbackBaseline(file, dataDir, true)).up);
    const [up, down, bup, bdown, bsync] = [ups, downs, baseUps, baseDowns, syncedUps].map((xs) => quantile(xs, 0.5));
    // Ratio = loopback time / API time: 1.0 is the speed of a plain copy (goal ≥ 0.8).
    console.log(`upload ${MIB} MiB (median of 3): ${mibps(bytes, up)} (${ms(up)}); baseline loopback copy ${mibps(bytes, bup)} (${ms(bup)}) → ×${(bup / up).toFixed(2)} of loopback speed (goal ≥ 0.8); the copy fsynced like an upload ${mibps(bytes, bsync)} (${ms(bsync)}) → ×${(bsync / up).toFixed(2)}`);
    console.log(`download ${MIB} MiB (median of 3): ${mibps(bytes, down)} (${ms(down)}); baseline loopback copy ${mibps(bytes, bdown)} (${ms(bdown)}) → ×${(bdown / down).toFixed(2)} of loopback speed (goal ≥ 0.8)`);
    return { up, down };
    }
    if (values.only === 'data') {
      await hostedPortsSection();
      const api = { base, key, hostDataDir: `${dataDir}/host` };
      for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
      await benchConcurrentCreates(api, { total: Number(values['burst-creates']), concurrency: Number(values['burst-concurrency']), serialP50: quantile(createTimes, 0.5) }, (sid) => created.push(sid));
      for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
      await benchIdlePss(api, { count: Number(values['pss-sandboxes']), settleMs: Number(values['pss-settle-seconds']) * 1000 }, (sid) => created.push(sid));
      return;
    }

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

    // 7b. Image builds: a cold build of a few steps (RUN, COPY-free) vs the unchanged rebuild
    //     answered from the layer cache; and creates from the built image vs from `default`.
    {
      const waitBuild = async (id: string): Promise<{ state: string; imageId: string }> => {
        for (let i = 0; i < 6000; i++) {
          const b = JSON.parse((await call(base, key, 'GET', `/builds/${id}`)).body) as { state: string; imageId: string };
          if (['succeeded', 'failed', 'cancelled'].includes(b.state)) return b;
          await new Promise((r) => setTimeout(r, 50));
        }
        throw new Error(`build ${id} did not finish`);
      };
      const steps = [{ run: 'mkdir -p /opt/app && seq 1 10000 > /opt/app/numbers' }, { env: { APP: '/opt/app' } }, { workdir: '/opt/app' }, { run: 'wc -l numbers > count' }];
      const buildOnce = async (noCache: boolean): Promise<number> => {
        const [t] = await timed(async () => {
          const res = await call(base, key, 'POST', '/builds', { name: 'bench-image', steps, noCache, egress: { mode: 'deny-all' } });
          if (res.status !== 202) throw new Error(`build failed to start: ${res.body}`);
          const done = await waitBuild(JSON.parse(res.body).id);
          if (done.state !== 'succeeded') throw new Error(`bench build ${done.state}`);
        });
        return t;
      };
      const cold: number[] = [];
      const cached: number[] = [];
      for (let i = 0; i < 3; i++) {
        cold.push(await buildOnce(true));
        cached.push(await buildOnce(false));
      }
      console.log(`image build of 4 steps (n=3): cold p50 ${ms(quantile(cold, 0.5))}; unchanged rebuild from the cache p50 ${ms(quantile(cached, 0.5))} → ×${(quantile(cold, 0.5) / quantile(cached, 0.5)).toFixed(1)} faster`);
      const fromImage: number[] = [];
      const fromDefault: number[] = [];
      for (let i = 0; i < 5; i++) {
        for (const [list, body] of [[fromImage, { image: 'bench-image', timeoutSeconds: 0 }], [fromDefault, { timeoutSeconds: 0 }]] as const) {
          const [t, res] = await timed(() => call(base, key, 'POST', '/sandboxes', body));
          if (res.status !== 201) throw new Error(`create failed: ${res.body}`);
          created.push(JSON.parse(res.body).id);
          list.push(t);
        }
      }
      console.log(`create from a built image (n=5, interleaved): p50 ${ms(quantile(fromImage, 0.5))}; baseline from default p50 ${ms(quantile(fromDefault, 0.5))} → ×${(quantile(fromImage, 0.5) / quantile(fromDefault, 0.5)).toFixed(2)}`);
      for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
    }

    // 8. Daytona compat overhead: the same exec and file round trips through @daytonaio/sdk
    //    (control plane at /daytona/api, toolbox at /daytona/toolbox) vs the native API.
    {
      const { Daytona } = await import('@daytonaio/sdk');
      const daytona = new Daytona({ apiUrl: `${server.url}/daytona/api`, apiKey: key });
      const [sdkCreate, sb] = await timed(() => daytona.create());
      created.push(sb.id);
      const sdkExec: number[] = [];
      const nativeExec: number[] = [];
      for (let i = 0; i < EXECS; i++) {
        sdkExec.push((await timed(() => sb.process.executeCommand('true')))[0]);
        nativeExec.push((await timed(() => call(base, key, 'POST', `/sandboxes/${sb.id}/commands`, { cmd: 'true' })))[0]);
      }
      const [se, ne] = [sdkExec, nativeExec].map((xs) => quantile(xs, 0.5));
      console.log(`daytona SDK create → started: ${ms(sdkCreate)}; baseline native create p50 ${ms(quantile(createTimes, 0.5))}`);
      console.log(`daytona SDK executeCommand(\`true\`) (n=${EXECS}): p50 ${ms(se)}; native p50 ${ms(ne)} → shim overhead +${ms(se - ne)}`);
      const small = randomBytes(64 * 1024);
      const sdkFiles: number[] = [];
      const nativeFiles: number[] = [];
      for (let i = 0; i < 20; i++) {
        sdkFiles.push((await timed(async () => {
          await sb.fs.uploadFile(small, '/root/rt.bin');
          await sb.fs.downloadFile('/root/rt.bin');
        }))[0]);
        nativeFiles.push((await timed(async () => {
          const u = `${base}/sandboxes/${sb.id}/files?path=/root/rt-native.bin`;
          const put = await fetch(u, { method: 'PUT', headers: { ...auth, 'content-type': 'application/octet-stream' }, body: small });
          if (put.status !== 200) throw new Error(`upload answered ${put.status}`);
          await (await fetch(u, { headers: auth })).arrayBuffer();
        }))[0]);
      }
      const [sf, nf] = [sdkFiles, nativeFiles].map((xs) => quantile(xs, 0.5));
      console.log(`daytona SDK 64 KiB upload + download (n=20): p50 ${ms(sf)}; native p50 ${ms(nf)} → shim overhead +${ms(sf - nf)}`);
      const bigUp = await timed(() => sb.fs.uploadFile(file, '/root/payload-sdk.bin'));
      const bigDown = await timed(() => sb.fs.downloadFile('/root/payload-sdk.bin'));
      console.log(`daytona SDK ${MIB} MiB upload ${mibps(bytes, bigUp[0])}, download ${mibps(bytes, bigDown[0])}; native upload ${mibps(bytes, up)}, download ${mibps(bytes, down)}`);
      await sb.delete();
      created.splice(created.indexOf(sb.id), 1);
    }

    // 9. Hosted ports: a request through the proxy (control plane → host agent → sandbox) vs
    //    the same request straight to the sandbox's slot address from the host; then create
    //    time with a warm slot pool vs an empty one (driver level, same machine, same image).
    await hostedPortsSection();
    async function hostedPortsSection(): Promise<void> {
      const portSandbox = JSON.parse((await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0 })).body).id as string;
      created.push(portSandbox);
      await call(base, key, 'POST', `/sandboxes/${portSandbox}/commands`, { cmd: 'mkdir -p /srv && head -c 67108864 /dev/urandom > /srv/big.bin && echo ok > /srv/small.txt' });
      await call(base, key, 'POST', `/sandboxes/${portSandbox}/commands`, { detach: true, cmd: 'cd /srv && python3 -m http.server 8000 --bind 0.0.0.0' });
      const published = await call(base, key, 'POST', `/sandboxes/${portSandbox}/ports`, { port: 8000, public: true });
      if (published.status !== 201) throw new Error(`publish failed: ${published.body}`);
      const { readFileSync } = await import('node:fs');
      const address = JSON.parse(readFileSync(`${dataDir}/host/sandboxes/${portSandbox}/record.json`, 'utf8')).slot.sandboxAddress as string;
      const proxied = `${server.url}/p/${portSandbox}/8000`;
      const direct = `http://${address}:8000`;
      const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
      const get = (url: string) =>
        new Promise<number>((resolve, reject) => {
          http.get(url, { agent }, (res) => {
            let size = 0;
            res.on('data', (c: Buffer) => (size += c.length));
            res.on('end', () => (res.statusCode === 200 ? resolve(size) : reject(new Error(`${url} answered ${res.statusCode}`))));
          }).on('error', reject);
        });
      const readyDeadline = Date.now() + 15_000;
      while (!(await get(`${direct}/small.txt`).catch(() => 0))) {
        if (Date.now() > readyDeadline) throw new Error('the sandbox server did not start');
        await new Promise((r) => setTimeout(r, 100));
      }
      const latency = async (root: string) => {
        const xs: number[] = [];
        for (let i = 0; i < 200; i++) xs.push((await timed(() => get(`${root}/small.txt`)))[0]);
        return quantile(xs, 0.5);
      };
      // Rates and bulk bytes from a client process of its own (bench/http-client.ts).
      const requestsPerSecond = async (root: string) => {
        const total = 400;
        const { ms: t } = await clientJob({ kind: 'gets', url: `${root}/small.txt`, headers: {}, total, concurrency: 8 });
        return total / (t / 1000);
      };
      const bulk = async (root: string) => {
        const { ms: t, bytes: size } = await clientJob({ kind: 'download', url: `${root}/big.bin`, headers: {} });
        return size / 2 ** 20 / (t / 1000);
      };
      const [pl, dl] = [await latency(proxied), await latency(direct)];
      console.log(`hosted port GET (n=200, keep-alive): p50 ${ms(pl)} via the proxy; direct to the sandbox ${ms(dl)} → proxy overhead +${ms(pl - dl)}`);
      const [pr, dr] = [await requestsPerSecond(proxied), await requestsPerSecond(direct)];
      console.log(`hosted port throughput (400 GETs, 8 in flight): ${pr.toFixed(0)} req/s via the proxy; direct ${dr.toFixed(0)} req/s → ×${(pr / dr).toFixed(2)} of direct (goal ≥ 0.8)`);
      const [pb, db] = [await bulk(proxied), await bulk(direct)];
      console.log(`hosted port 64 MiB download: ${pb.toFixed(0)} MiB/s via the proxy; direct ${db.toFixed(0)} MiB/s → ×${(pb / db).toFixed(2)} of direct (goal ≥ 0.8)`);
      agent.destroy();
    }
    {

      const { LocalDriver } = await import('../host/drivers/local/driver.js');
      const { GUEST_AGENT_BUNDLE } = await import('../src/paths.js');
      const poolDir = mkdtempSync('/tmp/nbx-bp-');
      const ownerOfBench = `bench-${randomBytes(4).toString('hex')}`;
      const driver = new LocalDriver({ dataDir: poolDir, imagesDir: values['images-dir']!, guestAgentBundle: GUEST_AGENT_BUNDLE(), ownerId: ownerOfBench, slotPoolSize: 4 });
      try {
        await driver.init();
        const warm: number[] = [];
        const cold: number[] = [];
        for (let i = 0; i < 5; i++) {
          await driver.resizeSlotPool(4);
          await driver.waitForSlotPool();
          const warmId = `bpw${i}${randomBytes(3).toString('hex')}`;
          warm.push((await timed(() => driver.create({ id: warmId, image: 'default', cpu: 1, memoryMiB: 256, env: {} })))[0]);
          await driver.destroy(warmId);
          await driver.resizeSlotPool(0);
          const coldId = `bpc${i}${randomBytes(3).toString('hex')}`;
          cold.push((await timed(() => driver.create({ id: coldId, image: 'default', cpu: 1, memoryMiB: 256, env: {} })))[0]);
          await driver.destroy(coldId);
        }
        const [w, c] = [quantile(warm, 0.5), quantile(cold, 0.5)];
        console.log(`driver create (n=5): p50 ${ms(w)} with a warm slot pool; ${ms(c)} with an empty one → the pool saves ${ms(c - w)}`);
      } finally {
        await driver.close();
        const { Cgroups } = await import('../host/drivers/local/cgroups.js');
        const cgroups = await Cgroups.detect();
        await cgroups.remove(cgroups.groupFor(`nestbox/${ownerOfBench}`)).catch(() => undefined);
        rmSync(poolDir, { recursive: true, force: true });
      }
    }

    // 10. E2B compat overhead: commands.run and a 64 KiB file round trip through the `e2b` SDK
    //     (control plane at /e2b, envd Connect RPC and /files at the root) vs the native API.
    {
      const { Sandbox: E2bSandbox } = await import('e2b');
      const e2bOpts = { apiKey: key, apiUrl: `${server.url}/e2b`, sandboxUrl: server.url };
      const [sdkCreate, sbx] = await timed(() => E2bSandbox.create({ ...e2bOpts, timeoutMs: 600_000 }));
      created.push(sbx.sandboxId);
      const sdkRun: number[] = [];
      const nativeRun: number[] = [];
      for (let i = 0; i < EXECS; i++) {
        sdkRun.push((await timed(() => sbx.commands.run('true')))[0]);
        nativeRun.push((await timed(() => call(base, key, 'POST', `/sandboxes/${sbx.sandboxId}/commands`, { cmd: 'true' })))[0]);
      }
      const [sr, nr] = [sdkRun, nativeRun].map((xs) => quantile(xs, 0.5));
      console.log(`e2b SDK create → running: ${ms(sdkCreate)}; baseline native create p50 ${ms(quantile(createTimes, 0.5))}`);
      console.log(`e2b SDK commands.run(\`true\`) (n=${EXECS}): p50 ${ms(sr)}; native p50 ${ms(nr)} → shim overhead +${ms(sr - nr)}`);
      const payload = randomBytes(64 * 1024);
      const sdkFiles: number[] = [];
      const nativeFiles: number[] = [];
      for (let i = 0; i < 20; i++) {
        sdkFiles.push((await timed(async () => {
          await sbx.files.write('/root/e2b-rt.bin', payload.buffer.slice(payload.byteOffset, payload.byteOffset + payload.byteLength) as ArrayBuffer);
          const back = await sbx.files.read('/root/e2b-rt.bin', { format: 'bytes' });
          if (back.byteLength !== payload.length) throw new Error(`e2b read back ${back.byteLength} bytes`);
        }))[0]);
        nativeFiles.push((await timed(async () => {
          const u = `${base}/sandboxes/${sbx.sandboxId}/files?path=/root/e2b-rt-native.bin`;
          const put = await fetch(u, { method: 'PUT', headers: { ...auth, 'content-type': 'application/octet-stream' }, body: payload });
          if (put.status !== 200) throw new Error(`upload answered ${put.status}`);
          await (await fetch(u, { headers: auth })).arrayBuffer();
        }))[0]);
      }
      const [sf, nf] = [sdkFiles, nativeFiles].map((xs) => quantile(xs, 0.5));
      console.log(`e2b SDK 64 KiB files.write + files.read (n=20): p50 ${ms(sf)}; native p50 ${ms(nf)} → shim overhead +${ms(sf - nf)}`);
      await sbx.kill();
      created.splice(created.indexOf(sbx.sandboxId), 1);
    }
    // 10b. Creates at concurrency and memory per idle sandbox (bench/density.ts).
    {
      const api = { base, key, hostDataDir: `${dataDir}/host` };
      for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
      await benchConcurrentCreates(api, { total: Number(values['burst-creates']), concurrency: Number(values['burst-concurrency']), serialP50: quantile(createTimes, 0.5) }, (sid) => created.push(sid));
      for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
      await benchIdlePss(api, { count: Number(values['pss-sandboxes']), settleMs: Number(values['pss-settle-seconds']) * 1000 }, (sid) => created.push(sid));
      for (const sid of created.splice(0)) await call(base, key, 'DELETE', `/sandboxes/${sid}`);
    }
    // 11. The code interpreter (bench/code-interpreter.ts).
    await codeInterpreter();
    await benchImagePull(dataDir);
    // 12. The host agent's usage sampling over idle sandboxes (bench/usage-sampling.ts).
    await usageSampling();
  } finally {
    await server.services.warmPool.stop();
    await server.services.warmPool.drain().catch(() => undefined);
    for (const id of created) await call(base, key, 'DELETE', `/sandboxes/${id}`).catch(() => undefined);
    await server.close();
    // The reflink store is a loop-mounted filesystem inside the data dir: release it first.
    await unmountReflinkStore(`${dataDir}/host`).catch(() => undefined);
    // A failure here must not hide the one that brought us here.
    try {
      rmSync(dataDir, { recursive: true, force: true });
    } catch (error) {
      console.error(`could not remove ${dataDir}: ${String(error)}`);
    }
  }
  // 12. Observability's cost on the exec round trip (bench/observability.ts): two servers of its own, after this one is gone.
  await observability();
  // 13. Scale-out: placement with 3 host agents vs 1, and GET throughput through 1 vs 2 replicas (their own processes and database).
  await placement();
  await replicas();
  await hostTransfer();
}

/**
 * An OCI image pull (host/images/oci: resolve, skopeo copy, umoci unpack, metadata) from a
 * registry on loopback, beside a plain `skopeo copy` of the same image into an OCI layout (the
 * transfer alone, no unpack), and a pull of an image already in the store. Images: busybox
 * (one static binary) and the base image's tree as one layer.
 */
async function benchImagePull(dataDir: string): Promise<void> {
  const { execFileSync } = await import('node:child_process');
  const { OciImageStore } = await import('../host/images/oci/store.js');
  const { buildTestImage, busyboxImageSpec, pushTestImage, startTestRegistry } = await import('../host/images/oci/test-registry.js');
  const work = `${dataDir}/image-bench`;
  const registry = await startTestRegistry();
  try {
    const debian = `${work}/debian/layout`;
    execFileSync('umoci', ['init', '--layout', debian]);
    execFileSync('umoci', ['new', '--image', `${debian}:image`]);
    execFileSync('umoci', ['insert', '--image', `${debian}:image`, `${values['images-dir']}/default/rootfs`, '/'], { stdio: 'ignore' });
    const images: Record<string, string> = { busybox: await buildTestImage(`${work}/busybox`, busyboxImageSpec()), debian: `${debian}:image` };
    for (const [name, layout] of Object.entries(images)) {
      const ref = `${registry.host}/bench/${name}:1`;
      await pushTestImage(layout, ref);
      const pulls: number[] = [];
      const copies: number[] = [];
      let sizes = '';
      for (let i = 0; i < 3; i++) {
        copies.push((await timed(async () => execFileSync('skopeo', ['copy', '--quiet', '--src-tls-verify=false', `docker://${ref}`, `oci:${work}/raw-${name}-${i}:x`])))[0]);
        const [t, image] = await timed(() => new OciImageStore({ storeDir: `${work}/store-${name}-${i}` }).pull(ref));
        pulls.push(t);
        sizes = `${(image.meta.compressedBytes / 1e6).toFixed(1)} MB compressed, ${(image.meta.sizeBytes / 1e6).toFixed(1)} MB unpacked`;
      }
      const [cached] = await timed(() => new OciImageStore({ storeDir: `${work}/store-${name}-0` }).pull(ref));
      const [p, c] = [pulls, copies].map((xs) => quantile(xs, 0.5));
      console.log(`image pull ${name} (${sizes}, n=3): p50 ${ms(p)}; skopeo copy alone p50 ${ms(c)} → ${(p / c).toFixed(1)}×; already in the store ${ms(cached)}`);
    }
  } finally {
    await registry.stop();
    rmSync(work, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
