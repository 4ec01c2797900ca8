// Per-sandbox usage on the native API (getSandboxUsage, getSandboxUsageHistory) against a real
// server, host agent and local driver sampling every second: the sample's fields come from the
// sandbox's cgroup, its own disk and its slot's veth (traffic the sandbox sends shows up as tx),
// a paused sandbox reports 0 CPU, ranges take ISO or unix seconds and are downsampled, and bad
// bounds are 400s naming the field. Every wait polls with a deadline.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, waitFor, type TestServer } from './harness.js';

const MiB = 2 ** 20;
let t: TestServer;
let id: string;

interface Sample {
  at: string;
  cpuUsedPct: number | null;
  cpuCount: number;
  memoryUsedBytes: number | null;
  memoryLimitBytes: number | null;
  diskUsedBytes: number | null;
  diskLimitBytes: number | null;
  networkRxBytes: number | null;
  networkTxBytes: number | null;
}

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_USAGE_SAMPLE_SECONDS: '1' } });
  const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, egress: { mode: 'deny-all' } });
  expect(res.status).toBe(201);
  id = res.body.id;
}, 180_000);

afterAll(async () => t?.close(), 120_000);

const latest = async (): Promise<Sample | null> => {
  const res = await t.http.get(`/api/v1/sandboxes/${id}/usage`).set(t.auth);
  expect(res.status).toBe(200);
  return res.body.sample;
};
const sampleAfter = (since: number, test: (s: Sample) => boolean = () => true) =>
  waitFor('a matching sample', async () => {
    const s = await latest();
    return s && Date.parse(s.at) > since && test(s) ? s : undefined;
  }, 60_000, 300);

describe('native sandbox usage', () => {
  it('reports CPU, memory, disk and network from the sandbox\'s own cgroup, disk and slot', async () => {
    const first = await sampleAfter(0, (s) => s.cpuUsedPct !== null);
    expect(first).toMatchObject({ cpuCount: 1, memoryLimitBytes: 1024 * MiB });
    expect(first.memoryUsedBytes).toBeGreaterThan(0);
    expect(first.memoryUsedBytes).toBeLessThan(1024 * MiB);
    expect(first.diskLimitBytes).toBeGreaterThan(0);
    expect(first.diskUsedBytes).toBeGreaterThan(0);
    expect(first.networkTxBytes).toEqual(expect.any(Number));

    // 100 UDP datagrams of 1000 bytes to the slot's gateway: the veth sees them leave the
    // sandbox whatever the egress policy does with them afterwards.
    const send = `python3 -c '
import socket, struct
gw = next(socket.inet_ntoa(struct.pack("<L", int(f[2], 16))) for f in (l.split() for l in open("/proc/net/route").readlines()[1:]) if f[1] == "00000000")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(100): s.sendto(b"x" * 1000, (gw, 9))
'`;
    const sent = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: send });
    expect(sent.body.exitCode).toBe(0);
    const after = Date.now();
    await sampleAfter(after, (s) => (s.networkTxBytes ?? 0) >= (first.networkTxBytes ?? 0) + 100 * 1000);
  }, 120_000);

  it('answers a range in ISO or unix seconds, downsampled to maxPoints, and 400s naming a bad bound', async () => {
    const startUnix = Math.floor(Date.now() / 1000) - 600;
    const all = await t.http.get(`/api/v1/sandboxes/${id}/usage/history?start=${startUnix}`).set(t.auth);
    expect(all.status).toBe(200);
    expect(all.body.samples.length).toBeGreaterThan(2);
    const times = (all.body.samples as Sample[]).map((s) => Date.parse(s.at));
    expect([...times].sort((a, b) => a - b)).toEqual(times);
    const two = await t.http.get(`/api/v1/sandboxes/${id}/usage/history`).query({ start: new Date(startUnix * 1000).toISOString(), maxPoints: 2 }).set(t.auth);
    expect(two.status).toBe(200);
    expect(two.body.samples).toHaveLength(2);
    expect(two.body.samples[1].at).toBe(all.body.samples.at(-1).at);
    for (const [query, field] of [['start=tomorrowish', 'start'], ['end=12:00', 'end'], [`start=${startUnix + 1200}&end=${startUnix}`, 'start'], ['maxPoints=0', 'maxPoints']]) {
      const bad = await t.http.get(`/api/v1/sandboxes/${id}/usage/history?${query}`).set(t.auth);
      expect(bad.status, query).toBe(400);
      expect(JSON.stringify(bad.body), query).toContain(field);
    }
    expect((await t.http.get('/api/v1/sandboxes/nosuchsandbox/usage').set(t.auth)).status).toBe(404);
  });

  it('reports 0 CPU while the sandbox is paused', async () => {
    const busy = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'nohup sh -c "while :; do :; done" >/dev/null 2>&1 &' });
    expect(busy.status).toBe(200);
    await sampleAfter(Date.now(), (s) => (s.cpuUsedPct ?? 0) > 10);
    expect((await t.http.post(`/api/v1/sandboxes/${id}/pause`).set(t.auth)).status).toBe(200);
    const pausedAt = Date.now();
    // A round that began before the pause may end after it: judge one that began well after.
    const paused = await sampleAfter(pausedAt + 2000);
    expect(paused.cpuUsedPct).toBe(0);
    expect(paused.memoryUsedBytes).toBeGreaterThan(0); // memory is kept while paused
    expect((await t.http.post(`/api/v1/sandboxes/${id}/unpause`).set(t.auth)).status).toBe(200);
  }, 120_000);
});
