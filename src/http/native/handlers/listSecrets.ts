import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { renderSecret } from '../render-secrets.js';

export const listSecrets: NativeHandler = async (ctx) => {
  const limit = queryString(ctx, 'limit');
  const page = await ctx.services.secrets.list(principalOf(ctx), {
    limit: limit === undefined ? undefined : Number(limit),
    cursor: queryString(ctx, 'cursor'),
    name: queryString(ctx, 'name'),
  });
  ctx.res.status(200).json({ items: page.items.map(renderSecret), nextCursor: page.nextCursor, total: page.total });
};
