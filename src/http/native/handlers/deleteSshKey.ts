import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const deleteSshKey: NativeHandler = async (ctx) => {
  await ctx.services.sshAccess.deleteKey(principalOf(ctx), String(ctx.api.request.params.sshKeyId));
  ctx.res.status(204).end();
};
