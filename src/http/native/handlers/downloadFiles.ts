import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, sendStream, untilClientGone } from '../guest-io.js';

/** One multipart/form-data part per path, streamed. */
export const downloadFiles: NativeHandler = async (ctx) => {
  await sendStream(ctx, await ctx.services.toolbox.downloadFiles(principalOf(ctx), sandboxIdOf(ctx), jsonBody(ctx), untilClientGone(ctx)));
};
