import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';

export const unpublishPort: NativeHandler = async (ctx) => {
  await ctx.services.ports.unpublish(principalOf(ctx), sandboxIdOf(ctx), Number(ctx.api.request.params.port));
  ctx.res.status(204).end();
};
