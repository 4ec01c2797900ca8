import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderDelivery } from '../render-events.js';

export const replayWebhookEvent: NativeHandler = async (ctx) => {
  const { webhookId, eventId } = ctx.api.request.params as { webhookId: string; eventId: string };
  ctx.res.status(202).json(renderDelivery(await ctx.services.webhooks.replayEvent(principalOf(ctx), webhookId, eventId)));
};
