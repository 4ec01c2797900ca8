import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';

export const createSshAccess: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as { expiresInMinutes?: number; revokeEarlier?: boolean };
  const access = await ctx.services.sshAccess.createAccess(principalOf(ctx), sandboxIdOf(ctx), body);
  ctx.res.status(201).json({
    id: access.id,
    sandboxId: access.sandboxId,
    token: access.token,
    expiresAt: access.expiresAt.toISOString(),
    createdAt: access.createdAt.toISOString(),
    updatedAt: access.updatedAt.toISOString(),
    sshCommand: ctx.services.sshAccess.sshCommand(access.token, ctx.req.headers.host),
  });
};
