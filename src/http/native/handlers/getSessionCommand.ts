import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param, untilClientGone } from '../guest-io.js';

export const getSessionCommand: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.getSessionCommand(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'sessionId'), param(ctx, 'commandId'), untilClientGone(ctx)));
};
