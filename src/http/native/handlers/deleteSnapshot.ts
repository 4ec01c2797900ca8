import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const deleteSnapshot: NativeHandler = async (ctx) => {
  await ctx.services.snapshots.delete(principalOf(ctx), String(ctx.api.request.params.name));
  ctx.res.status(204).end();
};
