import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSnapshot } from '../render.js';

export const listSnapshots: NativeHandler = async (ctx) => {
  const snapshots = await ctx.services.snapshots.list(principalOf(ctx));
  ctx.res.status(200).json({ items: snapshots.map(renderSnapshot) });
};
