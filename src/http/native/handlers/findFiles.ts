import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { queryNumber, untilClientGone } from '../guest-io.js';

export const findFiles: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.findFiles(principalOf(ctx), sandboxIdOf(ctx), { path: queryString(ctx, 'path'), pattern: queryString(ctx, 'pattern')!, maxResults: queryNumber(ctx, 'maxResults') }, untilClientGone(ctx)));
};
