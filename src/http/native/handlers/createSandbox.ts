import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSandbox } from '../render.js';
import type { CreateSandboxInput } from '../../../../core/services/sandboxes.js';

export const createSandbox: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as CreateSandboxInput;
  const sandbox = await ctx.services.sandboxes.create(principalOf(ctx), body);
  ctx.res.status(201).json(renderSandbox(sandbox));
};
