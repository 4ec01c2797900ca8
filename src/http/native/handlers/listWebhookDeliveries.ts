import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { renderDelivery } from '../render-events.js';

export const listWebhookDeliveries: NativeHandler = async (ctx) => {
  const limit = queryString(ctx, 'limit');
  const cursor = queryString(ctx, 'cursor');
  const status = queryString(ctx, 'status');
  const page = await ctx.services.webhooks.deliveries(principalOf(ctx), String(ctx.api.request.params.webhookId), {
    ...(limit !== undefined ? { limit: Number(limit) } : {}),
    ...(cursor ? { cursor } : {}),
    ...(status ? { status } : {}),
  });
  ctx.res.status(200).json({ items: page.items.map(renderDelivery), nextCursor: page.nextCursor });
};
