// Usage-sampling figures for `npm run bench` (issue 17): the CPU time the host agent's sampler
// (host/agent/usage-sampler.ts over LocalDriver.usage) spends on one round over N idle sandboxes,
// median and p95 over a bounded number of rounds, beside a baseline measured in the same run:
// the same number of small file reads the round makes (a plain readFile of /proc/self/stat),
// which is the floor any sampler reading cgroup, statfs and interface files pays.
//
// The sandboxes are created straight on a local driver of this process (its own data dir and
// owner, so nothing else on the machine is touched), since the control plane's host agent is a
// child process whose CPU time per round cannot be told from its other work. Counts are bounded
// by the caller; no thresholds.
import { mkdtempSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { UsageSampler } from '../host/agent/usage-sampler.js';
import { LocalDriver } from '../host/drivers/local/driver.js';
import { GUEST_AGENT_BUNDLE } from '../src/paths.js';
import { ms, quantile } from './measure.js';

export interface UsageBenchOptions {
  sandboxes: number;
  rounds: number;
  imagesDir: string;
}

/** Files one round reads per sandbox on cgroup v1 (cpuacct.usage, memory usage, limit, stat; statfs; rx, tx). */
const FILES_PER_SANDBOX = 7;

function cpuMs(from: NodeJS.CpuUsage): number {
  const d = process.cpuUsage(from);
  return (d.user + d.system) / 1000;
}

export async function benchUsageSampling(o: UsageBenchOptions): Promise<void> {
  const dataDir = mkdtempSync('/tmp/nbx-usage-');
  const driver = new LocalDriver({
    dataDir,
    imagesDir: o.imagesDir,
    guestAgentBundle: GUEST_AGENT_BUNDLE(),
    ownerId: `bench-usage-${randomBytes(4).toString('hex')}`,
    reflinkStore: 'off',
  });
  await driver.init();
  const ids: string[] = [];
  try {
    // Created a few at a time: the machine is shared, and the slot pool refills behind them.
    for (let i = 0; i < o.sandboxes; i += 5) {
      const batch = Array.from({ length: Math.min(5, o.sandboxes - i) }, () => `bu${randomBytes(5).toString('hex')}`);
      ids.push(...batch);
      await Promise.all(batch.map((id) => driver.create({ id, image: 'default', cpu: 0.25, memoryMiB: 128, env: {}, egress: { mode: 'deny-all' }, diskGiB: 1 })));
    }
    const sampler = new UsageSampler(driver, { intervalMs: 3_600_000 });
    await sampler.sampleOnce(); // the first round has no CPU delta yet, and warms the code paths
    const rounds: number[] = [];
    const walls: number[] = [];
    let sampled = 0;
    for (let r = 0; r < o.rounds; r++) {
      const started = process.cpuUsage();
      const wallStart = performance.now();
      sampled = (await sampler.sampleOnce()).length;
      rounds.push(cpuMs(started));
      walls.push(performance.now() - wallStart);
    }
    if (sampled !== o.sandboxes) throw new Error(`a round sampled ${sampled} sandboxes, not ${o.sandboxes}`);

    const reads = o.sandboxes * FILES_PER_SANDBOX;
    const baseline: number[] = [];
    for (let r = 0; r < o.rounds; r++) {
      const started = process.cpuUsage();
      await Promise.all(Array.from({ length: reads }, () => readFile('/proc/self/stat', 'utf8')));
      baseline.push(cpuMs(started));
    }
    const p50 = quantile(rounds, 0.5);
    const base = quantile(baseline, 0.5);
    console.log(
      `usage sampling, ${o.sandboxes} idle sandboxes (n=${o.rounds} rounds): CPU per round p50 ${ms(p50)}, p95 ${ms(quantile(rounds, 0.95))} ` +
        `(${((p50 * 1000) / o.sandboxes).toFixed(0)} µs per sandbox; ${((p50 / 5000) * 100).toFixed(2)}% of one core at the default 5 s interval), wall p50 ${ms(quantile(walls, 0.5))}; ` +
        `baseline ${reads} plain small-file reads p50 ${ms(base)} → ${(p50 / base).toFixed(1)}×`,
    );
  } finally {
    for (const id of ids) await driver.destroy(id).catch((err: unknown) => console.error(`destroy ${id}: ${String(err)}`));
    await driver.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}
