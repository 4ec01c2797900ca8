import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param, rawBody, untilClientGone } from '../guest-io.js';

export const writeCommandStdin: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.writeStdin(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'processId'), rawBody(ctx), untilClientGone(ctx));
  ctx.res.status(204).end();
};
