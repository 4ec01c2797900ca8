// Request bodies that are streamed on to a sandbox (uploads, stdin) rather than parsed here.
//
// Such a body lives for a while before anyone reads it: the route first authenticates, loads the
// sandbox and may wake a paused one, and only then opens the upstream request and pipes the body
// into it. A client can vanish at any byte of that time. Two rules keep that harmless:
//  - every stream we put between the client and the upstream is wired with stream.pipeline (so a
//    failure anywhere destroys the rest) and always has an 'error' listener, so "the client went
//    away before we read its body" is never an unhandled 'error' event (which ends the process);
//  - the route gets an AbortSignal that fires when the client leaves, and passes it to the
//    upstream request, so nothing keeps waiting on a body that will never come.
// The upstream side then sees an aborted request, and the guest agent discards the temp file
// it was writing (host/guest-agent/files.ts), so a half-sent file is never left in place.
import { IncomingMessage } from 'node:http';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream';
import { NestboxError } from '../core/errors.js';
import { discardableBody, STREAM_BUFFER_BYTES } from '../host/agent-protocol/request-body.js';

export { clientGoneSignal } from '../host/protocol/client-gone.js';

/** A destroyed stream's error is reported to whoever pipes it; here it only must not be fatal. */
const ignoreError = (): void => {};

/**
 * The request body, passed through until `maxBytes` (then it fails with 413). Chunked uploads
 * have no Content-Length to check up front, so the limit is enforced while streaming.
 */
export function streamedBody(source: Readable, maxBytes: number): Readable {
  let seen = 0;
  const limiter = new Transform({
    // The same buffering as the hop behind it (see STREAM_BUFFER_BYTES).
    highWaterMark: STREAM_BUFFER_BYTES,
    transform(chunk: Buffer, _enc, done) {
      seen += chunk.length;
      if (seen > maxBytes) return done(new NestboxError('payload_too_large', `body: exceeds the upload limit of ${maxBytes} bytes`));
      done(null, chunk);
    },
  });
  limiter.on('error', ignoreError);
  // A source that fails (the client reset the connection, or closed it early) destroys the
  // limiter with that error; the consumer's own pipeline then reports it. The client's request
  // itself is never destroyed from our side: when we stop reading early (413, or the sandbox
  // answered 507 before the body was all sent) the rest is read and dropped, so the client can
  // finish sending and read our answer instead of being reset mid-write.
  const body = source instanceof IncomingMessage ? discardableBody(source) : source;
  pipeline(body, limiter, ignoreError);
  return limiter;
}

/** `source` through `transform` (e.g. gunzip) with the same guarantees as streamedBody. */
export function streamedThrough(source: Readable, transform: Transform): Readable {
  transform.on('error', ignoreError);
  pipeline(source, transform, ignoreError);
  return transform;
}
