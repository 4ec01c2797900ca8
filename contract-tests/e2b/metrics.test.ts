// Per-sandbox metrics through the real `e2b` SDK (e2b-wave2.md §4.1): `sbx.getMetrics()` and
// `Sandbox.getMetrics(id)` read the samples the host agent takes from the sandbox's cgroup, disk
// and slot (every second here). CPU rises while a busy loop runs compared with idle samples of
// the same sandbox, and memory in use grows by a 200 MiB allocation a process holds. These were
// a 501 before. Every wait polls with a deadline: no timing thresholds.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, type SandboxMetrics } from 'e2b';
import { waitFor } from '../../test/harness.js';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

const MiB = 2 ** 20;
let t: E2bTestServer;
let sbx: Sandbox;

beforeAll(async () => {
  t = await startE2bTestServer({ NESTBOX_USAGE_SAMPLE_SECONDS: '1' });
  sbx = await Sandbox.create({ ...t.opts, allowInternetAccess: false, timeoutMs: 600_000 });
}, 180_000);

afterAll(async () => {
  await sbx?.kill().catch(() => undefined);
  await t?.close();
}, 120_000);

/** Samples taken after `since` (the SDK sends start in whole seconds; later ones are filtered here). */
async function samplesAfter(since: Date): Promise<SandboxMetrics[]> {
  return (await sbx.getMetrics({ start: since })).filter((m) => m.timestamp.getTime() > since.getTime());
}

describe('e2b sandbox metrics', () => {
  it('reports CPU rising under a busy loop and memory holding a 200 MiB allocation', async () => {
    // Idle: a few samples after the sandbox settled.
    const idleFrom = new Date();
    const idle = await waitFor('three idle samples', async () => {
      const samples = await samplesAfter(idleFrom);
      return samples.length >= 3 ? samples : undefined;
    }, 90_000, 500);
    for (const m of idle) {
      expect(m.timestamp).toBeInstanceOf(Date);
      expect(Number.isNaN(m.timestamp.getTime())).toBe(false);
      expect(m.cpuCount).toBeGreaterThanOrEqual(1);
      expect(m.memTotal).toBe(1024 * MiB); // the sandbox's own memory limit (the default)
      expect(m.memUsed).toBeGreaterThan(0);
      expect(m.diskTotal).toBeGreaterThan(0);
      expect(m.diskUsed).toBeGreaterThan(0);
    }
    const idleCpu = Math.max(...idle.map((m) => m.cpuUsedPct));

    const busy = await sbx.commands.run('while :; do :; done', { background: true });
    const busyFrom = new Date();
    try {
      const peak = await waitFor('a busy sample above the idle ones', async () => {
        const high = (await samplesAfter(busyFrom)).find((m) => m.cpuUsedPct > idleCpu + 10);
        return high;
      }, 120_000, 500);
      expect(peak.cpuUsedPct).toBeLessThanOrEqual(100);
    } finally {
      await busy.kill();
    }

    const baseline = (await waitFor('a sample after the loop ended', async () => (await samplesAfter(new Date(Date.now() - 1000))).at(-1), 60_000, 500)).memUsed;
    const holder = await sbx.commands.run(`python3 -c 'b = b"\\x01" * (200 << 20); import time; time.sleep(600)'`, { background: true });
    const heldFrom = new Date();
    try {
      const held = await waitFor('memory in use up by the allocation', async () => (await samplesAfter(heldFrom)).find((m) => m.memUsed >= baseline + 190 * MiB), 120_000, 500);
      expect(held.memUsed).toBeLessThan(held.memTotal);
      // The static form reads the same samples.
      const viaStatic = await Sandbox.getMetrics(sbx.sandboxId, { ...t.opts, start: heldFrom });
      expect(viaStatic.some((m) => m.memUsed >= baseline + 190 * MiB)).toBe(true);
    } finally {
      await holder.kill();
    }
  }, 420_000);

  it('answers the latest sample per sandbox on GET /sandboxes/metrics and refuses a bad range', async () => {
    const res = await t.http.get(`/e2b/sandboxes/metrics?sandbox_ids=${sbx.sandboxId},nosuchsandbox`).set('X-API-Key', t.apiKey);
    expect(res.status).toBe(200);
    expect(Object.keys(res.body.sandboxes)).toEqual([sbx.sandboxId]);
    const latest = res.body.sandboxes[sbx.sandboxId];
    expect(typeof latest.timestamp).toBe('string');
    expect(latest.timestampUnix).toBe(Math.floor(Date.parse(latest.timestamp) / 1000));
    expect(latest).toMatchObject({ cpuCount: expect.any(Number), memTotal: 1024 * MiB, memUsed: expect.any(Number), diskTotal: expect.any(Number) });

    // No range: since the sandbox started, oldest first.
    const startedAt = (await sbx.getInfo()).startedAt.getTime();
    const all = await sbx.getMetrics();
    expect(all.length).toBeGreaterThan(3);
    expect(all[0].timestamp.getTime()).toBeGreaterThanOrEqual(startedAt);
    const times = all.map((m) => m.timestamp.getTime());
    expect([...times].sort((a, b) => a - b)).toEqual(times);

    const bad = await t.http.get(`/e2b/sandboxes/${sbx.sandboxId}/metrics?start=yesterday`).set('X-API-Key', t.apiKey);
    expect(bad.status).toBe(400);
    expect(bad.body.message).toMatch(/start/);
    // The SDK's own error for an unknown sandbox.
    await expect(Sandbox.getMetrics('nosuchsandbox', t.opts)).rejects.toThrow(/not found/i);
  });
});
