import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';

export const deleteSandbox: NativeHandler = async (ctx) => {
  await ctx.services.sandboxes.delete(principalOf(ctx), sandboxIdOf(ctx));
  ctx.res.status(204).end();
};
