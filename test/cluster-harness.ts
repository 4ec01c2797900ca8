// A cluster on one box, as the multi-host tests need it: N "machines" (network namespaces of
// their own, each with its own address on a bridge in the root namespace, no route anywhere
// else: nothing leaves the box), a `nestbox host-agent` in each (its own data dir, id, labels,
// listening on and advertising its machine's address), and M `nestbox server` replicas on one
// fresh PostgreSQL database, listening on the bridge's address so the machines reach them.
//
// Also the process plumbing the replica and host tests share: `spawnNestbox` (the real program,
// `node dist/src/cli.js …`, optionally joined to a machine's namespace), `isRunning`, `stopProcess`.
//
// Host agents join their machine with `nsenter --net=` (network namespace only), not `ip netns
// exec`: the latter also gives them a mount namespace of their own, in which the sandboxes'
// namespaces would be mounted for that process alone (see assertMachineNetnsMounts).
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import knexFactory, { type Knex } from 'knex';
import supertest from 'supertest';
import { createTestDatabase, freePort, removeDataDir, testEnv, TEST_IMAGES_DIR, waitFor } from './harness.js';
import { projectPath } from '../src/paths.js';
import { deriveHostSecret } from '../core/services/hosts.js';
import { HttpHostClient } from '../host/protocol/client.js';
import { generateApiKey } from '../core/services/auth.js';
import { SLOTS_DIR } from '../host/network/slots.js';

// ---- processes --------------------------------------------------------------------------------

export interface NestboxProcess {
  child: ChildProcess;
  /** stdout and stderr as they came (shown when a wait fails). */
  output: string[];
}

/**
 * `nestbox <args>` as an operator runs it, with exactly `env` (plus PATH). `netns`: joined to
 * that named network namespace first (`nsenter --net=`, which execs: the pid is nestbox's own).
 */
export function spawnNestbox(args: string[], env: Record<string, string>, opts: { netns?: string } = {}): NestboxProcess {
  const output: string[] = [];
  const program = [process.execPath, projectPath('dist/src/cli.js'), ...args];
  const [file, ...argv] = opts.netns ? ['nsenter', `--net=/run/netns/${opts.netns}`, '--', ...program] : program;
  const child = spawn(file, argv, { env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (d) => output.push(String(d)));
  child.stderr!.on('data', (d) => output.push(String(d)));
  return { child, output };
}

/** Neither exited nor ended by a signal (a process killed by one has only a signal code). */
export const isRunning = (p: NestboxProcess | undefined): p is NestboxProcess => !!p && p.child.exitCode === null && p.child.signalCode === null;

export async function stopProcess(p: NestboxProcess | undefined, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (!isRunning(p)) return;
  const exited = new Promise((resolve) => p.child.once('exit', resolve));
  p.child.kill(signal);
  await exited;
}

const tail = (p: NestboxProcess | undefined, chars = 3000) => (p ? p.output.join('').slice(-chars) : '(not started)');

/** Waits (bounded) until the replica at `url` answers its health route. */
export async function waitForReplica(p: NestboxProcess, url: string): Promise<void> {
  await waitFor(`the replica at ${url}`, async () => {
    if (!isRunning(p)) throw new Error('the replica exited');
    return (await supertest(url).get('/api/v1/health')).status === 200;
  }, 60_000, 100).catch((err) => {
    throw new Error(`${(err as Error).message}\n${tail(p)}`);
  });
}

// ---- machines ---------------------------------------------------------------------------------

const ip = (...args: string[]) => execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const quietly = (fn: () => unknown) => {
  try {
    fn();
  } catch {
    // already gone
  }
};

export interface Machines {
  /** The bridge in the root namespace, and its address (where the replicas listen). */
  bridge: string;
  bridgeAddress: string;
  /** `10.250.<n>.0/24`. */
  subnet: string;
  namespaces: { netns: string; address: string }[];
  remove(): void;
}

/**
 * `count` machine namespaces on a bridge of their own, named after a random run id so that runs
 * never meet (`nbxc…`: not the `nbx-`/`nbxv` of sandbox slots). Each machine gets `.11`, `.12`, …
 * of a /24 in 10.250.0.0/16 that no interface of the box uses yet, and no default route.
 */
export function createMachines(count: number): Machines {
  const run = randomBytes(2).toString('hex');
  const bridge = `nbxc${run}`;
  const used = ip('-o', '-4', 'addr', 'show');
  let octet = -1;
  for (let attempt = 0; attempt < 20 && octet < 0; attempt++) {
    const candidate = randomBytes(1)[0];
    if (!used.includes(` 10.250.${candidate}.`)) octet = candidate;
  }
  if (octet < 0) throw new Error('no free /24 in 10.250.0.0/16 for the test machines');
  const prefix = `10.250.${octet}`;
  const namespaces = Array.from({ length: count }, (_, n) => ({ netns: `nbxc-${run}-${n + 1}`, address: `${prefix}.${11 + n}` }));
  const remove = () => {
    // Deleting a namespace destroys its end of the veth and so the pair; the bridge goes last.
    for (const { netns } of namespaces) quietly(() => ip('netns', 'del', netns));
    for (let n = 1; n <= count; n++) quietly(() => ip('link', 'del', `${bridge}m${n}`));
    quietly(() => ip('link', 'del', bridge));
  };
  try {
    ip('link', 'add', bridge, 'type', 'bridge');
    ip('addr', 'add', `${prefix}.1/24`, 'dev', bridge);
    ip('link', 'set', bridge, 'up');
    namespaces.forEach(({ netns, address }, n) => {
      const outer = `${bridge}m${n + 1}`;
      ip('netns', 'add', netns);
      ip('link', 'add', outer, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns);
      ip('link', 'set', outer, 'master', bridge, 'up');
      ip('-n', netns, 'addr', 'add', `${address}/24`, 'dev', 'eth0');
      ip('-n', netns, 'link', 'set', 'eth0', 'up');
      ip('-n', netns, 'link', 'set', 'lo', 'up');
    });
  } catch (error) {
    remove();
    throw error;
  }
  return { bridge, bridgeAddress: `${prefix}.1`, subnet: `${prefix}.0/24`, namespaces, remove };
}

// ---- the cluster ------------------------------------------------------------------------------

export interface ClusterHostSpec {
  id: string;
  /** NESTBOX_HOST_LABELS. */
  labels?: string;
  env?: Record<string, string>;
}

export interface ClusterHost {
  id: string;
  netns: string;
  address: string;
  /** What it advertises (and the control planes call): `http://<machine address>:<port>`. */
  url: string;
  dataDir: string;
  /** The claim owner its driver uses (host id + data dir), as src/host-agent.ts derives it. */
  slotOwner: string;
  process?: NestboxProcess;
  /** Its API, called directly with its own secret (cleanup, and checks of what it runs). */
  client: HttpHostClient;
}

export interface ClusterReplica {
  name: string;
  url: string;
  dataDir: string;
  process?: NestboxProcess;
  http(): ReturnType<typeof supertest>;
}

export interface ClusterOptions {
  hosts: ClusterHostSpec[];
  replicas: number;
  /** Extra settings of every replica (placement, grace periods, …). */
  replicaEnv?: Record<string, string>;
}

export class Cluster {
  readonly hostSecret = randomBytes(32).toString('base64url');
  readonly apiKey = generateApiKey();
  readonly hosts: ClusterHost[] = [];
  readonly replicas: ClusterReplica[] = [];
  machines?: Machines;
  database?: { url: string; drop: () => Promise<void> };
  db?: Knex;
  /** The one port every host agent listens on, each in its own machine: they cannot meet. */
  agentPort = 0;
  private closed = false;

  private constructor(private readonly options: ClusterOptions) {}

  /** Builds the machines, starts the replicas (the first one migrates), then the host agents, and waits until every replica sees every host. */
  static async start(options: ClusterOptions): Promise<Cluster> {
    const cluster = new Cluster(options);
    try {
      await cluster.boot();
    } catch (error) {
      await cluster.close().catch((closeError) => console.error(`cluster teardown after a failed start: ${String(closeError)}`));
      throw error;
    }
    return cluster;
  }

  get auth(): { Authorization: string } {
    return { Authorization: `Bearer ${this.apiKey}` };
  }

  host(id: string): ClusterHost {
    const host = this.hosts.find((h) => h.id === id);
    if (!host) throw new Error(`no host ${id} in the cluster`);
    return host;
  }

  private async boot(): Promise<void> {
    this.machines = createMachines(this.options.hosts.length);
    this.database = await createTestDatabase();
    this.db = knexFactory({ client: 'pg', connection: this.database.url, pool: { min: 0, max: 2 } });
    for (let n = 0; n < this.options.replicas; n++) {
      const name = String.fromCharCode(97 + n);
      const url = `http://${this.machines.bridgeAddress}:${await freePort()}`;
      this.replicas.push({ name, url, dataDir: mkdtempSync(`/tmp/nbx-cluster-${name}-`), http: () => supertest(url) });
    }
    // One after the other: the first migrates the fresh database and mints the bootstrap key.
    for (const replica of this.replicas) {
      this.startReplica(replica);
      await waitForReplica(replica.process!, replica.url);
    }
    this.agentPort = await freePort();
    this.options.hosts.forEach((spec, n) => {
      const machine = this.machines!.namespaces[n];
      const url = `http://${machine.address}:${this.agentPort}`;
      const dataDir = mkdtempSync(`/tmp/nbx-cluster-${spec.id}-`);
      this.hosts.push({
        id: spec.id,
        netns: machine.netns,
        address: machine.address,
        url,
        dataDir,
        slotOwner: `${spec.id}-${createHash('sha256').update(dataDir).digest('hex').slice(0, 12)}`,
        client: new HttpHostClient({ hostId: spec.id, baseUrl: url, secret: deriveHostSecret(this.hostSecret, spec.id) }),
      });
    });
    for (const host of this.hosts) this.startHost(host.id);
    await this.waitForHosts(this.hosts.map((h) => h.id));
  }

  /** A replica as an operator runs one: no supervisor, no local host agent, on the bridge's address. */
  startReplica(replica: ClusterReplica): void {
    const port = new URL(replica.url).port;
    replica.process = spawnNestbox(['server'], testEnv(replica.dataDir, {
      NESTBOX_HOST: this.machines!.bridgeAddress,
      NESTBOX_PORT: port,
      NESTBOX_DATABASE_URL: this.database!.url,
      NESTBOX_HOST_SECRET: this.hostSecret,
      NESTBOX_BOOTSTRAP_API_KEY: this.apiKey,
      NESTBOX_LOCAL_HOST_AGENT: 'false',
      NESTBOX_WARM_POOL_SIZE: '0',
      NESTBOX_SERVER_SUPERVISOR: 'false',
      ...this.options.replicaEnv,
    }));
  }

  /** Starts (or starts again) a host agent in its machine; it heartbeats to replica n mod M. */
  startHost(id: string): void {
    const host = this.host(id);
    if (isRunning(host.process)) throw new Error(`host agent ${id} is running already`);
    const spec = this.options.hosts.find((s) => s.id === id)!;
    const heartbeatTo = this.replicas[this.hosts.indexOf(host) % this.replicas.length];
    host.process = spawnNestbox(['host-agent'], {
      HOME: process.env.HOME ?? '/root',
      NESTBOX_DATA_DIR: host.dataDir,
      NESTBOX_IMAGES_DIR: TEST_IMAGES_DIR,
      NESTBOX_HOST_ID: id,
      NESTBOX_HOST_AGENT_HOST: host.address,
      NESTBOX_HOST_AGENT_PORT: String(this.agentPort),
      NESTBOX_HOST_AGENT_URL: host.url,
      NESTBOX_CONTROL_PLANE_URL: heartbeatTo.url,
      NESTBOX_HOST_AGENT_SECRET: deriveHostSecret(this.hostSecret, id),
      NESTBOX_HEARTBEAT_INTERVAL_MS: '500',
      NESTBOX_REFLINK_STORE: 'off',
      NESTBOX_CODE_INTERPRETER_IMAGE: 'on-demand',
      NESTBOX_SLOT_POOL_SIZE: '0',
      NESTBOX_LOG_LEVEL: 'warn',
      ...(spec.labels ? { NESTBOX_HOST_LABELS: spec.labels } : {}),
      ...spec.env,
    }, { netns: host.netns });
  }

  /** SIGKILL (or another signal) to a host agent; its sandboxes keep running, as on a real host whose agent died. */
  async killHost(id: string, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    await stopProcess(this.host(id).process, signal);
  }

  /** Waits (bounded) until every replica lists each of `ids` as ready. */
  async waitForHosts(ids: string[], timeoutMs = 120_000): Promise<void> {
    await waitFor(`hosts ${ids.join(', ')} ready on every replica`, async () => {
      for (const id of ids) if (!isRunning(this.host(id).process)) throw new Error(`host agent ${id} exited`);
      for (const replica of this.replicas) {
        const res = await replica.http().get('/api/v1/hosts').set(this.auth);
        const ready = new Set(((res.body.items ?? []) as { id: string; state: string }[]).filter((h) => h.state === 'ready').map((h) => h.id));
        if (!ids.every((id) => ready.has(id))) return false;
      }
      return true;
    }, timeoutMs, 200).catch((err) => {
      throw new Error(`${(err as Error).message}\n${ids.map((id) => `${id}:\n${tail(this.host(id).process, 2000)}`).join('\n')}`);
    });
  }

  /** Slot claims of the cluster's host agents still on the box (they share its claim directory). */
  slotClaims(): { index: number; owner: string; sandboxId: string; pooled: boolean }[] {
    const owners = new Set(this.hosts.map((h) => h.slotOwner));
    const claims: { index: number; owner: string; sandboxId: string; pooled: boolean }[] = [];
    for (const name of existsSync(SLOTS_DIR) ? readdirSync(SLOTS_DIR) : []) {
      if (!/^\d+$/.test(name)) continue;
      try {
        const claim = JSON.parse(readFileSync(join(SLOTS_DIR, name), 'utf8')) as { owner: string; sandboxId: string; pooled?: boolean };
        if (owners.has(claim.owner)) claims.push({ index: Number(name), owner: claim.owner, sandboxId: claim.sandboxId, pooled: !!claim.pooled });
      } catch {
        // being rewritten
      }
    }
    return claims;
  }

  /**
   * Everything goes, also after a failed test: host agents that a test killed are started again
   * so that they destroy their sandboxes (through a replica, else directly), then every process,
   * the machines with the bridge, the database and the data dirs. What a host agent could not
   * destroy has its slot namespace emptied and removed here, so nothing of a run stays. Returns
   * what had to be removed that way (empty when the host agents cleaned up after themselves).
   */
  async close(): Promise<string[]> {
    if (this.closed) return [];
    this.closed = true;
    const problems: string[] = [];
    const restarted = this.hosts.filter((h) => h.process && !isRunning(h.process));
    for (const host of restarted) this.startHost(host.id);
    // Its own API answers once its driver has adopted what it still runs (it listens after that);
    // a replica may be gone too, so that is not waited for.
    for (const host of restarted) {
      await waitFor(`host agent ${host.id} answering`, async () => {
        if (!isRunning(host.process)) throw new Error(`it exited:\n${tail(host.process, 2000)}`);
        return (await host.client.listImages(), true);
      }, 60_000, 200).catch((err) => problems.push(String(err)));
    }
    const live = this.replicas.find((r) => isRunning(r.process));
    const left = this.db ? ((await this.db('sandboxes').whereNot({ state: 'deleted' }).select('id', 'host_id').catch(() => [])) as { id: string; host_id: string | null }[]) : [];
    for (const { id } of left) if (live) await live.http().delete(`/api/v1/sandboxes/${id}`).set(this.auth).catch(() => undefined);
    for (const { id, host_id } of left) {
      const host = this.hosts.find((h) => h.id === host_id);
      if (host && isRunning(host.process)) await host.client.destroySandbox(id).catch(() => undefined);
    }
    for (const host of this.hosts) await stopProcess(host.process);
    for (const replica of this.replicas) await stopProcess(replica.process);
    for (const claim of this.slotClaims()) {
      problems.push(`slot ${claim.index} of ${claim.owner} (${claim.pooled ? 'pooled' : `sandbox ${claim.sandboxId}`}) was left; removed`);
      const netns = `nbx-${claim.index}`;
      quietly(() => {
        const pids = ip('netns', 'pids', netns).split('\n').filter((l) => /^\d+$/.test(l.trim()));
        for (const pid of pids) quietly(() => process.kill(Number(pid), 'SIGKILL'));
      });
      quietly(() => ip('netns', 'del', netns));
      rmSync(join(SLOTS_DIR, String(claim.index)), { force: true });
    }
    for (const host of this.hosts) problems.push(...removeOwnerCgroups(host.slotOwner));
    this.machines?.remove();
    await this.db?.destroy();
    await this.database?.drop();
    for (const dir of [...this.hosts.map((h) => h.dataDir), ...this.replicas.map((r) => r.dataDir)]) removeDataDir(dir);
    if (problems.length) console.error(`cluster teardown:\n  ${problems.join('\n  ')}`);
    return problems;
  }
}

/**
 * Kills what is left in the cgroups of one claim owner and removes them, deepest first (v2: one
 * tree; v1: one per controller); says what it found.
 */
function removeOwnerCgroups(owner: string): string[] {
  const base = '/sys/fs/cgroup';
  const roots = [join(base, 'nestbox', owner), ...readdirSync(base).map((controller) => join(base, controller, 'nestbox', owner))].filter((dir) => existsSync(dir));
  const found: string[] = [];
  const remove = (dir: string, depth: number) => {
    if (depth > 4) return;
    for (const entry of readdirSync(dir, { withFileTypes: true })) if (entry.isDirectory()) remove(join(dir, entry.name), depth + 1);
    if (depth > 0) found.push(`cgroup ${dir}`);
    for (let attempt = 0; attempt < 50; attempt++) {
      const pids = existsSync(join(dir, 'cgroup.procs')) ? readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean) : [];
      for (const pid of pids) quietly(() => process.kill(Number(pid), 'SIGKILL'));
      try {
        rmdirSync(dir);
        return;
      } catch {
        execFileSync('sleep', ['0.1']);
      }
    }
  };
  for (const root of roots) remove(root, 0);
  return found.length ? [`${found.length} cgroup(s) of ${owner} were left; removed: ${found.slice(0, 5).join(', ')}`] : [];
}
