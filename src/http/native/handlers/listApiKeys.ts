import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderApiKey } from '../render.js';

export const listApiKeys: NativeHandler = async (ctx) => {
  const keys = await ctx.services.auth.listApiKeys(principalOf(ctx).organizationId);
  ctx.res.status(200).json({ items: keys.map(renderApiKey) });
};
