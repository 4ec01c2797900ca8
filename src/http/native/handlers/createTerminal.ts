import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

/** A terminal is a detached process on a PTY running an interactive login shell. */
export const createTerminal: NativeHandler = async (ctx) => {
  ctx.res.status(201).json(await ctx.services.toolbox.openTerminal(principalOf(ctx), sandboxIdOf(ctx), jsonBody(ctx), untilClientGone(ctx)));
};
