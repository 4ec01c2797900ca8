// Daytona's bulk download (daytona.md (d)) is core's multipart download with one difference:
// a path that cannot be read is an `error` part whose JSON body is Daytona's daemon shape
// ({message, statusCode, code: FILE_NOT_FOUND…, source: DAYTONA_DAEMON}) instead of the native
// {error:{code, message, status}}. This stream rewrites exactly those bodies on the way
// through and passes everything else byte for byte: file parts are framed by their
// Content-Length (the guest always sends one), so their bytes are never parsed or held, and
// backpressure runs from the client back to the guest. A stream that ends inside a part fails,
// so a client never mistakes a cut-off file for a whole one.
import { Transform, type TransformCallback } from 'node:stream';
import { errors } from '../../core/errors.js';
import type { DaytonaDaemonCode } from './errors.js';

/** Core's file error codes → the daemon codes Daytona's SDK turns into error classes. */
const DOWNLOAD_CODES: Record<string, DaytonaDaemonCode> = {
  not_found: 'FILE_NOT_FOUND',
  forbidden: 'FILE_ACCESS_DENIED',
  validation_failed: 'INVALID_FILE_PATH',
};

/** A part's headers (or an error part's JSON) are small; anything larger is not our guest's stream. */
const MAX_HEAD_BYTES = 64 * 1024;
const EMPTY = Buffer.alloc(0);
const HEAD_END = Buffer.from('\r\n\r\n');

/** The native body of an error part in Daytona's daemon shape (unknown shapes pass unchanged). */
export function daytonaErrorPart(nativeBody: Buffer): Buffer {
  let parsed: { error?: { code?: unknown; message?: unknown; status?: unknown } };
  try {
    parsed = JSON.parse(nativeBody.toString('utf8')) as typeof parsed;
  } catch {
    return nativeBody;
  }
  const e = parsed?.error;
  if (!e || typeof e.code !== 'string' || typeof e.message !== 'string' || typeof e.status !== 'number') return nativeBody;
  return Buffer.from(JSON.stringify({ message: e.message, statusCode: e.status, code: DOWNLOAD_CODES[e.code] ?? 'FILE_READ_FAILED', source: 'DAYTONA_DAEMON' }));
}

/** The boundary of a `multipart/form-data; boundary=…` content type. */
function boundaryOf(contentType: string | undefined): string {
  const m = /;\s*boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType ?? '');
  if (!m) throw errors.internal(`the sandbox's download answer has no multipart boundary (content-type ${JSON.stringify(contentType ?? '')})`);
  return (m[1] ?? m[2])!;
}

/** A Transform from core's download stream (with `contentType`) to Daytona's. */
export function daytonaDownloadParts(contentType: string | undefined): Transform {
  const closing = Buffer.from(`--${boundaryOf(contentType)}--`);
  let state: 'head' | 'pass' | 'collect' | 'done' = 'head';
  let pending = EMPTY;
  let remaining = 0;
  let head = '';

  /** One complete header block in `pending`: decide how its body travels. Returns the bytes after it. */
  const startPart = (end: number, push: (b: Buffer) => void): Buffer => {
    head = pending.subarray(0, end).toString('latin1');
    const rest = pending.subarray(end + HEAD_END.length);
    pending = EMPTY;
    const length = /\r\ncontent-length:\s*(\d+)/i.exec(head);
    if (!length) throw new Error('a part of the download has no Content-Length');
    // The body and the CRLF that ends it.
    remaining = Number(length[1]) + 2;
    if (/;\s*name="error"/.test(head)) {
      if (remaining > MAX_HEAD_BYTES) throw new Error('an error part of the download is too large');
      state = 'collect';
    } else {
      push(Buffer.from(`${head}\r\n\r\n`, 'latin1'));
      state = 'pass';
    }
    return rest;
  };

  const finishErrorPart = (push: (b: Buffer) => void): void => {
    const body = daytonaErrorPart(pending.subarray(0, pending.length - 2));
    pending = EMPTY;
    const rewritten = head.replace(/(\r\ncontent-length:\s*)\d+/i, `$1${body.length}`);
    push(Buffer.concat([Buffer.from(`${rewritten}\r\n\r\n`, 'latin1'), body, Buffer.from('\r\n')]));
    state = 'head';
  };

  return new Transform({
    transform(chunk: Buffer, _encoding, done: TransformCallback) {
      const push = (b: Buffer) => void this.push(b);
      let data = chunk;
      try {
        while (data.length > 0) {
          if (state === 'done') {
            push(data);
            break;
          }
          if (state === 'pass' || state === 'collect') {
            const n = Math.min(remaining, data.length);
            if (state === 'pass') push(data.subarray(0, n));
            else pending = Buffer.concat([pending, data.subarray(0, n)]);
            remaining -= n;
            data = data.subarray(n);
            if (remaining === 0) {
              if (state === 'collect') finishErrorPart(push);
              else state = 'head';
            }
            continue;
          }
          pending = Buffer.concat([pending, data]);
          data = EMPTY;
          if (pending.length >= closing.length && pending.subarray(0, closing.length).equals(closing)) {
            push(pending);
            pending = EMPTY;
            state = 'done';
            break;
          }
          const end = pending.indexOf(HEAD_END);
          if (end === -1) {
            if (pending.length > MAX_HEAD_BYTES) throw new Error('a part header of the download is too large');
            break;
          }
          data = startPart(end, push);
        }
        done();
      } catch (err) {
        done(err as Error);
      }
    },
    flush(done: TransformCallback) {
      done(state === 'done' ? undefined : new Error('the download ended in the middle of a part'));
    },
  });
}
