// Placement cost for `npm run bench` (issue 16): what a create costs the control plane with
// three host agents to choose from, next to one. A server on a PostgreSQL database of its own
// (in this process, no local host agent) and host agents started as an operator starts them on
// other machines (`nestbox host-agent`, a secret from `nestbox host-secret`), all alike: the same
// slot pool, no reflink store, the code-interpreter image on demand, metrics on. One host first,
// then two more join.
//
// Three figures per phase, so the difference can be told from the noise of a shared machine:
// - create → running as a client sees it (POST /sandboxes until its 201), p50 and p95;
// - the part of it spent in the host agents' driver (their `create` histogram's sum over count,
//   scraped before and after), so HTTP minus driver is the control plane's own share
//   (authentication, quota, placement, the row, the host call's transport, the finish);
// - the placement step alone: `hosts.place` (lock the live hosts' rows, count their allocations,
//   pick by spread) in a transaction that is rolled back, many times.
// Every host's slot pool is full before a phase (so each create takes a prepared slot in both
// phases), and one create per host warms it first. Sandboxes are deleted after each phase.
// Counts are bounded by the caller; no thresholds.
import { mkdtempSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { startServer, type RunningServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';
import { removeTree } from '../host/util/fs.js';
import { call, ms, quantile, timed } from './measure.js';
import { freshDatabase, hostSecretOf, scrape, spawnNestbox, waitFor, type NestboxProcess } from './nestbox-processes.js';

export interface PlacementBenchOptions {
  /** Creates per phase (one host, then three). */
  creates: number;
  /** `hosts.place` calls per phase. */
  placements: number;
  imagesDir: string;
  /** A PostgreSQL server; the part makes a database of its own there. */
  postgres: string;
}

interface Agent {
  id: string;
  dataDir: string;
  proc: NestboxProcess;
}

const CREATE_BODY = { memoryMiB: 128, timeoutSeconds: 0, egress: { mode: 'deny-all' } };

export async function benchPlacement(o: PlacementBenchOptions): Promise<void> {
  const started = performance.now();
  const database = await freshDatabase(o.postgres);
  if (!database) {
    console.log(`placement (3 hosts vs 1): not run — it needs PostgreSQL, and none answered at ${new URL(o.postgres).host} (give --postgres URL)`);
    return;
  }
  const dataDir = mkdtempSync('/tmp/nbx-bench-place-');
  const key = generateApiKey();
  const hostSecret = randomBytes(32).toString('base64url');
  const metricsToken = `bench-metrics-${randomBytes(12).toString('hex')}`;
  const run = randomBytes(3).toString('hex');
  const agents: Agent[] = [];
  const created: string[] = [];
  const logs: string[] = [];
  let server: RunningServer | undefined;
  try {
    const config = loadConfig({
      NESTBOX_PORT: '0',
      NESTBOX_SSH_PORT: '0',
      NESTBOX_DATA_DIR: dataDir,
      NESTBOX_IMAGES_DIR: o.imagesDir,
      NESTBOX_BOOTSTRAP_API_KEY: key,
      NESTBOX_WARM_POOL_SIZE: '0', // no warm pool: its refills would run beside what is measured
      NESTBOX_DATABASE_URL: database.url,
      NESTBOX_HOST_SECRET: hostSecret,
      NESTBOX_LOCAL_HOST_AGENT: 'false',
      NESTBOX_DEFAULT_DISK_GIB: '1',
      NESTBOX_LOG_LEVEL: 'warn',
    });
    server = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => logs.push(line.trimEnd()) }));
    const srv = server;
    const base = `${srv.url}/api/v1`;
    const hostsAvailable = async () => JSON.parse((await call(base, key, 'GET', '/health')).body).hostsAvailable as number;
    const urlOf = async (id: string) => ((await srv.db('hosts').where({ id }).first()) as { url: string }).url;
    const slotsIdle = async (agent: Agent) => (await scrape(await urlOf(agent.id), metricsToken)).get('nestbox_host_agent_slot_pool{what="idle"}') ?? 0;
    /** Driver `create` calls that succeeded on every host so far: total seconds and count. */
    const driverCreates = async () => {
      let sum = 0;
      let count = 0;
      for (const agent of agents) {
        for (const [sample, value] of await scrape(await urlOf(agent.id), metricsToken)) {
          if (!sample.startsWith('nestbox_host_agent_driver_call_duration_seconds_') || !sample.includes('call="create"') || !sample.includes('outcome="ok"')) continue;
          if (sample.startsWith('nestbox_host_agent_driver_call_duration_seconds_sum')) sum += value;
          if (sample.startsWith('nestbox_host_agent_driver_call_duration_seconds_count')) count += value;
        }
      }
      return { sum, count };
    };
    const startAgent = async (n: number): Promise<void> => {
      const id = `bench-place-${run}-${n}`;
      const agentDir = mkdtempSync(`/tmp/nbx-bench-place-h${n}-`);
      const proc = spawnNestbox(['host-agent'], {
        NESTBOX_DATA_DIR: agentDir,
        NESTBOX_IMAGES_DIR: o.imagesDir,
        NESTBOX_HOST_ID: id,
        NESTBOX_HOST_AGENT_HOST: '127.0.0.1',
        NESTBOX_HOST_AGENT_PORT: '0',
        NESTBOX_CONTROL_PLANE_URL: srv.url,
        NESTBOX_HOST_AGENT_SECRET: await hostSecretOf(hostSecret, id),
        NESTBOX_HEARTBEAT_INTERVAL_MS: '500',
        NESTBOX_REFLINK_STORE: 'off',
        NESTBOX_CODE_INTERPRETER_IMAGE: 'on-demand',
        // Room for every create of a phase on one host, so no create waits for a slot in either phase.
        NESTBOX_SLOT_POOL_SIZE: String(o.creates + 1),
        NESTBOX_METRICS_TOKEN: metricsToken,
        NESTBOX_LOG_LEVEL: 'warn',
      });
      agents.push({ id, dataDir: agentDir, proc });
    };
    const allReady = async (n: number) => {
      await waitFor(`${n} live host(s)`, async () => (await hostsAvailable()) === n, 180_000).catch((err) => {
        throw new Error(`${(err as Error).message}\n${agents.map((a) => `${a.id}:\n${a.proc.output.join('').slice(-2000)}`).join('\n')}`);
      });
      for (const agent of agents) await waitFor(`${agent.id}'s slot pool`, async () => (await slotsIdle(agent)) >= o.creates + 1, 120_000);
    };
    const createOne = async (): Promise<[number, string]> => {
      const [t, res] = await timed(() => call(base, key, 'POST', '/sandboxes', CREATE_BODY));
      if (res.status !== 201) throw new Error(`create failed (${res.status}): ${res.body}`);
      const { id, hostId } = JSON.parse(res.body) as { id: string; hostId: string };
      created.push(id);
      return [t, hostId];
    };
    const deleteAll = async () => {
      for (const id of created.splice(0)) {
        const res = await call(base, key, 'DELETE', `/sandboxes/${id}`);
        if (res.status >= 300 && res.status !== 404) throw new Error(`delete ${id} answered ${res.status}: ${res.body}`);
      }
    };
    /** `hosts.place` alone, rolled back each time: what choosing among the live hosts costs. */
    const placeTimes = async (): Promise<number[]> => {
      const times: number[] = [];
      for (let i = 0; i < o.placements; i++) {
        const trx = await srv.db.transaction();
        try {
          times.push((await timed(() => srv.services.hosts.place(trx, { cpu: 1, memoryMiB: 128, diskGiB: 1 })))[0]);
        } finally {
          await trx.rollback();
        }
      }
      return times;
    };

    interface Phase {
      hosts: number;
      creates: number[];
      placedOn: Map<string, number>;
      driverMeanMs: number;
      httpMeanMs: number;
      place: number[];
    }
    const phase = async (hosts: number): Promise<Phase> => {
      await allReady(hosts);
      // Warm every host (its first create pays for cold caches), then refill the pools.
      for (let i = 0; i < hosts; i++) await createOne();
      await deleteAll();
      await allReady(hosts);
      const place = await placeTimes();
      const before = await driverCreates();
      const creates: number[] = [];
      const placedOn = new Map<string, number>();
      for (let i = 0; i < o.creates; i++) {
        const [t, hostId] = await createOne();
        creates.push(t);
        placedOn.set(hostId, (placedOn.get(hostId) ?? 0) + 1);
      }
      const after = await driverCreates();
      await deleteAll();
      const driverMeanMs = ((after.sum - before.sum) * 1000) / Math.max(1, after.count - before.count);
      return { hosts, creates, placedOn, driverMeanMs, httpMeanMs: creates.reduce((a, b) => a + b, 0) / creates.length, place };
    };

    await startAgent(1);
    const one = await phase(1);
    await startAgent(2);
    await startAgent(3);
    const three = await phase(3);

    const line = (p: Phase) => {
      const spread = [...p.placedOn.values()].sort((a, b) => b - a).join('/');
      return (
        `${p.hosts} host${p.hosts > 1 ? 's' : ' '} (n=${o.creates}, placed ${spread}): create → running p50 ${ms(quantile(p.creates, 0.5))}, p95 ${ms(quantile(p.creates, 0.95))}; ` +
        `mean ${ms(p.httpMeanMs)} of which the host agent's driver ${ms(p.driverMeanMs)} → the rest (control plane and its hop to the host agent) ${ms(p.httpMeanMs - p.driverMeanMs)}; ` +
        `hosts.place alone (n=${o.placements}) p50 ${ms(quantile(p.place, 0.5))}, p95 ${ms(quantile(p.place, 0.95))}`
      );
    };
    console.log('placement, 3 host agents vs 1 (PostgreSQL, host agents on this machine sharing its cores):');
    console.log(`  ${line(one)}`);
    console.log(`  ${line(three)}`);
    const ratio = (a: number, b: number) => `×${(a / b).toFixed(2)}`;
    console.log(
      `  → 3 hosts vs 1: create p50 ${ratio(quantile(three.creates, 0.5), quantile(one.creates, 0.5))}, ` +
        `the rest ${ratio(three.httpMeanMs - three.driverMeanMs, one.httpMeanMs - one.driverMeanMs)} (${ms(three.httpMeanMs - three.driverMeanMs - (one.httpMeanMs - one.driverMeanMs))}), ` +
        `hosts.place p50 ${ratio(quantile(three.place, 0.5), quantile(one.place, 0.5))} (${ms(quantile(three.place, 0.5) - quantile(one.place, 0.5))})`,
    );
    console.log(`  (this part took ${((performance.now() - started) / 1000).toFixed(0)} s)`);
  } catch (err) {
    throw new Error(`${(err as Error).message}\nserver log:\n${logs.slice(-30).join('\n')}`, { cause: err });
  } finally {
    if (server) {
      for (const id of created) await call(`${server.url}/api/v1`, key, 'DELETE', `/sandboxes/${id}`).catch(() => undefined);
    }
    for (const agent of agents) await agent.proc.stop().catch(() => undefined);
    await server?.close();
    await database.drop().catch((err: unknown) => console.error(`drop of the placement database: ${String(err)}`));
    // A data dir may hold mounts (sandbox disks): unmounted first, deepest first.
    for (const dir of [dataDir, ...agents.map((a) => a.dataDir)]) await removeTree(dir);
  }
}
