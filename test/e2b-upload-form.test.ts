// E2B's multipart upload form re-encoded as the native one (compat/e2b/envd/upload-form.ts):
// what the guest agent receives, parsed back with busboy. No sandbox: the translation alone
// (the E2B contract tests drive the whole path with the real SDK).
import busboy from 'busboy';
import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { NestboxError } from '../core/errors.js';
import { nativeUploadForm } from '../compat/e2b/envd/upload-form.js';
import { multipartBody } from '../host/guest-agent/files-testing.js';

type Parsed = { kind: 'field' | 'file'; name: string; value: string };

/** The parts of a native form in order (files as text), the way the guest agent reads them. */
async function parse(form: { contentType: string; body: Readable }): Promise<Parsed[]> {
  const parts: Parsed[] = [];
  const pending: Promise<void>[] = [];
  const parser = busboy({ headers: { 'content-type': form.contentType } });
  parser.on('field', (name, value) => parts.push({ kind: 'field', name, value }));
  parser.on('file', (name, stream) => {
    const entry: Parsed = { kind: 'file', name, value: '' };
    parts.push(entry);
    pending.push(
      (async () => {
        for await (const chunk of stream) entry.value += (chunk as Buffer).toString('utf8');
      })(),
    );
  });
  await new Promise<void>((resolve, reject) => {
    parser.once('finish', resolve);
    parser.once('error', reject);
    form.body.once('error', reject);
    form.body.pipe(parser);
  });
  await Promise.all(pending);
  return parts;
}

/** A client body in chunks of 5 bytes, so parts straddle chunk boundaries. */
function chunked(body: Buffer): Readable {
  const chunks: Buffer[] = [];
  for (let at = 0; at < body.length; at += 5) chunks.push(body.subarray(at, at + 5));
  return Readable.from(chunks);
}

describe('E2B upload form → native form', () => {
  it('turns each full-path filename into a path field before its file part', async () => {
    const e2b = multipartBody([
      { field: 'file', value: 'B', filename: '/home/user/a/b.txt' },
      { field: 'file', value: 'C'.repeat(10_000), filename: '/tmp/c.txt' },
    ]);
    const parts = await parse(nativeUploadForm(chunked(e2b.body), e2b.contentType, undefined));
    expect(parts).toEqual([
      { kind: 'field', name: 'path', value: '/home/user/a/b.txt' },
      { kind: 'file', name: 'file', value: 'B' },
      { kind: 'field', name: 'path', value: '/tmp/c.txt' },
      { kind: 'file', name: 'file', value: 'C'.repeat(10_000) },
    ]);
  });

  it('gives ?path= to every part, and keeps a path field the client sent', async () => {
    const single = multipartBody([{ field: 'file', value: 'Q', filename: 'ignored.txt' }]);
    expect(await parse(nativeUploadForm(chunked(single.body), single.contentType, 'from/query.txt'))).toEqual([
      { kind: 'field', name: 'path', value: 'from/query.txt' },
      { kind: 'file', name: 'file', value: 'Q' },
    ]);
    const simple = multipartBody([{ field: 'path', value: 'own/path.txt' }, { field: 'file', value: 'S', filename: 'x' }]);
    expect(await parse(nativeUploadForm(chunked(simple.body), simple.contentType, 'from/query.txt'))).toEqual([
      { kind: 'field', name: 'path', value: 'own/path.txt' },
      { kind: 'file', name: 'file', value: 'S' },
    ]);
  });

  it('passes other parts on as they came, without a destination (the guest judges them)', async () => {
    const form = multipartBody([
      { field: 'note', value: 'no filename: a text field', filename: '' },
      { field: 'other', value: 'O', filename: '/tmp/o' },
    ]);
    expect(await parse(nativeUploadForm(chunked(form.body), form.contentType, undefined))).toEqual([
      { kind: 'field', name: 'note', value: 'no filename: a text field' },
      { kind: 'file', name: 'other', value: 'O' },
    ]);
  });

  it("refuses a 'file' text field (no filename) with nowhere to go, naming it; envd writes one to ?path=", async () => {
    const form = multipartBody([{ field: 'file', value: 'no filename: a text field', filename: '' }]);
    const error = await parse(nativeUploadForm(chunked(form.body), form.contentType, undefined)).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(NestboxError);
    expect((error as NestboxError).message).toMatch(/^file: /);
  });

  it('refuses a content type without a boundary, naming it', () => {
    for (const contentType of ['multipart/form-data', 'multipart/form-data; charset=utf-8']) {
      let caught: unknown;
      try {
        nativeUploadForm(Readable.from([]), contentType, undefined);
      } catch (err) {
        caught = err;
      }
      expect(caught, contentType).toBeInstanceOf(NestboxError);
      expect((caught as NestboxError).code).toBe('validation_failed');
      expect((caught as NestboxError).message).toMatch(/^content-type: /);
    }
  });

  it('fails the native form (never ends it as complete) when the client form is cut short', async () => {
    const e2b = multipartBody([{ field: 'file', value: 'whole', filename: '/tmp/one' }, { field: 'file', value: 'cut', filename: '/tmp/two' }]);
    const cut = e2b.body.subarray(0, e2b.body.length - 12);
    const form = nativeUploadForm(chunked(cut), e2b.contentType, undefined);
    const error = await parse(form).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(NestboxError);
    expect((error as NestboxError).message).toMatch(/^body: malformed multipart\/form-data: /);
  });

  it('keeps the body limit’s own error (413) when the body breaks under the form', async () => {
    const tooLarge = new NestboxError('payload_too_large', 'body: too large');
    const e2b = multipartBody([{ field: 'file', value: 'x'.repeat(100), filename: '/tmp/big' }]);
    const source = new Readable({ read() {} });
    source.push(e2b.body.subarray(0, 120));
    setImmediate(() => source.destroy(tooLarge));
    const error = await parse(nativeUploadForm(source, e2b.contentType, undefined)).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(error).toBe(tooLarge);
  });
});
