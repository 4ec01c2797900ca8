import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderVolume } from '../render.js';

export const getVolume: NativeHandler = async (ctx) => {
  const principal = principalOf(ctx);
  const volume = await ctx.services.volumes.getByIdOrName(principal, String(ctx.api.request.params.volumeId));
  const usage = await ctx.services.volumes.usage(principal, volume.id);
  ctx.res.status(200).json(renderVolume(volume, usage));
};
