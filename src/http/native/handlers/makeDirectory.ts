import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

/** 201 when it was made, 200 when it already was a directory. */
export const makeDirectory: NativeHandler = async (ctx) => {
  const result = await ctx.services.toolbox.makeDirectory(principalOf(ctx), sandboxIdOf(ctx), jsonBody(ctx), untilClientGone(ctx));
  ctx.res.status(result.created ? 201 : 200).json(result.info);
};
