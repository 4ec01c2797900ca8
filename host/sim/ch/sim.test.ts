// The Cloud Hypervisor simulator itself: CH's wire conventions (status codes, JSON-array error
// bodies, 200 on vmm.shutdown, 400 for a wrong method), strict validation against the pinned
// YAML, the state machine, real snapshot files, restore from config.json (with disk locking),
// the hybrid-vsock handshake in front of the real guest agent, and the event monitor.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import { ChApi } from '../../drivers/cloud-hypervisor/api.js';
import { EventStreamParser } from '../../drivers/cloud-hypervisor/process.js';
import { dialHybridVsock, HybridVsockAgent } from '../../drivers/cloud-hypervisor/vsock.js';
import { installSimulator, type InstalledSimulator } from './launcher.js';

let dir: string;
let sim: InstalledSimulator;
const children: ChildProcess[] = [];

async function startVmm(name: string): Promise<{ api: ChApi; socket: string; events: string; child: ChildProcess }> {
  const runDir = join(dir, name, 'run');
  mkdirSync(runDir, { recursive: true });
  const socket = join(runDir, 'api.sock');
  const events = join(runDir, 'events.json');
  const child = spawn(sim.binary, ['--api-socket', `path=${socket}`, '--event-monitor', `path=${events}`, '--log-file', join(dir, name, 'ch.log')], { stdio: 'ignore' });
  children.push(child);
  const api = new ChApi(socket);
  for (let i = 0; i < 200; i++) {
    if (await api.ping(500).then(() => true, () => false)) return { api, socket, events, child };
    await sleep(20);
  }
  throw new Error('simulator did not start');
}

function raw(socket: string, method: string, path: string, body?: unknown): Promise<{ status: number; text: string; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const req = request({ socketPath: socket, method, path: `/api/v1/${path}`, headers: payload ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } : {} }, (res) => {
      let text = '';
      res.on('data', (chunk: Buffer) => (text += chunk.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text, headers: res.headers }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

function vmConfig(name: string) {
  const disk = join(dir, name, 'rootfs.img');
  writeFileSync(disk, '');
  truncateSync(disk, 16 * 1024 * 1024); // sparse raw disk
  return {
    cpus: { boot_vcpus: 1, max_vcpus: 1, nested: true },
    memory: { size: 128 * 1024 * 1024 },
    payload: { kernel: join(dir, 'vmlinuz'), initramfs: join(dir, 'initrd.img'), cmdline: 'console=ttyS0' },
    disks: [{ id: 'rootfs', path: disk, image_type: 'Raw' }],
    vsock: { id: 'vsock0', cid: 3, socket: join(dir, name, 'run', 'vsock.sock') },
    serial: { mode: 'File', file: join(dir, name, 'serial.log') },
    console: { mode: 'Off' },
    rng: { src: '/dev/urandom' },
  };
}

beforeAll(async () => {
  dir = mkdtempSync('/tmp/nbsim-');
  sim = await installSimulator(join(dir, 'bin'), { extraEnv: { NESTBOX_CH_SIM_LOCK_DIR: join(dir, 'locks') } });
  writeFileSync(join(dir, 'vmlinuz'), 'kernel');
  writeFileSync(join(dir, 'initrd.img'), 'initrd');
});

afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

describe('cloud-hypervisor simulator', () => {
  it('answers with CH conventions: 404 not created, 400 wrong method, JSON-array errors, strict bodies', async () => {
    const { api, socket } = await startVmm('conv');
    expect((await api.ping()).version).toMatch(/^v53\.0/);
    const info = await raw(socket, 'GET', 'vm.info');
    expect(info.status).toBe(404);
    expect(JSON.parse(info.text)).toEqual(['Error from API', 'The VM could not be queried', 'VM is not created']);
    expect(info.headers.server).toBe('Cloud Hypervisor API');
    expect(await raw(socket, 'GET', 'vm.pause')).toMatchObject({ status: 400, text: '' });
    expect((await raw(socket, 'GET', 'vm.nonsense')).status).toBe(404);
    expect((await raw(socket, 'PUT', 'vm.create')).status).toBe(400);
    expect((await raw(socket, 'PUT', 'vm.create', '{not json')).status).toBe(400);
    const typo = await raw(socket, 'PUT', 'vm.create', { ...vmConfig('conv'), memory: { size: 1, shraed: true } });
    expect(typo.status).toBe(400);
    expect(JSON.parse(typo.text).at(-1)).toMatch(/shraed/);
    const badCid = await raw(socket, 'PUT', 'vm.create', { ...vmConfig('conv'), vsock: { cid: '3', socket: '/x' } });
    expect(badCid.status).toBe(400);

    expect((await raw(socket, 'PUT', 'vm.create', vmConfig('conv'))).status).toBe(204);
    expect((await raw(socket, 'PUT', 'vm.create', vmConfig('conv'))).status).toBe(500); // already created
    expect((await raw(socket, 'PUT', 'vm.pause')).status).toBe(500); // Created, not Running
    expect((await raw(socket, 'PUT', 'vm.add-disk', { id: 'extra', path: '/x', image_type: 'Raw' })).status).toBe(204); // cold plug
    expect((await raw(socket, 'PUT', 'vm.add-disk', { id: 'extra', path: '/y' })).status).toBe(409);
    expect((await raw(socket, 'PUT', 'vm.remove-device', { id: 'nope' })).status).toBe(404);
    const shutdown = await raw(socket, 'PUT', 'vmm.shutdown');
    expect(shutdown).toMatchObject({ status: 200, text: '' }); // 200 with an empty body, not 204
  });

  it('boots the real guest agent behind hybrid vsock, snapshots to real files, restores from config.json', async () => {
    const first = await startVmm('vm1');
    const config = vmConfig('vm1');
    await first.api.createVm(config as never);
    await first.api.bootVm();
    expect((await first.api.info()).state).toBe('Running');
    // Hot plug into a running VM answers 200 with the PCI address.
    const added = await first.api.addDisk({ id: 'hot', path: '/x', image_type: 'Raw' });
    expect(added).toMatchObject({ id: 'hot', bdf: expect.stringMatching(/^0000:00:/) });
    await first.api.removeDevice('hot');

    const client = new AgentClient('vm1', { agent: new HybridVsockAgent(config.vsock.socket, 1024) });
    await client.waitReady({ timeoutMs: 10_000, intervalMs: 50 });
    expect((await client.exec({ cmd: 'echo $HOME; echo data > file.txt' })).exitCode).toBe(0);
    client.close();
    // Nothing listens on another port: the muxer closes without OK.
    await expect(dialHybridVsock(config.vsock.socket, 9)).rejects.toThrow(/closed before OK/);

    expect((await raw(first.socket, 'PUT', 'vm.snapshot', { destination_url: `file://${join(dir, 'snap')}` })).status).toBe(500); // running
    await first.api.pauseVm();
    await expect(first.api.snapshotVm(join(dir, 'missing'))).rejects.toThrow(/does not exist/);
    mkdirSync(join(dir, 'snap'));
    await first.api.snapshotVm(join(dir, 'snap'));
    expect(JSON.parse(readFileSync(join(dir, 'snap', 'config.json'), 'utf8'))).toEqual(config);
    expect(statSync(join(dir, 'snap', 'memory-ranges')).size).toBe(128 * 1024 * 1024);
    expect(statSync(join(dir, 'snap', 'memory-ranges')).blocks * 512).toBeLessThan(1024 * 1024); // sparse
    expect(existsSync(join(dir, 'snap', 'state.json'))).toBe(true);

    // A second VMM restoring the unpatched config.json collides with the first VM's disk lock
    // and vsock socket: exactly the bug the driver's patcher prevents.
    const second = await startVmm('vm2');
    const conflict = await raw(second.socket, 'PUT', 'vm.restore', { source_url: `file://${join(dir, 'snap')}`, memory_restore_mode: 'OnDemand' });
    expect(conflict.status).toBe(500);
    expect(JSON.parse(conflict.text).at(-1)).toMatch(/Address in use|held by another VMM/);
    expect((await raw(second.socket, 'PUT', 'vm.restore', { source_url: `file://${join(dir, 'snap')}`, memory_restore_mode: 'Lazy' })).status).toBe(400);

    // After the first VMM is gone, the same snapshot restores: Paused, files and boot id intact.
    await first.api.shutdownVmm();
    await sleep(200);
    await second.api.restoreVm({ source_url: `file://${join(dir, 'snap')}`, memory_restore_mode: 'OnDemand', resume: false });
    expect((await second.api.info()).state).toBe('Paused');
    await expect(second.api.restoreVm({ source_url: `file://${join(dir, 'snap')}` })).rejects.toMatchObject({ status: 500 });
    await second.api.resumeVm();
    const restored = new AgentClient('vm2', { agent: new HybridVsockAgent(config.vsock.socket, 1024) });
    await restored.waitReady({ timeoutMs: 10_000, intervalMs: 50 });
    expect((await restored.exec({ cmd: 'cat file.txt' })).stdout).toBe('data\n');
    restored.close();
    await second.api.shutdownVmm();

    const parser = new EventStreamParser();
    const names = parser.push(readFileSync(first.events, 'utf8')).map((event) => `${event.source}/${event.event}`);
    expect(names).toEqual(expect.arrayContaining(['vmm/starting', 'vm/booted', 'vm/paused', 'vm/snapshotted', 'vm/shutdown', 'vmm/shutdown']));
    const restoredEvents = new EventStreamParser().push(readFileSync(second.events, 'utf8')).map((event) => event.event);
    expect(restoredEvents).toEqual(expect.arrayContaining(['restoring', 'restored', 'resumed']));
  });

  it('injects faults per VM (latency, 500s, a vanishing socket) from the faults file', async () => {
    writeFileSync(sim.faultsFile, JSON.stringify({ faulty: { latencyMs: 150, failOn: ['vm.info'] } }));
    const { api } = await startVmm('faulty');
    const started = Date.now();
    const error = (await api.info().catch((caught: unknown) => caught)) as { status: number; chain: string[] };
    expect(Date.now() - started).toBeGreaterThanOrEqual(140);
    expect(error.status).toBe(500);
    expect(error.chain.at(-1)).toMatch(/Injected failure/);
    writeFileSync(sim.faultsFile, JSON.stringify({ faulty: { vanishOn: 'vm.counters' } }));
    await expect(api.counters()).rejects.toMatchObject({ status: 404 });
    await expect(api.ping()).rejects.toMatchObject({ status: 0 }); // the socket is gone
    writeFileSync(sim.faultsFile, '{}');
  });
});
