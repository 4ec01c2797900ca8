import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const deleteSecret: NativeHandler = async (ctx) => {
  await ctx.services.secrets.remove(principalOf(ctx), String(ctx.api.request.params.secretId));
  ctx.res.status(204).end();
};
