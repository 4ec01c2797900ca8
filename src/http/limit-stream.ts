import { Transform, type Readable } from 'node:stream';
import { NestboxError } from '../../core/errors.js';

/**
 * Pass bytes through until `maxBytes`, then fail with 413. Chunked uploads have no
 * Content-Length to check up front, so the limit is enforced while streaming.
 */
export function limitStream(source: Readable, maxBytes: number): Readable {
  let seen = 0;
  const limiter = new Transform({
    transform(chunk: Buffer, _enc, done) {
      seen += chunk.length;
      if (seen > maxBytes) return done(new NestboxError('payload_too_large', `body: exceeds the upload limit of ${maxBytes} bytes`));
      done(null, chunk);
    },
  });
  source.on('error', (err) => limiter.destroy(err));
  return source.pipe(limiter);
}
