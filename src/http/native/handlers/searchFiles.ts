import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { queryBoolean, queryNumber, untilClientGone } from '../guest-io.js';
import type { SearchInput } from '../../../../core/guest.js';

export const searchFiles: NativeHandler = async (ctx) => {
  const input: SearchInput = {
    path: queryString(ctx, 'path'),
    query: queryString(ctx, 'query')!,
    regex: queryBoolean(ctx, 'regex'),
    caseSensitive: queryBoolean(ctx, 'caseSensitive'),
    glob: queryString(ctx, 'glob'),
    maxResults: queryNumber(ctx, 'maxResults'),
  };
  ctx.res.status(200).json(await ctx.services.toolbox.searchFiles(principalOf(ctx), sandboxIdOf(ctx), input, untilClientGone(ctx)));
};
