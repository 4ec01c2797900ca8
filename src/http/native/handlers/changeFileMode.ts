import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

export const changeFileMode: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.changeMode(principalOf(ctx), sandboxIdOf(ctx), jsonBody(ctx), untilClientGone(ctx)));
};
