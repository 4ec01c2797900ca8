import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param, untilClientGone } from '../guest-io.js';

export const getSession: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.getSession(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'sessionId'), untilClientGone(ctx)));
};
