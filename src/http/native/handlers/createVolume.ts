import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderVolume } from '../render.js';

export const createVolume: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as { name: string; sizeBytes?: number };
  const volume = await ctx.services.volumes.create(principalOf(ctx), body);
  ctx.res.status(201).json(renderVolume(volume));
};
