// fast-check arbitraries for the fuzz suite: hostile text, URL encodings, JSON values built
// from the native OpenAPI schemas (then mutated), headers and bodies.
import fc from 'fast-check';

/** Text that has broken servers before: NUL, lone surrogates, huge, unicode, traversal, encodings. */
export const SPECIAL_STRINGS = [
  '', ' ', '\0', 'a\0b', '\uD800', 'x\uDFFFy', '..', '../../../etc/passwd', '.', '~', '~/', '%00', '%ED%A0%80', '%', '%zz',
  '𝒳𝒴', 'مرحبا', '\u202Eevil', 'é', '\r\n', '\t', "'; DROP TABLE sandboxes; --", '${HOME}', '$(id)', '`id`', 'null', 'true', '-1',
  '0', '1e309', 'NaN', '{}', '[]', '<script>', 'x'.repeat(70_000),
];

export const fuzzText: fc.Arbitrary<string> = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 40 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary', maxLength: 20 }) },
  { weight: 1, arbitrary: fc.string({ unit: 'grapheme', maxLength: 10 }) },
  { weight: 3, arbitrary: fc.constantFrom(...SPECIAL_STRINGS) },
  { weight: 1, arbitrary: fc.tuple(fc.string({ maxLength: 8 }), fc.constantFrom('\0', '\uD800', '/', '%', '\n')).map(([a, b]) => a + b + a) },
);

/** A string with no `/` and not `.`/`..`, for paths that must stay inside the fuzz directory. */
export const fuzzName: fc.Arbitrary<string> = fuzzText.map((s) => {
  const t = s.replace(/\//g, '_').slice(0, 200);
  return t === '' || t === '.' || t === '..' ? 'x' : t;
});

/** Where write operations may touch the sandbox: under /tmp/fuzz, never above it. */
export const FUZZ_DIR = '/tmp/fuzz';
export const writePath: fc.Arbitrary<string> = fc.oneof(
  fuzzName.map((n) => `${FUZZ_DIR}/${n}`),
  fc.tuple(fuzzName, fuzzName).map(([a, b]) => `${FUZZ_DIR}/${a}/${b}`),
  fc.constant(FUZZ_DIR),
);
export const readPath: fc.Arbitrary<string> = fc.oneof(
  writePath,
  fc.constantFrom('/', '/etc/passwd', '/proc/self/status', '/root', '~', '.', '..', '', '/nonexistent/x', '/tmp'),
  fuzzText,
);

/** Commands that end at once whatever their arguments: the fuzzer never starts a shell it cannot stop. */
export function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}
/** Commands that are also valid input (no NUL, not empty). */
export const validCommand: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom('true', 'echo hi', 'exit 3', 'sleep 0.05', 'echo err >&2', 'printf "\\x00\\xff"'),
  fuzzText.filter((s) => !s.includes('\0')).map((s) => `printf %s ${shellQuote(s)}`),
);
export const safeCommand: fc.Arbitrary<string> = fc.oneof(validCommand, fc.constantFrom('a\0b', '', 'x'.repeat(70_000)));

/** A URL path segment or query value, encoded in ways clients get right and wrong. */
export const encodedSegment = (value: fc.Arbitrary<string>): fc.Arbitrary<string> =>
  fc.oneof(
    { weight: 4, arbitrary: value.map(safeEncode) },
    { weight: 1, arbitrary: fc.constantFrom('%ED%A0%80', '%00', '%', '%zz', '%C0%AF', '%FF%FE', 'a%2Fb', '%2e%2e', '..', '%u0041', '\u00ff\u00e9', '%E2%82') },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 12 }).map((b) => [...b].map((x) => `%${x.toString(16).padStart(2, '0')}`).join('')) },
    // Raw latin-1 bytes on the wire (node sends 0x80–0xff unescaped): invalid UTF-8.
    { weight: 1, arbitrary: fc.string({ unit: fc.integer({ min: 0x21, max: 0xff }).map((c) => String.fromCharCode(c)), maxLength: 10 }).map((s) => s.replace(/[?#/]/g, '_')) },
  );

export function safeEncode(s: string): string {
  try {
    return encodeURIComponent(s);
  } catch {
    // A lone surrogate: send what a sloppy client would, the CESU-style bytes.
    return [...Buffer.from(s, 'latin1')].map((x) => `%${x.toString(16).padStart(2, '0')}`).join('');
  }
}

export const queryString = (pairs: fc.Arbitrary<[string, string][]>): fc.Arbitrary<string> =>
  pairs.map((p) => (p.length ? `?${p.map(([k, v]) => `${k}=${v}`).join('&')}` : ''));

// ---- JSON from schemas ----------------------------------------------------------------------

export type Schema = Record<string, unknown>;

export interface SchemaContext {
  resolve(ref: string): Schema;
  /** Fields whose values must come from elsewhere (paths of write operations, commands). */
  override?: (name: string) => fc.Arbitrary<unknown> | undefined;
  /** Values the schema accepts (plain strings, numbers in range, required fields): requests that get past validation. */
  valid?: boolean;
}

/** A string that fits most `type: string` fields (and the id patterns). */
const plainString = fc.string({ minLength: 1, maxLength: 12, unit: fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789') });

const anyJson: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  fuzzText,
  fc.constantFrom(null, -1, 0, 1e308, -0, 2 ** 53 + 1, '', [], {}),
);

/** A value that is usually valid for the schema and sometimes subtly not. */
export function fromSchema(schema: Schema | undefined, ctx: SchemaContext, depth = 0): fc.Arbitrary<unknown> {
  if (ctx.valid && schema && depth <= 5) return validFromSchema(schema, ctx, depth);
  if (!schema || depth > 5) return anyJson;
  if (typeof schema.$ref === 'string') return fromSchema(ctx.resolve(schema.$ref), ctx, depth + 1);
  const variants = (schema.oneOf ?? schema.anyOf ?? schema.allOf) as Schema[] | undefined;
  if (variants?.length) return fc.oneof(...variants.map((v) => fromSchema(v, ctx, depth + 1)));
  if (Array.isArray(schema.enum)) return fc.oneof({ weight: 5, arbitrary: fc.constantFrom(...(schema.enum as unknown[])) }, { weight: 1, arbitrary: fuzzText });
  switch (schema.type) {
    case 'string':
      return fc.oneof({ weight: 2, arbitrary: fuzzText }, { weight: 1, arbitrary: fc.string({ minLength: 1, maxLength: 12, unit: fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789') }) });
    case 'integer':
    case 'number': {
      const min = typeof schema.minimum === 'number' ? schema.minimum : -1000;
      const max = typeof schema.maximum === 'number' ? schema.maximum : 100_000;
      return fc.oneof(
        // A minimum above the usual range (a volume's 64 MiB) still gives a non-empty range.
        { weight: 4, arbitrary: fc.integer({ min: Math.max(min, -1e6), max: Math.max(Math.max(min, -1e6), Math.min(max, 1e6)) }) },
        { weight: 1, arbitrary: fc.constantFrom(min - 1, max + 1, 1.5, -1, 2 ** 31, 2 ** 63, '5') },
      );
    }
    case 'boolean':
      return fc.oneof({ weight: 5, arbitrary: fc.boolean() }, { weight: 1, arbitrary: fc.constantFrom('true', 0, null) });
    case 'array':
      return fc.oneof(
        { weight: 5, arbitrary: fc.array(fromSchema(schema.items as Schema, ctx, depth + 1), { maxLength: 4 }) },
        { weight: 1, arbitrary: anyJson },
      );
    case 'object':
    default: {
      const props = (schema.properties ?? {}) as Record<string, Schema>;
      const names = Object.keys(props);
      if (!names.length) {
        const values = typeof schema.additionalProperties === 'object' ? fromSchema(schema.additionalProperties as Schema, ctx, depth + 1) : anyJson;
        return fc.dictionary(fuzzText.map((k) => k.slice(0, 50)), values, { maxKeys: 4 });
      }
      const record: Record<string, fc.Arbitrary<unknown>> = {};
      const free: string[] = [];
      for (const n of names) {
        const fixed = ctx.override?.(n);
        if (!fixed) free.push(n);
        record[n] = fixed ?? fromSchema(props[n], ctx, depth + 1);
      }
      const required = (schema.required ?? []) as string[];
      // Mutations never touch overridden fields: those keep writes under /tmp/fuzz.
      const mutable = free.length ? free : ['extra'];
      return fc.oneof(
        { weight: 6, arbitrary: fc.record(record, { requiredKeys: required.filter((r) => names.includes(r)) }) },
        // An unknown field, a missing required one, a wrong-typed one.
        { weight: 1, arbitrary: fc.tuple(fc.record(record), fuzzText, anyJson).map(([o, k, v]) => (k in o ? o : { ...o, [k.slice(0, 30) || 'extra']: v })) },
        { weight: 1, arbitrary: fc.tuple(fc.record(record), fc.constantFrom(...mutable), anyJson).map(([o, k, v]) => ({ ...o, [k]: v })) },
        { weight: 1, arbitrary: anyJson },
      );
    }
  }
}

function validFromSchema(schema: Schema, ctx: SchemaContext, depth: number): fc.Arbitrary<unknown> {
  if (typeof schema.$ref === 'string') return fromSchema(ctx.resolve(schema.$ref), ctx, depth + 1);
  const variants = (schema.oneOf ?? schema.anyOf) as Schema[] | undefined;
  if (variants?.length) return fc.oneof(...variants.map((v) => fromSchema(v, ctx, depth + 1)));
  if (Array.isArray(schema.enum)) return fc.constantFrom(...(schema.enum as unknown[]));
  switch (schema.type) {
    case 'string':
      if (typeof schema.pattern === 'string') {
        const max = typeof schema.maxLength === 'number' ? schema.maxLength : 200;
        return fc.stringMatching(new RegExp(schema.pattern)).filter((s) => s.length <= max && s.length >= (typeof schema.minLength === 'number' ? schema.minLength : 0));
      }
      return typeof schema.format === 'string' && schema.format === 'date-time' ? fc.date({ noInvalidDate: true }).map((d) => d.toISOString()) : fc.oneof({ weight: 3, arbitrary: plainString }, { weight: 1, arbitrary: fuzzText.filter((s) => s.length > 0 && s.length < 200 && !s.includes('\0')) });
    case 'integer':
    case 'number':
      return fc.integer({ min: typeof schema.minimum === 'number' ? schema.minimum : 0, max: Math.max(typeof schema.minimum === 'number' ? schema.minimum : 0, typeof schema.maximum === 'number' ? Math.min(schema.maximum, 1e6) : 1000) });
    case 'boolean':
      return fc.boolean();
    case 'array':
      return fc.array(fromSchema(schema.items as Schema, ctx, depth + 1), { minLength: typeof schema.minItems === 'number' ? schema.minItems : 0, maxLength: 3 });
    default: {
      const props = (schema.properties ?? {}) as Record<string, Schema>;
      const names = Object.keys(props);
      if (!names.length) return fc.dictionary(plainString, typeof schema.additionalProperties === 'object' ? fromSchema(schema.additionalProperties as Schema, ctx, depth + 1) : plainString, { maxKeys: 3 });
      const record: Record<string, fc.Arbitrary<unknown>> = {};
      for (const n of names) record[n] = ctx.override?.(n) ?? fromSchema(props[n], ctx, depth + 1);
      return fc.record(record, { requiredKeys: ((schema.required ?? []) as string[]).filter((r) => names.includes(r)) });
    }
  }
}

// ---- bodies and headers ---------------------------------------------------------------------

export interface FuzzBody {
  contentType?: string;
  contentEncoding?: string;
  data?: Buffer;
}

export const CONTENT_TYPES = [
  'application/json', 'application/json; charset=utf-8', 'application/json; charset=latin1', 'application/json; charset=utf-16',
  'application/json;charset=bogus', 'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data',
  'multipart/form-data; boundary=zz', 'application/octet-stream', 'application/proto', 'application/connect+json',
  'application/connect+proto', 'application/grpc', 'application/grpc-web+proto', 'application/merge-patch+json', '*/*', 'garbage',
];

/** A request body: the schema's JSON (as JSON or under a wrong type/charset), raw garbage, or nothing. */
export function bodyFrom(json: fc.Arbitrary<unknown>): fc.Arbitrary<FuzzBody> {
  return fc.oneof(
    { weight: 6, arbitrary: json.map((v) => ({ contentType: 'application/json', data: Buffer.from(JSON.stringify(v) ?? 'null') })) },
    { weight: 2, arbitrary: fc.tuple(json, fc.constantFrom(...CONTENT_TYPES)).map(([v, ct]) => ({ contentType: ct, data: Buffer.from(JSON.stringify(v) ?? 'null') })) },
    { weight: 1, arbitrary: fc.constantFrom('{', '{"a":', '[1,2', 'nul', '\u0000', '{"a":"\\u0000"}', '{"a":"\\ud800"}', '"str"', '1e999', '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]').map((t) => ({ contentType: 'application/json', data: Buffer.from(t) })) },
    { weight: 1, arbitrary: fc.tuple(fc.uint8Array({ maxLength: 64 }), fc.constantFrom(...CONTENT_TYPES)).map(([b, ct]) => ({ contentType: ct, data: Buffer.from(b) })) },
    { weight: 1, arbitrary: fc.tuple(json, fc.constantFrom('gzip', 'deflate', 'br', 'bogus', 'identity')).map(([v, enc]) => ({ contentType: 'application/json', contentEncoding: enc, data: Buffer.from(JSON.stringify(v) ?? 'null') })) },
    { weight: 1, arbitrary: fc.constant({}) },
  );
}

/** Header values must be latin-1 without control characters, or node refuses to send them. */
export function headerSafe(s: string): string {
  return s.replace(/[^\x20-\x7e\x80-\xff]/g, '?').slice(0, 4000);
}
