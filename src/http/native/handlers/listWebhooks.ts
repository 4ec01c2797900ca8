import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderWebhook } from '../render-events.js';

export const listWebhooks: NativeHandler = async (ctx) => {
  ctx.res.status(200).json({ items: (await ctx.services.webhooks.list(principalOf(ctx))).map(renderWebhook) });
};
