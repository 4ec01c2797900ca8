import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { countStream, queryBoolean, requireEventStream, sendStream, untilClientGone } from '../guest-io.js';

/** Server-Sent Events of changes below a directory (WebSocket: websocket.ts). */
export const watchFiles: NativeHandler = async (ctx) => {
  requireEventStream(ctx, /\btext\/event-stream\b/i, 'GET /files/watch needs `Accept: text/event-stream` (Server-Sent Events) or a WebSocket upgrade');
  countStream(ctx);
  const input = { path: queryString(ctx, 'path')!, recursive: queryBoolean(ctx, 'recursive') };
  await sendStream(ctx, await ctx.services.toolbox.watchFiles(principalOf(ctx), sandboxIdOf(ctx), input, untilClientGone(ctx)));
};
