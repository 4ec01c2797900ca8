// The Daytona bulk download rewrites only the bodies of `error` parts of core's multipart
// download (compat/daytona/download-parts.ts). File bytes are framed by Content-Length, so
// bytes that look like headers or the closing boundary inside a file pass untouched, however
// the stream is chunked; a stream cut inside a part fails.
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { describe, expect, it } from 'vitest';
import { daytonaDownloadParts, daytonaErrorPart } from '../../compat/daytona/download-parts.js';

const B = 'nestbox-0123abcd';
const contentType = `multipart/form-data; boundary=${B}`;

function part(name: 'file' | 'error', filename: string, type: string, body: Buffer): Buffer {
  return Buffer.concat([
    Buffer.from(`--${B}\r\nContent-Disposition: form-data; name="${name}"; ${filename}\r\nContent-Type: ${type}\r\nContent-Length: ${body.length}\r\n\r\n`, 'latin1'),
    body,
    Buffer.from('\r\n'),
  ]);
}

// A file whose bytes contain what a parser could mistake for framing.
const tricky = Buffer.concat([Buffer.from(`x\r\n\r\n--${B}--\r\n--${B}\r\nContent-Disposition: form-data; name="error"\r\n\r\n`), Buffer.from([0, 255, 13, 10])]);
const nativeError = Buffer.from(JSON.stringify({ error: { code: 'not_found', message: 'no such file: /root/missing.txt', status: 404 } }));
const nativeDirError = Buffer.from(JSON.stringify({ error: { code: 'validation_failed', message: 'path: /root is a directory', status: 400 } }));
const nativeIoError = Buffer.from(JSON.stringify({ error: { code: 'internal', message: 'internal error reading /root/x', status: 500 } }));

const native = Buffer.concat([
  part('file', 'filename="/root/a.txt"', 'application/octet-stream', tricky),
  part('error', 'filename="/root/missing.txt"', 'application/json', nativeError),
  part('file', `filename="/root/na_ve _.txt"; filename*=utf-8''%2Froot%2Fna%C3%AFve%20%C3%BC.txt`, 'application/octet-stream', Buffer.from('ünïcode')),
  part('error', 'filename="/root"', 'application/json', nativeDirError),
  part('error', 'filename="/root/x"', 'application/json', nativeIoError),
  part('file', 'filename="/root/empty"', 'application/octet-stream', Buffer.alloc(0)),
  Buffer.from(`--${B}--\r\n`),
]);

const daytonaBody = (message: string, statusCode: number, code: string) => Buffer.from(JSON.stringify({ message, statusCode, code, source: 'DAYTONA_DAEMON' }));
const expected = Buffer.concat([
  part('file', 'filename="/root/a.txt"', 'application/octet-stream', tricky),
  part('error', 'filename="/root/missing.txt"', 'application/json', daytonaBody('no such file: /root/missing.txt', 404, 'FILE_NOT_FOUND')),
  part('file', `filename="/root/na_ve _.txt"; filename*=utf-8''%2Froot%2Fna%C3%AFve%20%C3%BC.txt`, 'application/octet-stream', Buffer.from('ünïcode')),
  part('error', 'filename="/root"', 'application/json', daytonaBody('path: /root is a directory', 400, 'INVALID_FILE_PATH')),
  part('error', 'filename="/root/x"', 'application/json', daytonaBody('internal error reading /root/x', 500, 'FILE_READ_FAILED')),
  part('file', 'filename="/root/empty"', 'application/octet-stream', Buffer.alloc(0)),
  Buffer.from(`--${B}--\r\n`),
]);

async function rewrite(input: Buffer, chunkSize: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for (let i = 0; i < input.length; i += chunkSize) chunks.push(input.subarray(i, i + chunkSize));
  const out: Buffer[] = [];
  await pipeline(
    Readable.from(chunks),
    daytonaDownloadParts(contentType),
    new Writable({
      write(chunk: Buffer, _e, done) {
        out.push(chunk);
        done();
      },
    }),
  );
  return Buffer.concat(out);
}

describe('Daytona bulk download parts', () => {
  it('rewrites error bodies to the daemon shape and passes files byte for byte, at every chunking', async () => {
    for (const size of [1, 2, 3, 7, 16, 61, 100, 333, native.length]) {
      expect((await rewrite(native, size)).equals(expected), `chunks of ${size}`).toBe(true);
    }
  });

  it('maps the codes the SDK knows and leaves unknown bodies alone', () => {
    expect(JSON.parse(daytonaErrorPart(Buffer.from(JSON.stringify({ error: { code: 'forbidden', message: 'permission denied: /x', status: 403 } }))).toString())).toEqual({
      message: 'permission denied: /x', statusCode: 403, code: 'FILE_ACCESS_DENIED', source: 'DAYTONA_DAEMON',
    });
    expect(daytonaErrorPart(Buffer.from('not json')).toString()).toBe('not json');
  });

  it('fails a stream that ends inside a part, and one without a boundary', async () => {
    await expect(rewrite(native.subarray(0, native.length - 40), 50)).rejects.toThrow(/middle of a part/);
    await expect(rewrite(native.subarray(0, 150), 50)).rejects.toThrow(/middle of a part/);
    expect(() => daytonaDownloadParts('application/json')).toThrow(/no multipart boundary/);
  });
});
