import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const deleteApiKey: NativeHandler = async (ctx) => {
  await ctx.services.auth.revokeApiKey(principalOf(ctx).organizationId, String(ctx.api.request.params.keyId));
  ctx.res.status(204).end();
};
