import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, param, untilClientGone } from '../guest-io.js';

export const resizeCommandTerminal: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.resizeTerminal(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'processId'), jsonBody(ctx), untilClientGone(ctx));
  ctx.res.status(204).end();
};
