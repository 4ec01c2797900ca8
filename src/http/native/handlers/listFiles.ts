import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { queryNumber, untilClientGone } from '../guest-io.js';

/** Works on a stopped sandbox too (from its kept disk). */
export const listFiles: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.listFiles(principalOf(ctx), sandboxIdOf(ctx), { path: queryString(ctx, 'path'), depth: queryNumber(ctx, 'depth') }, untilClientGone(ctx)));
};
