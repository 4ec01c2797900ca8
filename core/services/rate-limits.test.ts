// The rate-limit buckets: their arithmetic (fast-check, bounded runs), the SQL that implements
// it on PGlite (the embedded default; the PostgreSQL side runs in test/rate-limits.test.ts with
// two server processes), and the limiter's leases with two limiters on one database acting as
// two replicas.
import { mkdtempSync, rmSync } from 'node:fs';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateToLatest, openDatabase, type Db } from '../store/db.js';
import { NestboxError } from '../errors.js';
import {
  fixedRequestLimits,
  leaseSizeOf,
  leaseTokens,
  organizationRequestLimits,
  postgresBucketStore,
  requestLimitsOf,
  requestRatesInForce,
  refilled,
  RequestRateLimiter,
  secondsToToken,
  type BucketLimit,
  type BucketState,
} from './rate-limits.js';

const limitArb = fc.record({
  perSecond: fc.double({ min: 0.01, max: 1000, noNaN: true }),
  burst: fc.integer({ min: 1, max: 5000 }),
});

describe('bucket arithmetic', () => {
  it('never holds more than the burst nor less than nothing, and never grants more than asked', () => {
    fc.assert(
      fc.property(
        limitArb,
        fc.array(fc.record({ dt: fc.double({ min: -5, max: 50, noNaN: true }), want: fc.integer({ min: 1, max: 100 }), giveBack: fc.nat({ max: 100 }) }), { minLength: 1, maxLength: 60 }),
        (limit, steps) => {
          let state: BucketState | undefined;
          let now = 1000;
          let unspent = 0;
          for (const step of steps) {
            now += step.dt;
            // A replica gives back at most what it holds unspent.
            const returned = Math.min(unspent, step.giveBack);
            const r = leaseTokens(state, now, step.want, returned, limit);
            unspent += r.granted - returned;
            expect(Number.isInteger(r.granted)).toBe(true);
            expect(r.granted).toBeGreaterThanOrEqual(0);
            expect(r.granted).toBeLessThanOrEqual(step.want);
            expect(r.state.tokens).toBeGreaterThanOrEqual(0);
            expect(r.state.tokens).toBeLessThanOrEqual(limit.burst);
            // Refused only when less than one whole token was there.
            if (r.granted < step.want) expect(r.state.tokens).toBeLessThan(1);
            state = r.state;
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('hands out at most burst + rate × elapsed tokens over any run of leases', () => {
    fc.assert(
      fc.property(
        limitArb,
        fc.array(fc.record({ dt: fc.double({ min: 0, max: 2, noNaN: true }), want: fc.integer({ min: 1, max: 50 }) }), { minLength: 1, maxLength: 80 }),
        (limit, steps) => {
          let state: BucketState | undefined;
          const start = 0;
          let now = start;
          let taken = 0;
          for (const step of steps) {
            now += step.dt;
            const r = leaseTokens(state, now, step.want, 0, limit);
            taken += r.granted;
            state = r.state;
            expect(taken).toBeLessThanOrEqual(limit.burst + limit.perSecond * (now - start) + 1e-6);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('has a whole token again once secondsToToken has passed (Retry-After is enough)', () => {
    fc.assert(
      fc.property(limitArb, fc.double({ min: 0, max: 0.999, noNaN: true }), (limit, tokens) => {
        const wait = Math.max(1, Math.ceil(secondsToToken(tokens, limit)));
        expect(refilled(tokens, wait, limit)).toBeGreaterThanOrEqual(Math.min(limit.burst, 1) - 1e-9);
      }),
      { numRuns: 300 },
    );
  });

  it('leases at most a tenth of the burst, and at least one token', () => {
    fc.assert(
      fc.property(limitArb, fc.integer({ min: 1, max: 1000 }), (limit, configured) => {
        const size = leaseSizeOf(limit, configured);
        expect(size).toBeGreaterThanOrEqual(1);
        expect(size).toBeLessThanOrEqual(configured);
        if (limit.burst >= 10) expect(size).toBeLessThanOrEqual(limit.burst / 10);
      }),
      { numRuns: 200 },
    );
  });
});

describe('buckets in PGlite', () => {
  let db: Db;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync('/tmp/nbx-rate-');
    db = openDatabase({ kind: 'pglite', directory: dir });
    await migrateToLatest(db);
  });
  afterAll(async () => {
    await db?.destroy();
    rmSync(dir, { recursive: true, force: true });
  });

  // A refill this slow adds nothing measurable while a test runs, so the counts are exact.
  const slow = (burst: number): BucketLimit => ({ perSecond: 0.0001, burst });

  it('does in SQL what leaseTokens does: starts full, grants whole tokens, takes back unspent ones up to the burst', async () => {
    const store = postgresBucketStore(db);
    const limit = slow(5);
    const grants = [];
    for (let i = 0; i < 4; i++) grants.push((await store.lease('key:sql', 2, 0, limit)).granted);
    expect(grants).toEqual([2, 2, 1, 0]);
    // Three given back (more than were granted since the row was full would be capped at the burst).
    expect((await store.lease('key:sql', 0, 3, limit)).tokens).toBeCloseTo(3, 2);
    expect((await store.lease('key:sql', 0, 100, limit)).tokens).toBeCloseTo(5, 5);
    const drained = await store.lease('key:sql', 10, 0, limit);
    expect(drained.granted).toBe(5);
    expect(drained.tokens).toBeLessThan(1);
    // A lower limit applies at once: the row is capped at the new burst.
    await store.lease('key:capped', 0, 0, slow(50));
    expect((await store.lease('key:capped', 100, 0, slow(7))).granted).toBe(7);
  });

  it('shares a key bucket between two limiters (replicas): about the burst in all, then a 429 with Retry-After', async () => {
    const policy = fixedRequestLimits({ key: slow(20), organization: slow(1000) });
    const replicas = [new RequestRateLimiter(postgresBucketStore(db), policy, { leaseTokens: 10 }), new RequestRateLimiter(postgresBucketStore(db), policy, { leaseTokens: 10 })];
    const caller = { organizationId: 'org_shared', keyId: 'key_shared' };
    let passed = 0;
    let refusedInARow = 0;
    let refusal: unknown;
    for (let i = 0; i < 200 && refusedInARow < 2; i++) {
      try {
        await replicas[i % 2].admit(caller, 'native');
        passed++;
        refusedInARow = 0;
      } catch (err) {
        refusal = err;
        refusedInARow++;
      }
    }
    // The lease here is 2 tokens (a tenth of 20): at most 2 × 2 are outside the row at a time.
    expect(passed).toBeGreaterThanOrEqual(20 - 2 * 2);
    expect(passed).toBeLessThanOrEqual(20);
    expect(refusal).toBeInstanceOf(NestboxError);
    const e = refusal as NestboxError;
    expect(e.code).toBe('rate_limited');
    expect(e.details).toMatchObject({ scope: 'key', burst: 20 });
    expect(Number.isInteger(e.details?.retryAfterSeconds)).toBe(true);
    expect(e.details?.retryAfterSeconds as number).toBeGreaterThanOrEqual(1);
  });

  it('lets exactly the burst through when many requests of one key arrive at once (one lease in flight, shared)', async () => {
    const store = postgresBucketStore(db);
    let leases = 0;
    const counting = { lease: (...args: Parameters<typeof store.lease>) => (leases++, store.lease(...args)) };
    const limiter = new RequestRateLimiter(counting, fixedRequestLimits({ key: slow(20) }), { leaseTokens: 10 });
    const outcomes = await Promise.allSettled(Array.from({ length: 60 }, () => limiter.admit({ organizationId: 'org_burst', keyId: 'key_burst' }, 'native')));
    expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(20);
    // Leases of 2 (a tenth of 20): ten that granted, then the one that found the row empty; the
    // other refusals came from the cached refusal, not from more writes.
    expect(leases).toBe(11);
  });

  it('limits a second key of the organisation by the organisation bucket, and leaves other organisations alone', async () => {
    const policy = fixedRequestLimits({ key: slow(20), organization: slow(30) });
    const limiter = new RequestRateLimiter(postgresBucketStore(db), policy, { leaseTokens: 1 });
    const drain = async (caller: { organizationId: string; keyId: string }) => {
      let passed = 0;
      for (let i = 0; i < 100; i++) {
        try {
          await limiter.admit(caller, 'e2b');
          passed++;
        } catch (err) {
          return { passed, refusal: err as NestboxError };
        }
      }
      return { passed, refusal: undefined };
    };
    const first = await drain({ organizationId: 'org_a', keyId: 'key_a1' });
    expect(first).toMatchObject({ passed: 20, refusal: { code: 'rate_limited', details: { scope: 'key' } } });
    const second = await drain({ organizationId: 'org_a', keyId: 'key_a2' });
    expect(second).toMatchObject({ passed: 10, refusal: { code: 'rate_limited', details: { scope: 'organization' } } });
    const other = await drain({ organizationId: 'org_b', keyId: 'key_b1' });
    expect(other).toMatchObject({ passed: 20, refusal: { details: { scope: 'key' } } });
    // The organisation's refusals cost the second key nothing: its token goes back to the
    // replica's lease, so thirty more refusals leave its row where the first one left it (20 - 10
    // spent - the 1 the replica holds).
    for (let i = 0; i < 30; i++) await expect(limiter.admit({ organizationId: 'org_a', keyId: 'key_a2' }, 'native')).rejects.toMatchObject({ details: { scope: 'organization' } });
    expect((await postgresBucketStore(db).lease('key:key_a2', 0, 0, slow(20))).tokens).toBeCloseTo(9, 2);
  });

  it('limits nothing when both limits are off, and lets requests through when the database fails', async () => {
    const off = new RequestRateLimiter(postgresBucketStore(db), fixedRequestLimits({}), { leaseTokens: 10 });
    for (let i = 0; i < 50; i++) await off.admit({ organizationId: 'org_off', keyId: 'key_off' }, 'native');
    expect(off.localBuckets()).toBe(0);
    const failing = new RequestRateLimiter({ lease: () => Promise.reject(new Error('connection lost')) }, fixedRequestLimits({ key: slow(1) }), { leaseTokens: 1 });
    for (let i = 0; i < 5; i++) await failing.admit({ organizationId: 'org_x', keyId: 'key_x' }, 'daytona');
  });

  it('gives leased tokens back to the row once the lease has expired', async () => {
    let clock = 0;
    const limiter = new RequestRateLimiter(postgresBucketStore(db), fixedRequestLimits({ key: slow(100) }), { leaseTokens: 10, now: () => clock });
    const caller = { organizationId: 'org_ret', keyId: 'key_ret' };
    await limiter.admit(caller, 'native');
    // One spent of a lease of 10: 90 in the row, 9 held by this replica.
    expect((await postgresBucketStore(db).lease('key:key_ret', 0, 0, slow(100))).tokens).toBeCloseTo(90, 2);
    clock += 5_000;
    await limiter.admit(caller, 'native');
    // The 9 went back with the next lease, which took 10 again: 99 - 10.
    expect((await postgresBucketStore(db).lease('key:key_ret', 0, 0, slow(100))).tokens).toBeCloseTo(89, 2);
  });

  describe("an organisation's own request rates", () => {
    const none = { requestsPerSecond: null, requestBurst: null, keyRequestsPerSecond: null, keyRequestBurst: null };
    const defaults = { key: { perSecond: 10, burst: 20 }, organization: { perSecond: 50, burst: 100 } };

    it('replaces the defaults value by value; a rate of 0 turns a bucket off; a rate without a default gets two seconds of burst', () => {
      expect(requestLimitsOf(none, defaults)).toEqual(defaults);
      expect(requestLimitsOf({ ...none, keyRequestBurst: 3 }, defaults)).toEqual({ key: { perSecond: 10, burst: 3 }, organization: defaults.organization });
      expect(requestLimitsOf({ ...none, requestsPerSecond: 0 }, defaults)).toEqual({ key: defaults.key, organization: undefined });
      expect(requestLimitsOf({ ...none, keyRequestsPerSecond: 0.25 }, {})).toEqual({ key: { perSecond: 0.25, burst: 1 }, organization: undefined });
      expect(requestLimitsOf({ ...none, requestsPerSecond: 7 }, {})).toEqual({ key: undefined, organization: { perSecond: 7, burst: 14 } });
      expect(requestRatesInForce(requestLimitsOf({ ...none, requestsPerSecond: 0 }, defaults))).toEqual({ requestsPerSecond: 0, requestBurst: 0, keyRequestsPerSecond: 10, keyRequestBurst: 20 });
    });

    it('reads an organisation once per cache period, shares a read in flight, and falls back to the defaults when the read fails', async () => {
      let clock = 0;
      let reads = 0;
      let own = { ...none, keyRequestBurst: 3 };
      const policy = organizationRequestLimits(async (id) => {
        reads++;
        if (id === 'org_broken') throw new Error('connection lost');
        return id === 'org_gone' ? undefined : { limits: { maxSandboxes: null, maxCpu: null, maxMemoryMiB: null, maxDiskGiB: null, maxSnapshots: null, maxImages: null, maxVolumes: null, maxVolumeTotalGiB: null, maxVolumeSizeGiB: null, ...own } };
      }, defaults, { cacheMs: 5000, now: () => clock });
      const caller = { organizationId: 'org_a', keyId: 'k' };
      const [first, second] = await Promise.all([policy.limitsFor(caller), policy.limitsFor(caller)]);
      expect(first).toEqual({ key: { perSecond: 10, burst: 3 }, organization: defaults.organization });
      expect(second).toEqual(first);
      expect(reads).toBe(1);
      own = { ...none, keyRequestBurst: 9 };
      clock += 4999;
      expect((await policy.limitsFor(caller)).key?.burst).toBe(3);
      expect(reads).toBe(1);
      clock += 2;
      expect((await policy.limitsFor(caller)).key?.burst).toBe(9);
      expect(reads).toBe(2);
      expect(await policy.limitsFor({ organizationId: 'org_gone' })).toEqual(defaults);
      expect(await policy.limitsFor({ organizationId: 'org_broken' })).toEqual(defaults);
    });

    it("limits a key by its organisation's burst rather than the server's (two limiters on one database)", async () => {
      const own = { ...none, keyRequestBurst: 4, keyRequestsPerSecond: 0.01 };
      const find = async (id: string) => (id === 'org_own' ? { limits: { maxSandboxes: null, maxCpu: null, maxMemoryMiB: null, maxDiskGiB: null, maxSnapshots: null, maxImages: null, maxVolumes: null, maxVolumeTotalGiB: null, maxVolumeSizeGiB: null, ...own } } : undefined);
      const replicas = [0, 1].map(() => new RequestRateLimiter(postgresBucketStore(db), organizationRequestLimits(find, { key: slow(50) }), { leaseTokens: 10 }));
      let passed = 0;
      let refusal: NestboxError | undefined;
      for (let i = 0; i < 20 && !refusal; i++) {
        try {
          await replicas[i % 2].admit({ organizationId: 'org_own', keyId: 'key_own' }, 'native');
          passed++;
        } catch (err) {
          refusal = err as NestboxError;
        }
      }
      expect(passed).toBeLessThanOrEqual(4);
      expect(refusal?.details).toMatchObject({ scope: 'key', burst: 4 });
      // Another organisation's key has the server's 50.
      for (let i = 0; i < 20; i++) await replicas[i % 2].admit({ organizationId: 'org_default', keyId: 'key_default' }, 'native');
    });
  });
});
