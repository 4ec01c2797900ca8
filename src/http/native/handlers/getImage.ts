import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param } from '../guest-io.js';
import { renderImage } from '../render.js';

export const getImage: NativeHandler = async (ctx) => {
  const image = await ctx.services.images.get(principalOf(ctx), param(ctx, 'image'));
  ctx.res.status(200).json(renderImage(image, await ctx.services.images.layersOf(image)));
};
