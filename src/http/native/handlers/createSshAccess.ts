import { renderSshAccess } from '../../../../core/services/ssh-access.js';
import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';

export const createSshAccess: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as { expiresInMinutes?: number; revokeEarlier?: boolean };
  const access = await ctx.services.sshAccess.createAccess(principalOf(ctx), sandboxIdOf(ctx), { expiresInMinutes: body.expiresInMinutes, revokeEarlier: body.revokeEarlier, requestHost: ctx.req.headers.host });
  ctx.res.status(201).json(renderSshAccess(access));
};
