import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';

export const revokeSshAccess: NativeHandler = async (ctx) => {
  const revoked = await ctx.services.sshAccess.revokeAccess(principalOf(ctx), sandboxIdOf(ctx), queryString(ctx, 'token'));
  ctx.res.status(200).json({ revoked });
};
