import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { queryBoolean, untilClientGone } from '../guest-io.js';

export const deleteFile: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.deleteFile(principalOf(ctx), sandboxIdOf(ctx), { path: queryString(ctx, 'path')!, recursive: queryBoolean(ctx, 'recursive') }, untilClientGone(ctx));
  ctx.res.status(204).end();
};
