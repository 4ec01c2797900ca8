// Metrics history through the real @daytonaio/sdk (daytona-wave2.md §8.2): `sandbox.getMetrics()`
// asks /config for an analytics URL, finds none, and reads
// `GET /sandbox/{id}/telemetry/metrics` series, pivoting them back into samples by their exact
// timestamp strings. CPU rises while a busy loop runs compared with idle samples, and memory in
// use grows by a 200 MiB allocation a process holds (samples every second here). Not supported
// before. `getMetricsLatest` (the toolbox's own reading) keeps working beside it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '@daytonaio/sdk';
import { waitFor } from '../../test/harness.js';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

const MiB = 2 ** 20;
let env: DaytonaTestEnv;
let sb: Sandbox;

beforeAll(async () => {
  env = await startDaytonaEnv({ NESTBOX_USAGE_SAMPLE_SECONDS: '1' });
  sb = await env.daytona.create({ networkBlockAll: true });
}, 180_000);

afterAll(async () => {
  await sb?.delete().catch(() => undefined);
  await env?.server.close();
}, 120_000);

type Sample = Awaited<ReturnType<Sandbox['getMetrics']>>[number];
const samplesAfter = async (since: Date): Promise<Sample[]> => (await sb.getMetrics(since)).filter((m) => m.timestamp.getTime() > since.getTime());

/** Starts a detached command in the sandbox and returns its pid. */
async function detached(command: string): Promise<string> {
  const r = await sb.process.executeCommand(`nohup ${command} >/dev/null 2>&1 </dev/null & echo $!`);
  expect(r.exitCode).toBe(0);
  return r.result.trim();
}

describe('daytona sandbox metrics history', () => {
  it('reports CPU rising under a busy loop and memory holding a 200 MiB allocation', async () => {
    const idleFrom = new Date();
    const idle = await waitFor('three idle samples', async () => {
      const samples = await samplesAfter(idleFrom);
      return samples.length >= 3 ? samples : undefined;
    }, 90_000, 500);
    for (const m of idle) {
      expect(m.cpuCount).toBeGreaterThanOrEqual(1);
      expect(m.memTotal).toBe(1024 * MiB);
      expect(m.memUsed).toBeGreaterThan(0);
      expect(m.diskTotal).toBeGreaterThan(0);
    }
    // Sorted as the SDK sorts them, one sample per timestamp.
    const times = idle.map((m) => m.timestamp.getTime());
    expect([...times].sort((a, b) => a - b)).toEqual(times);
    expect(new Set(times).size).toBe(times.length);
    const idleCpu = Math.max(...idle.map((m) => m.cpuUsedPct));

    const busyPid = await detached(`sh -c 'while :; do :; done'`);
    const busyFrom = new Date();
    try {
      await waitFor('a busy sample above the idle ones', async () => (await samplesAfter(busyFrom)).find((m) => m.cpuUsedPct > idleCpu + 10), 120_000, 500);
    } finally {
      await sb.process.executeCommand(`kill ${busyPid}`);
    }

    const baseline = (await waitFor('a sample after the loop ended', async () => (await samplesAfter(new Date(Date.now() - 1000))).at(-1), 60_000, 500)).memUsed;
    const holderPid = await detached(`python3 -c 'b = b"\\x01" * (200 << 20); import time; time.sleep(600)'`);
    const heldFrom = new Date();
    try {
      const held = await waitFor('memory in use up by the allocation', async () => (await samplesAfter(heldFrom)).find((m) => m.memUsed >= baseline + 190 * MiB), 120_000, 500);
      expect(held.memUsed).toBeLessThan(held.memTotal);
    } finally {
      await sb.process.executeCommand(`kill ${holderPid}`);
    }

    const latest = await sb.getMetricsLatest();
    expect(latest.cpuCount).toBeGreaterThan(0);
    expect(latest.memTotal).toBeGreaterThan(0);
  }, 420_000);

  it('answers one identical timestamp string per sample across the series, and no analytics URL in /config', async () => {
    const config = await (await rawFetch(env, '/daytona/api/config')).json();
    expect(config).not.toHaveProperty('analyticsApiUrl');
    const from = new Date(Date.now() - 120_000).toISOString();
    const to = new Date().toISOString();
    const names = ['daytona.sandbox.cpu.limit', 'daytona.sandbox.memory.usage'];
    const res = await rawFetch(env, `/daytona/api/sandbox/${sb.id}/telemetry/metrics?from=${from}&to=${to}&${names.map((n) => `metricNames=${n}`).join('&')}`);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { series: { metricName: string; dataPoints: { timestamp: string; value: number }[] }[] };
    expect(body.series.map((s) => s.metricName)).toEqual(names);
    const [cpu, mem] = body.series;
    expect(cpu.dataPoints.length).toBeGreaterThan(0);
    expect(cpu.dataPoints.map((p) => p.timestamp)).toEqual(mem.dataPoints.map((p) => p.timestamp));
    for (const p of cpu.dataPoints) expect(p.timestamp).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);

    const bad = await rawFetch(env, `/daytona/api/sandbox/${sb.id}/telemetry/metrics?from=${from}&to=${to}&metricNames=daytona.sandbox.gpu`);
    expect(bad.status).toBe(400);
    expect((await bad.json()).message).toMatch(/metricNames/);
  });
});
