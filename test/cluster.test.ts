// The multi-host shape on one box: three host agents, each in a network namespace of its own
// acting as a separate machine with its own address (all three listen on the same port, which only
// separate machines can), and two `nestbox server` replicas on one PostgreSQL database, started by
// test/cluster-harness.ts. Placement spreads by room and honours region (native `placement`,
// Daytona `target`) and labels, skipping a full host; a sandbox made through replica A is used
// through replica B (exec, files, an SSE stream, a PTY, a hosted port); the control plane reaches
// each host only at the address it advertised, and a sandbox reaches neither its host agent nor a
// replica (its machine's isolation rules); a snapshot made on one machine is used on another and a
// drained machine's stopped sandbox moves to another (host agent to host agent over the bridge);
// a host agent killed with SIGKILL has its sandboxes
// marked error/host_lost while the others run on, and once started again adopts them; and nothing
// of any sandbox is left on the box afterwards. A host agent started with `ip netns exec` (whose
// mount namespace would keep its sandboxes' namespaces to itself) refuses to start.
import { execFileSync, spawn } from 'node:child_process';
import net from 'node:net';
import { existsSync, mkdtempSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster } from './cluster-harness.js';
import { expectTerminalRoundTrip, outputOf, readEvents, removeDataDir, TEST_IMAGES_DIR, waitFor } from './harness.js';
import { projectPath } from '../src/paths.js';
import { residueOf, slotNamesOf, snapshotHostNetwork } from './residue.js';
import { TCP_PROBE } from './test-internet.js';

const LOST_AFTER_MS = 3000;
let cluster: Cluster;

const A = () => cluster.replicas[0].http();
const B = () => cluster.replicas[1].http();
const auth = () => cluster.auth;
const create = (via: typeof A, body: Record<string, unknown> = {}) => via().post('/api/v1/sandboxes').set(auth()).send({ memoryMiB: 128, timeoutSeconds: 0, egress: { mode: 'deny-all' }, ...body });
const sandbox = async (id: string, via = A) => (await via().get(`/api/v1/sandboxes/${id}`).set(auth()).expect(200)).body as { id: string; state: string; hostId: string; stopReason?: string; errorMessage?: string };
const inMachine = (netns: string, ...command: string[]) => execFileSync('nsenter', [`--net=/run/netns/${netns}`, '--', ...command], { encoding: 'utf8' });

/** Connects from this (the root) namespace: 'connected', or the error's code. */
const probe = (host: string, port: number) =>
  new Promise<string>((resolve) => {
    const socket = net.connect(port, host);
    socket.once('connect', () => {
      socket.destroy();
      resolve('connected');
    });
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? 'error'));
  });

beforeAll(async () => {
  cluster = await Cluster.start({
    replicas: 2,
    replicaEnv: { NESTBOX_HOST_LOST_AFTER_MS: String(LOST_AFTER_MS), NESTBOX_DEFAULT_DISK_GIB: '1', NESTBOX_CAPACITY_RETRY_AFTER_SECONDS: '7' },
    hosts: [
      // 1024 MiB × 1.5 overcommit − 512 MiB reserve = 1024 MiB to place; the others 5632 MiB.
      { id: 'eu-small', labels: 'region=eu-central,tier=small', env: { NESTBOX_HOST_CAPACITY_MEMORY_MIB: '1024', NESTBOX_USAGE_SAMPLE_SECONDS: '1' } },
      // A pool of built slots on one of them: built, handed out, scrubbed back and torn down in its machine.
      { id: 'eu-big', labels: 'region=eu-central', env: { NESTBOX_HOST_CAPACITY_MEMORY_MIB: '4096', NESTBOX_USAGE_SAMPLE_SECONDS: '1', NESTBOX_SLOT_POOL_SIZE: '2' } },
      { id: 'us-big', labels: 'region=us-east', env: { NESTBOX_HOST_CAPACITY_MEMORY_MIB: '4096', NESTBOX_USAGE_SAMPLE_SECONDS: '1' } },
    ],
  });
}, 300_000);

afterAll(async () => {
  await cluster?.close();
}, 300_000);

describe('three machines, two replicas', () => {
  const placed: Record<string, string[]> = { 'eu-small': [], 'eu-big': [], 'us-big': [] };
  const all = () => Object.values(placed).flat();

  it('each host agent is a machine of its own: its own network namespace and address, all on one port', async () => {
    const ports = new Set<string>();
    for (const via of [A, B]) {
      const hosts = (await via().get('/api/v1/hosts').set(auth()).expect(200)).body.items as { id: string; state: string; region: string }[];
      expect(hosts.map((h) => [h.id, h.state, h.region])).toEqual([
        ['eu-big', 'ready', 'eu-central'],
        ['eu-small', 'ready', 'eu-central'],
        ['us-big', 'ready', 'us-east'],
      ]);
    }
    for (const host of cluster.hosts) {
      // What the replicas call is what the host advertised: its machine's address.
      const row = await cluster.db!('hosts').where({ id: host.id }).first();
      expect(row.url).toBe(host.url);
      const url = new URL(row.url);
      expect(url.hostname).toBe(host.address);
      ports.add(url.port);
      // The agent process is in its machine's network namespace, not in the root one where the
      // replicas run, and listens there on that address; from the root namespace it is reached
      // over the bridge at that address.
      const inode = statSync(`/run/netns/${host.netns}`).ino;
      expect(readlinkSync(`/proc/${host.process!.child.pid}/ns/net`)).toBe(`net:[${inode}]`);
      expect(readlinkSync('/proc/self/ns/net')).not.toBe(`net:[${inode}]`);
      expect(inMachine(host.netns, 'ss', '-Hltn', `sport = :${url.port}`)).toContain(`${host.address}:${url.port}`);
      expect(await probe(host.address, Number(url.port))).toBe('connected');
    }
    expect(ports.size).toBe(1);
  });

  it('a host agent started with `ip netns exec` refuses to start, saying why and what to use', async () => {
    // ip netns exec adds a mount namespace of its own: slot namespaces made in it would be lost.
    const dataDir = mkdtempSync('/tmp/nbx-cluster-netns-exec-');
    try {
      const child = spawn('ip', ['netns', 'exec', cluster.hosts[0].netns, process.execPath, projectPath('dist/src/cli.js'), 'host-agent'], {
        env: {
          PATH: process.env.PATH,
          NESTBOX_DATA_DIR: dataDir,
          NESTBOX_IMAGES_DIR: TEST_IMAGES_DIR,
          NESTBOX_HOST_ID: 'netns-exec',
          NESTBOX_HOST_AGENT_HOST: cluster.hosts[0].address,
          NESTBOX_CONTROL_PLANE_URL: cluster.replicas[0].url,
          NESTBOX_HOST_AGENT_SECRET: 'not-a-registered-host-secret',
          NESTBOX_REFLINK_STORE: 'off',
          NESTBOX_SLOT_POOL_SIZE: '0',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.on('data', (d) => (output += String(d)));
      child.stderr.on('data', (d) => (output += String(d)));
      const code = await new Promise<number | null>((resolve) => child.once('exit', (exitCode) => resolve(exitCode)));
      expect(code).not.toBe(0);
      expect(output).toMatch(/\/run\/netns is not shared with the machine's mount namespace.*ip netns exec.*nsenter --net=/s);
    } finally {
      removeDataDir(dataDir);
    }
    // It never registered.
    expect((await A().get('/api/v1/hosts/netns-exec').set(auth())).status).toBe(404);
  });

  it('spreads creates over the hosts with most room, through either replica', async () => {
    for (const via of [A, B, A, B]) {
      const made = await create(via);
      expect(made.status, JSON.stringify(made.body)).toBe(201);
      placed[made.body.hostId].push(made.body.id);
    }
    // The small host has a fifth of the others' room: the two big ones take two each.
    expect(Object.fromEntries(Object.entries(placed).map(([host, ids]) => [host, ids.length]))).toEqual({ 'eu-small': 0, 'eu-big': 2, 'us-big': 2 });
  });

  it('honours a region constraint: native placement and Daytona target', async () => {
    const native = await create(B, { placement: { region: 'us-east' } });
    expect(native.status, JSON.stringify(native.body)).toBe(201);
    expect(native.body.hostId).toBe('us-big');
    placed['us-big'].push(native.body.id);
    const daytona = await A().post('/daytona/api/sandbox').set(auth()).send({ target: 'us-east', networkBlockAll: true });
    expect(daytona.status, JSON.stringify(daytona.body)).toBeLessThan(300);
    const started = await waitFor('the Daytona sandbox running', async () => {
      const s = await sandbox(daytona.body.id, B);
      if (s.state === 'error') throw new Error(JSON.stringify(s));
      return s.state === 'running' ? s : undefined;
    }, 60_000);
    expect(started.hostId).toBe('us-big');
    placed['us-big'].push(daytona.body.id);
    // Daytona reports the region of the sandbox's host as its target, on either replica.
    expect(daytona.body.target).toBe('us-east');
    expect((await B().get(`/daytona/api/sandbox/${daytona.body.id}`).set(auth()).expect(200)).body.target).toBe('us-east');
    const listed = (await A().get('/daytona/api/sandbox').set(auth()).expect(200)).body.items as { id: string; target: string }[];
    expect(listed.find((s) => s.id === daytona.body.id)?.target).toBe('us-east');
    const nowhere = await create(A, { placement: { region: 'ap-south' } });
    expect(nowhere.status).toBe(400);
    expect(nowhere.body.error.message).toContain('placement.region');
  });

  it('skips a full host', async () => {
    const fill = await create(A, { memoryMiB: 1024, placement: { labels: { tier: 'small' } } });
    expect(fill.status, JSON.stringify(fill.body)).toBe(201);
    expect(fill.body.hostId).toBe('eu-small');
    placed['eu-small'].push(fill.body.id);
    const full = await create(B, { placement: { labels: { tier: 'small' } } });
    expect(full.status).toBe(503);
    expect(full.body.error.code).toBe('capacity_exhausted');
    expect(full.headers['retry-after']).toBe('7');
    // The region has two hosts; the full one is passed over.
    const eu = await create(B, { memoryMiB: 1024, placement: { region: 'eu-central' } });
    expect(eu.status, JSON.stringify(eu.body)).toBe(201);
    expect(eu.body.hostId).toBe('eu-big');
    placed['eu-big'].push(eu.body.id);
  });

  it('a sandbox created through A: exec, files, an SSE stream, a PTY and a hosted port through B', async () => {
    const made = await create(A, { timeoutSeconds: 600 });
    expect(made.status, JSON.stringify(made.body)).toBe(201);
    const id = made.body.id as string;
    placed[made.body.hostId].push(id);
    const api = `/api/v1/sandboxes/${id}`;

    expect((await B().post(`${api}/commands`).set(auth()).send({ cmd: 'echo from-b' })).body).toMatchObject({ exitCode: 0, stdout: 'from-b\n' });
    const put = await A().put(`${api}/files`).query({ path: '/tmp/via-a.txt' }).set(auth()).set('content-type', 'application/octet-stream').send(Buffer.from('written through A'));
    expect(put.status, JSON.stringify(put.body)).toBeLessThan(300);
    const got = await B().get(`${api}/files`).query({ path: '/tmp/via-a.txt' }).set(auth()).buffer(true).parse((res, done) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => done(null, Buffer.concat(chunks)));
    });
    expect(got.status).toBe(200);
    expect(String(got.body)).toBe('written through A');

    const started = await A().post(`${api}/commands`).set(auth()).send({ detach: true, cmd: 'for i in 1 2 3; do echo sse$i; sleep 0.05; done' });
    expect(started.status, JSON.stringify(started.body)).toBe(202);
    const events = await readEvents<{ type: string; data: string; exitCode?: number }>(`${cluster.replicas[1].url}${api}/commands/${started.body.processId}/stream`, auth(), (e) => e.type === 'exit');
    expect(outputOf(events, 'stdout')).toBe('sse1\nsse2\nsse3\n');
    expect(events.at(-1)).toMatchObject({ type: 'exit', exitCode: 0 });

    const terminal = await A().post(`${api}/terminals`).set(auth()).send({ cols: 80, rows: 24 });
    expect(terminal.status, JSON.stringify(terminal.body)).toBe(201);
    await expectTerminalRoundTrip(`${cluster.replicas[1].url.replace('http:', 'ws:')}${api}/commands/${terminal.body.processId}/pty`, auth());

    // A hosted port: replica B → the host agent at its machine's address → the sandbox's slot.
    await A().post(`${api}/commands`).set(auth()).send({ cmd: 'mkdir -p /tmp/www && echo hello from a machine > /tmp/www/index.html' }).expect(200);
    await A().post(`${api}/commands`).set(auth()).send({ detach: true, cmd: 'python3 -m http.server 8000 --bind 0.0.0.0 --directory /tmp/www' }).expect(202);
    await A().post(`${api}/ports`).set(auth()).send({ port: 8000, public: true }).expect(201);
    const page = await waitFor('the hosted port answering through B', async () => {
      const res = await B().get(`/p/${id}/8000/`);
      return res.status === 200 ? res : undefined;
    }, 20_000);
    expect(page.text).toBe('hello from a machine\n');

    // The sandbox's slot lives in its host's machine: the veth and the route to the sandbox are
    // there, not in the root namespace (which has no way to the sandbox but the host agent).
    const host = cluster.host(made.body.hostId);
    const slot = slotNamesOf(id, host.dataDir);
    expect(inMachine(host.netns, 'ip', '-o', 'link', 'show', slot.link)).toContain(slot.link);
    expect(() => execFileSync('ip', ['-o', 'link', 'show', slot.link], { stdio: 'pipe' })).toThrow();
    // Its traffic counters are read in the machine's namespace too (they were missing when read from /sys).
    const usage = await waitFor('a usage sample with network counters', async () => {
      const res = await B().get(`${api}/usage`).set(auth());
      return res.body.sample?.networkRxBytes > 0 ? res.body.sample : undefined;
    }, 20_000, 250);
    expect(usage.networkTxBytes).toBeGreaterThan(0);

    // The isolation rules are its machine's: the sandbox reaches neither its own host agent (the
    // machine's input chain) nor a replica over the bridge (its deny-all egress, then the blocked
    // private ranges), though both answer from the root namespace.
    await A().put(`${api}/files`).query({ path: '/root/probe.py' }).set(auth()).set('content-type', 'application/octet-stream').send(Buffer.from(TCP_PROBE)).expect((res) => expect(res.status).toBeLessThan(300));
    const replica = new URL(cluster.replicas[0].url);
    for (const [address, port] of [[host.address, cluster.agentPort], [replica.hostname, Number(replica.port)]] as const) {
      expect(await probe(address, port)).toBe('connected');
      const seen = await B().post(`${api}/commands`).set(auth()).send({ cmd: `python3 /root/probe.py ${address} ${port}` });
      expect(seen.body.stdout.trim(), `${address}:${port} from the sandbox`).toBe('timeout');
    }
  });

  it("a snapshot made on one machine is used on another, and a drained machine's stopped sandbox moves to another with its files (host to host over the bridge)", async () => {
    const run = async (id: string, cmd: string, via = B) => {
      const r = await via().post(`/api/v1/sandboxes/${id}/commands`).set(auth()).send({ cmd });
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(r.body.exitCode, r.body.stderr).toBe(0);
      return r.body.stdout as string;
    };
    const hostAction = async (hostId: string, action: string, via = A) => via().post(`/api/v1/hosts/${hostId}/${action}`).set(auth()).expect(200);

    const source = await create(A, { placement: { hostId: 'eu-big' } });
    expect(source.status, JSON.stringify(source.body)).toBe(201);
    placed['eu-big'].push(source.body.id);
    await run(source.body.id, 'echo made-on-eu-big > /root/origin.txt');
    const snap = await A().post('/api/v1/snapshots').set(auth()).send({ sandboxId: source.body.id, name: 'cluster-snap' });
    expect(snap.status, JSON.stringify(snap.body)).toBe(201);
    // In another region: the snapshot's layers go from eu-big's machine to us-big's.
    const child = await create(B, { snapshot: 'cluster-snap', placement: { region: 'us-east' } });
    expect(child.status, JSON.stringify(child.body)).toBe(201);
    expect(child.body.hostId).toBe('us-big');
    placed['us-big'].push(child.body.id);
    expect(await run(child.body.id, 'cat /root/origin.txt', A)).toBe('made-on-eu-big\n');
    const holders = (await cluster.db!('snapshot_hosts').where({ snapshot_id: snap.body.id }).select('host_id')) as { host_id: string }[];
    // The copies are recorded beside the snapshot's own host (eu-big, in its row).
    expect(holders.map((h) => h.host_id)).toEqual(['us-big']);

    const mover = await create(A, { placement: { hostId: 'eu-big' } });
    expect(mover.status, JSON.stringify(mover.body)).toBe(201);
    const sum = await run(mover.body.id, 'head -c 4194304 /dev/urandom > /root/blob && sha256sum /root/blob | cut -d" " -f1');
    expect((await A().post(`/api/v1/sandboxes/${mover.body.id}/stop`).set(auth())).body.state).toBe('stopped');
    await hostAction('eu-big', 'drain');
    try {
      const moved = await B().post(`/api/v1/sandboxes/${mover.body.id}/move`).set(auth()).send({ hostId: 'us-big' });
      expect(moved.status, JSON.stringify(moved.body)).toBe(200);
      expect(moved.body).toMatchObject({ fromHostId: 'eu-big', toHostId: 'us-big' });
    } finally {
      await hostAction('eu-big', 'uncordon', B);
    }
    placed['us-big'].push(mover.body.id);
    expect(existsSync(`${cluster.host('eu-big').dataDir}/sandboxes/${mover.body.id}`)).toBe(false);
    const resumed = await A().post(`/api/v1/sandboxes/${mover.body.id}/resume`).set(auth());
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    expect(resumed.body).toMatchObject({ state: 'running', hostId: 'us-big' });
    expect(await run(mover.body.id, 'sha256sum /root/blob | cut -d" " -f1')).toBe(sum);
  });

  it('a host agent killed with SIGKILL: its sandboxes become error/host_lost, the others run on; started again, it adopts them', async () => {
    const lost = placed['us-big'];
    const others = [...placed['eu-big'], ...placed['eu-small']];
    expect(lost.length).toBeGreaterThanOrEqual(3);
    await cluster.killHost('us-big');
    await waitFor('us-big lost, its sandboxes host_lost', async () => {
      for (const id of lost) {
        const s = await sandbox(id);
        if (s.state !== 'error') return false;
      }
      return true;
    }, LOST_AFTER_MS + 30_000, 250);
    for (const id of lost) {
      const s = await sandbox(id, B);
      expect(s).toMatchObject({ state: 'error', stopReason: 'host_lost' });
      expect(s.errorMessage).toContain('us-big');
    }
    expect(((await B().get('/api/v1/hosts/us-big').set(auth()).expect(200)).body as { state: string }).state).toBe('lost');
    for (const id of others) expect((await sandbox(id, B)).state).toBe('running');
    const onEu = placed['eu-big'][0];
    expect((await B().post(`/api/v1/sandboxes/${onEu}/commands`).set(auth()).send({ cmd: 'echo still-here' })).body.stdout).toBe('still-here\n');
    const refused = await A().post(`/api/v1/sandboxes/${lost[0]}/commands`).set(auth()).send({ cmd: 'true' });
    expect(refused.status).toBe(503);
    expect(refused.body.error.message).toContain('host_lost');

    // The sandboxes ran on in the machine meanwhile; its slot namespaces are the machine's (not
    // the dead process's), so the restarted host agent finds and adopts them.
    cluster.startHost('us-big');
    await cluster.waitForHosts(['us-big']);
    await waitFor('the sandboxes on us-big adopted', async () => {
      for (const id of lost) if ((await sandbox(id)).state !== 'running') return false;
      return true;
    }, 30_000, 250);
    expect((await B().post(`/api/v1/sandboxes/${lost[0]}/commands`).set(auth()).send({ cmd: 'echo adopted' })).body.stdout).toBe('adopted\n');
  });

  it('deleting every sandbox through B leaves nothing of them on the box or in the machines', async () => {
    const slots = new Map<string, { host: string; netns: string; link: string }>();
    for (const [hostId, ids] of Object.entries(placed)) for (const id of ids) slots.set(id, { host: hostId, ...slotNamesOf(id, cluster.host(hostId).dataDir) });
    for (const id of all()) expect((await B().delete(`/api/v1/sandboxes/${id}`).set(auth())).status).toBeLessThan(300);
    for (const host of cluster.hosts) {
      await waitFor(`the sandboxes of ${host.id} gone`, async () => readdirSync(`${host.dataDir}/sandboxes`).length === 0, 30_000, 100);
    }
    // Processes, mounts, cgroups and directories of each sandbox (residueOf's own network diff is
    // of the whole box, where other test files come and go: the slots are checked below instead).
    for (const [id, slot] of slots) expect(residueOf(id, cluster.host(slot.host).dataDir, snapshotHostNetwork())).toEqual([]);
    // No slot claims of these host agents but eu-big's pool; a slot's namespace exists only if
    // it is in that pool, or another host agent of the box claimed the index since.
    const claims = cluster.slotClaims();
    expect(claims.filter((claim) => !claim.pooled)).toEqual([]);
    expect(claims.map((claim) => claim.owner)).toEqual(claims.map(() => cluster.host('eu-big').slotOwner));
    expect(claims).toHaveLength(2);
    const pooled = new Set(claims.map((claim) => claim.index));
    for (const slot of slots.values()) {
      const index = Number(slot.netns.slice('nbx-'.length));
      if (existsSync(`/run/netns/${slot.netns}`)) expect(pooled.has(index) || existsSync(`/run/nestbox/slots/${index}`)).toBe(true);
    }
    for (const host of cluster.hosts) {
      const expected = host.id === 'eu-big' ? [...pooled].sort((x, y) => x - y) : [];
      const links = inMachine(host.netns, 'ip', '-o', 'link', 'show').split('\n').map((line) => / (nbxv\d+)[@:]/.exec(line)?.[1]).filter(Boolean);
      expect(links.map((link) => Number(link!.slice(4))).sort((x, y) => x - y)).toEqual(expected);
      const chains = [...inMachine(host.netns, 'nft', 'list', 'table', 'inet', 'nestbox').matchAll(/chain slot_(\d+)/g)].map((m) => Number(m[1])).sort((x, y) => x - y);
      expect(chains).toEqual(expected);
    }
  });

  it('tears the cluster down completely: processes, machines, bridge, database', async () => {
    const { bridge, namespaces } = cluster.machines!;
    const pids = [...cluster.hosts.map((h) => h.process!.child.pid!), ...cluster.replicas.map((r) => r.process!.child.pid!)];
    const dirs = [...cluster.hosts.map((h) => h.dataDir), ...cluster.replicas.map((r) => r.dataDir)];
    // Nothing for the sweep to remove: the host agents destroyed their sandboxes and, shut down
    // gracefully, their pools.
    expect(await cluster.close()).toEqual([]);
    expect(cluster.slotClaims()).toEqual([]);
    for (const pid of pids) expect(existsSync(`/proc/${pid}`)).toBe(false);
    for (const { netns } of namespaces) expect(existsSync(`/run/netns/${netns}`)).toBe(false);
    expect(() => execFileSync('ip', ['-o', 'link', 'show', bridge], { stdio: 'pipe' })).toThrow();
    for (const dir of dirs) expect(existsSync(dir)).toBe(false);
  });
});
