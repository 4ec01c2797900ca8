import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderHost } from '../render.js';

export const listHosts: NativeHandler = async (ctx) => {
  const hosts = await ctx.services.hosts.list(principalOf(ctx));
  ctx.res.status(200).json({ items: hosts.map(renderHost) });
};
