import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, param, untilClientGone } from '../guest-io.js';

/** 200 with the output when it ran to the end; 202 at once with `async`. */
export const runSessionCommand: NativeHandler = async (ctx) => {
  const run = await ctx.services.toolbox.runSessionCommand(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'sessionId'), jsonBody(ctx), untilClientGone(ctx));
  ctx.res.status(run.status).json(run.command);
};
