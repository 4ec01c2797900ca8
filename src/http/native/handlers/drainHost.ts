import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderHost } from '../render.js';

export const drainHost: NativeHandler = async (ctx) => {
  const host = await ctx.services.hosts.setAdminState(principalOf(ctx), String(ctx.api.request.params.hostId), 'drain');
  ctx.res.status(200).json(renderHost(host));
};
