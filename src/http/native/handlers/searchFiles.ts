import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf, queryString } from '../context.js';
import { queryBoolean, queryNumber, untilClientGone } from '../guest-io.js';

export const searchFiles: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.searchFiles(
    principalOf(ctx), sandboxIdOf(ctx),
    {
      path: queryString(ctx, 'path'),
      query: queryString(ctx, 'query')!,
      regex: queryBoolean(ctx, 'regex'),
      caseSensitive: queryBoolean(ctx, 'caseSensitive'),
      glob: queryString(ctx, 'glob'),
      maxResults: queryNumber(ctx, 'maxResults'),
    },
    untilClientGone(ctx),
  ));
};
