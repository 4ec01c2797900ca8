import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSnapshot } from '../render.js';

export const getSnapshot: NativeHandler = async (ctx) => {
  const snapshot = await ctx.services.snapshots.get(principalOf(ctx), String(ctx.api.request.params.name));
  ctx.res.status(200).json(renderSnapshot(snapshot));
};
