// GET throughput through one control-plane replica vs two, for `npm run bench` (issue 16).
// Five `nestbox server` processes on one PostgreSQL database of their own, started the way an
// operator runs replicas (the same NESTBOX_HOST_SECRET and object store directory, no local host
// agent, no supervisor): two with the request rate limits off, two with them on as configured by
// default, so the cost of the PostgreSQL-backed limiter (a token lease per bucket every
// NESTBOX_RATE_LIMIT_LEASE requests) shows beside the scale-out, and a fifth that is not measured
// and takes the host agent's heartbeats (the replica receiving them was measurably slower, which
// would have favoured whichever pair did not). One `nestbox host-agent` runs the sandbox whose
// GET /api/v1/sandboxes/{id} is the load: a read of its row after the key is authenticated and
// admitted, no host call.
//
// autocannon drives a fixed number of connections for a fixed time, at one replica, then at two
// (one autocannon run whose connections are split over both URLs, so the load generator is the
// same in both); the baseline is the same autocannon run against a plain Node HTTP server (its
// own process) answering the same JSON bytes: the most this generator gets through loopback on
// this machine. The configurations take turns for a few rounds, every other round in reverse, so
// drift on a shared machine falls on all of them alike. Everything is on loopback; bounded by rounds × configurations × seconds.
import { mkdtempSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import autocannon from 'autocannon';
import { generateApiKey } from '../core/services/auth.js';
import { removeTree } from '../host/util/fs.js';
import { call, ms } from './measure.js';
import { freePort, freshDatabase, hostSecretOf, spawnNestbox, waitFor, type NestboxProcess } from './nestbox-processes.js';

export interface ReplicaBenchOptions {
  /** Seconds of load per configuration and round. */
  seconds: number;
  /** Connections autocannon keeps open (split evenly over the replicas). */
  connections: number;
  /** Times the configurations are run in turn. */
  rounds: number;
  imagesDir: string;
  /** A PostgreSQL server; the part makes a database of its own there. */
  postgres: string;
}

interface Replica {
  name: string;
  url: string;
  dir: string;
  proc: NestboxProcess;
}

interface Load {
  /** 2xx answers per second. */
  rps: number;
  p50: number;
  p99: number;
  /** Answers other than 2xx (429s when a limit is hit) and connection errors. */
  non2xx: number;
  errors: number;
}

async function load(urls: string[], headers: Record<string, string>, connections: number, seconds: number): Promise<Load> {
  // autocannon takes several URLs and spreads its connections over them (its typings know one).
  const result = await autocannon({ url: (urls.length === 1 ? urls[0] : urls) as string, connections, duration: seconds, headers });
  return { rps: result['2xx'] / result.duration, p50: result.latency.p50, p99: result.latency.p99, non2xx: result.non2xx, errors: result.errors };
}

/** A plain HTTP server in a process of its own, answering every request with `body` as JSON. */
async function startBaselineServer(body: string, port: number): Promise<{ url: string; stop: () => Promise<void> }> {
  const script = `const body = Buffer.from(process.env.BODY); require('node:http').createServer((req, res) => { req.resume(); res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'content-length': body.length }).end(body); }).listen(${port}, '127.0.0.1', () => console.log('up'));`;
  const child = spawn(process.execPath, ['-e', script], { env: { BODY: body }, stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`the baseline server exited (${code})`)));
  });
  return {
    url: `http://127.0.0.1:${port}`,
    stop: async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

export async function benchReplicaThroughput(o: ReplicaBenchOptions): Promise<void> {
  const started = performance.now();
  const database = await freshDatabase(o.postgres);
  if (!database) {
    console.log(`GET throughput through 1 vs 2 replicas: not run — it needs PostgreSQL, and none answered at ${new URL(o.postgres).host} (give --postgres URL)`);
    return;
  }
  const key = generateApiKey();
  const auth = { authorization: `Bearer ${key}` };
  const hostSecret = randomBytes(32).toString('base64url');
  const objects = mkdtempSync('/tmp/nbx-bench-rep-objects-');
  const replicas: Replica[] = [];
  let agent: { dir: string; proc: NestboxProcess } | undefined;
  let baseline: Awaited<ReturnType<typeof startBaselineServer>> | undefined;
  let sandboxId: string | undefined;
  try {
    const limitsOff = { NESTBOX_RATE_LIMIT_KEY_PER_SECOND: '0', NESTBOX_RATE_LIMIT_ORG_PER_SECOND: '0' };
    for (const [name, extra] of [['off-a', limitsOff], ['off-b', limitsOff], ['on-a', {}], ['on-b', {}], ['heartbeats', {}]] as const) {
      const port = await freePort();
      const dir = mkdtempSync(`/tmp/nbx-bench-rep-${name}-`);
      const proc = spawnNestbox(['server'], {
        NESTBOX_PORT: String(port),
        NESTBOX_SSH_PORT: '0',
        NESTBOX_HOST: '127.0.0.1',
        NESTBOX_DATA_DIR: dir,
        NESTBOX_IMAGES_DIR: o.imagesDir,
        NESTBOX_DATABASE_URL: database.url,
        NESTBOX_HOST_SECRET: hostSecret,
        NESTBOX_OBJECT_STORE_DIR: objects,
        NESTBOX_BOOTSTRAP_API_KEY: key,
        NESTBOX_WARM_POOL_SIZE: '0', // no warm pool: its refills would run beside what is measured
        NESTBOX_LOCAL_HOST_AGENT: 'false',
        NESTBOX_SERVER_SUPERVISOR: 'false',
        // Per-request info lines would be piped into this process, which also runs the load generator.
        NESTBOX_LOG_LEVEL: 'warn',
        ...extra,
      });
      replicas.push({ name, url: `http://127.0.0.1:${port}`, dir, proc });
    }
    for (const r of replicas) {
      await waitFor(`replica ${r.name}`, async () => {
        if (!r.proc.running()) throw new Error('it exited');
        return (await fetch(`${r.url}/api/v1/health`)).status === 200;
      }, 60_000, 100).catch((err) => {
        throw new Error(`${(err as Error).message}\n${r.proc.output.join('').slice(-3000)}`);
      });
    }
    const upAfter = performance.now() - started;
    const [offA, offB, onA, onB, heartbeats] = replicas as [Replica, Replica, Replica, Replica, Replica];

    const hostId = `bench-rep-${randomBytes(3).toString('hex')}`;
    const agentDir = mkdtempSync('/tmp/nbx-bench-rep-host-');
    agent = {
      dir: agentDir,
      proc: spawnNestbox(['host-agent'], {
        NESTBOX_DATA_DIR: agentDir,
        NESTBOX_IMAGES_DIR: o.imagesDir,
        NESTBOX_HOST_ID: hostId,
        NESTBOX_HOST_AGENT_HOST: '127.0.0.1',
        NESTBOX_HOST_AGENT_PORT: '0',
        NESTBOX_CONTROL_PLANE_URL: heartbeats.url,
        NESTBOX_HOST_AGENT_SECRET: await hostSecretOf(hostSecret, hostId),
        NESTBOX_REFLINK_STORE: 'off',
        NESTBOX_CODE_INTERPRETER_IMAGE: 'on-demand',
        NESTBOX_SLOT_POOL_SIZE: '1',
        NESTBOX_LOG_LEVEL: 'warn',
      }),
    };
    const agentProc = agent.proc;
    await waitFor('the host agent', async () => {
      if (!agentProc.running()) throw new Error('it exited');
      return JSON.parse((await call(`${offA.url}/api/v1`, key, 'GET', '/health')).body).hostsAvailable >= 1;
    }, 180_000).catch((err) => {
      throw new Error(`${(err as Error).message}\n${agentProc.output.join('').slice(-3000)}`);
    });
    const created = await call(`${offA.url}/api/v1`, key, 'POST', '/sandboxes', { memoryMiB: 128, timeoutSeconds: 0, egress: { mode: 'deny-all' } });
    if (created.status !== 201) throw new Error(`create failed (${created.status}): ${created.body}`);
    sandboxId = (JSON.parse(created.body) as { id: string }).id;
    const path = `/api/v1/sandboxes/${sandboxId}`;
    const answer = await fetch(`${onB.url}${path}`, { headers: auth });
    if (answer.status !== 200) throw new Error(`GET through another replica answered ${answer.status}`);
    const body = await answer.text();
    baseline = await startBaselineServer(body, await freePort());

    const configs: { name: string; urls: string[] }[] = [
      { name: 'baseline', urls: [`${baseline.url}${path}`] },
      { name: 'off×1', urls: [`${offA.url}${path}`] },
      { name: 'off×2', urls: [`${offA.url}${path}`, `${offB.url}${path}`] },
      { name: 'on×1', urls: [`${onA.url}${path}`] },
      { name: 'on×2', urls: [`${onA.url}${path}`, `${onB.url}${path}`] },
    ];
    // Warm every replica's connection pools and code paths (not counted).
    for (const c of configs) await load(c.urls, auth, o.connections, 1);
    const results = new Map<string, Load[]>(configs.map((c) => [c.name, []]));
    // Every other round runs the configurations in reverse (ABBA), so a trend on the machine does not favour the ones run first.
    for (let round = 0; round < o.rounds; round++) {
      for (const c of round % 2 ? [...configs].reverse() : configs) results.get(c.name)!.push(await load(c.urls, auth, o.connections, o.seconds));
    }
    const mean = (name: string): Load => {
      const xs = results.get(name)!;
      const avg = (f: (l: Load) => number) => xs.reduce((a, l) => a + f(l), 0) / xs.length;
      return { rps: avg((l) => l.rps), p50: avg((l) => l.p50), p99: avg((l) => l.p99), non2xx: xs.reduce((a, l) => a + l.non2xx, 0), errors: xs.reduce((a, l) => a + l.errors, 0) };
    };
    const show = (l: Load) => `${l.rps.toFixed(0)} req/s, p50 ${ms(l.p50)}, p99 ${ms(l.p99)}${l.non2xx || l.errors ? ` (${l.non2xx} non-2xx, ${l.errors} errors)` : ''}`;
    const [base, off1, off2, on1, on2] = configs.map((c) => mean(c.name)) as [Load, Load, Load, Load, Load];
    console.log(
      `GET /api/v1/sandboxes/{id}, autocannon ${o.connections} connections × ${o.seconds} s, mean of ${o.rounds} rounds (PostgreSQL; the replicas, PostgreSQL and autocannon share this machine's cores):`,
    );
    console.log(`  rate limits off: 1 replica ${show(off1)}; 2 replicas ${show(off2)} → 2/1 ×${(off2.rps / off1.rps).toFixed(2)}`);
    console.log(`  rate limits on (defaults): 1 replica ${show(on1)}; 2 replicas ${show(on2)} → 2/1 ×${(on2.rps / on1.rps).toFixed(2)}`);
    console.log(`  limiter's cost: on/off ×${(on1.rps / off1.rps).toFixed(2)} of the req/s through 1 replica, ×${(on2.rps / off2.rps).toFixed(2)} through 2`);
    console.log(`  baseline: a plain Node HTTP server answering the same ${Buffer.byteLength(body)} bytes of JSON: ${show(base)} (what this load generator gets through loopback here)`);
    console.log(`  (this part took ${((performance.now() - started) / 1000).toFixed(0)} s, ${(upAfter / 1000).toFixed(0)} s of it starting the five replicas)`);
  } finally {
    await baseline?.stop();
    if (sandboxId && replicas[0]) await call(`${replicas[0].url}/api/v1`, key, 'DELETE', `/sandboxes/${sandboxId}`).catch(() => undefined);
    await agent?.proc.stop().catch(() => undefined);
    for (const r of replicas) await r.proc.stop().catch(() => undefined);
    await database.drop().catch((err: unknown) => console.error(`drop of the replicas database: ${String(err)}`));
    for (const dir of [objects, ...replicas.map((r) => r.dir), ...(agent ? [agent.dir] : [])]) await removeTree(dir);
  }
}
