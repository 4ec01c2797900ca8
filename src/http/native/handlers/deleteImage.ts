import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param } from '../guest-io.js';

export const deleteImage: NativeHandler = async (ctx) => {
  await ctx.services.images.delete(principalOf(ctx), param(ctx, 'image'));
  ctx.res.status(204).end();
};
