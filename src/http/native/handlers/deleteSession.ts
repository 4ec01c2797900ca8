import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param, untilClientGone } from '../guest-io.js';

export const deleteSession: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.deleteSession(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'sessionId'), untilClientGone(ctx));
  ctx.res.status(204).end();
};
