// What observability costs on the exec round trip (issue 17): two servers on this machine, one
// with everything off (no metrics token, no OTLP endpoint) and one with Prometheus metrics and
// OpenTelemetry tracing on (every span sampled, exported to an OTLP/HTTP sink on loopback that
// this part runs), each with its own data dir, database and local host agent, one sandbox each.
// Execs alternate between the two in small batches, so drift on the machine (other load, page
// cache) falls on both alike; the figure is the ratio of the medians. No thresholds.
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { startServer, type RunningServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';
import { unmountReflinkStore } from '../host/storage/disk-store.js';
import { call, ms, quantile, timed } from './measure.js';

export interface ObservabilityBenchOptions {
  /** Execs per server (alternating batches of 10). */
  execs: number;
  imagesDir: string;
  postgres?: string;
}

interface Side {
  name: string;
  server: RunningServer;
  dataDir: string;
  key: string;
  base: string;
  sandboxId: string;
  logs: string[];
}

/** An OTLP/HTTP receiver that takes every export and counts it (bodies are not decoded: only their arrival matters here). */
async function startOtlpSink(): Promise<{ url: string; exports: () => number; bytes: () => number; close: () => Promise<void> }> {
  let exports = 0;
  let bytes = 0;
  const server = http.createServer((req, res) => {
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => {
      if (req.url?.startsWith('/v1/')) exports++;
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    exports: () => exports,
    bytes: () => bytes,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

async function startSide(name: string, o: ObservabilityBenchOptions, extra: Record<string, string>): Promise<Side> {
  const dataDir = mkdtempSync(`/tmp/nbx-bench-obs-${name}-`);
  const key = generateApiKey();
  const config = loadConfig({
    NESTBOX_PORT: '0',
    NESTBOX_SSH_PORT: '0',
    NESTBOX_DATA_DIR: dataDir,
    NESTBOX_IMAGES_DIR: o.imagesDir,
    NESTBOX_BOOTSTRAP_API_KEY: key,
    NESTBOX_WARM_POOL_SIZE: '0', // no warm pool: its refills would run beside what is measured
    // Two host agents on one machine: each keeps its slots to itself.
    NESTBOX_HOST_ID: `bench-${name}`,
    NESTBOX_SLOT_POOL_SIZE: '1',
    ...(o.postgres ? { NESTBOX_DATABASE_URL: o.postgres } : {}),
    ...extra,
  });
  const logs: string[] = [];
  const server = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => logs.push(line.trimEnd()) }));
  const base = `${server.url}/api/v1`;
  const deadline = Date.now() + 180_000;
  while (JSON.parse((await call(base, key, 'GET', '/health')).body).hostsAvailable < 1) {
    if (Date.now() > deadline) throw new Error(`${name}: no host agent registered:\n${logs.slice(-50).join('\n')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const created = await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0, egress: { mode: 'deny-all' } });
  if (created.status !== 201) throw new Error(`${name}: create failed: ${created.body}`);
  return { name, server, dataDir, key, base, sandboxId: JSON.parse(created.body).id as string, logs };
}

async function stopSide(side: Side): Promise<void> {
  await call(side.base, side.key, 'DELETE', `/sandboxes/${side.sandboxId}`).catch(() => undefined);
  await side.server.close();
  await unmountReflinkStore(`${side.dataDir}/host`).catch(() => undefined);
  rmSync(side.dataDir, { recursive: true, force: true });
}

export async function benchObservability(o: ObservabilityBenchOptions): Promise<void> {
  const sink = await startOtlpSink();
  const metricsToken = `bench-metrics-${generateApiKey().slice(4, 28)}`;
  const sides: Side[] = [];
  try {
    sides.push(await startSide('off', o, {}));
    sides.push(await startSide('on', o, { NESTBOX_METRICS_TOKEN: metricsToken, NESTBOX_OTLP_ENDPOINT: sink.url, NESTBOX_TRACE_SAMPLE_RATIO: '1' }));
    const times = new Map<string, number[]>(sides.map((s) => [s.name, []]));
    const exec = async (side: Side) => {
      const [t, res] = await timed(() => call(side.base, side.key, 'POST', `/sandboxes/${side.sandboxId}/commands`, { cmd: 'true' }));
      if (res.status !== 200) throw new Error(`${side.name}: exec failed: ${res.body}`);
      return t;
    };
    // Warm both (connections, the guest agent's first spawn) before anything counts.
    for (const side of sides) for (let i = 0; i < 5; i++) await exec(side);
    for (let done = 0; done < o.execs; done += 10) {
      for (const side of sides) for (let i = 0; i < Math.min(10, o.execs - done); i++) times.get(side.name)!.push(await exec(side));
    }
    const off = quantile(times.get('off')!, 0.5);
    const on = quantile(times.get('on')!, 0.5);
    console.log(`exec \`true\` round trip (n=${o.execs} each, interleaved): observability off p50 ${ms(off)}, metrics + tracing on p50 ${ms(on)} → ×${(on / off).toFixed(3)}`);
    // What the "on" side produced meanwhile: one scrape, and what reached the OTLP sink.
    const on_ = sides[1]!;
    const [scrapeMs, scrape] = await timed(() => fetch(`${on_.server.url}/metrics`, { headers: { authorization: `Bearer ${metricsToken}` } }).then(async (r) => ({ status: r.status, text: await r.text() })));
    const series = scrape.text.split('\n').filter((l) => l && !l.startsWith('#')).length;
    // Batch span processors export on a timer: give them a moment before counting.
    await new Promise((r) => setTimeout(r, 6000));
    console.log(`  on: /metrics answered ${scrape.status} in ${ms(scrapeMs)} with ${series} samples; the OTLP sink received ${sink.exports()} exports (${(sink.bytes() / 1024).toFixed(0)} KiB)`);
  } finally {
    for (const side of sides) await stopSide(side).catch((err) => console.error(`cleanup of ${side.name}: ${String(err)}`));
    await sink.close();
  }
}
