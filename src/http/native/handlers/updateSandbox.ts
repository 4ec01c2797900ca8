import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderSandbox } from '../render.js';
import type { UpdateSandboxInput } from '../../../../core/services/sandboxes.js';

export const updateSandbox: NativeHandler = async (ctx) => {
  const { cpu, memoryMiB, diskGiB, ...rest } = ctx.api.request.requestBody as UpdateSandboxInput & { cpu?: number; memoryMiB?: number; diskGiB?: number };
  const principal = principalOf(ctx);
  // Sizes first (sandbox-resize.ts): a refused resize changes nothing else either.
  let sandbox = cpu !== undefined || memoryMiB !== undefined || diskGiB !== undefined ? await ctx.services.sandboxes.resize(principal, sandboxIdOf(ctx), { cpu, memoryMiB, diskGiB }) : undefined;
  if (Object.keys(rest).length || !sandbox) sandbox = await ctx.services.sandboxes.update(principal, sandboxIdOf(ctx), rest);
  ctx.res.status(200).json(renderSandbox(sandbox, principal));
};
