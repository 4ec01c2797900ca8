import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderWebhook } from '../render-events.js';

export const getWebhook: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(renderWebhook(await ctx.services.webhooks.get(principalOf(ctx), String(ctx.api.request.params.webhookId))));
};
