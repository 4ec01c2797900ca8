import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { untilClientGone } from '../guest-io.js';

/** Works on a stopped sandbox too (from its kept disk). */
export const statFile: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.statFile(principalOf(ctx), sandboxIdOf(ctx), queryString(ctx, 'path')!, untilClientGone(ctx)));
};
