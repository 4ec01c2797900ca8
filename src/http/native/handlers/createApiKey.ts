import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderApiKey } from '../render.js';
import type { KeyPreset } from '../../../../core/services/auth.js';

export const createApiKey: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as { name: string; preset: KeyPreset; sandboxIds?: string[] };
  const principal = principalOf(ctx);
  const created = await ctx.services.auth.mintApiKey(principal, principal.organizationId, body);
  ctx.res.status(201).json({ ...renderApiKey(created.record), key: created.key });
};
