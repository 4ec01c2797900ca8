import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

export const setFileMetadata: NativeHandler = async (ctx) => {
  const body = jsonBody<{ set: Record<string, string>; replacePrefix?: string }>(ctx);
  const input = { path: queryString(ctx, 'path')!, set: body.set, ...(body.replacePrefix !== undefined ? { replacePrefix: body.replacePrefix } : {}) };
  ctx.res.status(200).json(await ctx.services.toolbox.writeFileMetadata(principalOf(ctx), sandboxIdOf(ctx), input, untilClientGone(ctx)));
};
