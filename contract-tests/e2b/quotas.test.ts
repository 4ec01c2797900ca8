// Organisation limits through the real `e2b` SDK: a create past the limit is a 429 with
// Retry-After, which the SDK waits out and retries (`retries`, default 3) and then raises as
// RateLimitError; the sandbox's disk size shows as diskSizeMB.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimitError, Sandbox } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;

beforeAll(async () => {
  t = await startE2bTestServer({ NESTBOX_ORG_MAX_SANDBOXES: '1', NESTBOX_QUOTA_RETRY_AFTER_SECONDS: '1', NESTBOX_DEFAULT_DISK_GIB: '2' });
}, 180_000);

afterAll(async () => {
  await t?.close();
}, 180_000);

describe('e2b: organisation limits', () => {
  it('raises RateLimitError past the limit of concurrent sandboxes, and lets a create through once one is gone', async () => {
    const first = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    // The disk limit is the sandbox's own: df inside and diskSizeMB agree.
    const df = await first.commands.run('df -B1M --output=size / | tail -1');
    expect(Number(df.stdout.trim())).toBeGreaterThan(0.9 * 2048);
    const info = await (await fetch(`${t.opts.apiUrl}/sandboxes/${first.sandboxId}`, { headers: { 'X-API-Key': t.apiKey } })).json();
    expect(info.diskSizeMB).toBe(2048);

    const started = Date.now();
    const second = Sandbox.create({ ...t.opts, timeoutMs: 120_000, retries: 1 });
    await expect(second).rejects.toBeInstanceOf(RateLimitError);
    await expect(second).rejects.toThrow(/organisation limit reached/);
    // One retry after Retry-After (1 s): the SDK honoured the header.
    expect(Date.now() - started).toBeGreaterThanOrEqual(1000);

    // The raw answer: 429 in E2B's shape, with Retry-After.
    const raw = await fetch(`${t.opts.apiUrl}/sandboxes`, { method: 'POST', headers: { 'X-API-Key': t.apiKey, 'content-type': 'application/json' }, body: JSON.stringify({ templateID: 'base' }) });
    expect(raw.status).toBe(429);
    expect(raw.headers.get('retry-after')).toBe('1');
    expect(await raw.json()).toMatchObject({ code: 429, message: expect.stringContaining('1 of 1 sandboxes') });

    await first.kill();
    const third = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    expect(await third.isRunning()).toBe(true);
    await third.kill();
  }, 180_000);
});
