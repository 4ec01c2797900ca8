// Two control-plane replicas on one PostgreSQL database (one host agent, which the first
// runs): a deadline set through either is honoured when it falls due, by whichever replica's
// timer fires first, and never acted on twice. Both periodic passes run once a minute, so only
// the deadline timers can end the sandboxes in time here.
import { mkdtempSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, SandboxNotFoundError } from 'e2b';
import { loadConfig } from '../../src/config.js';
import { createLogger } from '../../src/logger.js';
import { startServer, type RunningServer } from '../../src/server.js';
import { removeDataDir, testEnv } from '../../test/harness.js';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

const HOST_SECRET = randomBytes(32).toString('base64url');
let a: E2bTestServer;
let b: RunningServer;
let bDataDir: string;
const bLogs: string[] = [];
let bOpts: E2bTestServer['opts'];

beforeAll(async () => {
  a = await startE2bTestServer({ NESTBOX_BACKGROUND_INTERVAL_MS: '60000', NESTBOX_HOST_SECRET: HOST_SECRET });
  bDataDir = mkdtempSync('/tmp/nbx-it-');
  const config = loadConfig(
    testEnv(bDataDir, {
      NESTBOX_DATABASE_URL: a.databaseUrl!,
      NESTBOX_HOST_SECRET: HOST_SECRET,
      NESTBOX_LOCAL_HOST_AGENT: 'false',
      NESTBOX_BOOTSTRAP_API_KEY: a.apiKey,
      NESTBOX_BACKGROUND_INTERVAL_MS: '60000',
    }),
  );
  b = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => bLogs.push(line.trimEnd()) }));
  bOpts = { apiKey: a.apiKey, apiUrl: `${b.url}/e2b`, sandboxUrl: b.url };
});

afterAll(async () => {
  await b?.close();
  if (bDataDir) removeDataDir(bDataDir);
  await a?.close();
});

const isGone = (id: string) => Sandbox.getInfo(id, a.opts).then(() => false, (e: unknown) => e instanceof SandboxNotFoundError);

async function goneBy(id: string, until: number): Promise<boolean> {
  for (let i = 0; i < 400 && Date.now() < until; i++) {
    if (await isGone(id)) return true;
    await sleep(50);
  }
  return isGone(id);
}

describe('e2b timeouts with two control-plane replicas', () => {
  it('honours deadlines set through either replica, once', async () => {
    // Created through one replica, its deadline set through the other (and the other way round).
    const viaA = await Sandbox.create({ ...a.opts, timeoutMs: 120_000 });
    const viaB = await Sandbox.create({ ...bOpts, timeoutMs: 120_000 });
    await Sandbox.setTimeout(viaA.sandboxId, 3_000, bOpts);
    await Sandbox.setTimeout(viaB.sandboxId, 3_000, a.opts);
    const ends = await Promise.all([viaA, viaB].map(async (s) => (await Sandbox.getInfo(s.sandboxId, a.opts)).endAt.getTime()));
    for (const [i, s] of [viaA, viaB].entries()) expect(await goneBy(s.sandboxId, ends[i] + 15_000)).toBe(true);
    // Each was deleted by exactly one replica, and neither replica failed at it.
    const lines = [...a.logs, ...bLogs].filter((l) => l.includes('reached its timeout'));
    for (const s of [viaA, viaB]) expect(lines.filter((l) => l.includes(s.sandboxId))).toHaveLength(1);
    expect([...a.logs, ...bLogs].filter((l) => /timeout (delete|stop) failed|deadline pass failed/.test(l))).toEqual([]);
  });
});
