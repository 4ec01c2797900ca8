import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param, untilClientGone } from '../guest-io.js';

export const deleteFileWatcher: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.deleteWatcher(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'watcherId'), untilClientGone(ctx));
  ctx.res.status(204).end();
};
