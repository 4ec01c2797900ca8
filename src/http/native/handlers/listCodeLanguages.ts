import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';

export const listCodeLanguages: NativeHandler = async (ctx) => {
  ctx.res.status(200).json({ languages: await ctx.services.codeInterpreter.languages(principalOf(ctx), sandboxIdOf(ctx)) });
};
