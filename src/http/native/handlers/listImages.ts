import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { queryBoolean, queryNumber } from '../guest-io.js';
import { renderImage } from '../render.js';

export const listImages: NativeHandler = async (ctx) => {
  const page = await ctx.services.images.list(principalOf(ctx), {
    name: queryString(ctx, 'name'),
    includeUntagged: queryBoolean(ctx, 'all'),
    limit: queryNumber(ctx, 'limit'),
    cursor: queryString(ctx, 'cursor'),
  });
  ctx.res.status(200).json({ items: page.items.map((i) => renderImage(i)), nextCursor: page.nextCursor });
};
