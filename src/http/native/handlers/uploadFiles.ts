import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { rawBody, untilClientGone } from '../guest-io.js';

/** multipart/form-data, streamed to the guest; 207 when some files failed. */
export const uploadFiles: NativeHandler = async (ctx) => {
  const result = await ctx.services.toolbox.uploadFiles(
    principalOf(ctx), sandboxIdOf(ctx),
    { contentType: String(ctx.req.headers['content-type'] ?? ''), body: rawBody(ctx) },
    untilClientGone(ctx),
  );
  ctx.res.status(result.status).json({ results: result.results });
};
