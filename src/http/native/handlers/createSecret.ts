import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSecret } from '../render-secrets.js';
import type { SecretInput } from '../../../../core/services/secrets.js';

/** The value goes in and is never shown again (the answer has no field for it). */
export const createSecret: NativeHandler = async (ctx) => {
  const secret = await ctx.services.secrets.create(principalOf(ctx), (ctx.api.request.requestBody ?? {}) as SecretInput);
  ctx.res.status(201).json(renderSecret(secret));
};
