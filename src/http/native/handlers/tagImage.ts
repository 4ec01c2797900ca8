import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { jsonBody, param } from '../guest-io.js';
import { renderImage } from '../render.js';

export const tagImage: NativeHandler = async (ctx) => {
  const body = jsonBody<{ name?: string; tags: string[] }>(ctx);
  const principal = principalOf(ctx);
  const target = await ctx.services.images.get(principal, param(ctx, 'image'));
  const image = await ctx.services.images.addTags(principal, target.id, body.name ?? target.name, body.tags);
  ctx.res.status(200).json(renderImage(image));
};
