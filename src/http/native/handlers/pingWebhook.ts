import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderDelivery } from '../render-events.js';

export const pingWebhook: NativeHandler = async (ctx) => {
  ctx.res.status(202).json(renderDelivery(await ctx.services.webhooks.ping(principalOf(ctx), String(ctx.api.request.params.webhookId))));
};
