import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderPort } from '../render.js';
import type { PublishPortInput } from '../../../../core/services/ports.js';

export const publishPort: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as PublishPortInput;
  const port = await ctx.services.ports.publish(principalOf(ctx), sandboxIdOf(ctx), body);
  ctx.res.status(201).json(renderPort(port));
};
