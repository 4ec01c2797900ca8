import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const deleteVolume: NativeHandler = async (ctx) => {
  const principal = principalOf(ctx);
  const volume = await ctx.services.volumes.getByIdOrName(principal, String(ctx.api.request.params.volumeId));
  await ctx.services.volumes.delete(principal, volume.id);
  ctx.res.status(204).end();
};
