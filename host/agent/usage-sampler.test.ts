// The sampler's arithmetic and its buffer, over counters given directly: CPU % is the CPU time
// between two rounds over the wall time and the sandbox's CPU limit, a paused sandbox is 0, a
// field the driver did not read stays absent, and the buffer keeps the newest samples only.
import { describe, expect, it } from 'vitest';
import type { SandboxUsageCounters } from '../drivers/types.js';
import { UsageSampler } from './usage-sampler.js';

function driverOf(rounds: SandboxUsageCounters[][]) {
  let i = 0;
  return { usage: async () => rounds[Math.min(i++, rounds.length - 1)] };
}

describe('UsageSampler', () => {
  it('turns CPU time into a share of the limit, reports 0 while paused and leaves unknown fields out', async () => {
    const base = { id: 'a', cpuLimit: 2, memoryUsedBytes: 10, memoryLimitBytes: 100 };
    // A CPU time far beyond any wall time between the rounds: the share is capped at 100.
    const sampler = new UsageSampler(driverOf([[{ ...base, status: 'running', cpuNs: 0 }], [{ ...base, status: 'running', cpuNs: 1e15 }], [{ ...base, status: 'paused', cpuNs: 2e15 }], [{ ...base, status: 'running', cpuNs: 2e15 }]]), { intervalMs: 1000 });
    const [first] = await sampler.sampleOnce();
    expect(first.cpuUsedPct).toBeUndefined(); // no previous read to compare with
    expect(first).toMatchObject({ sandboxId: 'a', cpuCount: 2, memUsed: 10, memTotal: 100 });
    expect(first).not.toHaveProperty('diskUsed');
    expect(first).not.toHaveProperty('netRx');
    expect((await sampler.sampleOnce())[0].cpuUsedPct).toBe(100);
    expect((await sampler.sampleOnce())[0].cpuUsedPct).toBe(0);
    expect((await sampler.sampleOnce())[0].cpuUsedPct).toBe(0); // no CPU time since the paused read
    expect(sampler.buffered).toBe(4);
  });

  it('keeps at most maxBuffered samples, the newest, and takes failed deliveries back in front', async () => {
    const sampler = new UsageSampler(driverOf([[{ id: 'a', status: 'running', cpuLimit: 1 }, { id: 'b', status: 'running', cpuLimit: 1 }]]), { intervalMs: 1000, maxBuffered: 3 });
    for (let i = 0; i < 3; i++) await sampler.sampleOnce();
    expect(sampler.buffered).toBe(3);
    const taken = sampler.take(2);
    expect(taken).toHaveLength(2);
    expect(sampler.buffered).toBe(1);
    sampler.putBack(taken);
    expect(sampler.take(10)).toEqual([...taken, expect.objectContaining({ sandboxId: 'b' })]);
  });

  it('survives a failing driver: an empty round, nothing buffered', async () => {
    const sampler = new UsageSampler({ usage: async () => { throw new Error('cgroup gone'); } }, { intervalMs: 1000 });
    expect(await sampler.sampleOnce()).toEqual([]);
    expect(sampler.buffered).toBe(0);
  });
});
