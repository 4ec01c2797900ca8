import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';

export const listFiles: NativeHandler = async (ctx) => {
  const entries = await ctx.services.sandboxes.listFiles(principalOf(ctx), sandboxIdOf(ctx), queryString(ctx, 'path')!);
  ctx.res.status(200).json({ entries });
};
