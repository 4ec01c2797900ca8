// What the fuzzer sends: one fast-check arbitrary of requests per API, built from
// openapi/native.yaml for the native API and from route tables for Daytona and E2B.
// Rules that keep the two real sandboxes usable (and the run short):
// - operations that create, stop, delete, fork, snapshot or re-configure sandboxes (or keys) go
//   to an id that does not exist, or with a key that lacks the scope: they reach validation,
//   routing and auth, never the action;
// - writes stay under /tmp/fuzz, listings and searches never start at `/`;
// - commands are ones that end at once (safeCommand), Connect process starts get a timeout.
import fc from 'fast-check';
import { create, fromJson, toBinary, type DescMessage, type JsonValue } from '@bufbuild/protobuf';
import {
  CloseStdinRequestSchema, ConnectRequestSchema, ListRequestSchema, SendInputRequestSchema, SendSignalRequestSchema, StartRequestSchema, StreamInputRequestSchema, UpdateRequestSchema,
} from '../../compat/e2b/gen/process/process_pb.js';
import {
  CreateWatcherRequestSchema, GetWatcherEventsRequestSchema, ListDirRequestSchema, MakeDirRequestSchema, MoveRequestSchema, RemoveRequestSchema, RemoveWatcherRequestSchema, StatRequestSchema, WatchDirRequestSchema,
} from '../../compat/e2b/gen/filesystem/filesystem_pb.js';
import {
  validCommand, bodyFrom, encodedSegment, fromSchema, fuzzName, fuzzText, headerSafe, queryString, readPath, safeCommand, safeEncode, writePath, FUZZ_DIR, type FuzzBody, type Schema,
} from './arbitraries.js';
import type { ApiShape, FuzzRequest } from './client.js';

export interface FuzzTargets {
  /** A running sandbox the fuzzer may read, write under /tmp/fuzz and run short commands in. */
  sandboxId: string;
  /** A valid-looking id that names no sandbox. */
  missingId: string;
  adminKey: string;
  readOnlyKey: string;
  envdToken: string;
}

/** Listings and searches: small places only (a recursive walk of `/` can take longer than any deadline). */
const boundedReadPath: fc.Arbitrary<string> = fc.oneof(writePath, fc.constantFrom('/etc/hostname', '/nonexistent', '/etc/apt'), fuzzName);

type Auth = 'admin' | 'readonly';

const authHeader = (t: FuzzTargets, auth: Auth, style: 'bearer' | 'x-api-key'): fc.Arbitrary<Record<string, string>> => {
  const key = auth === 'admin' ? t.adminKey : t.readOnlyKey;
  const valid: Record<string, string> = style === 'bearer' ? { authorization: `Bearer ${key}` } : { 'x-api-key': key };
  const h = (a: fc.Arbitrary<Record<string, string>>) => a;
  return fc.oneof(
    { weight: 8, arbitrary: h(fc.constant(valid)) },
    { weight: 1, arbitrary: h(fc.constant({})) },
    { weight: 1, arbitrary: h(fuzzText.map((s): Record<string, string> => (style === 'bearer' ? { authorization: headerSafe(`Bearer ${s}`) } : { 'x-api-key': headerSafe(s) }))) },
    { weight: 1, arbitrary: h(fc.constantFrom<Record<string, string>>({ authorization: 'Basic Og==' }, { authorization: 'Bearer' }, { authorization: `Bearer ${key}x` }, { authorization: `bearer ${key}` }, { 'x-api-key': key }, { authorization: `Bearer ${t.readOnlyKey}` })) },
  );
};

function withBody(method: string, path: string, headers: Record<string, string>, body: FuzzBody, api: ApiShape, label: string): FuzzRequest {
  const h = { ...headers };
  if (body.contentType) h['content-type'] = body.contentType;
  if (body.contentEncoding) h['content-encoding'] = body.contentEncoding;
  return { api, label, method, path, headers: h, body: body.data };
}

// ---- native ----------------------------------------------------------------------------------

/** Operations that would change the fuzzed sandbox's life (or create costly things): never with the right scope. */
const NATIVE_GUARDED = new Set([
  'createSandbox', 'deleteSandbox', 'updateSandbox', 'stopSandbox', 'resumeSandbox', 'pauseSandbox', 'unpauseSandbox', 'forkSandbox',
  'createSnapshot', 'deleteSnapshot', 'createApiKey', 'deleteApiKey',
  // Builds and pulls start sandboxes and would ask registries outside (a fuzzed FROM or
  // reference names Docker Hub): they are fuzzed up to validation and the scope check only.
  'createBuild', 'pullImage', 'cancelBuild', 'deleteImage', 'tagImage', 'uploadBuildContext',
  // A terminal's default shell lives until killed; the WebSocket part fuzzes one made on purpose.
  'createTerminal',
  // Each starts a Jupyter kernel (tens of MiB that live until deleted or reaped): hundreds of
  // them would exhaust the fuzzed sandbox's memory. Runs still reach the default context.
  'createCodeContext', 'restartCodeContext',
  // The operator's organisation admin: a fuzzed suspension or limit would change the server for every case.
  'createOrganization', 'updateOrganization', 'createOrganizationApiKey',
]);
/** Code-interpreter runs: cells and scripts that end at once (the kernel is a real one). */
const CODE_RUNS = new Set(['runCode', 'runCodeScript']);
const safeCode = fc.constantFrom('1+1', 'print("fuzz")', 'x = 1', '1/0', 'import sys; sys.stderr.write("e\\n")', '', '"\u00e9"', 'console.log(1)', 'echo fuzz');
/** Write operations: every path-like field stays under /tmp/fuzz. */
const PATH_FIELDS = new Set(['path', 'from', 'to', 'source', 'destination', 'paths', 'files', 'cwd']);

interface NativeOperation {
  operationId: string;
  method: string;
  template: string;
  scope?: string;
  params: { name: string; in: string; required?: boolean; schema?: Schema }[];
  bodySchema?: Schema;
  bodyType?: string;
}

export function nativeOperations(spec: Record<string, unknown>): NativeOperation[] {
  const resolve = (ref: string): Schema => ref.replace(/^#\//, '').split('/').reduce<Record<string, unknown>>((o, k) => o[k] as Record<string, unknown>, spec) as Schema;
  const deref = (x: Schema): Schema => (typeof x.$ref === 'string' ? resolve(x.$ref) : x);
  const ops: NativeOperation[] = [];
  for (const [template, item] of Object.entries(spec.paths as Record<string, Record<string, unknown>>)) {
    const shared = ((item.parameters ?? []) as Schema[]).map(deref);
    for (const method of ['get', 'post', 'put', 'patch', 'delete']) {
      const op = item[method] as Record<string, unknown> | undefined;
      if (!op) continue;
      const params = [...shared, ...((op.parameters ?? []) as Schema[]).map(deref)] as NativeOperation['params'];
      const content = ((op.requestBody as Schema | undefined)?.content ?? {}) as Record<string, { schema?: Schema }>;
      const bodyType = Object.keys(content)[0];
      ops.push({ operationId: String(op.operationId), method: method.toUpperCase(), template, scope: op['x-nestbox-scope'] as string | undefined, params, bodySchema: bodyType ? content[bodyType].schema : undefined, bodyType });
    }
  }
  return ops;
}

export function nativeRequests(spec: Record<string, unknown>, t: FuzzTargets): fc.Arbitrary<FuzzRequest> {
  const resolve = (ref: string): Schema => ref.replace(/^#\//, '').split('/').reduce<Record<string, unknown>>((o, k) => o[k] as Record<string, unknown>, spec) as Schema;
  const ops = nativeOperations(spec);
  // Half the requests are well formed (they get past validation into core and the sandbox),
  // half hostile (odd encodings, wrong types, bad auth, garbage bodies).
  return fc.oneof(...ops.flatMap((op) => [nativeOperation(op, t, resolve, true), nativeOperation(op, t, resolve, false)]));
}

function nativeOperation(op: NativeOperation, t: FuzzTargets, resolve: (ref: string) => Schema, valid: boolean): fc.Arbitrary<FuzzRequest> {
  const guarded = NATIVE_GUARDED.has(op.operationId);
  const writes = op.scope === 'files:write';
  const exec = op.scope === 'sandboxes:exec';
  const override = (name: string): fc.Arbitrary<unknown> | undefined => {
    if (exec && name === 'cmd') return valid ? validCommand : safeCommand;
    if (exec && name === 'argv') return fc.tuple(fc.constantFrom('/bin/echo', '/bin/true', 'printf', '/nonexistent', ''), fc.array(fuzzText, { maxLength: 3 })).map(([a, rest]) => [a, ...rest]);
    if (exec && name === 'shell') return fc.constantFrom('/bin/true', '/nonexistent/sh', 'relative', 'a\0b', '');
    if (exec && name === 'timeoutMs') return fc.integer({ min: 1, max: 3000 });
    if (exec && name === 'code') return valid ? safeCode : fc.oneof(safeCode, fuzzText);
    // Node prints a JavaScript stack trace for a program that fails to parse, which the judge
    // would take for a leak of ours: scripts are fuzzed in python (and refused languages).
    if (op.operationId === 'runCodeScript' && name === 'language') return valid ? fc.constant('python') : fc.constantFrom('python', 'cobol', '');
    if (writes && PATH_FIELDS.has(name)) return name === 'paths' || name === 'files' ? fc.array(writePath, { maxLength: 3 }) : writePath;
    if (name === 'path' || name === 'paths') return name === 'paths' ? fc.array(boundedReadPath, { maxLength: 3 }) : op.operationId === 'statFile' ? readPath : boundedReadPath;
    return undefined;
  };
  const ctx = { resolve, override, valid };
  const pathParams = op.params.filter((p) => p.in === 'path');
  const queryParams = op.params.filter((p) => p.in === 'query');
  const segment = (p: NativeOperation['params'][number]): fc.Arbitrary<string> => {
    if (valid) return p.name === 'sandboxId' ? fc.constant(guarded ? t.missingId : t.sandboxId) : fromSchema(p.schema, ctx).map((v) => safeEncode(String(v)));
    if (p.name === 'sandboxId') {
      return fc.oneof({ weight: 6, arbitrary: fc.constant(guarded ? t.missingId : t.sandboxId) }, { weight: 1, arbitrary: fc.constant(t.missingId) }, { weight: 2, arbitrary: encodedSegment(fuzzText) });
    }
    return fc.oneof({ weight: 3, arbitrary: fromSchema(p.schema, ctx).map((v) => safeEncode(String(v))) }, { weight: 2, arbitrary: encodedSegment(fuzzText) });
  };
  const query = fc.tuple(
    ...queryParams.map((p) => {
      const fixed = override(p.name);
      // Constrained fields (write paths) keep their constraint: no free-form alternative.
      const value = fixed || valid ? (fixed ?? fromSchema(p.schema, ctx)).map((v) => safeEncode(String(v))) : fc.oneof({ weight: 3, arbitrary: fromSchema(p.schema, ctx).map((v) => safeEncode(String(v))) }, { weight: 1, arbitrary: encodedSegment(fuzzText) });
      const pair = value.map((v) => [p.name, v] as [string, string]);
      return valid && p.required ? pair : fc.option(pair, { nil: undefined });
    }),
    valid ? fc.constant(undefined) : fc.option(fc.tuple(encodedSegment(fuzzText), encodedSegment(fuzzText)), { nil: undefined, freq: 8 }),
  ).map((pairs) => pairs.filter((x): x is [string, string] => x !== undefined));
  // Guarded operations reach validation and auth, never the action: a key without the scope.
  const authAs = guarded || (exec && op.template.endsWith('/sessions')) ? 'readonly' : 'admin';
  const auth = valid ? fc.constant({ authorization: `Bearer ${authAs === 'admin' ? t.adminKey : t.readOnlyKey}` }) : authHeader(t, authAs, 'bearer');
  const body: fc.Arbitrary<FuzzBody> = valid
    ? op.bodyType === 'multipart/form-data' ? multipart('file')
      : op.bodyType && op.bodyType !== 'application/json' ? fc.uint8Array({ maxLength: 256 }).map((b) => ({ contentType: op.bodyType, data: Buffer.from(b) }))
      : op.bodySchema ? fromSchema(op.bodySchema, ctx).map((v) => ({ contentType: 'application/json', data: Buffer.from(JSON.stringify(op.operationId === 'runCommand' ? oneOfCmdArgv(v) : CODE_RUNS.has(op.operationId) ? boundedCodeRun(v) : v)) }))
      : fc.constant({})
    : op.bodyType && op.bodyType !== 'application/json'
    ? fc.oneof(fc.uint8Array({ maxLength: 256 }).map((b) => ({ contentType: op.bodyType, data: Buffer.from(b) })), bodyFrom(fromSchema(undefined, ctx)))
    : op.bodySchema ? bodyFrom(fromSchema(op.bodySchema, ctx)) : fc.oneof({ weight: 4, arbitrary: fc.constant({} as FuzzBody) }, { weight: 1, arbitrary: bodyFrom(fromSchema(undefined, ctx)) });
  // Only methods that read: a mutated DELETE on /sandboxes/{id} would be deleteSandbox.
  const method = valid ? fc.constant(op.method) : fc.oneof({ weight: 12, arbitrary: fc.constant(op.method) }, { weight: 1, arbitrary: fc.constantFrom('GET', 'HEAD', 'OPTIONS', 'TRACE', 'PROPFIND') });
  return fc.tuple(method, fc.tuple(...pathParams.map(segment)), queryString(query), auth, body).map(([m, segs, qs, headers, b]) => {
    let path = `/api/v1${op.template}`;
    pathParams.forEach((p, i) => { path = path.replace(`{${p.name}}`, segs[i] || 'x'); });
    // Stream routes answer a plain GET with 400 (they need SSE or a WebSocket).
    const h = valid && /\/(stream|watch)$/.test(op.template) ? { ...headers, accept: 'text/event-stream' } : headers;
    return withBody(m, path + qs, h, m === op.method && m !== 'GET' ? b : {}, 'native', `native ${op.operationId}${valid ? '' : ' (hostile)'}`);
  });
}

/** runCommand takes exactly one of cmd and argv. */
function oneOfCmdArgv(v: unknown): unknown {
  const o = { ...(v as Record<string, unknown>) };
  if (o.cmd !== undefined && o.argv !== undefined) delete o.argv;
  if (o.cmd === undefined && o.argv === undefined) o.cmd = 'true';
  return o;
}

/** A well-formed code run always has a timeout (the cell or script is cut within 3 s) and at most one of contextId and language. */
function boundedCodeRun(v: unknown): unknown {
  const o = { ...(v as Record<string, unknown>) };
  if (o.timeoutMs === undefined) o.timeoutMs = 2000;
  if (o.contextId !== undefined && o.language !== undefined) delete o.contextId;
  return o;
}

// ---- Daytona ---------------------------------------------------------------------------------

interface RouteSpec {
  method: string;
  /** `:id` is the sandbox, other `:name`s are fuzzed segments. */
  path: string;
  guarded?: boolean;
  query?: Record<string, fc.Arbitrary<string>>;
  body?: fc.Arbitrary<unknown>;
  raw?: fc.Arbitrary<FuzzBody>;
}

const obj = (fields: Record<string, fc.Arbitrary<unknown>>): fc.Arbitrary<unknown> =>
  fc.oneof({ weight: 5, arbitrary: fc.record(fields, { requiredKeys: [] }) }, { weight: 1, arbitrary: fromSchema(undefined, { resolve: () => ({}) }) });
const small = fc.oneof(fc.integer({ min: 0, max: 3 }), fc.constantFrom(-1, 1.5, '2', null, 1e9));
const envs = fc.dictionary(fuzzText.map((k) => k.slice(0, 20)), fuzzText, { maxKeys: 3 });
/** A multipart body whose file parts all land under /tmp/fuzz. */
const multipart = (field: string): fc.Arbitrary<FuzzBody> => fc.tuple(writePath, fc.uint8Array({ maxLength: 64 })).map(([p, data]) => ({
  contentType: 'multipart/form-data; boundary=fuzzb',
  data: Buffer.concat([Buffer.from(`--fuzzb\r\nContent-Disposition: form-data; name="${field}"; filename="${p.replace(/["\r\n]/g, '_')}"\r\nContent-Type: application/octet-stream\r\n\r\n`), Buffer.from(data), Buffer.from('\r\n--fuzzb--\r\n')]),
}));

const DAYTONA_API: RouteSpec[] = [
  { method: 'GET', path: '/config' },
  { method: 'POST', path: '/sandbox', guarded: true, body: obj({ snapshot: fuzzText, user: fuzzText, env: envs, labels: envs, cpu: small, memory: small, disk: small, autoStopInterval: small, public: fc.boolean(), networkBlockAll: fc.boolean() }) },
  { method: 'GET', path: '/sandbox', query: { labels: fuzzText.map(safeEncode), verbose: fc.constantFrom('true', 'x') } },
  { method: 'GET', path: '/sandbox/paginated', query: { page: fuzzText.map(safeEncode), limit: fc.constantFrom('1', '0', '-1', '1000000', 'abc'), labels: fuzzText.map(safeEncode), states: fuzzText.map(safeEncode) } },
  { method: 'GET', path: '/sandbox/:id' },
  { method: 'GET', path: '/sandbox/:id/toolbox-proxy-url' },
  ...['start', 'stop', 'archive', 'recover', 'pause', 'fork', 'snapshot'].map((a) => ({ method: 'POST', path: `/sandbox/:id/${a}`, guarded: true, body: obj({ name: fuzzText, timeout: small }) })),
  { method: 'DELETE', path: '/sandbox/:id', guarded: true },
  { method: 'PUT', path: '/sandbox/:id/labels', body: obj({ labels: envs }) },
  ...['autostop', 'autoarchive', 'autodelete'].map((a) => ({ method: 'POST', path: `/sandbox/:id/${a}/:minutes`, guarded: true })),
  { method: 'POST', path: '/sandbox/:id/last-activity' },
  { method: 'GET', path: '/sandbox/:id/signing-key' },
  { method: 'GET', path: '/sandbox/:id/ports/:port/preview-url' },
  { method: 'GET', path: '/sandbox/:id/ports/:port/signed-preview-url', query: { expiresInSeconds: fc.constantFrom('0', '60', '-5', 'x', '99999999999') } },
  { method: 'GET', path: '/snapshots', query: { page: fuzzText.map(safeEncode), limit: fuzzText.map(safeEncode) } },
  { method: 'GET', path: '/snapshots/:snapshot' },
  { method: 'DELETE', path: '/snapshots/:snapshot', guarded: true },
  { method: 'POST', path: '/snapshots/:snapshot/activate', guarded: true },
  { method: 'POST', path: '/snapshots', guarded: true, body: obj({ name: fuzzText, imageName: fuzzText }) },
  { method: 'GET', path: '/snapshots/:snapshot/build-logs-url' },
  { method: 'GET', path: '/volumes' },
  { method: 'POST', path: '/secret/:name' },
  { method: 'GET', path: '/warm-pools' },
  { method: 'GET', path: '/warm-pools/:pool' },
  // Guarded (a read-only key): a valid pool would keep sandboxes running for the rest of the run.
  { method: 'POST', path: '/warm-pools', guarded: true, body: obj({ snapshot: fuzzText, pool: small, target: fuzzText, cpu: small, memory: small, disk: small }) },
  { method: 'PATCH', path: '/warm-pools/:pool', guarded: true, body: obj({ pool: small }) },
  { method: 'DELETE', path: '/warm-pools/:pool', guarded: true },
  { method: 'GET', path: '/object-storage/push-access' },
  { method: 'GET', path: '/:unknown' },
];

const DAYTONA_TOOLBOX: RouteSpec[] = [
  { method: 'POST', path: '/process/execute', body: obj({ command: safeCommand, cwd: readPath, envs, timeout: small }) },
  { method: 'POST', path: '/process/code-run', body: obj({ code: fc.oneof(fuzzText.map((s) => `print(${JSON.stringify(s)})`), fuzzText), language: fc.constantFrom('python', 'typescript', 'javascript', 'x'), argv: fc.array(fuzzText, { maxLength: 2 }), envs, timeout: small }) },
  { method: 'POST', path: '/process/session', guarded: true, body: obj({ sessionId: fuzzText }) },
  { method: 'GET', path: '/process/session' },
  { method: 'GET', path: '/process/session/entrypoint' },
  { method: 'GET', path: '/process/session/entrypoint/logs' },
  { method: 'GET', path: '/process/session/:sid' },
  { method: 'DELETE', path: '/process/session/:sid' },
  { method: 'POST', path: '/process/session/:sid/exec', body: obj({ command: safeCommand, runAsync: fc.boolean(), async: fc.boolean(), timeout: small }) },
  { method: 'GET', path: '/process/session/:sid/command/:cid' },
  { method: 'GET', path: '/process/session/:sid/command/:cid/logs', query: { follow: fc.constantFrom('false', 'x') } },
  { method: 'POST', path: '/process/session/:sid/command/:cid/input', body: obj({ data: fuzzText }) },
  { method: 'POST', path: '/process/pty', guarded: true, body: obj({ id: fuzzText, cwd: readPath, envs, cols: small, rows: small, lazyStart: fc.boolean() }) },
  { method: 'GET', path: '/process/pty' },
  { method: 'GET', path: '/process/pty/:pty' },
  { method: 'POST', path: '/process/pty/:pty/resize', body: obj({ cols: small, rows: small }) },
  { method: 'DELETE', path: '/process/pty/:pty' },
  { method: 'GET', path: '/process/interpreter/context' },
  { method: 'POST', path: '/process/interpreter/context', body: obj({ cwd: readPath, language: fuzzText }) },
  { method: 'DELETE', path: '/process/interpreter/context/:ctx' },
  { method: 'GET', path: '/files', query: { path: boundedReadPath.map(safeEncode), depth: fc.constantFrom('1', '0', '-3', '99', 'x') } },
  { method: 'GET', path: '/files/info', query: { path: readPath.map(safeEncode) } },
  { method: 'POST', path: '/files/folder', query: { path: writePath.map(safeEncode), mode: fc.constantFrom('755', '0', '9999', 'rwx', '') } },
  { method: 'DELETE', path: '/files', query: { path: writePath.map(safeEncode), recursive: fc.constantFrom('true', 'false', 'x') } },
  { method: 'POST', path: '/files/move', query: { source: writePath.map(safeEncode), destination: writePath.map(safeEncode) } },
  { method: 'POST', path: '/files/permissions', query: { path: writePath.map(safeEncode), mode: fc.constantFrom('644', '7777', 'x', ''), owner: fuzzText.map(safeEncode), group: fuzzText.map(safeEncode) } },
  { method: 'GET', path: '/files/find', query: { path: boundedReadPath.map(safeEncode), pattern: fuzzText.map(safeEncode) } },
  { method: 'GET', path: '/files/search', query: { path: boundedReadPath.map(safeEncode), pattern: fuzzText.map(safeEncode) } },
  { method: 'POST', path: '/files/replace', body: obj({ files: fc.array(writePath, { maxLength: 2 }), pattern: fuzzText, newValue: fuzzText }) },
  { method: 'POST', path: '/files/bulk-upload', raw: fc.oneof(multipart('files[0].file'), bodyFrom(fuzzText)) },
  { method: 'POST', path: '/files/upload-v2', query: { path: writePath.map(safeEncode) }, raw: fc.oneof(multipart('file'), bodyFrom(fuzzText)) },
  { method: 'POST', path: '/files/upload', query: { path: writePath.map(safeEncode) }, raw: fc.oneof(multipart('file'), bodyFrom(fuzzText)) },
  { method: 'POST', path: '/files/bulk-download', body: obj({ paths: fc.array(boundedReadPath, { maxLength: 2 }) }) },
  { method: 'GET', path: '/files/download', query: { path: boundedReadPath.map(safeEncode) } },
  { method: 'GET', path: '/user-home-dir' },
  { method: 'GET', path: '/work-dir' },
  { method: 'GET', path: '/system/metrics' },
  { method: 'GET', path: '/version' },
  { method: 'POST', path: '/env', body: envs },
  ...['status', 'branches', 'history', 'remotes', 'config'].map((p) => ({ method: 'GET', path: `/git/${p}`, query: { path: writePath.map(safeEncode) } })),
  ...['branches', 'checkout', 'add', 'commit', 'init', 'reset', 'restore', 'remotes', 'config', 'config/user'].map((p) => ({
    method: 'POST', path: `/git/${p}`, body: obj({ path: writePath, name: fuzzText, branch: fuzzText, files: fc.array(fuzzName, { maxLength: 2 }), message: fuzzText, author: fuzzText, email: fuzzText, url: fc.constantFrom('file:///nonexistent', 'not a url'), key: fuzzText, value: fuzzText }),
  })),
  { method: 'DELETE', path: '/git/branches', body: obj({ path: writePath, name: fuzzText }) },
  // Network-facing git calls: auth and routing only (a key without the scope).
  ...['clone', 'push', 'pull', 'credentials'].map((p) => ({ method: 'POST', path: `/git/${p}`, guarded: true, body: obj({ path: writePath, url: fuzzText, username: fuzzText, password: fuzzText }) })),
  // Language servers: a start only of languages that do not exist (a fuzzer spawning real
  // servers would only measure the machine); the document calls with any language.
  { method: 'POST', path: '/lsp/start', body: obj({ languageId: fc.constantFrom('ruby', '', 'Python'), pathToProject: fuzzText }) },
  ...['stop', 'did-open', 'did-close', 'completions'].map((p) => ({
    method: 'POST', path: `/lsp/${p}`, body: obj({ languageId: fc.constantFrom('python', 'typescript', 'ruby'), pathToProject: fuzzText, uri: fuzzText, position: fc.constantFrom({ line: 0, character: 0 }, { line: -1 }, 'x') }),
  })),
  { method: 'GET', path: '/lsp/document-symbols', query: { languageId: fc.constantFrom('python', 'ruby'), pathToProject: fuzzText.map(safeEncode), uri: fuzzText.map(safeEncode) } },
  { method: 'GET', path: '/lsp/workspacesymbols', query: { query: fuzzText.map(safeEncode), languageId: fc.constantFrom('typescript', ''), pathToProject: fuzzText.map(safeEncode) } },
  { method: 'POST', path: '/computeruse/start' },
  { method: 'GET', path: '/port' },
  { method: 'GET', path: '/:unknown' },
];

function routeRequests(routes: RouteSpec[], prefix: (id: string) => string, api: ApiShape, style: 'bearer' | 'x-api-key', t: FuzzTargets, label: string): fc.Arbitrary<FuzzRequest> {
  return fc.oneof(...routes.flatMap((r) => [validRouteRequest(r, prefix, api, style, t, label), hostileRouteRequest(r, prefix, api, style, t, label)]));
}

/** A well-formed request for the route: right id, key, encodings and a JSON body of its fields. */
function validRouteRequest(r: RouteSpec, prefix: (id: string) => string, api: ApiShape, style: 'bearer' | 'x-api-key', t: FuzzTargets, label: string): fc.Arbitrary<FuzzRequest> {
  const names = [...r.path.matchAll(/:(\w+)/g)].map((m) => m[1]).filter((n) => n !== 'id');
  const segs = fc.tuple(...names.map(() => fc.constantFrom('1', '3000', 'x', 'entrypoint', 'abc123')));
  const q = queryString(fc.tuple(...Object.entries(r.query ?? {}).map(([k, v]) => fc.option(v.map((x) => [k, x] as [string, string]), { nil: undefined }))).map((p) => p.filter((x): x is [string, string] => x !== undefined)));
  const body: fc.Arbitrary<FuzzBody> = r.raw ?? (r.body ? r.body.map((v) => ({ contentType: 'application/json', data: Buffer.from(JSON.stringify(v) ?? 'null') })) : fc.constant({}));
  const key = r.guarded ? t.readOnlyKey : t.adminKey;
  const headers: Record<string, string> = style === 'bearer' ? { authorization: `Bearer ${key}` } : { 'x-api-key': key };
  const id = r.guarded ? t.missingId : t.sandboxId;
  return fc.tuple(segs, q, body).map(([s, qs, b]) => {
    let path = prefix(id) + r.path.replace(':id', id);
    names.forEach((n, i) => { path = path.replace(`:${n}`, s[i]); });
    return withBody(r.method, path + qs, headers, r.method === 'GET' ? {} : b, api, `${label} ${r.method} ${r.path}`);
  });
}

function hostileRouteRequest(r: RouteSpec, prefix: (id: string) => string, api: ApiShape, style: 'bearer' | 'x-api-key', t: FuzzTargets, label: string): fc.Arbitrary<FuzzRequest> {
  {
    const id = fc.oneof({ weight: 6, arbitrary: fc.constant(r.guarded ? t.missingId : t.sandboxId) }, { weight: 1, arbitrary: fc.constant(t.missingId) }, { weight: 2, arbitrary: encodedSegment(fuzzText) });
    const names = [...r.path.matchAll(/:(\w+)/g)].map((m) => m[1]).filter((n) => n !== 'id');
    const segs = fc.tuple(...names.map(() => fc.oneof(fc.constantFrom('1', '3000', 'x', 'entrypoint'), encodedSegment(fuzzText))));
    // Path-like query values keep their constraint (writes under /tmp/fuzz); others may be anything.
    const q = queryString(fc.tuple(...Object.entries(r.query ?? {}).map(([k, v]) => fc.option((PATH_FIELDS.has(k) ? v : fc.oneof({ weight: 4, arbitrary: v }, { weight: 1, arbitrary: encodedSegment(fuzzText) })).map((x) => [k, x] as [string, string]), { nil: undefined })), fc.option(fc.tuple(encodedSegment(fuzzText), encodedSegment(fuzzText)), { nil: undefined, freq: 8 }))
      .map((p) => p.filter((x): x is [string, string] => x !== undefined)));
    const body: fc.Arbitrary<FuzzBody> = r.raw ?? (r.body ? bodyFrom(r.body) : fc.oneof({ weight: 4, arbitrary: fc.constant({} as FuzzBody) }, { weight: 1, arbitrary: bodyFrom(fuzzText) }));
    return fc.tuple(id, segs, q, authHeader(t, r.guarded ? 'readonly' : 'admin', style), body).map(([sid, s, qs, headers, b]) => {
      // An empty id would make `//`, which app.ts collapses: another route, judged by another shape.
      const id = sid || 'x';
      let path = prefix(id) + r.path.replace(':id', id);
      names.forEach((n, i) => { path = path.replace(`:${n}`, s[i] || 'x'); });
      return withBody(r.method, path + qs, headers, r.method === 'GET' ? {} : b, api, `${label} ${r.method} ${r.path} (hostile)`);
    });
  }
}

export function daytonaRequests(t: FuzzTargets): fc.Arbitrary<FuzzRequest> {
  return fc.oneof(
    { weight: 2, arbitrary: routeRequests(DAYTONA_API, () => '/daytona/api', 'daytona-api', 'bearer', t, 'daytona api') },
    { weight: 4, arbitrary: routeRequests(DAYTONA_TOOLBOX, (id) => `/daytona/toolbox/${id}`, 'daytona-toolbox', 'bearer', t, 'daytona toolbox') },
    { weight: 1, arbitrary: routeRequests(DAYTONA_TOOLBOX.slice(0, 25), (id) => `/daytona/api/toolbox/${id}/toolbox`, 'daytona-toolbox', 'bearer', t, 'daytona legacy toolbox') },
  );
}

// ---- E2B control plane -------------------------------------------------------------------------

const E2B_API: RouteSpec[] = [
  ...['/sandboxes', '/v2/sandboxes'].map((p) => ({ method: 'POST', path: p, guarded: true, body: obj({ templateID: fuzzText, timeout: small, metadata: envs, envVars: envs, autoPause: fc.boolean(), secure: fc.boolean(), allow_internet_access: fc.boolean(), network: obj({ allowOut: fc.array(fuzzText, { maxLength: 2 }), denyOut: fc.array(fuzzText, { maxLength: 2 }) }) }) })),
  ...['/sandboxes', '/v2/sandboxes'].map((p) => ({ method: 'GET', path: p, query: { metadata: fuzzText.map(safeEncode), state: fc.constantFrom('running', 'paused', 'running,paused', 'x'), limit: fc.constantFrom('1', '0', '-1', 'abc', '100000'), nextToken: fuzzText.map(safeEncode) } })),
  { method: 'GET', path: '/sandboxes/metrics' },
  { method: 'GET', path: '/sandboxes/:id' },
  { method: 'DELETE', path: '/sandboxes/:id', guarded: true },
  { method: 'POST', path: '/sandboxes/:id/timeout', guarded: true, body: obj({ timeout: small }) },
  { method: 'POST', path: '/sandboxes/:id/refreshes', body: obj({ duration: small }) },
  ...['pause', 'resume', 'connect', 'snapshots', 'fork'].map((a) => ({ method: 'POST', path: `/sandboxes/:id/${a}`, guarded: true, body: obj({ timeout: small, autoPause: fc.boolean(), name: fuzzText, count: small }) })),
  { method: 'POST', path: '/v2/sandboxes/:id/connect', guarded: true, body: obj({ timeout: small }) },
  { method: 'GET', path: '/sandboxes/:id/metrics' },
  { method: 'GET', path: '/sandboxes/:id/logs' },
  { method: 'GET', path: '/v2/sandboxes/:id/logs' },
  { method: 'PUT', path: '/sandboxes/:id/network', guarded: true, body: obj({ allowOut: fc.array(fuzzText, { maxLength: 2 }), allow_internet_access: fc.boolean() }) },
  { method: 'GET', path: '/snapshots', query: { sandboxID: fuzzText.map(safeEncode), name: fuzzText.map(safeEncode) } },
  { method: 'DELETE', path: '/templates/:template', guarded: true },
  { method: 'POST', path: '/templates' },
  { method: 'GET', path: '/v2/templates/:template' },
  { method: 'GET', path: '/volumes' },
  { method: 'POST', path: '/secrets/:name' },
  { method: 'GET', path: '/:unknown' },
];

export function e2bRequests(t: FuzzTargets): fc.Arbitrary<FuzzRequest> {
  return routeRequests(E2B_API, () => '/e2b', 'e2b', 'x-api-key', t, 'e2b');
}

// ---- E2B envd (Connect RPCs, /files, /health) and the code interpreter ------------------------

const selector = fc.oneof(fc.record({ pid: fc.oneof(fc.integer({ min: 0, max: 70000 }), fc.constantFrom(-1, 2 ** 32, '1')) }), fc.record({ tag: fuzzText }), fc.constant({}));
const ptySize = fc.record({ size: fc.record({ cols: small, rows: small }, { requiredKeys: [] }) }, { requiredKeys: [] });

const RPCS: { path: string; schema: DescMessage; json: fc.Arbitrary<unknown>; stream?: 'server' | 'client' }[] = [
  { path: '/process.Process/Start', stream: 'server', schema: StartRequestSchema, json: obj({ process: obj({ cmd: fc.oneof(fc.constantFrom('/bin/true', '/bin/echo', '/nonexistent', ''), fuzzName), args: fc.array(fuzzText, { maxLength: 3 }), envs, cwd: readPath }), pty: ptySize, tag: fuzzText, stdin: fc.boolean() }) },
  { path: '/process.Process/Connect', stream: 'server', schema: ConnectRequestSchema, json: obj({ process: selector }) },
  { path: '/process.Process/List', schema: ListRequestSchema, json: obj({}) },
  { path: '/process.Process/SendInput', schema: SendInputRequestSchema, json: obj({ process: selector, input: obj({ stdin: fc.uint8Array({ maxLength: 16 }).map((b) => Buffer.from(b).toString('base64')), pty: fuzzText }) }) },
  { path: '/process.Process/StreamInput', stream: 'client', schema: StreamInputRequestSchema, json: obj({ start: obj({ process: selector }) }) },
  { path: '/process.Process/SendSignal', schema: SendSignalRequestSchema, json: obj({ process: selector, signal: fc.constantFrom('SIGNAL_SIGKILL', 'SIGNAL_SIGTERM', 'SIGNAL_UNSPECIFIED', 9, 'X') }) },
  { path: '/process.Process/Update', schema: UpdateRequestSchema, json: obj({ process: selector, pty: ptySize }) },
  { path: '/process.Process/CloseStdin', schema: CloseStdinRequestSchema, json: obj({ process: selector }) },
  { path: '/filesystem.Filesystem/Stat', schema: StatRequestSchema, json: obj({ path: readPath }) },
  { path: '/filesystem.Filesystem/MakeDir', schema: MakeDirRequestSchema, json: obj({ path: writePath }) },
  { path: '/filesystem.Filesystem/Move', schema: MoveRequestSchema, json: obj({ source: writePath, destination: writePath }) },
  { path: '/filesystem.Filesystem/ListDir', schema: ListDirRequestSchema, json: obj({ path: boundedReadPath, depth: fc.integer({ min: 0, max: 40 }) }) },
  { path: '/filesystem.Filesystem/Remove', schema: RemoveRequestSchema, json: obj({ path: writePath }) },
  { path: '/filesystem.Filesystem/WatchDir', stream: 'server', schema: WatchDirRequestSchema, json: obj({ path: boundedReadPath, recursive: fc.boolean() }) },
  { path: '/filesystem.Filesystem/CreateWatcher', schema: CreateWatcherRequestSchema, json: obj({ path: fc.constant(FUZZ_DIR), recursive: fc.boolean(), includeEntry: fc.boolean() }) },
  { path: '/filesystem.Filesystem/GetWatcherEvents', schema: GetWatcherEventsRequestSchema, json: obj({ watcherId: fuzzText }) },
  { path: '/filesystem.Filesystem/RemoveWatcher', schema: RemoveWatcherRequestSchema, json: obj({ watcherId: fuzzText }) },
  { path: '/process.Process/Nope', schema: ListRequestSchema, json: obj({}) },
];

/** A Connect envelope: flags byte, big-endian length, message. */
function envelope(flags: number, data: Uint8Array): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(data.length, 1);
  return Buffer.concat([head, data]);
}

function protobufOf(schema: DescMessage, json: unknown): Uint8Array | undefined {
  try {
    return toBinary(schema, fromJson(schema, json as JsonValue, { ignoreUnknownFields: true }));
  } catch {
    try {
      return toBinary(schema, create(schema));
    } catch {
      return undefined;
    }
  }
}

export function envdRequests(t: FuzzTargets): fc.Arbitrary<FuzzRequest> {
  const routing = fc.oneof(
    { weight: 6, arbitrary: fc.constant({ 'e2b-sandbox-id': t.sandboxId, 'e2b-sandbox-port': '49983' }) },
    { weight: 1, arbitrary: fc.constant({ 'e2b-sandbox-id': t.missingId }) },
    // A fuzzed id; a fuzzed port would send the request to the hosted-port proxy instead.
    { weight: 1, arbitrary: fuzzText.map((s) => ({ 'e2b-sandbox-id': headerSafe(s) || 'x', 'e2b-sandbox-port': '49983' })) },
    { weight: 1, arbitrary: fc.constant({}) },
  );
  const token = fc.oneof(
    { weight: 6, arbitrary: fc.constant({ 'x-access-token': t.envdToken }) },
    { weight: 1, arbitrary: fc.constant({}) },
    { weight: 1, arbitrary: fuzzText.map((s) => ({ 'x-access-token': headerSafe(s) || 'x' })) },
    { weight: 1, arbitrary: fc.constant({ 'x-access-token': t.adminKey, authorization: 'Basic cm9vdDo=' }) },
  );
  const rpc = fc.oneof(...RPCS.map((r) => {
    const body: fc.Arbitrary<FuzzBody> = fc.oneof(
      { weight: 3, arbitrary: r.json.map((j) => (r.stream ? { contentType: 'application/connect+json', data: envelope(0, Buffer.from(JSON.stringify(j) ?? 'null')) } : { contentType: 'application/json', data: Buffer.from(JSON.stringify(j) ?? 'null') })) },
      { weight: 3, arbitrary: r.json.map((j) => { const bin = protobufOf(r.schema, j) ?? new Uint8Array(); return r.stream ? { contentType: 'application/connect+proto', data: envelope(0, bin) } : { contentType: 'application/proto', data: Buffer.from(bin) }; }) },
      // Malformed protobuf, in and out of an envelope (finding 9: these were 500s).
      { weight: 2, arbitrary: fc.tuple(fc.uint8Array({ minLength: 1, maxLength: 48 }), fc.constantFrom('application/proto', 'application/connect+proto', 'application/grpc', 'application/grpc-web+proto'), fc.boolean()).map(([b, ct, framed]) => ({ contentType: ct, data: ct !== 'application/proto' && framed ? envelope(b[0] & 3, b.slice(1)) : Buffer.from(b) })) },
      { weight: 1, arbitrary: fc.uint8Array({ minLength: 1, maxLength: 48 }).map((b) => ({ contentType: 'application/proto', contentEncoding: 'gzip', data: Buffer.from(b) })) },
      { weight: 1, arbitrary: bodyFrom(r.json) },
    );
    const extra = fc.record({
      'connect-protocol-version': fc.constantFrom('1', '1', '1', '2', ''),
      // Server streams end when the client's deadline does: a fuzzed Start never outlives it.
      'connect-timeout-ms': r.stream === 'server' ? fc.constantFrom('1500', '800') : fc.constantFrom('5000', 'abc', '-1', '0', '99999999999999'),
    }, { requiredKeys: r.stream === 'server' ? ['connect-timeout-ms'] : [] });
    return fc.tuple(routing, token, extra, body, fc.constantFrom('POST', 'POST', 'POST', 'POST', 'GET', 'PUT')).map(([a, b, c, d, m]) => withBody(m === 'GET' && r.stream ? 'POST' : m, r.path + (m === 'GET' ? `?encoding=json&message=${safeEncode(d.data?.toString('latin1') ?? '')}` : ''), { ...a, ...b, ...c }, m === 'GET' ? {} : d, 'connect', `envd ${r.path}`));
  }));
  const files = fc.tuple(routing, token, fc.constantFrom('GET', 'POST', 'PUT'), fc.record({ path: fc.oneof(writePath, boundedReadPath).map(safeEncode), username: fuzzText.map(safeEncode), signature: fuzzText.map(safeEncode), signature_expiration: fc.constantFrom('0', '-1', 'x', '99999999999') }, { requiredKeys: [] }), fc.oneof(multipart('file'), bodyFrom(fuzzText)))
    .map(([a, b, m, q, body]) => {
      // Uploads only under /tmp/fuzz: a POST's path (query or part name) is always a write path.
      const query = m === 'GET' ? q : { ...q, path: q.path && decodeURIComponentSafe(q.path).startsWith(`${FUZZ_DIR}`) ? q.path : safeEncode(`${FUZZ_DIR}/up`) };
      const qs = Object.entries(query).map(([k, v]) => `${k}=${v}`).join('&');
      const headers: Record<string, string> = { ...a, ...b };
      return withBody(m, `/files${qs ? `?${qs}` : ''}`, headers, m === 'GET' ? {} : body, envdOrNative(headers, Boolean(query.signature)), `envd ${m} /files`);
    });
  const health = fc.tuple(routing, token).map(([a, b]) => withBody('GET', '/health', { ...a, ...b }, {}, envdOrNative({ ...a, ...b }, false), 'envd /health'));
  const interpreter = fc.tuple(
    fc.constantFrom('/contexts', '/contexts/x', '/contexts/x/restart', '/execute', '/nope', '/contexts/%ED%A0%80'),
    fc.constantFrom('GET', 'POST', 'DELETE'),
    fc.oneof(fc.constant({}), fuzzText.map((s) => ({ 'x-access-token': headerSafe(s) || 'x' })), fc.constant({ 'e2b-traffic-access-token': 'nope' })),
    bodyFrom(obj({ code: fuzzText, language: fuzzText, context_id: fuzzText, cwd: readPath })),
  ).map(([p, m, auth, body]) => withBody(m, p, { 'e2b-sandbox-id': t.sandboxId, 'e2b-sandbox-port': '49999', ...auth }, m === 'GET' ? {} : body, 'code-interpreter', `code interpreter ${m} ${p}`));
  return fc.oneof({ weight: 6, arbitrary: rpc }, { weight: 2, arbitrary: files }, { weight: 1, arbitrary: health }, { weight: 1, arbitrary: interpreter });
}

/** /files and /health are envd's only with a routing header, a token or a signature (compat/e2b/index.ts); otherwise they are native paths. */
function envdOrNative(headers: Record<string, string>, signed: boolean): ApiShape {
  // Node trims header values: a blank one is no header at all.
  return headers['e2b-sandbox-id']?.trim() || headers['x-access-token']?.trim() || signed ? 'envd-http' : 'native';
}

function decodeURIComponentSafe(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return '';
  }
}
