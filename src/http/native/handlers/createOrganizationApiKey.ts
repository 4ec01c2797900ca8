import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderApiKey } from '../render.js';
import type { KeyPreset } from '../../../../core/services/auth.js';

export const createOrganizationApiKey: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as { name?: string; preset?: KeyPreset };
  const created = await ctx.services.organizations.mintKey(principalOf(ctx), String(ctx.api.request.params.organizationId), body);
  ctx.res.status(201).json({ ...renderApiKey(created.record), key: created.key });
};
