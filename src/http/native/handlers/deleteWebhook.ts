import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const deleteWebhook: NativeHandler = async (ctx) => {
  await ctx.services.webhooks.remove(principalOf(ctx), String(ctx.api.request.params.webhookId));
  ctx.res.status(204).end();
};
