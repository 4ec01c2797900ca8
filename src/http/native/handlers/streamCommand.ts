import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { countStream, param, queryNumber, requireEventStream, sendStream, untilClientGone } from '../guest-io.js';

/** Server-Sent Events of a process's output and exit (WebSocket: websocket.ts). */
export const streamCommand: NativeHandler = async (ctx) => {
  requireEventStream(ctx, /text\/event-stream/, 'events are served as a WebSocket (Upgrade) or as Server-Sent Events (Accept: text/event-stream)');
  countStream(ctx);
  const from = { stdoutOffset: queryNumber(ctx, 'stdoutOffset'), stderrOffset: queryNumber(ctx, 'stderrOffset') };
  await sendStream(ctx, await ctx.services.toolbox.processEvents(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'processId'), from, untilClientGone(ctx)));
};
