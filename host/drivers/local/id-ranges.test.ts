// The id range allocator on its own (claim files in a private directory): ranges never overlap,
// concurrent claims never hand out one index twice, and a release only frees its own claim.
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { IDS_PER_SANDBOX, IdRangeAllocator } from './id-ranges.js';

describe('IdRangeAllocator', () => {
  const dir = mkdtempSync('/tmp/nbx-idr-');
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('hands out disjoint ranges, even to concurrent claims of two allocators', async () => {
    const claimsDir = join(dir, 'concurrent');
    const [a, b] = [new IdRangeAllocator(1 << 20, 64, claimsDir), new IdRangeAllocator(1 << 20, 64, claimsDir)];
    const ranges = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).claim(i % 2 ? 'owner-a' : 'owner-b', `sb${i}`)));
    const indexes = ranges.map((range) => range.index);
    expect(new Set(indexes).size).toBe(20);
    for (const range of ranges) {
      expect(range.base).toBe((1 << 20) + range.index * IDS_PER_SANDBOX);
      expect(range.count).toBe(IDS_PER_SANDBOX);
    }
    expect(readdirSync(claimsDir)).toHaveLength(20);
  });

  it('releases only a claim of the same owner and holder, and reuses a released index', async () => {
    const claimsDir = join(dir, 'release');
    const ranges = new IdRangeAllocator(1 << 20, 4, claimsDir);
    const first = await ranges.claim('me', 'one');
    await ranges.release(first.index, 'someone-else', 'one');
    await ranges.release(first.index, 'me', 'other');
    expect((await ranges.claims()).map((claim) => claim.index)).toEqual([first.index]);
    await ranges.release(first.index, 'me', 'one');
    expect(await ranges.claims()).toEqual([]);
    expect((await ranges.claim('me', 'two')).index).toBe(first.index);
  });

  it('counts a torn claim file as taken, and fails clearly when every range is in use', async () => {
    const claimsDir = join(dir, 'full');
    const ranges = new IdRangeAllocator(1 << 20, 2, claimsDir);
    await ranges.claim('me', 'one');
    writeFileSync(join(claimsDir, '1'), '{"own');
    await expect(ranges.claim('me', 'three')).rejects.toThrow(/all 2 user namespace id ranges are in use/);
  });

  it('refuses a base that would overlap host root or run past 32-bit ids', () => {
    expect(() => new IdRangeAllocator(0)).toThrow(/at least 65536/);
    expect(() => new IdRangeAllocator(2 ** 32 - IDS_PER_SANDBOX, 2)).toThrow(/32-bit/);
  });
});
