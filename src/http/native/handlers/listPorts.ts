import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderPort } from '../render.js';

export const listPorts: NativeHandler = async (ctx) => {
  const ports = await ctx.services.ports.list(principalOf(ctx), sandboxIdOf(ctx));
  ctx.res.status(200).json({ items: ports.map(renderPort) });
};
