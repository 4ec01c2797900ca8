import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

export const moveFile: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.moveFile(principalOf(ctx), sandboxIdOf(ctx), jsonBody(ctx), untilClientGone(ctx)));
};
