// Request rate limits: a token bucket per API key and one per organisation, shared by every
// control-plane replica on the database (no sticky sessions, so a client may spread its requests
// over all of them).
//
// The buckets live in PostgreSQL (`rate_limit_buckets`), with the time of their last refill on
// the database's clock: replicas' clocks play no part in how many tokens a bucket has. To avoid
// a database write per request, a replica *leases* a few tokens at a time with one atomic
// INSERT … ON CONFLICT DO UPDATE … RETURNING (one statement, so it also works on PGlite's single
// connection, and it takes the row lock only for that statement) and spends them locally.
//
// What the leases cost in accuracy, with R replicas and a lease of L tokens (L ≤ a tenth of
// the burst, see `leaseSizeOf`):
// - Over any interval of t seconds a bucket hands out at most burst + rate × t tokens, exactly
//   as one bucket would: a token is taken from the row before any replica spends it.
// - Leased tokens are spendable for LEASE_MS only; what is left then goes back to the row with
//   the replica's next lease (capped at the burst, as any refill). So at any instant at most
//   R × L tokens are outside the row, and a client can get at most burst + R × L requests through
//   in a burst (the row full plus every replica's unspent lease): the overshoot is ≤ R × L.
// - The other way, a replica that refuses a request may do so while another replica still holds
//   up to L unspent tokens of the same bucket: a client is refused at most R × L tokens early.
// Refusals are cached until the bucket's next token is due (by the rate the row reported), so a
// client hammering a limited key costs no database write per request either.
import { NestboxError } from '../errors.js';
import type { Logger } from '../logger.js';
import type { DbOrTx } from '../store/db.js';
import type { Organization, OrganizationLimitOverrides, Principal } from '../types.js';

/** One bucket's limit: tokens added per second, and how many it holds at most (the burst). */
export interface BucketLimit {
  perSecond: number;
  burst: number;
}

/** Which bucket refused a request (the `scope` in the 429's details and the metric's label). */
export type RateLimitScope = 'key' | 'organization';

/** The limits that apply to one caller; an absent entry is not limited. */
export interface RequestLimits {
  key?: BucketLimit;
  organization?: BucketLimit;
}

/**
 * Where a caller's limits come from: the configuration's values for everyone
 * (`fixedRequestLimits`), or those with each organisation's own rates over them
 * (`organizationRequestLimits`, what the server uses); the buckets are the same either way.
 */
export interface RequestLimitPolicy {
  limitsFor(caller: RateLimitedCaller): RequestLimits | Promise<RequestLimits>;
}

/** Who a request is counted against: its key (absent: organisation bucket only) and organisation. */
export type RateLimitedCaller = Pick<Principal, 'organizationId'> & Partial<Pick<Principal, 'keyId'>>;

/** Which front door a refused request came through (a metric label only). */
export type RateLimitedVia = 'native' | 'daytona' | 'e2b';

export function fixedRequestLimits(limits: RequestLimits): RequestLimitPolicy {
  return { limitsFor: () => limits };
}

/** An organisation's own request rates (null: the server's default); see OrganizationLimitOverrides. */
export type OwnRequestRates = Pick<OrganizationLimitOverrides, 'requestsPerSecond' | 'requestBurst' | 'keyRequestsPerSecond' | 'keyRequestBurst'>;

/** The rates in force as the API shows them: requests per second (0: not limited) and bursts. */
export interface RequestRatesInForce {
  requestsPerSecond: number;
  requestBurst: number;
  keyRequestsPerSecond: number;
  keyRequestBurst: number;
}

/**
 * The buckets in force for an organisation: each of its own values replaces the server's default
 * one by one. A rate of 0 turns the bucket off; a rate set where the server has none gets a
 * burst of two seconds' worth unless the organisation sets its own.
 */
export function requestLimitsOf(own: OwnRequestRates, defaults: RequestLimits): RequestLimits {
  const bucket = (perSecond: number | null, burst: number | null, fallback: BucketLimit | undefined): BucketLimit | undefined => {
    const rate = perSecond ?? fallback?.perSecond ?? 0;
    if (rate <= 0) return undefined;
    return { perSecond: rate, burst: burst ?? fallback?.burst ?? Math.max(1, Math.ceil(rate * 2)) };
  };
  return {
    key: bucket(own.keyRequestsPerSecond, own.keyRequestBurst, defaults.key),
    organization: bucket(own.requestsPerSecond, own.requestBurst, defaults.organization),
  };
}

export function requestRatesInForce(limits: RequestLimits): RequestRatesInForce {
  return {
    requestsPerSecond: limits.organization?.perSecond ?? 0,
    requestBurst: limits.organization?.burst ?? 0,
    keyRequestsPerSecond: limits.key?.perSecond ?? 0,
    keyRequestBurst: limits.key?.burst ?? 0,
  };
}

/** How long a replica trusts an organisation's rates it has read (a change reaches every replica within this). */
export const ORGANIZATION_RATES_CACHE_MS = 5000;
const MAX_CACHED_ORGANIZATIONS = 10_000;

/**
 * Per-organisation overrides: the organisation's row, read at most once per
 * ORGANIZATION_RATES_CACHE_MS by each replica (a request costs no extra query), its own rates
 * over the server's defaults. An organisation that cannot be read gets the defaults: the limiter
 * must not refuse requests because of its own lookup, and authentication has already checked
 * that the organisation exists.
 */
export function organizationRequestLimits(
  findOrganization: (organizationId: string) => Promise<Pick<Organization, 'limits'> | undefined>,
  defaults: RequestLimits,
  options: { cacheMs?: number; now?: () => number; log?: Logger } = {},
): RequestLimitPolicy {
  const cacheMs = options.cacheMs ?? ORGANIZATION_RATES_CACHE_MS;
  const now = options.now ?? (() => performance.now());
  const cache = new Map<string, { limits: RequestLimits; until: number }>();
  const inFlight = new Map<string, Promise<RequestLimits>>();
  const read = (organizationId: string): Promise<RequestLimits> => {
    let pending = inFlight.get(organizationId);
    if (!pending) {
      pending = findOrganization(organizationId)
        .then((org) => (org ? requestLimitsOf(org.limits, defaults) : defaults))
        .catch((err: unknown) => {
          options.log?.warn({ err, organizationId }, "could not read the organisation's request rates; its requests count against the server's defaults");
          return defaults;
        })
        .then((limits) => {
          if (cache.size >= MAX_CACHED_ORGANIZATIONS) cache.clear();
          cache.set(organizationId, { limits, until: now() + cacheMs });
          return limits;
        })
        .finally(() => inFlight.delete(organizationId));
      inFlight.set(organizationId, pending);
    }
    return pending;
  };
  return {
    limitsFor(caller) {
      const hit = cache.get(caller.organizationId);
      if (hit && now() < hit.until) return hit.limits;
      return read(caller.organizationId);
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The bucket arithmetic. `leaseTokens` is what the SQL of `postgresBucketStore` computes; it is
// written out here as well so that it can be tested on its own (rate-limits.test.ts checks the
// two agree).

/** Tokens after `elapsedSeconds` of refill (a negative time, another replica's older transaction, adds none). */
export function refilled(tokens: number, elapsedSeconds: number, limit: BucketLimit): number {
  return Math.min(limit.burst, tokens + limit.perSecond * Math.max(0, elapsedSeconds));
}

export interface BucketState {
  tokens: number;
  /** Seconds on the database's clock. */
  at: number;
}

/**
 * One lease: refill the bucket to `now`, add back what the replica `returned` unspent, then take
 * up to `want` whole tokens. A bucket seen for the first time (`state` undefined) starts full.
 */
export function leaseTokens(state: BucketState | undefined, now: number, want: number, returned: number, limit: BucketLimit): { granted: number; state: BucketState } {
  const available = state ? Math.min(limit.burst, refilled(state.tokens, now - state.at, limit) + returned) : limit.burst;
  const granted = Math.max(0, Math.min(want, Math.floor(available)));
  return { granted, state: { tokens: available - granted, at: state ? Math.max(state.at, now) : now } };
}

/** Seconds until a bucket holding `tokens` (< 1) has a whole token again. */
export function secondsToToken(tokens: number, limit: BucketLimit): number {
  return (1 - Math.min(1, Math.max(0, tokens))) / limit.perSecond;
}

/** A 429's Retry-After: whole seconds, at least 1, until `until` (local ms). */
function secondsUntil(until: number, now: number): number {
  return Math.max(1, Math.ceil((until - now) / 1000));
}

/**
 * Tokens one lease takes: the configured lease, but never more than a tenth of the burst (at
 * least 1), so what replicas can hold outside the row stays small next to what the bucket allows.
 */
export function leaseSizeOf(limit: BucketLimit, configuredLease: number): number {
  return Math.max(1, Math.min(configuredLease, Math.floor(limit.burst / 10)));
}

// ---------------------------------------------------------------------------------------------
// The shared store.

export interface BucketStore {
  /** Atomically refill bucket `id`, add back `returned`, take up to `want`; what was granted and what is left. */
  lease(id: string, want: number, returned: number, limit: BucketLimit): Promise<{ granted: number; tokens: number }>;
}

/**
 * The buckets in PostgreSQL (or PGlite). One statement per lease: the insert of a bucket seen for
 * the first time and the update of an existing one are the same upsert, which locks the row for
 * the statement only, so concurrent leases of replicas serialise on the row and never lose a
 * token. `now()` is the statement's time (it is alone in its transaction), the same value in
 * every place it appears. FLOOR is taken of the refilled amount, so fractions of a token stay in
 * the row. Keep the arithmetic in step with `leaseTokens`.
 */
export function postgresBucketStore(db: DbOrTx): BucketStore {
  // CAST rather than `::`, which knex would read as a named binding.
  const burst = 'CAST(:burst AS float8)';
  const want = 'CAST(:want AS integer)';
  const available = `LEAST(${burst}, b.tokens + CAST(:returned AS float8) + CAST(:perSecond AS float8) * GREATEST(0, CAST(EXTRACT(EPOCH FROM (now() - b.refreshed_at)) AS float8)))`;
  const grant = (tokens: string) => `GREATEST(0, LEAST(${want}, CAST(FLOOR(${tokens}) AS integer)))`;
  const sql = `
    INSERT INTO rate_limit_buckets AS b (id, tokens, granted, refreshed_at)
    VALUES (:id, ${burst} - ${grant(burst)}, ${grant(burst)}, now())
    ON CONFLICT (id) DO UPDATE SET
      granted = ${grant(available)},
      tokens = ${available} - ${grant(available)},
      refreshed_at = GREATEST(b.refreshed_at, now())
    RETURNING granted, tokens`;
  return {
    async lease(id, want, returned, limit) {
      const result = (await db.raw(sql, { id, want, returned, burst: limit.burst, perSecond: limit.perSecond })) as { rows: { granted: number | string; tokens: number | string }[] };
      const row = result.rows[0];
      return { granted: Number(row.granted), tokens: Number(row.tokens) };
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The limiter each replica runs.

/** How long leased tokens may be spent locally before what is left goes back to the row. */
export const LEASE_MS = 1000;
/** Leases one request may wait through while concurrent requests of the same bucket take the tokens (bounded, never a spin). */
const MAX_LEASE_ROUNDS = 64;
/** Buckets kept in memory before idle ones are forgotten (their unspent tokens with them: the row refills anyway). */
const MAX_LOCAL_BUCKETS = 10_000;

interface LocalBucket {
  /** Leased tokens not yet spent. */
  tokens: number;
  /** Until when (local monotonic ms) they may be spent. */
  expiresAt: number;
  /** Expired leases' unspent tokens, given back with the next lease. */
  toReturn: number;
  /** The row had no whole token: refuse locally until then (local monotonic ms). */
  deniedUntil: number;
  /** The lease in flight, which concurrent requests of this bucket wait for instead of leasing too. */
  pending?: Promise<'granted' | 'empty' | 'failed'>;
}

export interface RequestRateLimiterOptions {
  /** The most tokens one lease takes (NESTBOX_RATE_LIMIT_LEASE); see leaseSizeOf. */
  leaseTokens: number;
  leaseMs?: number;
  /** Local monotonic clock in ms (tests). */
  now?: () => number;
  log?: Pick<Logger, 'warn'>;
  /** Called for every refused request (the metric). */
  onLimited?: (scope: RateLimitScope, via: RateLimitedVia) => void;
}

export class RequestRateLimiter {
  private readonly local = new Map<string, LocalBucket>();
  private readonly now: () => number;
  private readonly leaseMs: number;

  constructor(
    private readonly store: BucketStore,
    private readonly policy: RequestLimitPolicy,
    private readonly options: RequestRateLimiterOptions,
  ) {
    this.now = options.now ?? (() => performance.now());
    this.leaseMs = options.leaseMs ?? LEASE_MS;
  }

  /**
   * Count one request of `caller` against its key's bucket and its organisation's; a 429
   * (`rate_limited`, with the scope that refused and Retry-After in whole seconds) when either is
   * empty. Called by every front door right after it has authenticated the request and before it
   * does anything else for it.
   */
  async admit(caller: RateLimitedCaller, via: RateLimitedVia): Promise<void> {
    const limits = await this.policy.limitsFor(caller);
    const buckets: { id: string; scope: RateLimitScope; limit: BucketLimit }[] = [];
    if (limits.key && caller.keyId !== undefined && limits.key.perSecond > 0) buckets.push({ id: `key:${caller.keyId}`, scope: 'key', limit: limits.key });
    if (limits.organization && limits.organization.perSecond > 0) buckets.push({ id: `org:${caller.organizationId}`, scope: 'organization', limit: limits.organization });
    const taken: string[] = [];
    for (const bucket of buckets) {
      const refusal = await this.take(bucket.id, bucket.limit);
      if (refusal === undefined) {
        taken.push(bucket.id);
        continue;
      }
      // The key's token was not used after all: back to this replica's lease, so a request the
      // organisation refused costs the key nothing.
      for (const id of taken) this.bucket(id).tokens += 1;
      this.options.onLimited?.(bucket.scope, via);
      const what = bucket.scope === 'key' ? 'this API key' : "this API key's organisation";
      throw new NestboxError('rate_limited', `rate limit: ${what} may make ${bucket.limit.perSecond} requests per second (bursts of ${bucket.limit.burst}); retry in ${refusal} s`, {
        scope: bucket.scope,
        perSecond: bucket.limit.perSecond,
        burst: bucket.limit.burst,
        retryAfterSeconds: refusal,
      });
    }
  }

  /** Buckets this replica holds now (tests and diagnostics). */
  localBuckets(): number {
    return this.local.size;
  }

  private bucket(id: string): LocalBucket {
    let b = this.local.get(id);
    if (!b) {
      if (this.local.size >= MAX_LOCAL_BUCKETS) this.forgetIdle();
      b = { tokens: 0, expiresAt: 0, toReturn: 0, deniedUntil: 0 };
      this.local.set(id, b);
    }
    return b;
  }

  /** One token of bucket `id`: undefined when taken, else the seconds until the bucket has one. */
  private async take(id: string, limit: BucketLimit): Promise<number | undefined> {
    const b = this.bucket(id);
    for (let round = 0; round < MAX_LEASE_ROUNDS; round++) {
      const now = this.now();
      if (b.tokens > 0 && now >= b.expiresAt) {
        b.toReturn += b.tokens;
        b.tokens = 0;
      }
      if (b.tokens >= 1) {
        b.tokens -= 1;
        return undefined;
      }
      if (now < b.deniedUntil) return secondsUntil(b.deniedUntil, now);
      // One lease at a time per bucket: the others wait for it and share what it brings.
      b.pending ??= this.lease(id, b, limit).finally(() => {
        b.pending = undefined;
      });
      const outcome = await b.pending;
      if (outcome === 'failed') return undefined;
      if (outcome === 'empty' && b.tokens < 1) return secondsUntil(b.deniedUntil, this.now());
      // Tokens came (for this request, or taken by concurrent ones first): look again.
    }
    // Every round's tokens went to concurrent requests of the same bucket: the bucket is busy
    // enough to call it empty for now.
    return 1;
  }

  private async lease(id: string, b: LocalBucket, limit: BucketLimit): Promise<'granted' | 'empty' | 'failed'> {
    const returned = b.toReturn;
    b.toReturn = 0;
    try {
      const { granted, tokens } = await this.store.lease(id, leaseSizeOf(limit, this.options.leaseTokens), returned, limit);
      const now = this.now();
      b.tokens += granted;
      b.expiresAt = now + this.leaseMs;
      if (granted > 0) return 'granted';
      b.deniedUntil = now + secondsToToken(tokens, limit) * 1000;
      return 'empty';
    } catch (err) {
      // Fail open: the limiter protects capacity, it is no security boundary, and the request
      // was just authenticated against the same database. The returned tokens are lost (the row
      // refills anyway).
      this.options.log?.warn({ err, bucket: id }, 'rate limit lease failed; the request is let through');
      return 'failed';
    }
  }

  private forgetIdle(): void {
    const now = this.now();
    for (const [id, b] of this.local) {
      if (!b.pending && now >= b.expiresAt && now >= b.deniedUntil) this.local.delete(id);
    }
  }
}
