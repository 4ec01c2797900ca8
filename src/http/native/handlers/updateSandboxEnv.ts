import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import type { EnvChange } from '../../../../core/services/sandbox-env.js';

export const updateSandboxEnv: NativeHandler = async (ctx) => {
  const sandbox = await ctx.services.sandboxEnv.update(principalOf(ctx), String(ctx.api.request.params.sandboxId), (ctx.api.request.requestBody ?? {}) as EnvChange);
  ctx.res.status(200).json({ env: sandbox.env });
};
