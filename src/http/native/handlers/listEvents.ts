import type { NativeHandler } from '../context.js';
import { principalOf, queryList, queryString } from '../context.js';
import { renderEvent } from '../render-events.js';

export const listEvents: NativeHandler = async (ctx) => {
  const limit = queryString(ctx, 'limit');
  const since = queryString(ctx, 'since');
  const sandboxId = queryString(ctx, 'sandboxId');
  const cursor = queryString(ctx, 'cursor');
  const page = await ctx.services.events.list(principalOf(ctx), {
    types: queryList(ctx, 'type'),
    ...(sandboxId ? { sandboxId } : {}),
    ...(since ? { since: new Date(since) } : {}),
    ...(cursor ? { cursor } : {}),
    ...(limit !== undefined ? { limit: Number(limit) } : {}),
  });
  ctx.res.status(200).json({ items: page.items.map(renderEvent), nextCursor: page.nextCursor, hasMore: page.hasMore });
};
