// A pool of pre-built network slots per host agent (host-runtime.md §6): creating a sandbox
// takes a ready namespace + veth pair instead of building one (~50 ms of `ip` calls saved),
// and a stopped or deleted sandbox's slot is scrubbed and put back instead of torn down.
//
// The claim files under /run/nestbox/slots stay the source of truth: a pooled slot is a claim
// of this owner with no sandbox (`pooled: true`), so several host agents on one machine keep
// their pools apart, and a restarted host agent finds its pool (and a crashed run's leftovers)
// again from the claims alone. Never fails a create: an empty pool builds on demand.
import { flushSlotConntrack, netnsPids, slotExists, buildSlot, teardownSlot, type Slot, type SlotAllocator } from './slots.js';
import type { Logger } from '../../core/logger.js';
import { applyNftRuleset, listSlotNftObjects, removeSlotNftObjects, renderSlotEgress, renderSlotSourceCheck } from './nft.js';

export interface SlotPoolOptions {
  allocator: SlotAllocator;
  /** Claim owner (host id + data dir): only claims of this owner are ever touched. */
  owner: string;
  /** Idle slots to keep ready; 0 = build every slot on demand and tear it down after use. */
  size: number;
  vethPrefix: string;
  logger: Logger;
}

export interface SlotPoolStats {
  size: number;
  idle: number;
  /** Creates served from the pool vs built on demand, since start. */
  hits: number;
  misses: number;
  recycled: number;
  tornDown: number;
}

export interface TakenSlot {
  slot: Slot;
  /** Whether it came ready from the pool (false: built just now). */
  pooled: boolean;
}

export class SlotPool {
  private readonly idle: Slot[] = [];
  private size: number;
  private filling?: Promise<void>;
  private closed = false;
  private readonly counters = { hits: 0, misses: 0, recycled: 0, tornDown: 0 };

  constructor(private readonly options: SlotPoolOptions) {
    this.size = options.size;
  }

  stats(): SlotPoolStats {
    return { size: this.size, idle: this.idle.length, ...this.counters };
  }

  /**
   * A new target size (benchmarks compare a warm pool with none). Shrinking tears idle slots
   * down at once; growing fills in the background unless `fill` is false.
   */
  async resize(size: number, fill = true): Promise<void> {
    if (!Number.isInteger(size) || size < 0) throw new Error(`invalid slot pool size ${size}`);
    this.size = size;
    await this.filling;
    while (this.idle.length > size) await this.destroy(this.idle.pop()!);
    if (fill) void this.fill();
  }

  /** Indices waiting in the pool (for diagnostics and tests). */
  idleIndices(): number[] {
    return this.idle.map((slot) => slot.index);
  }

  /**
   * At host-agent start: every claim of this owner whose sandbox is not live goes back into the
   * pool after a scrub (or is torn down when the pool is full or the slot is damaged).
   * `liveSlots` maps slot index → sandbox id for sandboxes that were adopted running or paused.
   */
  async reclaim(liveSlots: Map<number, string>): Promise<void> {
    const { allocator, owner, logger } = this.options;
    for (const claim of await allocator.claims()) {
      if (claim.owner !== owner) continue;
      if (!claim.pooled && liveSlots.get(claim.index) === claim.sandboxId) continue;
      const slot = allocator.slot(claim.index);
      if (!claim.pooled) logger.info({ operation: 'init', slot: claim.index, sandboxId: claim.sandboxId || undefined }, `init: reclaiming network slot ${claim.index} of sandbox ${claim.sandboxId || '(none)'}`);
      await this.recycle(slot, claim.pooled ? 'reclaimed' : 'orphaned');
    }
    await this.removeNftLeftovers();
  }

  /**
   * Per-slot nft objects of indices nobody claims: what a host agent that crashed (or an older
   * version that never deleted them) left in the shared table. Each index is claimed while its
   * objects go, so no host agent builds on it meanwhile; a claimed index is someone's and stays.
   * Returns how many indices were cleaned.
   */
  async removeNftLeftovers(): Promise<number> {
    const { allocator, owner, vethPrefix, logger } = this.options;
    // Listed before the claims are read: an index claimed after the listing is skipped below
    // (its claim exists), one claimed before it is not in `claimed`'s complement either.
    const objects = await listSlotNftObjects(vethPrefix);
    const claimed = new Set((await allocator.claims()).map((claim) => claim.index));
    let cleaned = 0;
    for (const [index] of objects) {
      if (claimed.has(index) || !(await allocator.claimIndex(index, owner))) continue;
      try {
        // Listed again under the claim: what exists now is what gets deleted.
        await removeSlotNftObjects(index, vethPrefix);
        cleaned++;
      } catch (error) {
        logger.warn({ slot: index }, `slot pool: removing the nft leftovers of slot ${index} failed: ${(error as Error).message}`);
      } finally {
        await allocator.release(index);
      }
    }
    if (cleaned) logger.info({ operation: 'init' }, `init: removed the nft objects of ${cleaned} unclaimed network slot(s)`);
    return cleaned;
  }

  /** Starts building slots up to the pool size in the background (one builder at a time). */
  fill(): Promise<void> {
    if (this.filling) return this.filling;
    this.filling = (async () => {
      try {
        // Bounded: at most `size` builds per call, even if slots keep being taken meanwhile.
        for (let built = 0; built < this.size && this.idle.length < this.size && !this.closed; built++) {
          const slot = await this.build('');
          if (this.closed) {
            await this.destroy(slot);
            break;
          }
          this.idle.push(slot);
        }
      } catch (error) {
        this.options.logger.warn(`slot pool: building a slot failed: ${(error as Error).message}`);
      } finally {
        this.filling = undefined;
      }
    })();
    return this.filling;
  }

  /** A ready slot for `sandboxId`: from the pool when it has one, else built now. */
  async take(sandboxId: string): Promise<TakenSlot> {
    const { allocator, owner } = this.options;
    const ready = this.idle.shift();
    if (ready) {
      try {
        await allocator.reassign(ready.index, owner, sandboxId);
        this.counters.hits++;
        void this.fill();
        return { slot: ready, pooled: true };
      } catch (error) {
        this.options.logger.warn({ slot: ready.index }, `slot pool: could not hand out slot ${ready.index}: ${(error as Error).message}`);
        await this.destroy(ready).catch(() => {});
      }
    }
    this.counters.misses++;
    const slot = await this.build(sandboxId);
    void this.fill();
    return { slot, pooled: false };
  }

  /** A sandbox is done with its slot: scrub it back into the pool, or tear it down. */
  async release(slot: Slot): Promise<void> {
    await this.recycle(slot, 'released');
  }

  /** Graceful shutdown: idle slots are torn down (a crash leaves them for the next start's reclaim). */
  async close(): Promise<void> {
    this.closed = true;
    await this.filling;
    while (this.idle.length) {
      const slot = this.idle.shift()!;
      await this.destroy(slot).catch((error) => this.options.logger.warn({ slot: slot.index }, `slot pool: teardown of slot ${slot.index} failed: ${(error as Error).message}`));
    }
  }

  private async build(sandboxId: string): Promise<Slot> {
    const { allocator, owner } = this.options;
    const slot = await allocator.claim(owner, sandboxId);
    try {
      // The source check is in place before the veth exists (the element names it), and the
      // egress chain exists from the start (empty = allow all) so applying a policy later only
      // replaces its contents.
      await applyNftRuleset(this.freshSlotRules(slot));
      await buildSlot(slot);
    } catch (error) {
      await teardownSlot(slot).catch(() => {});
      await removeSlotNftObjects(slot.index, this.options.vethPrefix).catch(() => {});
      await allocator.release(slot.index);
      throw error;
    }
    return slot;
  }

  private async recycle(slot: Slot, why: 'released' | 'reclaimed' | 'orphaned'): Promise<void> {
    if (this.idle.some((s) => s.index === slot.index)) return;
    if (this.closed || this.idle.length >= this.size) {
      await this.destroy(slot);
      return;
    }
    const problem = await this.scrub(slot).catch((error: Error) => error.message);
    if (problem) {
      this.options.logger.warn({ slot: slot.index }, `slot pool: slot ${slot.index} (${why}) is not reusable (${problem}); tearing it down`);
      await this.destroy(slot);
      return;
    }
    await this.options.allocator.reassign(slot.index, this.options.owner, '');
    this.idle.push(slot);
    this.counters.recycled++;
  }

  /**
   * Makes a used slot indistinguishable from a fresh one: no process left in its namespace, its
   * egress chain and allow set emptied, no connection-tracking or NAT state for its address.
   * Returns what is wrong when it cannot be reused. The sandbox never had CAP_NET_ADMIN, so it
   * could not change the namespace's addresses, routes or links.
   */
  private async scrub(slot: Slot): Promise<string | undefined> {
    const present = await slotExists(slot);
    if (!present.netns || !present.veth) return `netns ${present.netns}, veth ${present.veth}`;
    const pids = await netnsPids(slot);
    if (pids.length) return `processes still inside: ${pids.slice(0, 5).join(', ')}`;
    // The source check again too: a slot an older host agent built has none yet.
    await applyNftRuleset(this.freshSlotRules(slot));
    await flushSlotConntrack(slot);
    return undefined;
  }

  /** A slot's nft objects as a fresh slot has them: allow-all egress, its source check. */
  private freshSlotRules(slot: Slot): string {
    return renderSlotEgress(slot.index, this.options.vethPrefix, { mode: 'allow-all', addresses: [] }) + renderSlotSourceCheck(slot);
  }

  /**
   * Takes a slot apart for good: namespace and veth, then its nft objects (chain, allow set, map
   * and set elements), then the claim, so nobody builds on the index before its objects are gone.
   * A failed nft removal is logged and left to the next start's `removeNftLeftovers`.
   */
  private async destroy(slot: Slot): Promise<void> {
    await teardownSlot(slot);
    await removeSlotNftObjects(slot.index, this.options.vethPrefix).catch((error: Error) =>
      this.options.logger.warn({ slot: slot.index }, `slot pool: removing the nft objects of slot ${slot.index} failed: ${error.message}`),
    );
    await this.options.allocator.release(slot.index);
    this.counters.tornDown++;
  }
}
