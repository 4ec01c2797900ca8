import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderSandbox } from '../render.js';

export const moveSandbox: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as { hostId?: string };
  const principal = principalOf(ctx);
  const result = await ctx.services.transfers.move(principal, sandboxIdOf(ctx), { hostId: body.hostId });
  ctx.res.status(200).json({ sandbox: renderSandbox(result.sandbox, principal), fromHostId: result.fromHostId, toHostId: result.toHostId, layersCopied: result.layersCopied, ms: result.ms });
};
