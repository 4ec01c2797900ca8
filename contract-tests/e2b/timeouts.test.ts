// Sandbox timeouts through the real `e2b` SDK: deadlines are honoured when they fall due (not at
// the next periodic pass), connect only extends, setTimeout sets exactly, and E2B's `0` means
// "now" (Nestbox's own 0 means "never").
//
// The server's periodic background pass runs once a minute here, far longer than any wait
// below: whatever ends a sandbox in these tests is the deadline timer, not that pass.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, SandboxError, SandboxNotFoundError } from 'e2b';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;

beforeAll(async () => {
  t = await startE2bTestServer({ NESTBOX_BACKGROUND_INTERVAL_MS: '60000' });
});

afterAll(async () => {
  await t?.close();
});

const isGone = (id: string) => Sandbox.getInfo(id, t.opts).then(() => false, (e: unknown) => e instanceof SandboxNotFoundError);

/** Polls until the sandbox is gone or `until` (ms since the epoch) passes; returns when it was first seen gone. */
async function goneBy(id: string, until: number): Promise<number | undefined> {
  for (let i = 0; i < 400 && Date.now() < until; i++) {
    if (await isGone(id)) return Date.now();
    await sleep(50);
  }
  return (await isGone(id)) ? Date.now() : undefined;
}

/** A margin that is generous next to the few hundred ms a deadline may take, and far below the periodic pass. */
const MARGIN_MS = 15_000;

describe('e2b sandbox timeouts', () => {
  it('kills a sandbox at the deadline setTimeout gave it, running until then', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    await sbx.setTimeout(4_000);
    const { endAt } = await sbx.getInfo();
    // setTimeout sets the deadline exactly, shorter too.
    expect(endAt.getTime()).toBeLessThanOrEqual(Date.now() + 4_000);
    // Still running before its deadline (checked only while the deadline is clearly ahead).
    if (Date.now() < endAt.getTime() - 1_000) expect((await sbx.getInfo()).state).toBe('running');
    const gone = await goneBy(sbx.sandboxId, endAt.getTime() + MARGIN_MS);
    expect(gone).toBeDefined();
    // The gap is logged for whoever wants to see it; asserting on it would be a timing threshold.
    console.log(`setTimeout deadline honoured ${gone! - endAt.getTime()} ms after endAt (first poll that saw it gone)`);
    expect(await sbx.isRunning()).toBe(false);
  });

  it('kills a sandbox at the deadline it was created with', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 3_000 });
    const { endAt } = await sbx.getInfo();
    expect(await goneBy(sbx.sandboxId, endAt.getTime() + MARGIN_MS)).toBeDefined();
  });

  it('pauses a sandbox with onTimeout "pause" at its deadline', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } });
    const { endAt } = await sbx.getInfo();
    let state = 'running';
    for (let i = 0; i < 400 && state !== 'paused' && Date.now() < endAt.getTime() + MARGIN_MS; i++) {
      await sleep(50);
      state = (await sbx.getInfo()).state;
    }
    expect(state).toBe('paused');
    await sbx.kill();
  });

  it('refuses the timeout options it cannot honour, naming them', async () => {
    const memory = await Sandbox.create({ ...t.opts, timeoutMs: 60_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: true } } }).catch((e: unknown) => e);
    expect(memory).toBeInstanceOf(SandboxError);
    expect(String((memory as Error).message)).toMatch(/^501: lifecycle\.onTimeout keepMemory .*not supported/);
    const resume = await Sandbox.create({ ...t.opts, timeoutMs: 60_000, lifecycle: { onTimeout: 'pause', autoResume: true } }).catch((e: unknown) => e);
    expect(resume).toBeInstanceOf(SandboxError);
    expect(String((resume as Error).message)).toMatch(/^501: lifecycle\.autoResume .*not supported/);
    // What Nestbox does anyway is accepted.
    const plain = await Sandbox.create({ ...t.opts, timeoutMs: 60_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: false } });
    await plain.kill();
  });

  it('connect only extends a running sandbox\'s timeout; setTimeout also shortens it', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    const before = (await sbx.getInfo()).endAt.getTime();
    // A shorter connect timeout leaves the longer deadline as it was.
    await Sandbox.connect(sbx.sandboxId, { ...t.opts, timeoutMs: 10_000 });
    expect((await sbx.getInfo()).endAt.getTime()).toBe(before);
    await sbx.connect({ timeoutMs: 10_000 });
    expect((await sbx.getInfo()).endAt.getTime()).toBe(before);
    // A longer one extends it.
    await Sandbox.connect(sbx.sandboxId, { ...t.opts, timeoutMs: 600_000 });
    const extended = (await sbx.getInfo()).endAt.getTime();
    expect(extended).toBeGreaterThan(before);
    expect(extended).toBeGreaterThan(Date.now() + 300_000);
    // setTimeout sets it exactly, shorter than what connect gave.
    await sbx.setTimeout(30_000);
    expect((await sbx.getInfo()).endAt.getTime()).toBeLessThanOrEqual(Date.now() + 30_000);
    // The 2.6–2.50 route (v1 connect) extends only as well.
    const v1 = await fetch(`${t.opts.apiUrl}/sandboxes/${sbx.sandboxId}/connect`, {
      method: 'POST',
      headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' },
      body: JSON.stringify({ timeout: 5 }),
    });
    expect(v1.status).toBe(200);
    expect((await sbx.getInfo()).endAt.getTime()).toBeGreaterThan(Date.now() + 10_000);
    await sbx.kill();
  });

  it('connect resumes a paused sandbox with exactly the timeout it gives', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 600_000 });
    expect(await sbx.pause()).toBe(true);
    await Sandbox.connect(sbx.sandboxId, { ...t.opts, timeoutMs: 20_000 });
    const info = await sbx.getInfo();
    expect(info.state).toBe('running');
    expect(info.endAt.getTime()).toBeLessThanOrEqual(Date.now() + 20_000);
    await sbx.kill();
  });

  it('reads a timeout of 0 as E2B does: setTimeout(0) and create ends it now, resume and fork refuse it', async () => {
    const a = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    await a.setTimeout(0);
    expect(await goneBy(a.sandboxId, Date.now() + MARGIN_MS)).toBeDefined();

    const b = await Sandbox.create({ ...t.opts, timeoutMs: 0 });
    expect(await goneBy(b.sandboxId, Date.now() + MARGIN_MS)).toBeDefined();

    const c = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    // A running sandbox: connect with 0 extends nothing and ends nothing.
    const before = (await c.getInfo()).endAt.getTime();
    await Sandbox.connect(c.sandboxId, { ...t.opts, timeoutMs: 0 });
    expect((await c.getInfo()).endAt.getTime()).toBe(before);
    expect(await c.isRunning()).toBe(true);
    // A paused one: resuming it for no time at all is refused, as upstream does.
    expect(await c.pause()).toBe(true);
    const refused = await Sandbox.connect(c.sandboxId, { ...t.opts, timeoutMs: 0 }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(SandboxError);
    expect(String((refused as Error).message)).toMatch(/^400: timeout: must be greater than 0/);
    expect((await c.getInfo()).state).toBe('paused');
    await Sandbox.connect(c.sandboxId, { ...t.opts, timeoutMs: 60_000 });
    const fork = await fetch(`${t.opts.apiUrl}/sandboxes/${c.sandboxId}/fork`, {
      method: 'POST',
      headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' },
      body: JSON.stringify({ timeout: 0 }),
    });
    expect(fork.status).toBe(400);
    expect(await fork.json()).toMatchObject({ code: 400, message: 'timeout: must be greater than 0' });
    await c.kill();
  });
});
