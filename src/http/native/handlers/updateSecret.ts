import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSecret } from '../render-secrets.js';
import type { SecretInput } from '../../../../core/services/secrets.js';

export const updateSecret: NativeHandler = async (ctx) => {
  const secret = await ctx.services.secrets.update(principalOf(ctx), String(ctx.api.request.params.secretId), (ctx.api.request.requestBody ?? {}) as SecretInput);
  ctx.res.status(200).json(renderSecret(secret));
};
