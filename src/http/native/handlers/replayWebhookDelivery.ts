import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderDelivery } from '../render-events.js';

export const replayWebhookDelivery: NativeHandler = async (ctx) => {
  const { webhookId, deliveryId } = ctx.api.request.params as { webhookId: string; deliveryId: string };
  ctx.res.status(202).json(renderDelivery(await ctx.services.webhooks.replayDelivery(principalOf(ctx), webhookId, deliveryId)));
};
