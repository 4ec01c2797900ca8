// POST /files/download: many files in one multipart/form-data response, one part per requested
// path in request order, each file streamed with backpressure after the previous one. Failures
// of single files become `error` parts so one missing file does not fail the others (see
// agent-protocol/files.ts; compat/daytona gives their bodies Daytona's shape).
import { randomBytes } from 'node:crypto';
import type { FileHandle } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import type { DownloadErrorPart } from '../agent-protocol/files.js';
import { AgentHttpError, fsErrorToHttp } from './errors.js';
import { noteStreamedBytes, openForReading, readUntilEof } from './files.js';
import { resolveSandboxPath } from './paths.js';

/** Printable ASCII other than `"` and `\`: safe inside a quoted header parameter as it is. */
const PLAIN_FILENAME = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

/** RFC 5987 attr-char is narrower than what encodeURIComponent leaves alone. */
function encodeRfc5987(value: string): string {
  return encodeURIComponent(value).replace(/['()*]/g, (char) => `%${char.charCodeAt(0).toString(16).toUpperCase()}`);
}

/**
 * The filename parameters for a requested path. Plain ASCII goes byte-for-byte; anything else
 * gets an ASCII fallback plus `filename*`, because busboy reads a plain filename as latin1.
 */
export function filenameParameters(requestedPath: string): string {
  if (PLAIN_FILENAME.test(requestedPath)) return `filename="${requestedPath}"`;
  // A lone surrogate cannot be percent-encoded as UTF-8; it becomes U+FFFD, as in toWellFormed().
  const wellFormed = requestedPath.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, '\uFFFD');
  const fallback = wellFormed.replace(/[^\x20\x21\x23-\x5b\x5d-\x7e]/gu, '_');
  return `filename="${fallback}"; filename*=utf-8''${encodeRfc5987(wellFormed)}`;
}

function errorBody(error: unknown, path: string): DownloadErrorPart {
  const mapped =
    (error instanceof AgentHttpError ? error : fsErrorToHttp(error, path)) ??
    new AgentHttpError(500, 'internal', `internal error reading ${path}: ${(error as Error)?.message ?? String(error)}`);
  return { error: { code: mapped.code, message: mapped.message, status: mapped.status } };
}

/** Resolves once `res` can take more, rejects if the client goes away first. */
function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve, reject) => {
    const onDrain = (): void => {
      res.off('close', onClose);
      resolve();
    };
    const onClose = (): void => {
      res.off('drain', onDrain);
      reject(new Error('the client went away during the download'));
    };
    res.once('drain', onDrain);
    res.once('close', onClose);
  });
}

async function write(res: ServerResponse, data: Buffer | string): Promise<void> {
  if (res.destroyed) throw new Error('the client went away during the download');
  if (!res.write(data)) await drained(res);
}

/** Largest file of unknown size (see openForReading) one download part holds. */
export const MAX_UNSIZED_PART_BYTES = 16 * 1024 * 1024;

async function readWhole(handle: FileHandle, shownPath: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of readUntilEof(handle)) {
    total += chunk.length;
    if (total > MAX_UNSIZED_PART_BYTES) {
      throw new AgentHttpError(413, 'payload_too_large', `${shownPath}: its size is not known in advance (a pseudo-filesystem file) and it is larger than ${MAX_UNSIZED_PART_BYTES} bytes; read it alone through GET /files/content instead`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, total);
}

export async function sendDownload(res: ServerResponse, requestedPaths: string[], home: string): Promise<void> {
  const boundary = `nestbox-${randomBytes(16).toString('hex')}`;
  res.writeHead(200, { 'Content-Type': `multipart/form-data; boundary=${boundary}` });

  for (const [index, requested] of requestedPaths.entries()) {
    const disposition = filenameParameters(requested);
    let opened: Awaited<ReturnType<typeof openForReading>> | undefined;
    let unsized: Buffer | undefined;
    let shownPath = requested;
    try {
      const absolutePath = resolveSandboxPath(requested, home, `paths[${index}]`);
      shownPath = absolutePath;
      opened = await openForReading(absolutePath);
      if (!opened.sizeKnown) {
        // Each part states its length up front, so a file of unknown size (procfs, sysfs) is
        // read to its end first: such files are small, and a bound keeps it so.
        const handle = opened.handle;
        opened = undefined;
        unsized = await readWhole(handle, shownPath).finally(() => handle.close().catch(() => {}));
      }
    } catch (error) {
      const body = Buffer.from(JSON.stringify(errorBody(error, shownPath)));
      await write(
        res,
        `--${boundary}\r\nContent-Disposition: form-data; name="error"; ${disposition}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`,
      );
      await write(res, body);
      await write(res, '\r\n');
      continue;
    }

    if (unsized) {
      await write(res, `--${boundary}\r\nContent-Disposition: form-data; name="file"; ${disposition}\r\nContent-Type: application/octet-stream\r\nContent-Length: ${unsized.length}\r\n\r\n`);
      await write(res, unsized);
      await write(res, '\r\n');
      continue;
    }
    if (!opened) continue;
    const { handle, size } = opened;
    try {
      await write(
        res,
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; ${disposition}\r\nContent-Type: application/octet-stream\r\nContent-Length: ${size}\r\n\r\n`,
      );
      let sent = 0;
      if (size > 0) {
        // Exactly `size` bytes (the size from the open descriptor): a file growing meanwhile
        // cannot break the framing, and one shrinking is detected below.
        const stream = handle.createReadStream({ start: 0, end: size - 1, autoClose: false });
        try {
          for await (const chunk of stream as AsyncIterable<Buffer>) {
            noteStreamedBytes(chunk.length);
            sent += chunk.length;
            await write(res, chunk);
          }
        } finally {
          stream.destroy();
        }
      }
      if (sent !== size) {
        // The part already promised `size` bytes; a short part would be silently wrong data.
        throw new Error(`${shownPath} shrank from ${size} to ${sent} bytes while it was being sent`);
      }
      await write(res, '\r\n');
    } finally {
      await handle.close().catch(() => {});
    }
  }
  await write(res, `--${boundary}--\r\n`);
  res.end();
}
