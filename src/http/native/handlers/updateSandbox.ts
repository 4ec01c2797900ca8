import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderSandbox } from '../render.js';
import type { UpdateSandboxInput } from '../../../../core/services/sandboxes.js';

export const updateSandbox: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as UpdateSandboxInput;
  const sandbox = await ctx.services.sandboxes.update(principalOf(ctx), sandboxIdOf(ctx), body);
  ctx.res.status(200).json(renderSandbox(sandbox, principalOf(ctx)));
};
