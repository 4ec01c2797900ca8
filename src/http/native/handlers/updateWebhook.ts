import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderWebhook } from '../render-events.js';
import type { WebhookInput } from '../../../../core/services/webhooks.js';

export const updateWebhook: NativeHandler = async (ctx) => {
  const webhook = await ctx.services.webhooks.update(principalOf(ctx), String(ctx.api.request.params.webhookId), ctx.api.request.requestBody as WebhookInput);
  ctx.res.status(200).json(renderWebhook(webhook));
};
