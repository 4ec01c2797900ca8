import type { Response } from 'express';
import type { NativeContext, NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { countStream, jsonBody, untilClientGone } from '../guest-io.js';
import { allEvents, CodeRunCollector, failureFrame, startCodeRun, type CodeStreamFrame, type RunCodeBody } from '../code-run.js';
import { requestLogger } from '../../request-id.js';

/**
 * One cell. `Accept` picks the form: Server-Sent Events, NDJSON, or (default) one collected
 * JSON answer; the WebSocket form is in websocket.ts. The client going away aborts the run,
 * which interrupts the cell in its kernel (core keeps the context).
 */
export const runCode: NativeHandler = async (ctx) => {
  const principal = principalOf(ctx);
  const sandboxId = sandboxIdOf(ctx);
  const form = ctx.req.accepts(['application/json', 'text/event-stream', 'application/x-ndjson']);
  countStream(ctx);
  const { signal } = untilClientGone(ctx);
  // (core keeps the sandbox active while the cell runs.)
  const started = await startCodeRun(ctx.services, principal, sandboxId, jsonBody<RunCodeBody>(ctx), signal!);
  if (form === 'text/event-stream' || form === 'application/x-ndjson') return streamRun(ctx, form, allEvents(started));
  const collected = new CodeRunCollector();
  for await (const e of allEvents(started)) collected.add(e);
  if (signal!.aborted) return void ctx.res.destroy();
  ctx.res.status(200).json(collected.done());
};

async function streamRun(ctx: NativeContext, form: 'text/event-stream' | 'application/x-ndjson', events: AsyncGenerator<CodeStreamFrame>): Promise<void> {
  const res = ctx.res;
  const frame = form === 'text/event-stream'
    ? (e: CodeStreamFrame) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`
    : (e: CodeStreamFrame) => `${JSON.stringify(e)}\n`;
  res.status(200).setHeader('content-type', form === 'text/event-stream' ? 'text/event-stream; charset=utf-8' : 'application/x-ndjson; charset=utf-8');
  res.setHeader('cache-control', 'no-store');
  // No proxy buffering: each event is worth something only when it arrives.
  res.setHeader('x-accel-buffering', 'no');
  res.flushHeaders();
  try {
    for await (const e of events) {
      if (!(await write(res, frame(e)))) return; // the client left: leaving the loop ends the generator
    }
  } catch (err) {
    // Headers are out: the only way left to say it failed is a last frame.
    await write(res, frame(failureFrame(err, requestLogger(ctx.req, ctx.services.logger)).frame));
  }
  res.end();
}

/** Writes with backpressure; false once the client is gone. */
async function write(res: Response, chunk: string): Promise<boolean> {
  if (res.destroyed || res.writableEnded) return false;
  if (res.write(chunk)) return true;
  await new Promise<void>((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.once('drain', done);
    res.once('close', done);
  });
  return !res.destroyed;
}
