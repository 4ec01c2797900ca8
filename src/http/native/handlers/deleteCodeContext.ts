import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { param } from '../guest-io.js';

export const deleteCodeContext: NativeHandler = async (ctx) => {
  await ctx.services.codeInterpreter.deleteContext(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'contextId'));
  ctx.res.status(204).end();
};
