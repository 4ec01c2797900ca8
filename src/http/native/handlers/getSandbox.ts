import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderSandbox } from '../render.js';

export const getSandbox: NativeHandler = async (ctx) => {
  const sandbox = await ctx.services.sandboxes.get(principalOf(ctx), sandboxIdOf(ctx));
  ctx.res.status(200).json(renderSandbox(sandbox, principalOf(ctx)));
};
