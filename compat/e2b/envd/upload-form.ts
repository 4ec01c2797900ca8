// E2B's multipart upload form (envd POST /files, e2b.md (d)) re-encoded as the native one. E2B
// names each file's destination in its part's filename (parts named `file`, the full path), or
// for a single-file write in `?path=`; the native upload (host/agent-protocol/files.ts UPLOAD,
// simple form) takes a `path` text field before each `file` part. So the translation is one
// `path` field inserted before each such part; everything else is passed on as it came.
//
// It streams: busboy parses the client's form, each part is written out under a fresh boundary
// as the toolbox reads it (a generator behind Readable.from: it is pulled, so backpressure
// reaches the client socket), and nothing is buffered beyond a chunk.
import busboy from 'busboy';
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream';
import { NestboxError } from '../../../core/errors.js';
import { homeRelative } from '../target.js';

/** Text fields other than `file` only ever carry paths; anything longer is not one (the guest's limit too). */
const MAX_FIELD_BYTES = 64 * 1024;
/**
 * A `file` part without a filename is a text field to busboy (a browser's
 * `form.append('file', 'some text')`), which busboy holds in memory: at most this much.
 */
const MAX_TEXT_FILE_BYTES = 1024 * 1024;
const MULTIPART_FORM_DATA = /^multipart\/form-data\s*;/i;

export interface NativeUploadForm {
  contentType: string;
  body: Readable;
  /**
   * Why the client's form could not be translated, once it failed. The upstream request then
   * fails as a broken body ("socket hang up"), which is not what the client must hear: the
   * caller answers with this instead.
   */
  failure(): NestboxError | undefined;
}

type FormItem =
  | { kind: 'field'; name: string; value: string; truncated: boolean }
  | { kind: 'file'; name: string; part: Readable; filename: string | undefined }
  | { kind: 'end' }
  | { kind: 'error'; error: Error };

/**
 * The body's own failures (over the upload limit) keep their meaning; anything else came from
 * busboy reading the form (or the body breaking under it), as the guest agent words it.
 */
function formError(err: Error): NestboxError {
  return err instanceof NestboxError ? err : new NestboxError('validation_failed', `body: malformed multipart/form-data: ${err.message}`, { field: 'body' });
}

/** A part name inside `name="…"`: quotes and line breaks cannot be written there. */
function headerSafe(name: string): string {
  return name.replace(/["\\\r\n]/g, '_');
}

/**
 * The native form for E2B's: `source` is the (size-limited, possibly gunzipped) request body.
 * A part's destination is, as envd's: a preceding `path` field, else `?path=`, else the part's
 * filename (busboy with preservePath keeps the directories in it). With `home`, a relative
 * filename resolves in it (the request's user's home), as envd resolves it.
 */
export function nativeUploadForm(source: Readable, contentType: string, queryPath: string | undefined, home?: string): NativeUploadForm {
  if (!MULTIPART_FORM_DATA.test(contentType.trim())) {
    // Read and drop the body (bounded by the upload limit) so the 400 reaches a client still sending.
    source.resume();
    throw new NestboxError('validation_failed', `content-type: expected multipart/form-data with a boundary, got ${JSON.stringify(contentType)}`, { field: 'content-type' });
  }
  let parser: busboy.Busboy;
  try {
    parser = busboy({ headers: { 'content-type': contentType }, preservePath: true, limits: { fieldSize: MAX_TEXT_FILE_BYTES } });
  } catch (err) {
    source.resume();
    throw new NestboxError('validation_failed', `content-type: ${(err as Error).message}`, { field: 'content-type' });
  }

  // busboy pushes; the generator below pulls. Between them one small queue of parts in order
  // (a file part is read to its end before busboy emits the next one).
  const queue: FormItem[] = [];
  let wake: (() => void) | undefined;
  const push = (item: FormItem): void => {
    queue.push(item);
    wake?.();
  };
  parser.on('field', (name, value, info) => push({ kind: 'field', name, value, truncated: info.valueTruncated }));
  parser.on('file', (name, part, info) => {
    // busboy may destroy a part (form cut short) before it is read: its error is the form's,
    // reported through the pipeline below, and must not go unhandled here.
    part.on('error', () => {});
    push({ kind: 'file', name, part, filename: info.filename });
  });
  // Only a form read to its end closes the native one: a cut or malformed form must fail the
  // upload (the guest then discards the file in flight), never end it as if it were complete.
  parser.on('finish', () => push({ kind: 'end' }));
  pipeline(source, parser, (err) => {
    if (err) push({ kind: 'error', error: formError(err) });
  });

  let failure: NestboxError | undefined;
  const boundary = `nestbox-e2b-${randomBytes(16).toString('hex')}`;
  const partHead = (disposition: string, type?: string): Buffer =>
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; ${disposition}\r\n${type ? `Content-Type: ${type}\r\n` : ''}\r\n`);
  const textPart = (name: string, value: string): Buffer => Buffer.concat([partHead(`name="${headerSafe(name)}"`), Buffer.from(value, 'utf8'), Buffer.from('\r\n')]);

  async function* encode(): AsyncGenerator<Buffer> {
    let pathFieldPending = false;
    try {
      for (;;) {
        const item = queue.shift();
        if (!item) {
          await new Promise<void>((resolve) => (wake = resolve));
          wake = undefined;
          continue;
        }
        if (item.kind === 'error') throw (failure = formError(item.error));
        if (item.kind === 'end') {
          yield Buffer.from(`--${boundary}--\r\n`);
          return;
        }
        if (item.kind === 'field' && item.name === 'file') {
          // envd takes any part named `file` as a file, with or without a filename (its
          // destination then comes from `?path=` or a `path` field): so does this layer.
          if (item.truncated) {
            throw (failure = new NestboxError('payload_too_large', `file: a file part without a filename is read into memory, at most ${MAX_TEXT_FILE_BYTES} bytes; send it with a filename (as a file) instead`));
          }
          const destination = pathFieldPending ? undefined : queryPath;
          if (!pathFieldPending && !destination) {
            throw (failure = new NestboxError('validation_failed', 'file: a file part without a filename needs ?path= (or a preceding path field) to say where it goes', { field: 'file' }));
          }
          if (destination !== undefined) yield textPart('path', destination);
          pathFieldPending = false;
          yield partHead('name="file"; filename="file"', 'application/octet-stream');
          yield Buffer.from(item.value, 'utf8');
          yield Buffer.from('\r\n');
          continue;
        }
        if (item.kind === 'field') {
          if (item.truncated || Buffer.byteLength(item.value) > MAX_FIELD_BYTES) {
            throw (failure = new NestboxError('validation_failed', `${item.name}: text fields are at most ${MAX_FIELD_BYTES} bytes`, { field: item.name }));
          }
          if (item.name === 'path') pathFieldPending = true;
          yield textPart(item.name, item.value);
          continue;
        }
        if (item.name === 'file') {
          const destination = pathFieldPending ? undefined : queryPath || (item.filename && home !== undefined ? homeRelative(item.filename, home) : item.filename || undefined);
          if (destination !== undefined) yield textPart('path', destination);
          pathFieldPending = false;
        }
        yield partHead(`name="${headerSafe(item.name)}"; filename="file"`, 'application/octet-stream');
        try {
          for await (const chunk of item.part) yield chunk as Buffer;
        } catch (err) {
          // busboy destroys the part in flight with the error that broke the form.
          throw (failure = formError(err as Error));
        }
        yield Buffer.from('\r\n');
      }
    } finally {
      // The reader went away (or the form failed): stop parsing and let the body go.
      if (!parser.destroyed) parser.destroy();
    }
  }

  return { contentType: `multipart/form-data; boundary=${boundary}`, body: Readable.from(encode(), { objectMode: false }), failure: () => failure };
}
