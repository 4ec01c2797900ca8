// Request bodies answered before they are all sent, on the chain control plane → host agent →
// guest agent: a server's reader may give up on a body without harming the connection it came
// on (discardableBody), and a client stops sending a body once its answer has been read
// (giveUpBodyAfterAnswer).
//
// Why: a handler can answer before the body is all there (disk full: 507 after the first
// write). Handing the IncomingMessage itself to stream.pipeline is then a trap: when the
// destination fails, pipeline destroys the request, and Node's HTTP parser, which keeps
// pushing the body bytes still arriving into a destroyed stream, stops reading the socket for
// good. The client's remaining body then backs up through every hop until a server closes the
// socket with those bytes unread, which makes the kernel send an RST: the client's next write
// fails with EPIPE, and a client still busy writing never reads the answer it was sent
// (the 507 arrived as "503 host_unavailable: write EPIPE"); on a keep-alive connection the
// keep-alive timeout resets a socket the client's pool is about to reuse (ECONNRESET).
// So the reader gets its own stream: when it stops early, the rest of the body is read and
// dropped, the client finishes sending, and the connection stays usable. A client that leaves
// mid-body still fails the reader (the upload is discarded, the upstream request aborted).
import type { ClientRequest, IncomingMessage } from 'node:http';
import { PassThrough, finished, type Readable } from 'node:stream';

/**
 * How much of a streamed body each hop buffers before it pauses the socket it reads from.
 * Streams default to 16 KiB: a 64 KiB socket read then fills the buffer at once, the socket is
 * paused and resumed for every read (a readStop/readStart pair per chunk on every hop), and
 * each hop waits on the next one's drain. A few hundred KiB lets a hop keep reading while the
 * next writes, at a bounded cost per open upload.
 */
export const STREAM_BUFFER_BYTES = 512 * 1024;

export function discardableBody(req: IncomingMessage): Readable {
  const body = new PassThrough({ highWaterMark: STREAM_BUFFER_BYTES });
  // Already read to its end (pipe would then never end the stream): an empty body.
  if (req.readableEnded) return body.end();
  req.pipe(body);
  // pipe() forwards data and the end, not failures: a client gone mid-body must fail the reader.
  finished(req, (error) => {
    if (error) body.destroy(error);
  });
  body.once('close', () => {
    if (req.readableEnded || req.destroyed) return;
    // The reader stopped before the end (it has answered, or will): read the rest and drop it.
    req.unpipe(body);
    req.resume();
  });
  return body;
}

/**
 * Most bytes of a refused body (413) read and dropped after the answer, so the answer reaches
 * the client: closing a connection with the client's bytes still unread makes the kernel reset
 * it, and a client still writing then sees EPIPE instead of the 413. Past this the connection is
 * dropped (a client sending gigabytes after its 413 gets the reset).
 */
export const MAX_DISCARDED_BODY_BYTES = 8 * 1024 * 1024;

/** Reads and drops the rest of req's body; past maxBytes, drops the connection instead. */
export function discardRestOfBody(req: IncomingMessage, maxBytes = MAX_DISCARDED_BODY_BYTES): void {
  if (req.readableEnded || req.destroyed) return;
  let dropped = 0;
  const onData = (chunk: Buffer): void => {
    dropped += chunk.length;
    if (dropped > maxBytes) {
      req.off('data', onData);
      req.socket?.destroy();
    }
  };
  req.on('data', onData);
  req.resume();
}

/**
 * An answer can come before the request body is all sent (507: the disk filled up). Node's
 * client stops relaying 'drain' to a request once its answer is complete, so a body sent with
 * backpressure would hang half-sent on that socket for good. Once the answer has been read to
 * its end, the rest of the body is not wanted: stop sending it and drop the connection (it is
 * mid-request, so never reusable; the server has answered and drops what it received).
 */
export function giveUpBodyAfterAnswer(req: ClientRequest, response: IncomingMessage): void {
  response.once('end', () => {
    if (!req.writableEnded) req.destroy();
  });
}
