import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderHost } from '../render.js';

export const cordonHost: NativeHandler = async (ctx) => {
  const host = await ctx.services.hosts.setAdminState(principalOf(ctx), String(ctx.api.request.params.hostId), 'cordon');
  ctx.res.status(200).json(renderHost(host));
};
