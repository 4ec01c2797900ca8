import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderVolume } from '../render.js';

export const listVolumes: NativeHandler = async (ctx) => {
  const volumes = await ctx.services.volumes.list(principalOf(ctx));
  ctx.res.status(200).json({ items: volumes.map((v) => renderVolume(v)) });
};
