// Volume write throughput for `npm run bench` (issue 19): inside one sandbox, `dd` of --volume-mib
// MiB (default 256) with conv=fsync into a volume (its own ext4 image, idmapped bind mount,
// host/storage/volumes.ts) beside the same write into the sandbox's own disk (the overlay's upper
// layer on its disk image), median of --volume-runs runs (default 3). Run on a local driver of this
// process (its own data dir and owner), like usage-sampling.ts. No thresholds.
import { mkdtempSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { AgentClient } from '../host/agent-protocol/client.js';
import { LocalDriver } from '../host/drivers/local/driver.js';
import { GUEST_AGENT_BUNDLE } from '../src/paths.js';
import { quantile } from './measure.js';

export interface VolumeBenchOptions {
  runs: number;
  mib: number;
  imagesDir: string;
}

async function ddSeconds(socket: string, file: string, mib: number): Promise<number> {
  const client = new AgentClient(socket);
  try {
    const started = performance.now();
    const out = await client.exec({ cmd: `dd if=/dev/zero of=${file} bs=1M count=${mib} conv=fsync status=none && rm -f ${file}`, timeoutMs: 600_000 });
    if (out.exitCode !== 0) throw new Error(`dd into ${file} failed: ${out.stderr}`);
    return (performance.now() - started) / 1000;
  } finally {
    client.close();
  }
}

export async function benchVolumes(o: VolumeBenchOptions): Promise<void> {
  const dataDir = mkdtempSync('/tmp/nbx-vol-');
  const driver = new LocalDriver({ dataDir, imagesDir: o.imagesDir, guestAgentBundle: GUEST_AGENT_BUNDLE(), ownerId: `bench-vol-${randomBytes(4).toString('hex')}`, reflinkStore: 'off', slotPoolSize: 0 });
  await driver.init();
  const volumeId = `bv${randomBytes(5).toString('hex')}`;
  const id = `bv${randomBytes(5).toString('hex')}`;
  try {
    await driver.volumes.ensure(volumeId, (o.mib * 2 + 128) * 2 ** 20);
    const sandbox = await driver.create({ id, image: 'default', cpu: 1, memoryMiB: 512, env: {}, egress: { mode: 'deny-all' }, diskGiB: Math.max(1, Math.ceil((o.mib * 2) / 1024)), volumes: [{ volumeId, mountPath: '/vol', readOnly: false }] });
    const disk: number[] = [];
    const volume: number[] = [];
    for (let r = 0; r < o.runs; r++) {
      disk.push(await ddSeconds(sandbox.agentSocket!, '/root/bench.bin', o.mib));
      volume.push(await ddSeconds(sandbox.agentSocket!, '/vol/bench.bin', o.mib));
    }
    const rate = (s: number) => `${(o.mib / s).toFixed(0)} MiB/s`;
    const d = quantile(disk, 0.5);
    const v = quantile(volume, 0.5);
    console.log(`volume write, dd ${o.mib} MiB conv=fsync inside one sandbox (n=${o.runs}): volume ${rate(v)} (median ${v.toFixed(2)} s) vs the sandbox's own disk ${rate(d)} (${d.toFixed(2)} s) → ${(d / v).toFixed(2)}× the disk's throughput`);
  } finally {
    await driver.destroy(id).catch((err: unknown) => console.error(`destroy ${id}: ${String(err)}`));
    await driver.volumes.destroy(volumeId).catch((err: unknown) => console.error(`destroy volume ${volumeId}: ${String(err)}`));
    await driver.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}
