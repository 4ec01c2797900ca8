import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { untilClientGone } from '../guest-io.js';

export const getFileMetadata: NativeHandler = async (ctx) => {
  const [entry] = await ctx.services.toolbox.readFileMetadata(principalOf(ctx), sandboxIdOf(ctx), { paths: [queryString(ctx, 'path')!] }, untilClientGone(ctx));
  ctx.res.status(200).json(entry);
};
