import type { CreateContextInput } from '../../../../core/code-interpreter/types.js';
import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody } from '../guest-io.js';
import { renderCodeContext } from '../render.js';

export const createCodeContext: NativeHandler = async (ctx) => {
  const { language, cwd, user, envs } = jsonBody<CreateContextInput>(ctx);
  const context = await ctx.services.codeInterpreter.createContext(principalOf(ctx), sandboxIdOf(ctx), { language, cwd, user, envs });
  ctx.res.status(201).json(renderCodeContext(context));
};
