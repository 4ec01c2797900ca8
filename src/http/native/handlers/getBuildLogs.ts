import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param, queryNumber, untilClientGone } from '../guest-io.js';
import { renderBuild, renderBuildLogLine } from '../render.js';

/**
 * JSON by default; `Accept: text/event-stream` follows the build as Server-Sent Events: one
 * `line` event per log line (its `id` is the offset, so `Last-Event-ID` resumes), then an `end`
 * event with the finished build. The WebSocket form is in websocket.ts.
 */
export const getBuildLogs: NativeHandler = async (ctx) => {
  const principal = principalOf(ctx);
  const id = param(ctx, 'buildId');
  const lastEventId = Number(ctx.req.headers['last-event-id']);
  const offset = Number.isInteger(lastEventId) && lastEventId >= 0 ? lastEventId + 1 : (queryNumber(ctx, 'offset') ?? 0);
  if (!/text\/event-stream/.test(String(ctx.req.headers.accept ?? ''))) {
    const { build, lines } = await ctx.services.builds.logs(principal, id, offset, queryNumber(ctx, 'limit'));
    ctx.res.status(200).json({ lines: lines.map(renderBuildLogLine), nextOffset: lines.length ? lines[lines.length - 1]!.offset + 1 : offset, state: build.state });
    return;
  }
  await ctx.services.builds.get(principal, id); // a 404 before the stream starts
  ctx.services.streams.acquireUntilClosed({ keyId: principal.keyId, sandboxId: `build:${id}` }, ctx.res);
  ctx.res.status(200).setHeader('content-type', 'text/event-stream; charset=utf-8');
  ctx.res.setHeader('cache-control', 'no-store');
  ctx.res.flushHeaders();
  const { signal } = untilClientGone(ctx);
  const keepalive = setInterval(() => ctx.res.write(': keepalive\n\n'), 15_000);
  try {
    for await (const item of ctx.services.builds.follow(principal, id, offset, signal!)) {
      if ('line' in item) {
        if (!ctx.res.write(`id: ${item.line.offset}\nevent: line\ndata: ${JSON.stringify(renderBuildLogLine(item.line))}\n\n`)) await new Promise((r) => ctx.res.once('drain', r));
      } else ctx.res.write(`event: end\ndata: ${JSON.stringify(renderBuild(item.done))}\n\n`);
    }
  } finally {
    clearInterval(keepalive);
    ctx.res.end();
  }
};
