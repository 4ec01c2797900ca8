import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSnapshot } from '../render.js';

export const createSnapshot: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as { sandboxId: string; name: string };
  const snapshot = await ctx.services.snapshots.create(principalOf(ctx), body);
  ctx.res.status(201).json(renderSnapshot(snapshot));
};
