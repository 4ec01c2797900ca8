import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { sendStream, untilClientGone } from '../guest-io.js';

/** Streams the file (one Range header honoured); works on stopped sandboxes too. */
export const downloadFile: NativeHandler = async (ctx) => {
  const range = typeof ctx.req.headers.range === 'string' ? ctx.req.headers.range : undefined;
  await sendStream(ctx, await ctx.services.toolbox.readFile(principalOf(ctx), sandboxIdOf(ctx), queryString(ctx, 'path')!, { range }, untilClientGone(ctx)));
};
