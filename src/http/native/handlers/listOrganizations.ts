import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { renderOrganization } from '../render-organizations.js';

export const listOrganizations: NativeHandler = async (ctx) => {
  const limit = queryString(ctx, 'limit');
  const page = await ctx.services.organizations.list(principalOf(ctx), { limit: limit === undefined ? undefined : Number(limit), cursor: queryString(ctx, 'cursor') });
  ctx.res.status(200).json({ items: page.items.map(renderOrganization), nextCursor: page.nextCursor });
};
