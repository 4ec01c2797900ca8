import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { untilClientGone } from '../guest-io.js';

export const listSessions: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.listSessions(principalOf(ctx), sandboxIdOf(ctx), untilClientGone(ctx)));
};
