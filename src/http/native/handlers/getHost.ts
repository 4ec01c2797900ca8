import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderHost } from '../render.js';

export const getHost: NativeHandler = async (ctx) => {
  const host = await ctx.services.hosts.get(principalOf(ctx), String(ctx.api.request.params.hostId));
  ctx.res.status(200).json(renderHost(host));
};
