import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param } from '../guest-io.js';
import { renderBuild } from '../render.js';

export const cancelBuild: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(renderBuild(await ctx.services.builds.cancel(principalOf(ctx), param(ctx, 'buildId'))));
};
