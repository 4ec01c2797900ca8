import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param } from '../guest-io.js';
import { renderCodeContext } from '../render.js';

export const restartCodeContext: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(renderCodeContext(await ctx.services.codeInterpreter.restartContext(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'contextId'))));
};
