// POST /files/upload: many files in one multipart/form-data body, streamed part by part onto
// disk. busboy parses; each file part flows through a PassThrough into the same atomic writer
// PUT /files/content uses, so backpressure reaches the client socket and memory stays bounded
// whatever the body size. The accepted forms are described in agent-protocol/files.ts.
import busboy from 'busboy';
import type { IncomingMessage } from 'node:http';
import { PassThrough, type Readable } from 'node:stream';
import { finished } from 'node:stream/promises';
import type { UploadResponse, UploadResult } from '../agent-protocol/files.js';
import { discardRestOfBody, MAX_DISCARDED_BODY_BYTES } from '../agent-protocol/request-body.js';
import { AgentHttpError, fsErrorToHttp, validationFailed } from './errors.js';
import { receiveFile } from './files.js';
import type { Owner } from './files-ownership.js';
import { resolveSandboxPath } from './paths.js';

export interface UploadSettings {
  home: string;
  /** Largest accepted body in bytes; Infinity = no limit. */
  maxUploadBytes: number;
  /** `?path=` of the request: the destination of `file` parts without a `path` field. */
  queryPath: string | null;
  /** `?owner=`: who gets the files and the directories made for them (files-ownership.ts). */
  owner?: Owner;
}

const DAYTONA_PATH_FIELD = /^files\[(\d+)\]\.path$/;
const DAYTONA_FILE_FIELD = /^files\[(\d+)\]\.file$/;
/** Text fields only ever carry paths; anything longer is not one. */
const MAX_FIELD_BYTES = 64 * 1024;

/**
 * The rest of the body is read and dropped (bounded: discardRestOfBody) so the 413 reaches a
 * client still sending; only a declared body too big even for that gets Connection: close.
 */
function tooLarge(limit: number, declaredLength = 0): AgentHttpError {
  const headers = declaredLength > MAX_DISCARDED_BODY_BYTES ? { Connection: 'close' } : undefined;
  return new AgentHttpError(413, 'payload_too_large', `body: the upload is larger than the limit of ${limit} bytes`, headers);
}

function describeFailure(error: unknown, path: string): { code: string; message: string } {
  const mapped = error instanceof AgentHttpError ? error : fsErrorToHttp(error, path);
  if (mapped) return { code: mapped.code, message: mapped.message };
  return { code: 'internal', message: `internal error writing ${path}: ${(error as Error)?.message ?? String(error)}` };
}

/**
 * Writes one part. Whatever happens, the part's stream is consumed to its end: busboy only moves
 * on to the next part once this one is drained, and a destroyed part would stall the form.
 */
async function writePart(part: Readable, destination: { field: string; raw: string | undefined }, home: string, owner?: Owner): Promise<UploadResult> {
  const body = new PassThrough();
  part.pipe(body);
  // pipe() forwards data but not failures; a part cut short must fail the write, not hang it.
  part.once('error', (error) => body.destroy(error));
  part.once('close', () => {
    if (!part.readableEnded) body.destroy(new Error('the upload ended in the middle of a file'));
  });
  const shownPath = destination.raw ?? destination.field;
  try {
    if (destination.raw === undefined) throw validationFailed(destination.field, 'required before the file part');
    const absolutePath = resolveSandboxPath(destination.raw, home, destination.field);
    const info = await receiveFile(body, absolutePath, undefined, owner);
    return { path: absolutePath, size: info.size, ok: true };
  } catch (error) {
    part.unpipe(body);
    body.destroy();
    if (!part.destroyed) part.resume();
    return { path: shownPath, ok: false, error: describeFailure(error, shownPath) };
  }
}

function isMultipartFormData(contentType: string | undefined): boolean {
  return typeof contentType === 'string' && /^multipart\/form-data\s*;/i.test(contentType.trim());
}

export async function receiveUpload(req: IncomingMessage, settings: UploadSettings): Promise<{ status: number; body: UploadResponse }> {
  if (!isMultipartFormData(req.headers['content-type'])) {
    throw validationFailed('content-type', `expected multipart/form-data with a boundary, got ${JSON.stringify(req.headers['content-type'] ?? '')}`);
  }
  const declaredLength = Number(req.headers['content-length'] ?? Number.NaN);
  if (Number.isFinite(declaredLength) && declaredLength > settings.maxUploadBytes) {
    discardRestOfBody(req);
    throw tooLarge(settings.maxUploadBytes, declaredLength);
  }

  let parser: busboy.Busboy;
  try {
    parser = busboy({ headers: req.headers, limits: { fieldSize: MAX_FIELD_BYTES } });
  } catch (error) {
    throw validationFailed('content-type', (error as Error).message);
  }

  const pendingDaytonaPaths = new Map<string, string>();
  let pendingSimplePath: string | undefined;
  const results: Promise<UploadResult>[] = [];

  parser.on('field', (name, value) => {
    const daytona = DAYTONA_PATH_FIELD.exec(name);
    if (daytona) pendingDaytonaPaths.set(daytona[1], value);
    else if (name === 'path') pendingSimplePath = value;
    // Other text fields carry nothing the agent uses.
  });
  parser.on('file', (name, part) => {
    const daytona = DAYTONA_FILE_FIELD.exec(name);
    let destination: { field: string; raw: string | undefined };
    if (daytona) {
      destination = { field: `files[${daytona[1]}].path`, raw: pendingDaytonaPaths.get(daytona[1]) };
      pendingDaytonaPaths.delete(daytona[1]);
    } else if (name === 'file') {
      // The simple form's `path` field, else the query's path. (E2B's full-path filenames are
      // translated into `path` fields by compat/e2b: the agent reads only the native forms.)
      const raw = pendingSimplePath ?? (settings.queryPath || undefined);
      destination = { field: 'path', raw };
      pendingSimplePath = undefined;
    } else {
      part.resume();
      results.push(Promise.resolve({ path: name, ok: false, error: { code: 'validation_failed', message: `${name}: unexpected file field (expected files[i].file or file)` } }));
      return;
    }
    results.push(writePart(part, destination, settings.home, settings.owner));
  });

  try {
    await feedParser(req, parser, settings.maxUploadBytes);
  } catch (error) {
    // Let the parts in flight discard their temp files before answering.
    await Promise.all(results);
    throw error;
  }
  const settled = await Promise.all(results);
  if (settled.length === 0) throw validationFailed('body', 'no file parts (expected files[i].path + files[i].file, or path + file)');
  const status = settled.every((result) => result.ok) ? 200 : 207;
  return { status, body: { results: settled } };
}

/**
 * Feeds the request into the parser with backpressure, counting bytes against the limit. Not
 * stream.pipeline: on a 413 that would destroy the request and with it the socket the answer
 * has to go out on.
 */
async function feedParser(req: IncomingMessage, parser: busboy.Busboy, limit: number): Promise<void> {
  let received = 0;
  await new Promise<void>((resolve, reject) => {
    let settled = false;
    const fail = (error: Error): void => {
      if (settled) return;
      settled = true;
      req.off('data', onData);
      // Discard the rest of the body rather than leave it unread.
      discardRestOfBody(req);
      parser.destroy(error);
      reject(error);
    };
    const onData = (chunk: Buffer): void => {
      received += chunk.length;
      if (received > limit) {
        fail(tooLarge(limit));
        return;
      }
      if (!parser.write(chunk)) req.pause();
    };
    parser.on('drain', () => req.resume());
    parser.on('error', (error: Error) => fail(new AgentHttpError(400, 'validation_failed', `body: malformed multipart/form-data: ${error.message}`)));
    req.on('data', onData);
    req.once('end', () => {
      if (settled) return;
      parser.end();
      finished(parser).then(
        () => {
          settled = true;
          resolve();
        },
        (error: Error) => fail(new AgentHttpError(400, 'validation_failed', `body: malformed multipart/form-data: ${error.message}`)),
      );
    });
    req.once('close', () => {
      if (!req.complete) fail(new Error('the client aborted the upload'));
    });
    req.once('error', (error) => fail(error));
  });
}
