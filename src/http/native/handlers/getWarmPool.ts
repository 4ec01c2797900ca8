import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const getWarmPool: NativeHandler = async (ctx) => {
  const hostId = ctx.api.request.query.hostId;
  const stats = await ctx.services.warmPool.stats(principalOf(ctx), typeof hostId === 'string' ? hostId : undefined);
  ctx.res.status(200).json({ hits: stats.hits, misses: stats.misses, items: stats.keys });
};
