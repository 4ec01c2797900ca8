import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

export const createSession: NativeHandler = async (ctx) => {
  ctx.res.status(201).json(await ctx.services.toolbox.createSession(principalOf(ctx), sandboxIdOf(ctx), jsonBody(ctx), untilClientGone(ctx)));
};
