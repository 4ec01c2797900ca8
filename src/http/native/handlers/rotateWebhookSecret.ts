import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderWebhook } from '../render-events.js';

export const rotateWebhookSecret: NativeHandler = async (ctx) => {
  const { webhook, secret } = await ctx.services.webhooks.rotateSecret(principalOf(ctx), String(ctx.api.request.params.webhookId));
  ctx.res.status(200).json({ ...renderWebhook(webhook), secret });
};
