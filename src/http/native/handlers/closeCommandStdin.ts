import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param, untilClientGone } from '../guest-io.js';

export const closeCommandStdin: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.closeStdin(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'processId'), untilClientGone(ctx));
  ctx.res.status(204).end();
};
