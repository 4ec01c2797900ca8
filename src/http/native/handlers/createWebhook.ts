import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderWebhook } from '../render-events.js';
import type { WebhookInput } from '../../../../core/services/webhooks.js';

/** The secret is in this answer only (the server keeps it encrypted, for signing). */
export const createWebhook: NativeHandler = async (ctx) => {
  const { webhook, secret } = await ctx.services.webhooks.create(principalOf(ctx), ctx.api.request.requestBody as WebhookInput);
  ctx.res.status(201).json({ ...renderWebhook(webhook), secret });
};
