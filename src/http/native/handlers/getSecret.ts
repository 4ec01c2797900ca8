import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSecret } from '../render-secrets.js';

export const getSecret: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(renderSecret(await ctx.services.secrets.get(principalOf(ctx), String(ctx.api.request.params.secretId))));
};
