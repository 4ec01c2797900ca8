// Organisation limits and the disk size through the real @daytonaio/sdk: a create or start past
// the limit is a 429 the SDK raises as DaytonaRateLimitError; `resources.disk` is the sandbox's
// disk in GiB (400 past the configured maximum), visible to df inside.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaRateLimitError, DaytonaValidationError, type CreateSandboxFromSnapshotParams } from '@daytonaio/sdk';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

// The SDK's types allow `resources` only next to an `image`, but its create() sends them with the
// default snapshot too (what these tests pin), so those params are cast to the snapshot form.
describe('Daytona: organisation limits and disk size', () => {
  let env: DaytonaTestEnv;
  beforeAll(async () => {
    env = await startDaytonaEnv({ NESTBOX_ORG_MAX_SANDBOXES: '1', NESTBOX_QUOTA_RETRY_AFTER_SECONDS: '3', NESTBOX_DEFAULT_DISK_GIB: '1', NESTBOX_MAX_DISK_GIB: '4' });
  }, 180_000);
  afterAll(async () => {
    await env?.server.close();
  }, 180_000);

  it('honours resources.disk and refuses one past the maximum', async () => {
    await expect(env.daytona.create({ resources: { disk: 5 } } as CreateSandboxFromSnapshotParams)).rejects.toBeInstanceOf(DaytonaValidationError);
    const sb = await env.daytona.create({ resources: { cpu: 1, memory: 1, disk: 3 } } as CreateSandboxFromSnapshotParams);
    expect(sb.disk).toBe(3);
    const df = await sb.process.executeCommand('df -B1M --output=size / | tail -1');
    expect(Number(df.result.trim())).toBeGreaterThan(0.9 * 3 * 1024);
    expect(Number(df.result.trim())).toBeLessThanOrEqual(3 * 1024);
    await sb.delete();
  }, 180_000);

  it('raises DaytonaRateLimitError on a create or start past the limit', async () => {
    const first = await env.daytona.create({});
    const second = env.daytona.create({});
    await expect(second).rejects.toBeInstanceOf(DaytonaRateLimitError);
    await expect(second).rejects.toThrow(/organisation limit reached/);

    const raw = await rawFetch(env, '/daytona/api/sandbox', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(raw.status).toBe(429);
    expect(raw.headers.get('retry-after')).toBe('3');
    expect(await raw.json()).toMatchObject({ statusCode: 429, error: 'Too Many Requests', code: 'quota_exceeded' });

    // A stopped sandbox does not count; starting it again when another took its place does.
    await first.stop();
    const other = await env.daytona.create({});
    await expect(first.start()).rejects.toBeInstanceOf(DaytonaRateLimitError);
    await other.delete();
    await first.start();
    expect(first.state).toBe('started');
    await first.delete();
  }, 240_000);
});
