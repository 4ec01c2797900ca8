import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderCodeContext } from '../render.js';

export const listCodeContexts: NativeHandler = async (ctx) => {
  const contexts = await ctx.services.codeInterpreter.listContexts(principalOf(ctx), sandboxIdOf(ctx));
  ctx.res.status(200).json({ contexts: contexts.map(renderCodeContext) });
};
